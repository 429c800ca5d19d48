//! wasm32 kernels, chosen at compile time.
//!
//! wasm has no run-time feature detection: a module either validates with
//! SIMD128 instructions or fails to load. So these kernels exist only in a
//! build with `-C target-feature=+simd128` (`Isa::Simd128`); a build that
//! adds `+relaxed-simd` uses `i32x4.relaxed_dot_i8x16_i7x16_add` for the
//! formats whose weights are (or are made) 7-bit unsigned, and is a separate
//! module for the engines that have relaxed SIMD.
//!
//! Agreement with the scalar kernels is as on x86 (see `x86/mod.rs`): exact
//! integer sums per block, then the scalar float order, so the 32-element
//! formats, Q2_K, IQ4_XS and the float dots are bit-identical; Q3_K .. Q6_K
//! scale each block's exact integer sum once and differ by f32 rounding only.

pub(in crate::backend::cpu) mod attention;
mod bands;
pub(in crate::backend::cpu) mod rowops;
mod simd128;

use bytemuck::Pod;

use super::{DotFn, GemmFn, Isa, Layout, QuantizeFn, Widen};
use crate::quant::GgmlType;

/// Whether this build runs `isa`'s kernels (SIMD128 is fixed at compile time).
pub(super) fn available(isa: Isa) -> bool {
    matches!(isa, Isa::Scalar | Isa::Simd128)
}

/// The SIMD128 dot of weight type `ty` under `isa`, `None` where the scalar
/// one stays.
pub(super) fn vec_dot(isa: Isa, ty: GgmlType) -> Option<DotFn> {
    match isa {
        Isa::Simd128 => simd128::vec_dot(ty),
        _ => None,
    }
}

/// The SIMD128 activation quantizer to `ty` under `isa`, `None` where the
/// scalar one stays.
pub(super) fn quantizer(isa: Isa, ty: GgmlType) -> Option<QuantizeFn> {
    match isa {
        Isa::Simd128 => simd128::quantizer(ty),
        _ => None,
    }
}

/// The SIMD128 tiled kernel of weight type `ty` under `isa`, `None` where
/// the matmul dots row by row. Its results equal the per-row dot's bit for
/// bit, so the matmul runs it for one token too.
pub(super) fn gemm(isa: Isa, ty: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Simd128 => bands::gemm::<true>(ty),
        _ => None,
    }
}

/// [`gemm`] for weights without subnormal f16 block scales: it converts
/// them in fewer instructions.
pub(super) fn gemm_normal_scales(isa: Isa, ty: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Simd128 => bands::gemm::<false>(ty),
        _ => None,
    }
}

/// How [`gemm`]'s kernel of `ty` wants the weight stored: in bands of four
/// rows where it has one.
pub(super) fn layout(isa: Isa, ty: GgmlType) -> Layout {
    match isa {
        Isa::Simd128 => bands::layout(ty).unwrap_or(Layout::Plain),
        _ => Layout::Plain,
    }
}

/// The re-encoding weights of type `ty` are stored in under `isa`, `None`
/// for the GGUF one. Q5_0 is stored as Q8_0 (exact, see
/// `legacy::q5_0_to_q8_0`): its tile decoded the fifth bits at half the
/// speed of Q8_0's, and in wasm decode is bound by instructions more than
/// by bytes. That costs 34 bytes a block instead of 22.
pub(super) fn widen(isa: Isa, ty: GgmlType) -> Option<Widen> {
    use crate::backend::cpu::kernels::legacy::{q5_0_to_q8_0, q8_0_to_q5_0};
    use crate::quant::blocks::{BlockQ5_0, BlockQ8_0};
    match (isa, ty) {
        (Isa::Simd128, GgmlType::Q5_0) => Some(Widen {
            to: GgmlType::Q8_0,
            encode: |from, to| per_block::<BlockQ5_0, BlockQ8_0>(from, to, q5_0_to_q8_0),
            decode: |from, to| per_block::<BlockQ8_0, BlockQ5_0>(from, to, q8_0_to_q5_0),
        }),
        _ => None,
    }
}

/// `f` on each block of `from` (unaligned bytes) into the same block of `to`.
fn per_block<A: Pod, B: Pod>(from: &[u8], to: &mut [u8], f: fn(&[A], &mut [B])) {
    let (sa, sb) = (std::mem::size_of::<A>(), std::mem::size_of::<B>());
    for (x, y) in from.chunks_exact(sa).zip(to.chunks_exact_mut(sb)) {
        let a: A = bytemuck::pod_read_unaligned(x);
        let mut b = B::zeroed();
        f(std::slice::from_ref(&a), std::slice::from_mut(&mut b));
        y.copy_from_slice(bytemuck::bytes_of(&b));
    }
}
