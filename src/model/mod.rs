//! Models: configuration from metadata, tokenizers, chat templates, and the
//! forward-pass seam every model implements.

pub mod any;
pub mod arch;
pub mod chat;
pub mod config;
pub mod forward;
pub mod generic;
pub mod layout;
pub mod load;
pub mod memory;
pub mod offload;
pub mod plans;
pub mod quantize;
pub mod shard;
pub mod split;
pub mod stream;
pub mod synth;
pub mod tokenizer;
pub mod weights;

pub use any::AnyModel;
pub use config::{ConfigError, ModelConfig, SUPPORTED_ARCHITECTURES};
pub use forward::{Batch, ForwardModel, LogitsWanted, SeqInput};
pub use generic::Model;
pub use load::{check_model, load_model, Checked, LoadError, LoadOptions, LoadProgress};
pub use plans::Readout;
