//! The block pool: every KV block of the cache, as one flat array indexed by
//! [`BlockId`], with refcounts, free lists threaded through the array, and the
//! prefix-cache index from [`BlockHash`] to block.
//!
//! # Complexity
//!
//! Every operation is O(1) (hash-map operations expected O(1)), with no
//! allocation except [`BlockPool::register`] (which stores the block's token
//! ids) and the hash map's growth:
//! - [`BlockPool::allocate`]: pops the head of the fresh list, else evicts the
//!   head (least recently freed) of the cached list;
//! - [`BlockPool::acquire`] of a cached block with refcount 0 unlinks it from
//!   the middle of the cached list (the list is doubly linked through indices);
//! - [`BlockPool::release`] appends to the tail of a free list.
//!
//! # Free lists
//!
//! A block with refcount 0 is on exactly one of two lists: *fresh* (holds no
//! reusable content) or *cached* (a full block with a registered hash, still
//! findable by [`BlockPool::lookup`]). Allocation takes fresh blocks first and
//! evicts cached ones only when none is left, least recently freed first.
//! Block 0 is the null block: never allocated, on no list, used by callers as
//! a placeholder (padding entries in a block table).

use std::collections::HashMap;

use super::hash::BlockHash;
use super::KvError;

/// Index of a block in the pool. `BlockId::NULL` (0) is never allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The null block: a valid index that is never handed out.
    pub const NULL: BlockId = BlockId(0);
}

/// End of a list.
const NIL: u32 = u32::MAX;

/// Which free list a block is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    /// In use (refcount > 0), or the null block.
    None,
    Fresh,
    Cached,
}

#[derive(Debug, Clone)]
struct Block {
    ref_cnt: u32,
    /// Set while the block is in the prefix-cache index.
    hash: Option<BlockHash>,
    /// The block's token ids while `hash` is set (verified on every hit).
    tokens: Box<[u32]>,
    prev: u32,
    next: u32,
    on: On,
}

