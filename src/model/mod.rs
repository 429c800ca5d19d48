//! Models: configuration from metadata, tokenizers and chat templates.

pub mod chat;
pub mod tokenizer;
