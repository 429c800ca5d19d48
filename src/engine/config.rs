//! The engine's limits and the size of its K/V cache.

use super::EngineError;
use crate::graph::{KvCacheConfig, KvType};
use crate::kv::DEFAULT_BLOCK_SIZE;

use crate::sched::SchedulerConfig;

/// Limits of an [`Engine`](super::Engine). The model must be loaded with
/// [`EngineConfig::kv_cache_config`] so its K/V memory matches the pool the
/// engine hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most tokens of one sequence, prompt plus output (>= 2).
    pub n_ctx: usize,
    /// Tokens the K/V pool holds over all sequences; values below `n_ctx`
    /// (0 included) mean `n_ctx`. Concurrent requests beyond it wait or are
    /// preempted (recomputed later).
    pub kv_tokens: usize,
    /// Most requests running at once (>= 1).
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (>= 1); longer prompts are prefilled
    /// in chunks of this size.
    pub max_num_batched_tokens: usize,
    /// Tokens per K/V block (>= 1).
    pub block_size: usize,
    /// Element type of the K/V cache.
    pub kv_type: KvType,
    /// Reuse the K/V of shared prompt prefixes (full blocks) across requests.
    pub enable_prefix_caching: bool,
    /// Most prompt tokens a step computes beside each four running decodes
    /// (0: `max_num_batched_tokens`): bounds the time between their tokens
    /// (see [`SchedulerConfig`]'s field of the same name).
    pub prefill_tokens_per_4_decodes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_ctx: 4096,
            kv_tokens: 0,
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            block_size: DEFAULT_BLOCK_SIZE,
            kv_type: KvType::F16,
            enable_prefix_caching: true,
            prefill_tokens_per_4_decodes: 0,
        }
    }
}

impl EngineConfig {
    /// Checks the limits are usable.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |detail: &str| {
            Err(EngineError::BadConfig {
                detail: detail.to_string(),
            })
        };
        if self.n_ctx < 2 {
            return bad("n_ctx must be at least 2 (one prompt token and one new token)");
        }
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 {
            return bad("max_num_seqs and max_num_batched_tokens must be >= 1");
        }
        if self.block_size == 0 {
            return bad("block_size must be >= 1");
        }
        Ok(())
    }

    /// Blocks in the pool: enough for `max(kv_tokens, n_ctx)` tokens, plus
    /// the null block.
    pub fn num_blocks(&self) -> usize {
        self.kv_tokens
            .max(self.n_ctx)
            .div_ceil(self.block_size.max(1))
            + 1
    }

    /// The K/V cache the model must allocate (pass it to the loader).
    pub fn kv_cache_config(&self) -> KvCacheConfig {
        KvCacheConfig {
            num_blocks: self.num_blocks(),
            block_size: self.block_size,
            dtype: self.kv_type,
        }
    }

    /// The scheduler's configuration for these limits.
    pub fn scheduler_config(&self) -> SchedulerConfig {
        SchedulerConfig {
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_num_seqs: self.max_num_seqs,
            num_blocks: self.num_blocks(),
            block_size: self.block_size,
            enable_prefix_caching: self.enable_prefix_caching,
            prefill_tokens_per_4_decodes: self.prefill_tokens_per_4_decodes,
        }
    }
}
