//! Per-sequence block tables over the [`BlockPool`], prefix-cache lookups and
//! the slot mapping handed to the model (the shape of vLLM v1's
//! `KVCacheManager`).
//!
//! Life of a sequence: [`KvManager::find_cached_prefix`] on its tokens, then
//! [`KvManager::allocate_slots`] each step for the tokens the step computes,
//! [`KvManager::commit_computed`] after the step ran (full blocks become
//! findable by later sequences only once their K/V is really written), and
//! [`KvManager::free`] when it ends or is preempted.

use std::collections::HashMap;

use super::hash::{hash_block_tokens, BlockHash};
use super::pool::{BlockId, BlockPool};
use super::KvError;

/// The tokens per block when nothing else is configured.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Identifies a sequence to the KV manager (the scheduler uses request ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// Where one token's K/V goes: block and position inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The block.
    pub block: BlockId,
    /// Position inside the block, `< block_size`.
    pub offset: u32,
}

impl Slot {
    /// The flat slot index `block * block_size + offset`, the form attention
    /// kernels write K/V with (vLLM's `slot_mapping`).
    pub fn flat(&self, block_size: usize) -> usize {
        self.block.0 as usize * block_size + self.offset as usize
    }
}

/// A sequence's block table: its blocks in token order (token `p` lives in
/// `blocks[p / block_size]` at offset `p % block_size`).
pub type BlockTable = Vec<BlockId>;

/// The longest cached run of full blocks at the start of a token sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachedPrefix {
    /// The cached blocks, in order (may have refcount 0 until allocated).
    pub blocks: Vec<BlockId>,
    /// Their chained hashes.
    pub hashes: Vec<BlockHash>,
    /// `blocks.len() * block_size`: tokens that need no computing.
    pub num_cached_tokens: usize,
}

/// Prefix-cache counters, over every sequence that was allocated with a
/// prefix lookup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Sequences whose first allocation looked up a prefix.
    pub queries: u64,
    /// Tokens those sequences had at that time.
    pub queried_tokens: u64,
    /// Tokens found cached.
    pub hit_tokens: u64,
}

impl PrefixCacheStats {
    /// `hit_tokens / queried_tokens`, 0 before any query.
    pub fn hit_rate(&self) -> f64 {
        if self.queried_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.queried_tokens as f64
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Seq {
    table: BlockTable,
    /// Tokens that have a slot.
    num_tokens: usize,
    /// Chained hashes of the first `hashes.len()` blocks (committed ones).
    hashes: Vec<BlockHash>,
}

/// Block tables of every live sequence over one [`BlockPool`].
#[derive(Debug, Clone)]
pub struct KvManager {
    pool: BlockPool,
    seqs: HashMap<SeqId, Seq>,
    stats: PrefixCacheStats,
}

impl KvManager {
    /// A manager over a fresh pool of `num_blocks` blocks (null block
    /// included) of `block_size` tokens. Errors as [`BlockPool::new`].
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        Ok(KvManager {
            pool: BlockPool::new(num_blocks, block_size)?,
            seqs: HashMap::new(),
            stats: PrefixCacheStats::default(),
        })
    }

    /// The pool, read-only.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    /// Blocks an allocation can still take (cached free blocks included).
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free()
    }

    /// Blocks the pool has in all (the null block excluded).
    pub fn num_usable_blocks(&self) -> usize {
        self.pool.num_usable()
    }

