//! Tokenizers built from GGUF metadata.

use thiserror::Error;

/// Errors building or running a tokenizer.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required metadata key is missing.
    #[error("tokenizer metadata key {0} is missing")]
    MissingKey(&'static str),
}
