//! The paged KV cache's bookkeeping: which block holds which tokens of which
//! sequence. No tensors live here: backends own the K/V memory, laid out as
//! `[num_blocks, block_size, kv_heads, head_dim]` per layer, and read it
//! through the block tables and slots this module hands out.
//!
//! - [`pool`]: the flat block array with refcounts, free lists and the
//!   prefix-cache index;
//! - [`hash`]: the stable chained block hash;
//! - [`manager`]: per-sequence block tables, prefix lookup, slot mapping.

pub mod hash;
pub mod manager;
pub mod pool;

pub use hash::{hash_block_tokens, hash_full_blocks, BlockHash};
pub use manager::{
    BlockTable, CachedPrefix, KvManager, PrefixCacheStats, SeqId, Slot, DEFAULT_BLOCK_SIZE,
};
pub use pool::{BlockId, BlockPool};

use thiserror::Error;

/// Errors of the KV cache bookkeeping: a caller broke a precondition.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KvError {
    /// The pool size or block size is unusable.
    #[error("KV pool of {num_blocks} blocks of {block_size} tokens is unusable: need at least 2 blocks (one is the null block), fewer than 2^32 - 1, and block_size >= 1")]
    BadConfig {
        /// Blocks asked for.
        num_blocks: usize,
        /// Tokens per block asked for.
        block_size: usize,
    },
    /// A block id out of range, or the null block.
    #[error("block id {block} is not a usable block of this pool ({num_blocks} blocks, id 0 is the null block)")]
    BadBlock {
        /// The id.
        block: u32,
        /// Blocks in the pool.
        num_blocks: usize,
    },
    /// An operation that needs a block in use met a free one.
    #[error("{op} on block {block}, which is not in use (refcount 0): the caller released it already or never allocated it")]
    NotInUse {
        /// The block.
        block: u32,
        /// The operation.
        op: &'static str,
    },
    /// Registering a block that is not a full, unhashed block.
    #[error("cannot register block {block} in the prefix cache with {tokens} tokens (block_size {block_size}) or twice")]
    BadRegister {
        /// The block.
        block: u32,
        /// Tokens given.
        tokens: usize,
        /// Tokens per block.
        block_size: usize,
    },
    /// A sequence that holds no blocks.
    #[error("sequence {seq} holds no KV blocks (never allocated, or freed already)")]
    UnknownSeq {
        /// The sequence.
        seq: u64,
    },
    /// A cached prefix given for a sequence that already has blocks.
    #[error("sequence {seq} already has blocks: a cached prefix can only start a sequence")]
    PrefixOnExistingSeq {
        /// The sequence.
        seq: u64,
    },
    /// A cached prefix whose blocks were evicted since the lookup.
    #[error("cached prefix for sequence {seq} is stale: call find_cached_prefix again right before allocate_slots")]
    StalePrefix {
        /// The sequence.
        seq: u64,
    },
    /// Slots asked for tokens the caller did not pass.
    #[error("sequence {seq}: slots up to token {need} asked for but only {have} tokens given")]
    TokensShort {
        /// The sequence.
        seq: u64,
        /// Tokens the allocation reaches.
        need: usize,
        /// Tokens passed.
        have: usize,
    },
    /// Committing tokens that have no slot.
    #[error("sequence {seq}: commit of {computed} computed tokens but only {slotted} have slots")]
    CommitBeyondSlots {
        /// The sequence.
        seq: u64,
        /// Tokens claimed computed.
        computed: usize,
        /// Tokens with slots.
        slotted: usize,
    },
    /// An internal invariant broke (a bug in this module).
    #[error("KV pool invariant broken: {detail}; please report this")]
    PoolCorrupt {
        /// What was found.
        detail: String,
    },
}
