//! Quantization formats: the ggml type table, block layouts, and the scalar
//! reference implementation that every kernel is checked against.

pub mod blocks;
pub mod recipe;
pub mod reference;
pub mod types;

pub use types::{GgmlType, TypeInfo, TYPES, WEIGHT_TYPES};

use thiserror::Error;

/// Errors about quantization formats.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QuantError {
    /// The type exists but this operation is not implemented for it.
    #[error("{op} is not supported for type {ty}; supported types: {supported}")]
    Unsupported {
        /// What was attempted (`dequantize`, `quantize`, ...).
        op: &'static str,
        /// The type asked for.
        ty: GgmlType,
        /// The types that are supported, for the message.
        supported: String,
    },
    /// A row length that is not a multiple of the block size, or buffers of mismatched size.
    #[error("bad shape for {ty}: {detail}")]
    Shape {
        /// The type.
        ty: GgmlType,
        /// What was wrong.
        detail: String,
    },
}
