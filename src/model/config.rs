//! Model hyper-parameters read from GGUF metadata (`{arch}.*` keys).

use thiserror::Error;

use crate::gguf::Metadata;

/// Architectures Hearth knows how to run, as named in `general.architecture`.
pub const SUPPORTED_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "qwen3moe", "gemma3"];

/// Errors reading the model configuration.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `general.architecture` is missing.
    #[error("the model has no general.architecture key; is this a language model GGUF?")]
    NoArchitecture,
    /// The architecture is not one Hearth runs.
    #[error("architecture {arch:?} is not supported; supported: {}", SUPPORTED_ARCHITECTURES.join(", "))]
    UnsupportedArchitecture {
        /// The file's architecture.
        arch: String,
    },
    /// A required key is missing or has the wrong type.
    #[error("metadata key {key} is missing or not {expected}")]
    MissingKey {
        /// The full key.
        key: String,
        /// What it should hold.
        expected: &'static str,
    },
    /// A value that makes no sense (zero heads, heads not dividing the width, ...).
    #[error("invalid model configuration: {0}")]
    Invalid(String),
}

/// The shapes and constants of a transformer model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: String,
    /// `general.name`, when present.
    pub name: Option<String>,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Width of the residual stream.
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Per-head width of queries and keys.
    pub head_dim_k: usize,
    /// Per-head width of values.
    pub head_dim_v: usize,
    /// Feed-forward width (per expert for MoE models, see `n_ff_expert`).
    pub n_ff: usize,
    /// Vocabulary size (`tokenizer.ggml.tokens` length).
    pub n_vocab: usize,
    /// Trained context length.
    pub n_ctx_train: usize,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RoPE frequency base of sliding-window layers, when the model has one.
    pub rope_base_swa: Option<f32>,
    /// Sliding-window size for local attention layers, when the model has them.
    pub sliding_window: Option<usize>,
    /// Experts per MoE layer (0 for dense models).
    pub n_expert: usize,
    /// Experts used per token.
    pub n_expert_used: usize,
    /// Feed-forward width of one expert, when given separately.
    pub n_ff_expert: Option<usize>,
    /// The first expert and the count the stacked expert weights hold,
    /// when the model is an expert-parallel shard
    /// ([`crate::model::shard`], `hearth.shard.expert_first` and
    /// `hearth.shard.expert_count`); `None`: all `n_expert`.
    pub expert_shard: Option<(usize, usize)>,
}

