//! Models: configuration from metadata, tokenizers and chat templates.

pub mod chat;
pub mod config;
pub mod tokenizer;

pub use config::{ConfigError, ModelConfig, SUPPORTED_ARCHITECTURES};
