//! Chat templates.

use thiserror::Error;

/// Errors rendering a chat template.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ChatError {
    /// The model has no chat template.
    #[error("the model has no chat template; pass a built-in one (chatml, llama3, gemma)")]
    NoTemplate,
}
