//! x86-64 kernels, chosen at run time.
//!
//! The quantized kernels are split by format family first, then by kind
//! of kernel:
//! - `q32/`: the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//!   IQ4_NL);
//! - `k256/`: the 256-element formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//!   IQ4_XS);
//!
//! each with `dots.rs` (per-row dots), `tiles16.rs` (AVX-512 VNNI, 16
//! tokens per register), `one_token.rs` (AVX-512 one-token passes),
//! `tiles8.rs` (AVX2, 8 tokens per register) and `lane_tiles.rs` (the
//! eight-lane tiles that `lane_tiles.rs` here instantiates for both ISAs).
//! Beside them: `float.rs` (F32, F16, BF16 dots and tiles), `quantize.rs`
//! (activation quantizers), `simd.rs` (AVX2 building blocks), `lanes.rs`
//! (what the one-token passes of both families share), `tiling.rs` (what
//! every tile shares), `tuning.rs` (the per-CPU settings of the one-token
//! passes), and the ISA variants of the attention (`attention.rs`) and the
//! row ops (`rowops.rs`).
//!
//! The AVX2 8-token and the AVX-512 16-token kernels stay separate files
//! rather than one kernel generic over the lane width: their integer
//! parts are different instructions (`maddubs` pairs into i16, whose
//! saturation bounds how many words a sum may hold, against VNNI's
//! `vpdpbusd` straight into i32), only AVX-512 reads the banded weight
//! layout ([`Layout::Bands`]), and each was tuned by measurement on its
//! own.
//!
//! Each kernel file defines kernels under the scalar names
//! (`vec_dot_q4_0_q8_0`, ...) as `unsafe` `#[target_feature]` functions and
//! a `vec_dot(ty)` or `gemm(ty)` that wraps them as table entries. Those
//! entries are only reachable through [`vec_dot`], [`gemm`] and
//! [`quantizer`] here, which the kernel table calls only for an [`Isa`]
//! whose features it has detected: that is the safety argument of every
//! `unsafe` call in the entries.
//!
//! Agreement with the scalar kernels: the integer sum of each block (or
//! sub-block) is computed exactly and then scaled and summed in the same
//! float order as the scalar kernel, so the 32-element formats, Q2_K and
//! IQ4_XS give bit-identical results. Q3_K, Q4_K, Q5_K and Q6_K sum each block's
//! integer parts exactly but scale them once per block (the scalar kernel
//! scales eight partial lanes), so they differ by f32 rounding only: within
//! `1e-6 * sum |w * a|` (a few ulps of the magnitude; tested).
//!
//! Precondition shared with ggml's x86 code: int8 activations lie in
//! -127..=127 (what every activation quantizer produces); -128 multiplies
//! wrongly in the sign trick of `maddubs`.

pub(in crate::backend::cpu) mod attention;
mod float;
mod k256;
mod lane_tiles;
mod lanes;
mod q32;
mod quantize;
pub(in crate::backend::cpu) mod rowops;
mod simd;
mod tiling;
mod tuning;

use super::{DotFn, GemmFn, Isa, Layout, QuantizeFn};
use crate::quant::GgmlType;

/// Whether this CPU runs `isa`'s kernels.
pub(super) fn available(isa: Isa) -> bool {
    match isa {
        Isa::Scalar => true,
        Isa::Avx2 => {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        }
        Isa::Avx512 => {
            available(Isa::Avx2)
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        }
        Isa::Neon | Isa::Simd128 => false,
    }
}

/// The fast dot of weight type `ty` under `isa`, `None` where the scalar one
/// stays. Callers must have checked [`available`]`(isa)`.
pub(super) fn vec_dot(isa: Isa, ty: GgmlType) -> Option<DotFn> {
    match isa {
        Isa::Avx2 => q32::dots::vec_dot(ty)
            .or_else(|| k256::dots::vec_dot(ty))
            .or_else(|| float::avx2::vec_dot(ty)),
        Isa::Avx512 => q32::dots_vnni::vec_dot(ty)
            .or_else(|| q32::dots::vec_dot(ty))
            .or_else(|| k256::dots::vec_dot(ty))
            .or_else(|| float::avx512::vec_dot(ty)),
        _ => None,
    }
}

