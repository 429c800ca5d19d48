//! The streaming GGUF reader.

pub mod value;

pub use value::{Array, Metadata, Value, ValueType};

use thiserror::Error;

/// Errors reading a GGUF file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file (magic {0:02x?}); check that the path points at a .gguf model")]
    BadMagic([u8; 4]),
}
