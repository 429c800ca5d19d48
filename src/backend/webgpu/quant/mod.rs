//! Quantized weights on the GPU: their device layout, the streaming repack
//! that writes it at load, and the WGSL kernels that read it.
//!
//! Formats: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K,
//! Q5_K, Q6_K, IQ4_NL, IQ4_XS (the CPU path's list,
//! [`crate::quant::WEIGHT_TYPES`]).
//!
//! Loading a weight `[rows, cols]` of type `ty`:
//! 1. [`packed_layout`] gives its bytes and row stride; [`PackedLayout::parts`]
//!    splits it by rows so no buffer exceeds the storage binding limit;
//! 2. a [`Repacker`] per weight turns whole GGUF rows, as the reader yields
//!    them, into packed bytes for offset [`Repacker::packed_offset`] (row `r`
//!    of the weight goes to part `r / rows_per_part` at byte
//!    `(r % rows_per_part) * row_bytes`).
//!
//! Running: [`QuantKernels::encode_matmul`] (`y[m, n] = x[m, k] · W[n, k]ᵀ`:
//! matrix-vector kernels for decode, a tiled kernel for prefill) and
//! [`QuantKernels::encode_get_rows`] (embedding lookup) queue dispatches on
//! the backend.
//!
//! Variants (see [`sources::variant`]): matrix-vector with packed int8 dot
//! products (`dot4I8Packed`, activations quantized per 32 values on the
//! device) or f32 dots of dequantized weights; subgroup or workgroup-memory
//! reductions; tiles in f16 or f32 workgroup memory.

pub mod kernels;
pub mod sources;

pub use crate::backend::packed::{packed_layout, unpack_rows, PackedLayout, Repacker};
pub use kernels::{
    BufRef, GetRowsArgs, KernelParams, MatmulArgs, MoeMatvecArgs, QuantKernels, WeightPart,
};
pub use sources::{Kernel, KernelConfig};

#[cfg(test)]
mod tests_gpu;
#[cfg(test)]
mod tests_naga;