/// The fast activation quantizer to `ty` under `isa`, `None` where the
/// scalar one stays. Callers must have checked [`available`]`(isa)`.
pub(super) fn quantizer(isa: Isa, ty: GgmlType) -> Option<QuantizeFn> {
    match isa {
        Isa::Avx2 | Isa::Avx512 => quantize::quantizer(ty),
        _ => None,
    }
}

/// The tiled kernel (several rows by several activation rows) of weight
/// type `ty` under `isa`, `None` where the matmul dots pair by pair.
/// AVX-512 runs the 16-token kernels (`k256/tiles16.rs`, `q32/tiles16.rs`:
/// every format with a tile but Q5_1), the VNNI eight-lane tiles
/// (`lane_tiles.rs`) for Q5_1. AVX2 runs the 8-token kernels
/// (`q32/tiles8.rs`, `k256/tiles8.rs`: every format with a tile but
/// Q5_1), the eight-lane tiles for Q5_1. The float formats run `float.rs`
/// on both.
/// Callers must have checked [`available`]`(isa)`.
pub(super) fn gemm(isa: Isa, ty: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Avx2 => q32::tiles8::gemm(ty)
            .or_else(|| k256::tiles8::gemm(ty))
            .or_else(|| lane_tiles::avx2::gemm(ty))
            .or_else(|| float::avx2::gemm(ty)),
        Isa::Avx512 => k256::tiles16::gemm(ty)
            .or_else(|| q32::tiles16::gemm(ty))
            .or_else(|| lane_tiles::avx512::gemm(ty))
            .or_else(|| float::avx512::gemm(ty)),
        _ => None,
    }
}

/// How [`gemm()`]'s kernel of `ty` under `isa` wants the weight stored:
/// AVX-512's kernels of Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, Q4_K and Q6_K read groups of
/// 16 rows transposed block by block ([`Layout::Bands`]), the rest plain.
pub(super) fn layout(isa: Isa, ty: GgmlType) -> Layout {
    match isa {
        Isa::Avx512 if k256::tiles16::gemm(ty).is_some() => k256::tiles16::layout(ty),
        Isa::Avx512 => q32::tiles16::layout(ty),
        _ => Layout::Plain,
    }
}

/// Whether the tile of `ty` under `isa` follows the per-row dot only for
/// finite block scales: the eight-lane tiles (`lane_tiles.rs`) scale each block's eight integer
/// lanes apart, and an exact zero lane times an infinite scale is NaN
/// where the per-row dot, scaling the block's sum, is infinite. The
/// banded kernels scale each pair's exact sum, as the per-row dots do.
pub(super) fn gemm_finite_scales(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Avx2 => {
            q32::tiles8::gemm(ty).is_none()
                && k256::tiles8::gemm(ty).is_none()
                && lane_tiles::avx2::gemm(ty).is_some()
        }
        Isa::Avx512 => {
            k256::tiles16::gemm(ty).is_none()
                && q32::tiles16::gemm(ty).is_none()
                && lane_tiles::avx512::gemm(ty).is_some()
        }
        _ => false,
    }
}

/// Whether a one-token matmul of weight type `ty` under `isa` runs the tile
/// (see [`gemm`]) rather than the per-row dot: always where there is a tile.
///
/// The per-row dot sums in another order than the tiles, and the engine's guarantee that a request batched gives the tokens it gives alone
/// (`tests/engine_cpu.rs`) needs a token's results bit for bit independent
/// of the batch: that holds only while one token runs the batches' tiles.
pub(super) fn gemm_one_token(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Avx2 | Isa::Avx512 => gemm(isa, ty).is_some(),
        _ => false,
    }
}
