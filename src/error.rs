//! The crate's one error type. Each module has its own error enum with the
//! details; [`Error`](enum@Error) wraps them so callers can match on the module.

use thiserror::Error;

/// Every error the Hearth core can return.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading or parsing a GGUF file failed.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// A quantization format problem (unsupported type, bad shape).
    #[error(transparent)]
    Quant(#[from] crate::quant::QuantError),
    /// The model's configuration is missing, invalid or unsupported.
    #[error(transparent)]
    Config(#[from] crate::model::ConfigError),
    /// Building or running the tokenizer failed.
    #[error(transparent)]
    Tokenizer(#[from] crate::model::tokenizer::TokenizerError),
    /// Rendering a chat template failed.
    #[error(transparent)]
    Chat(#[from] crate::model::chat::ChatError),
    /// KV cache bookkeeping refused an operation.
    #[error(transparent)]
    Kv(#[from] crate::kv::KvError),
    /// The scheduler refused a request or an out-of-order call.
    #[error(transparent)]
    Sched(#[from] crate::sched::SchedError),
    /// A backend could not run an op or hold a tensor.
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
    /// Building a model from a file's tensors failed.
    #[error(transparent)]
    Load(#[from] crate::model::LoadError),
    /// Making a synthetic model failed.
    #[error(transparent)]
    Synth(#[from] crate::model::synth::SynthError),
    /// Bad sampling parameters or logits.
    #[error(transparent)]
    Sample(#[from] crate::sample::SampleError),
    /// The engine refused a request or the model broke its contract.
    #[error(transparent)]
    Engine(#[from] crate::engine::EngineError),
    /// A model that does not split into the tensor-parallel shards asked for.
    #[error(transparent)]
    Shard(#[from] crate::model::shard::ShardError),
}

/// `Result` with the crate's [`Error`](enum@Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;
