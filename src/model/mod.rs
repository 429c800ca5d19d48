//! Models: configuration from metadata, tokenizers, chat templates, and the
//! forward-pass seam every model implements.

pub mod arch;
pub mod chat;
pub mod config;
pub mod forward;
pub mod generic;
pub mod layout;
pub mod load;
pub mod synth;
pub mod tokenizer;

pub use crate::backend::cpu::CpuModel;
pub use config::{ConfigError, ModelConfig, SUPPORTED_ARCHITECTURES};
pub use forward::{Batch, ForwardModel, KvCacheConfig, KvType, LogitsWanted, SeqInput};
pub use load::{check_types, load_cpu_model, load_model, LoadError, LoadOptions, LoadProgress};