impl ModelConfig {
    /// Reads the configuration of any architecture, without checking that it is supported.
    pub fn from_metadata(md: &Metadata) -> Result<Self, ConfigError> {
        let arch = md
            .architecture()
            .ok_or(ConfigError::NoArchitecture)?
            .to_string();
        let key = |s: &str| format!("{arch}.{s}");
        let req = |s: &str| -> Result<usize, ConfigError> {
            md.get_u64(&key(s))
                .map(|v| v as usize)
                .ok_or(ConfigError::MissingKey {
                    key: key(s),
                    expected: "an integer",
                })
        };
        let opt = |s: &str| md.get_u64(&key(s)).map(|v| v as usize);

        let n_embd = req("embedding_length")?;
        let n_head = first_of_array_or_scalar(md, &key("attention.head_count")).ok_or(
            ConfigError::MissingKey {
                key: key("attention.head_count"),
                expected: "an integer",
            },
        )?;
        if n_head == 0 {
            return Err(ConfigError::Invalid("attention.head_count is 0".into()));
        }
        let n_head_kv =
            first_of_array_or_scalar(md, &key("attention.head_count_kv")).unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ConfigError::Invalid(format!(
                "{n_head} query heads cannot share {n_head_kv} key/value heads"
            )));
        }
        let head_dim_k = opt("attention.key_length").unwrap_or(n_embd / n_head);
        let head_dim_v = opt("attention.value_length").unwrap_or(head_dim_k);
        let n_vocab = md
            .get_array("tokenizer.ggml.tokens")
            .map(|a| a.len())
            .or_else(|| opt("vocab_size"))
            .ok_or(ConfigError::MissingKey {
                key: "tokenizer.ggml.tokens".into(),
                expected: "an array",
            })?;
        Ok(ModelConfig {
            name: md.get_str("general.name").map(str::to_string),
            n_layer: req("block_count")?,
            n_embd,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff: first_of_array_or_scalar(md, &key("feed_forward_length")).unwrap_or(0),
            n_vocab,
            n_ctx_train: req("context_length")?,
            rms_eps: md
                .get_f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            rope_base: md.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rope_base_swa: md.get_f32(&key("rope.freq_base_swa")),
            sliding_window: opt("attention.sliding_window"),
            n_expert: opt("expert_count").unwrap_or(0),
            n_expert_used: opt("expert_used_count").unwrap_or(0),
            n_ff_expert: opt("expert_feed_forward_length"),
            expert_shard: md
                .get_u64("hearth.shard.expert_first")
                .zip(md.get_u64("hearth.shard.expert_count"))
                .map(|(f, c)| (f as usize, c as usize)),
            arch,
        })
    }

    /// Like [`ModelConfig::from_metadata`], and fails for architectures Hearth cannot run.
    pub fn from_metadata_supported(md: &Metadata) -> Result<Self, ConfigError> {
        let arch = md.architecture().ok_or(ConfigError::NoArchitecture)?;
        if !SUPPORTED_ARCHITECTURES.contains(&arch) {
            return Err(ConfigError::UnsupportedArchitecture {
                arch: arch.to_string(),
            });
        }
        Self::from_metadata(md)
    }

    /// Bytes of K/V cache for `n_ctx` tokens with `bytes_per_elem` per element
    /// (2 for f16, 4 for f32), over every layer.
    pub fn kv_cache_bytes(&self, n_ctx: usize, bytes_per_elem: usize) -> u64 {
        let per_token = self.n_head_kv * (self.head_dim_k + self.head_dim_v) * bytes_per_elem;
        (per_token as u64) * (n_ctx as u64) * (self.n_layer as u64)
    }
}

/// Reads `key` as an integer, or as the first element of a per-layer integer array
/// (some models store head counts and FFN widths per layer).
fn first_of_array_or_scalar(md: &Metadata, key: &str) -> Option<usize> {
    if let Some(v) = md.get_u64(key) {
        return Some(v as usize);
    }
    let values = md.get_array(key)?.to_i64_vec()?;
    values.first().and_then(|&v| usize::try_from(v).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Array, Value};

    fn llama_like() -> Metadata {
        let mut md = Metadata::new();
        md.set("general.architecture", Value::String("llama".into()));
        md.set("llama.embedding_length", Value::U32(576));
        md.set("llama.block_count", Value::U32(30));
        md.set("llama.attention.head_count", Value::U32(9));
        md.set("llama.attention.head_count_kv", Value::U32(3));
        md.set("llama.feed_forward_length", Value::U32(1536));
        md.set("llama.context_length", Value::U32(8192));
        md.set(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["a".into(); 10])),
        );
        md
    }

    #[test]
    fn reads_llama_shapes() {
        let cfg = ModelConfig::from_metadata_supported(&llama_like()).expect("valid");
        assert_eq!(
            (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_head_kv),
            (30, 576, 9, 3)
        );
        assert_eq!((cfg.head_dim_k, cfg.head_dim_v, cfg.n_vocab), (64, 64, 10));
        assert_eq!(cfg.rope_base, 10_000.0);
        // 30 layers * 3 kv heads * (64 + 64) * 2 bytes * 100 tokens
        assert_eq!(cfg.kv_cache_bytes(100, 2), 30 * 3 * 128 * 2 * 100);
    }

    #[test]
    fn rejects_bad_configs() {
        let mut md = llama_like();
        md.set("llama.attention.head_count_kv", Value::U32(2));
        assert!(matches!(
            ModelConfig::from_metadata(&md),
            Err(ConfigError::Invalid(_))
        ));
        let mut md = llama_like();
        md.remove("llama.block_count");
        let err = ModelConfig::from_metadata(&md).expect_err("missing key");
        assert!(err.to_string().contains("llama.block_count"));
        let mut md = llama_like();
        md.set("general.architecture", Value::String("rwkv9".into()));
        let err = ModelConfig::from_metadata_supported(&md).expect_err("unsupported");
        assert!(err.to_string().contains("rwkv9") && err.to_string().contains("qwen3"));
    }
}
