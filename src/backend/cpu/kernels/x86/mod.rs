//! x86-64 kernels, chosen at run time.
//!
//! Each ISA file defines kernels under the scalar names
//! (`vec_dot_q4_0_q8_0`, ...) as `unsafe` `#[target_feature]` functions and
//! a `vec_dot(ty)` that wraps them as table entries. Those entries are only
//! reachable through [`vec_dot`] here, which the kernel table calls only for
//! an [`Isa`] whose features it has detected: that is the safety argument of
//! every `unsafe` call in the entries.
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
mod avx2;
mod avx512;
mod band_decode;
mod decode512;
mod gemm;
mod gemm16;
mod gemm16_legacy;
mod gemm8;
mod gemm8_k;
mod gemm_float;
mod gemm_k;
pub(in crate::backend::cpu) mod rowops;
mod tiling;
mod tuning;

use tiling::Lines;
#[cfg(test)]
use tuning::{assert_passes_agree, PassFn};
use tuning::{bands_ahead, one_token_groups};

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
        Isa::Avx2 => avx2::vec_dot(ty).or_else(|| gemm_float::avx2::vec_dot(ty)),
        Isa::Avx512 => avx512::vec_dot(ty)
            .or_else(|| avx2::vec_dot(ty))
            .or_else(|| gemm_float::avx512::vec_dot(ty)),
        _ => None,
    }
}

/// The fast activation quantizer to `ty` under `isa`, `None` where the
/// scalar one stays. Callers must have checked [`available`]`(isa)`.
pub(super) fn quantizer(isa: Isa, ty: GgmlType) -> Option<QuantizeFn> {
    match isa {
        Isa::Avx2 | Isa::Avx512 => avx2::quantizer(ty),
        _ => None,
    }
}

/// The tiled kernel (several rows by several activation rows) of weight
/// type `ty` under `isa`, `None` where the matmul dots pair by pair.
/// AVX-512 runs the 16-token kernels (`gemm16.rs`, `gemm16_legacy.rs`:
/// every format with a tile); `gemm.rs`'s VNNI tiles stay behind them.
/// AVX2 runs the 8-token kernels of `gemm8.rs` and `gemm8_k.rs` (every
/// format with a tile but Q5_1), `gemm.rs`'s tiles for Q5_1. The float formats run
/// `gemm_float.rs` on both.
/// Callers must have checked [`available`]`(isa)`.
pub(super) fn gemm(isa: Isa, ty: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Avx2 => gemm8::gemm(ty)
            .or_else(|| gemm8_k::gemm(ty))
            .or_else(|| gemm::avx2::gemm(ty))
            .or_else(|| gemm_float::avx2::gemm(ty)),
        Isa::Avx512 => gemm16::gemm(ty)
            .or_else(|| gemm16_legacy::gemm(ty))
            .or_else(|| gemm::avx512::gemm(ty))
            .or_else(|| gemm_float::avx512::gemm(ty)),
        _ => None,
    }
}

/// How [`gemm()`]'s kernel of `ty` under `isa` wants the weight stored:
/// AVX-512's kernels of Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, Q4_K and Q6_K read groups of
/// 16 rows transposed block by block ([`Layout::Bands`]), the rest plain.
pub(super) fn layout(isa: Isa, ty: GgmlType) -> Layout {
    match isa {
        Isa::Avx512 if gemm16::gemm(ty).is_some() => gemm16::layout(ty),
        Isa::Avx512 => gemm16_legacy::layout(ty),
        _ => Layout::Plain,
    }
}

/// Whether the tile of `ty` under `isa` follows the per-row dot only for
/// finite block scales: `gemm.rs`'s tiles scale each block's eight integer
/// lanes apart, and an exact zero lane times an infinite scale is NaN
/// where the per-row dot, scaling the block's sum, is infinite. The
/// banded kernels scale each pair's exact sum, as the per-row dots do.
pub(super) fn gemm_finite_scales(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Avx2 => {
            gemm8::gemm(ty).is_none()
                && gemm8_k::gemm(ty).is_none()
                && gemm::avx2::gemm(ty).is_some()
        }
        Isa::Avx512 => {
            gemm16::gemm(ty).is_none()
                && gemm16_legacy::gemm(ty).is_none()
                && gemm::avx512::gemm(ty).is_some()
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