/// A doubly linked list threaded through `Block::{prev, next}`.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// The pool of KV blocks (see the module docs for the O(1) guarantees).
#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<Block>,
    fresh: List,
    cached: List,
    index: HashMap<BlockHash, BlockId>,
    block_size: usize,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (the null block included, so
    /// `num_blocks - 1` are usable) of `block_size` tokens each.
    ///
    /// Errors: `num_blocks < 2`, `num_blocks >= u32::MAX` or `block_size == 0`.
    pub fn new(num_blocks: usize, block_size: usize) -> Result<Self, KvError> {
        if num_blocks < 2 || num_blocks >= NIL as usize || block_size == 0 {
            return Err(KvError::BadConfig {
                num_blocks,
                block_size,
            });
        }
        let blank = Block {
            ref_cnt: 0,
            hash: None,
            tokens: Box::new([]),
            prev: NIL,
            next: NIL,
            on: On::None,
        };
        let mut pool = BlockPool {
            blocks: vec![blank; num_blocks],
            fresh: List::EMPTY,
            cached: List::EMPTY,
            index: HashMap::new(),
            block_size,
        };
        for i in 1..num_blocks as u32 {
            pool.push_back(On::Fresh, i);
        }
        Ok(pool)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks that can ever be allocated (all but the null block).
    pub fn num_usable(&self) -> usize {
        self.blocks.len() - 1
    }

    /// Blocks with refcount 0 (fresh plus cached-but-unused): what
    /// [`allocate`](Self::allocate) can still hand out.
    pub fn num_free(&self) -> usize {
        self.fresh.len + self.cached.len
    }

    /// Free blocks that still hold cached content (evictable).
    pub fn num_cached_free(&self) -> usize {
        self.cached.len
    }

    /// Refcount of `id`, or `None` when `id` is out of range.
    pub fn ref_count(&self, id: BlockId) -> Option<u32> {
        self.blocks.get(id.0 as usize).map(|b| b.ref_cnt)
    }

    /// The registered hash of `id`, if it is in the prefix-cache index.
    pub fn block_hash(&self, id: BlockId) -> Option<BlockHash> {
        self.blocks.get(id.0 as usize).and_then(|b| b.hash)
    }

    /// Takes one free block, with refcount 1, O(1). Fresh blocks go first;
    /// when none is left the least recently freed cached block is evicted
    /// (removed from the index). `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = match self.pop_front(On::Fresh) {
            Some(id) => id,
            None => {
                let id = self.pop_front(On::Cached)?;
                self.evict(id);
                id
            }
        };
        let b = &mut self.blocks[id as usize];
        debug_assert!(
            b.ref_cnt == 0 && b.hash.is_none(),
            "allocated block {id} is not clean"
        );
        b.ref_cnt = 1;
        Some(BlockId(id))
    }

    /// Finds the cached block holding exactly `tokens` under `hash`, O(1)
    /// expected (plus the comparison of `tokens`). The block may have
    /// refcount 0; [`acquire`](Self::acquire) it before use.
    pub fn lookup(&self, hash: BlockHash, tokens: &[u32]) -> Option<BlockId> {
        let id = *self.index.get(&hash)?;
        let b = &self.blocks[id.0 as usize];
        debug_assert_eq!(
            b.hash,
            Some(hash),
            "index and block disagree on block {}",
            id.0
        );
        (&*b.tokens == tokens).then_some(id)
    }

    /// Adds a reference to `id`, O(1). Precondition: `id` is allocated or is a
    /// cached free block (then it leaves the free list: it can no longer be
    /// evicted).
    pub fn acquire(&mut self, id: BlockId) -> Result<(), KvError> {
        let b = self.block(id)?;
        match (b.ref_cnt, b.on) {
            (0, On::Cached) => {
                self.unlink(id.0);
                self.blocks[id.0 as usize].ref_cnt = 1;
                Ok(())
            }
            (n, On::None) if n > 0 => {
                self.blocks[id.0 as usize].ref_cnt = n.saturating_add(1);
                Ok(())
            }
            _ => Err(KvError::NotInUse {
                block: id.0,
                op: "acquire",
            }),
        }
    }

    /// Drops one reference to `id`, O(1). Precondition: refcount > 0. At zero
    /// the block goes to the tail of the cached list when it has a hash (still
    /// findable, evicted last among older ones), else to the fresh list.
    pub fn release(&mut self, id: BlockId) -> Result<(), KvError> {
        let b = self.block(id)?;
        debug_assert!(
            b.ref_cnt > 0 || b.on != On::None,
            "block {} has refcount 0 but is on no list",
            id.0
        );
        if b.ref_cnt == 0 {
            return Err(KvError::NotInUse {
                block: id.0,
                op: "release",
            });
        }
        let left = b.ref_cnt - 1;
        let list = if b.hash.is_some() {
            On::Cached
        } else {
            On::Fresh
        };
        self.blocks[id.0 as usize].ref_cnt = left;
        if left == 0 {
            self.push_back(list, id.0);
        }
        Ok(())
    }

    /// Puts the full, computed block `id` in the prefix-cache index under
    /// `hash`. Preconditions: `id` is in use, has no hash yet, and
    /// `tokens.len() == block_size`. Returns `false` (and changes nothing)
    /// when another block already holds `hash`: the same content computed
    /// twice is kept once in the index, the duplicate is simply not findable.
    pub fn register(
        &mut self,
        id: BlockId,
        hash: BlockHash,
        tokens: &[u32],
    ) -> Result<bool, KvError> {
        let block_size = self.block_size;
        let b = self.block(id)?;
        if b.ref_cnt == 0 {
            return Err(KvError::NotInUse {
                block: id.0,
                op: "register",
            });
        }
        if tokens.len() != block_size || b.hash.is_some() {
            return Err(KvError::BadRegister {
                block: id.0,
                tokens: tokens.len(),
                block_size,
            });
        }
        if self.index.contains_key(&hash) {
            return Ok(false);
        }
        self.index.insert(hash, id);
        let b = &mut self.blocks[id.0 as usize];
        b.hash = Some(hash);
        b.tokens = tokens.into();
        Ok(true)
    }

    /// Drops every cached free block from the index (they become fresh), for
    /// when cached contents can no longer be trusted (a failed step, new
    /// weights). Blocks in use keep their hashes. O(cached free blocks).
    pub fn reset_prefix_cache(&mut self) {
        while let Some(id) = self.pop_front(On::Cached) {
            self.evict(id);
            self.push_back(On::Fresh, id);
        }
    }

    /// Checks every internal invariant (list links and lengths, refcounts,
    /// index consistency); O(blocks). For tests and debug assertions.
    pub fn check_invariants(&self) -> Result<(), String> {
        let walk = |list: List, on: On| -> Result<usize, String> {
            let (mut n, mut prev, mut cur) = (0usize, NIL, list.head);
            while cur != NIL {
                let b = &self.blocks[cur as usize];
                if b.on != on || b.ref_cnt != 0 || b.prev != prev || cur == 0 {
                    return Err(format!("block {cur} badly linked on {on:?}"));
                }
                if (on == On::Cached) != b.hash.is_some() {
                    return Err(format!("block {cur} on {on:?} with hash {:?}", b.hash));
                }
                n += 1;
                prev = cur;
                cur = b.next;
                if n > self.blocks.len() {
                    return Err(format!("cycle in {on:?} list"));
                }
            }
            if prev != list.tail || n != list.len {
                return Err(format!("{on:?} list tail/len mismatch"));
            }
            Ok(n)
        };
        let listed = walk(self.fresh, On::Fresh)? + walk(self.cached, On::Cached)?;
        let zero = self
            .blocks
            .iter()
            .skip(1)
            .filter(|b| b.ref_cnt == 0)
            .count();
        if listed != zero {
            return Err(format!(
                "{zero} blocks have refcount 0 but {listed} are on free lists"
            ));
        }
        for (h, id) in &self.index {
            if self.blocks[id.0 as usize].hash != Some(*h) {
                return Err(format!("index entry for block {} is stale", id.0));
            }
        }
        let hashed = self.blocks.iter().filter(|b| b.hash.is_some()).count();
        if hashed != self.index.len() {
            return Err(format!(
                "{hashed} hashed blocks but {} index entries",
                self.index.len()
            ));
        }
        Ok(())
    }

    /// Bounds check for ids that come from callers; the null block is never
    /// a valid operand.
    fn block(&self, id: BlockId) -> Result<&Block, KvError> {
        match self.blocks.get(id.0 as usize) {
            Some(b) if id != BlockId::NULL => Ok(b),
            _ => Err(KvError::BadBlock {
                block: id.0,
                num_blocks: self.blocks.len(),
            }),
        }
    }

    /// Removes `id` from the index and forgets its content.
    fn evict(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        if let Some(h) = b.hash.take() {
            b.tokens = Box::new([]);
            let removed = self.index.remove(&h);
            debug_assert_eq!(removed, Some(BlockId(id)), "index lost block {id}");
        }
    }

    fn list_mut(&mut self, on: On) -> &mut List {
        match on {
            On::Cached => &mut self.cached,
            _ => &mut self.fresh,
        }
    }

    /// Precondition: `id` is on no list.
    fn push_back(&mut self, on: On, id: u32) {
        debug_assert_eq!(
            self.blocks[id as usize].on,
            On::None,
            "block {id} already listed"
        );
        let tail = self.list_mut(on).tail;
        {
            let b = &mut self.blocks[id as usize];
            b.prev = tail;
            b.next = NIL;
            b.on = on;
        }
        if tail == NIL {
            self.list_mut(on).head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        let list = self.list_mut(on);
        list.tail = id;
        list.len += 1;
    }

    fn pop_front(&mut self, on: On) -> Option<u32> {
        let head = self.list_mut(on).head;
        if head == NIL {
            return None;
        }
        self.unlink(head);
        Some(head)
    }

    /// Precondition: `id` is on a list.
    fn unlink(&mut self, id: u32) {
        let (prev, next, on) = {
            let b = &self.blocks[id as usize];
            (b.prev, b.next, b.on)
        };
        debug_assert_ne!(on, On::None, "unlinking block {id} that is on no list");
        if prev == NIL {
            self.list_mut(on).head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.list_mut(on).tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.list_mut(on).len -= 1;
        let b = &mut self.blocks[id as usize];
        b.prev = NIL;
        b.next = NIL;
        b.on = On::None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unlinking from the head, the middle and the tail keeps the list whole.
    #[test]
    fn unlink_anywhere_keeps_links() {
        let mut p = BlockPool::new(6, 1).unwrap();
        let ids: Vec<u32> = (0..5).map(|_| p.allocate().unwrap().0).collect();
        for (i, &id) in ids.iter().enumerate() {
            let h = BlockHash(1000 + i as u128);
            assert!(p.register(BlockId(id), h, &[i as u32]).unwrap());
            p.release(BlockId(id)).unwrap();
        }
        for &victim in &[ids[2], ids[0], ids[4]] {
            p.acquire(BlockId(victim)).unwrap();
            p.check_invariants().unwrap();
        }
        let order: Vec<u32> = std::iter::from_fn(|| p.pop_front(On::Cached)).collect();
        assert_eq!(order, vec![ids[1], ids[3]]);
    }

    #[test]
    fn release_to_zero_picks_the_list_by_hash() {
        let mut p = BlockPool::new(3, 1).unwrap();
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        p.acquire(a).unwrap();
        p.release(a).unwrap();
        assert_eq!(p.ref_count(a), Some(1), "still held once");
        p.register(b, BlockHash(7), &[9]).unwrap();
        p.release(a).unwrap();
        p.release(b).unwrap();
        assert_eq!((p.fresh.len, p.cached.len), (1, 1));
        assert_eq!(p.blocks[b.0 as usize].on, On::Cached);
    }
}