    /// Prefix-cache counters.
    pub fn prefix_stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// Whether `seq` holds blocks.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// The block table of `seq`, `None` when it holds no blocks.
    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.table.as_slice())
    }

    /// Tokens of `seq` that have a slot, `None` when it holds no blocks.
    pub fn num_tokens(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.num_tokens)
    }

    /// The longest run of cached full blocks at the start of `tokens`, never
    /// the whole of `tokens`: at most `tokens.len() - 1` tokens count as
    /// cached, so the last token is always computed and yields logits. Pure
    /// lookup, O(cached blocks); nothing is reserved until
    /// [`allocate_slots`](Self::allocate_slots).
    pub fn find_cached_prefix(&self, tokens: &[u32]) -> CachedPrefix {
        let bs = self.pool.block_size();
        let max_blocks = tokens.len().saturating_sub(1) / bs;
        let mut out = CachedPrefix::default();
        for chunk in tokens.chunks_exact(bs).take(max_blocks) {
            let h = hash_block_tokens(out.hashes.last().copied(), chunk);
            match self.pool.lookup(h, chunk) {
                Some(id) => {
                    out.blocks.push(id);
                    out.hashes.push(h);
                }
                None => break,
            }
        }
        out.num_cached_tokens = out.blocks.len() * bs;
        out
    }

    /// Gives slots to the next `num_new_tokens` tokens of `seq` (positions
    /// `n .. n + num_new_tokens`, `n` = tokens already slotted plus the
    /// prefix's), allocating blocks as needed; returns one [`Slot`] per new
    /// token. All or nothing: `Ok(None)` (and no change) when the pool has
    /// too few free blocks.
    ///
    /// Preconditions (errors when broken): `prefix` only on the first
    /// allocation of `seq`, found by [`find_cached_prefix`](Self::find_cached_prefix)
    /// with no allocation in between; `tokens` (all known tokens of the
    /// sequence) has at least `n + num_new_tokens` entries.
    pub fn allocate_slots(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        prefix: Option<&CachedPrefix>,
        num_new_tokens: usize,
    ) -> Result<Option<Vec<Slot>>, KvError> {
        let empty = CachedPrefix::default();
        let prefix = prefix.unwrap_or(&empty);
        let (start, need) = self.plan(seq, tokens, prefix, num_new_tokens)?;
        let prefix_free = prefix
            .blocks
            .iter()
            .filter(|&&b| self.pool.ref_count(b) == Some(0))
            .count();
        if need + prefix_free > self.pool.num_free() {
            return Ok(None);
        }
        if !self.seqs.contains_key(&seq) {
            self.stats.queries += 1;
            self.stats.queried_tokens += tokens.len() as u64;
            self.stats.hit_tokens += prefix.num_cached_tokens as u64;
        }
        for &b in &prefix.blocks {
            self.pool.acquire(b)?;
        }
        let state = self.seqs.entry(seq).or_default();
        state.table.extend_from_slice(&prefix.blocks);
        state.hashes.extend_from_slice(&prefix.hashes);
        for _ in 0..need {
            let Some(b) = self.pool.allocate() else {
                debug_assert!(false, "free count said {need} blocks were available");
                return Err(KvError::PoolCorrupt {
                    detail: "free count and free lists disagree".into(),
                });
            };
            state.table.push(b);
        }
        let bs = self.pool.block_size();
        let end = start + num_new_tokens;
        state.num_tokens = end;
        debug_assert!(
            state.table.len() * bs >= end,
            "table too short for its tokens"
        );
        let table = &state.table;
        Ok(Some(
            (start..end)
                .map(|p| Slot {
                    block: table[p / bs],
                    offset: (p % bs) as u32,
                })
                .collect(),
        ))
    }

    /// Checks an allocation's preconditions; returns the first new position
    /// and the blocks to allocate.
    fn plan(
        &self,
        seq: SeqId,
        tokens: &[u32],
        prefix: &CachedPrefix,
        num_new_tokens: usize,
    ) -> Result<(usize, usize), KvError> {
        let (have_tokens, have_blocks) = self
            .seqs
            .get(&seq)
            .map_or((0, 0), |s| (s.num_tokens, s.table.len()));
        if !prefix.blocks.is_empty() && self.seqs.contains_key(&seq) {
            return Err(KvError::PrefixOnExistingSeq { seq: seq.0 });
        }
        self.check_prefix(seq, prefix)?;
        let start = have_tokens + prefix.num_cached_tokens;
        let end = start + num_new_tokens;
        if end > tokens.len() {
            return Err(KvError::TokensShort {
                seq: seq.0,
                need: end,
                have: tokens.len(),
            });
        }
        let need = end
            .div_ceil(self.pool.block_size())
            .saturating_sub(have_blocks + prefix.blocks.len());
        Ok((start, need))
    }

    /// Records that the first `num_computed` tokens of `seq` now have their
    /// K/V written: every full block among them enters the prefix cache
    /// (hashed, chained on the block before). Call after the model step ran.
    ///
    /// Preconditions (errors when broken): `seq` holds blocks,
    /// `num_computed <= ` its slotted tokens `<= tokens.len()`.
    pub fn commit_computed(
        &mut self,
        seq: SeqId,
        tokens: &[u32],
        num_computed: usize,
    ) -> Result<(), KvError> {
        let bs = self.pool.block_size();
        let state = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSeq { seq: seq.0 })?;
        if num_computed > state.num_tokens || state.num_tokens > tokens.len() {
            return Err(KvError::CommitBeyondSlots {
                seq: seq.0,
                computed: num_computed,
                slotted: state.num_tokens,
            });
        }
        for i in state.hashes.len()..num_computed / bs {
            let chunk = &tokens[i * bs..(i + 1) * bs];
            let h = hash_block_tokens(state.hashes.last().copied(), chunk);
            self.pool.register(state.table[i], h, chunk)?;
            state.hashes.push(h);
        }
        Ok(())
    }

    /// Releases every block of `seq`, last block first (so the tail of a
    /// sequence is evicted before its shared head). Error when `seq` holds
    /// no blocks.
    pub fn free(&mut self, seq: SeqId) -> Result<(), KvError> {
        let state = self
            .seqs
            .remove(&seq)
            .ok_or(KvError::UnknownSeq { seq: seq.0 })?;
        for &b in state.table.iter().rev() {
            self.pool.release(b)?;
        }
        Ok(())
    }

    /// Forgets every cached free block (see [`BlockPool::reset_prefix_cache`]).
    pub fn reset_prefix_cache(&mut self) {
        self.pool.reset_prefix_cache();
    }

    /// A prefix is usable when each block still holds the hash it was found
    /// under (no eviction since the lookup) and the token count matches.
    fn check_prefix(&self, seq: SeqId, prefix: &CachedPrefix) -> Result<(), KvError> {
        let bs = self.pool.block_size();
        let consistent = prefix.blocks.len() == prefix.hashes.len()
            && prefix.num_cached_tokens == prefix.blocks.len() * bs;
        let current = prefix
            .blocks
            .iter()
            .zip(&prefix.hashes)
            .all(|(&b, &h)| self.pool.block_hash(b) == Some(h));
        if consistent && current {
            Ok(())
        } else {
            Err(KvError::StalePrefix { seq: seq.0 })
        }
    }
}
