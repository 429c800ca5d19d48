//! Block pool and KV manager: free lists, eviction order, refcounts, prefix
//! lookup, slot mapping, errors, and a seeded random walk over operations
//! that checks every invariant after each one.

mod sched_sim;

use hearth::kv::{hash_full_blocks, BlockId, BlockPool, KvError, KvManager, SeqId, Slot};
use sched_sim::TestRng;

fn toks(base: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + base * 1000 + i).collect()
}

#[test]
fn null_block_is_never_allocated_and_pool_runs_dry() {
    let mut p = BlockPool::new(6, 4).unwrap();
    assert_eq!((p.num_usable(), p.num_free()), (5, 5));
    let got: Vec<BlockId> = (0..5).map(|_| p.allocate().unwrap()).collect();
    assert!(got.iter().all(|b| *b != BlockId::NULL));
    assert_eq!(p.allocate(), None);
    assert_eq!(p.num_free(), 0);
    for b in got {
        p.release(b).unwrap();
    }
    assert_eq!(p.num_free(), 5);
    p.check_invariants().unwrap();
}

#[test]
fn cached_blocks_stay_findable_and_are_evicted_least_recently_freed_first() {
    let mut p = BlockPool::new(4, 2).unwrap();
    let ids: Vec<BlockId> = (0..3).map(|_| p.allocate().unwrap()).collect();
    let hs = hash_full_blocks(&toks(1, 6), 2);
    for (i, (&b, &h)) in ids.iter().zip(&hs).enumerate() {
        assert!(p.register(b, h, &toks(1, 6)[2 * i..2 * i + 2]).unwrap());
    }
    // Free in order 1, 0, 2: block 1 is the least recently freed.
    for i in [1, 0, 2] {
        p.release(ids[i]).unwrap();
    }
    assert_eq!((p.num_free(), p.num_cached_free()), (3, 3));
    assert_eq!(p.lookup(hs[1], &toks(1, 6)[2..4]), Some(ids[1]));
    assert_eq!(
        p.lookup(hs[1], &[0, 0]),
        None,
        "tokens are verified on a hit"
    );
    let first = p.allocate().unwrap();
    assert_eq!(first, ids[1], "LRU eviction");
    assert_eq!(
        p.lookup(hs[1], &toks(1, 6)[2..4]),
        None,
        "evicted blocks are no longer found"
    );
    assert_eq!(p.lookup(hs[0], &toks(1, 6)[0..2]), Some(ids[0]));
    // Acquiring a cached free block takes it off the free list.
    p.acquire(ids[0]).unwrap();
    assert_eq!(p.num_free(), 1);
    assert_eq!(p.allocate(), Some(ids[2]));
    p.check_invariants().unwrap();
}

#[test]
fn fresh_blocks_are_used_before_cached_ones() {
    let mut p = BlockPool::new(4, 2).unwrap();
    let a = p.allocate().unwrap();
    let h = hash_full_blocks(&[7, 8], 2)[0];
    p.register(a, h, &[7, 8]).unwrap();
    p.release(a).unwrap();
    let b = p.allocate().unwrap();
    let c = p.allocate().unwrap();
    assert!(b != a && c != a);
    assert_eq!(p.lookup(h, &[7, 8]), Some(a));
    assert_eq!(p.allocate(), Some(a));
}

#[test]
fn pool_rejects_bad_input_with_errors() {
    assert!(matches!(
        BlockPool::new(1, 16),
        Err(KvError::BadConfig { .. })
    ));
    assert!(matches!(
        BlockPool::new(8, 0),
        Err(KvError::BadConfig { .. })
    ));
    let mut p = BlockPool::new(4, 2).unwrap();
    assert!(matches!(
        p.release(BlockId(1)),
        Err(KvError::NotInUse { .. })
    ));
    assert!(matches!(
        p.release(BlockId(0)),
        Err(KvError::BadBlock { .. })
    ));
    assert!(matches!(
        p.acquire(BlockId(99)),
        Err(KvError::BadBlock { .. })
    ));
    let a = p.allocate().unwrap();
    let h = hash_full_blocks(&[1, 2], 2)[0];
    assert!(matches!(
        p.register(a, h, &[1]),
        Err(KvError::BadRegister { .. })
    ));
    assert!(p.register(a, h, &[1, 2]).unwrap());
    assert!(matches!(
        p.register(a, h, &[1, 2]),
        Err(KvError::BadRegister { .. })
    ));
    let b = p.allocate().unwrap();
    assert!(
        !p.register(b, h, &[1, 2]).unwrap(),
        "a duplicate of cached content is not indexed twice"
    );
    p.check_invariants().unwrap();
}

#[test]
fn slot_mapping_and_all_or_nothing_allocation() {
    let mut m = KvManager::new(4, 4).unwrap();
    let t = toks(2, 20);
    let s = m.allocate_slots(SeqId(1), &t, None, 6).unwrap().unwrap();
    let table = m.block_table(SeqId(1)).unwrap().to_vec();
    assert_eq!(table.len(), 2);
    assert_eq!(
        s[5],
        Slot {
            block: table[1],
            offset: 1
        }
    );
    assert_eq!(s[5].flat(4), table[1].0 as usize * 4 + 1);
    // 6 + 8 = 14 tokens need 4 blocks; only 3 exist: nothing changes.
    assert_eq!(m.allocate_slots(SeqId(1), &t, None, 8).unwrap(), None);
    assert_eq!((m.num_free_blocks(), m.num_tokens(SeqId(1))), (1, Some(6)));
    let s = m.allocate_slots(SeqId(1), &t, None, 6).unwrap().unwrap();
    assert_eq!(
        s[0],
        Slot {
            block: table[1],
            offset: 2
        }
    );
    assert!(matches!(
        m.allocate_slots(SeqId(1), &t, None, 9),
        Err(KvError::TokensShort { .. })
    ));
    m.free(SeqId(1)).unwrap();
    assert_eq!(m.num_free_blocks(), 3);
    assert!(matches!(m.free(SeqId(1)), Err(KvError::UnknownSeq { .. })));
}

#[test]
fn prefix_lookup_sharing_and_staleness() {
    let mut m = KvManager::new(10, 4).unwrap();
    let a = toks(3, 13);
    m.allocate_slots(SeqId(1), &a, None, 13).unwrap().unwrap();
    assert_eq!(
        m.find_cached_prefix(&a).num_cached_tokens,
        0,
        "nothing is cached before commit"
    );
    m.commit_computed(SeqId(1), &a, 13).unwrap();
    // Same first 9 tokens, then different: two full blocks match.
    let mut b = a[..9].to_vec();
    b.extend([1, 1, 1, 1]);
    let pre = m.find_cached_prefix(&b);
    assert_eq!(pre.num_cached_tokens, 8);
    m.allocate_slots(SeqId(2), &b, Some(&pre), 5)
        .unwrap()
        .unwrap();
    let (ta, tb) = (
        m.block_table(SeqId(1)).unwrap(),
        m.block_table(SeqId(2)).unwrap(),
    );
    assert_eq!(ta[..2], tb[..2]);
    assert_eq!(m.pool().ref_count(ta[0]), Some(2));
    // A whole-prompt hit keeps the last token to compute.
    assert_eq!(m.find_cached_prefix(&a[..12]).num_cached_tokens, 8);
    assert!(matches!(
        m.allocate_slots(SeqId(2), &b, Some(&pre), 0),
        Err(KvError::PrefixOnExistingSeq { .. })
    ));
    // A prefix whose blocks were evicted since the lookup is refused.
    m.free(SeqId(1)).unwrap();
    m.free(SeqId(2)).unwrap();
    let pre = m.find_cached_prefix(&a);
    assert_eq!(pre.num_cached_tokens, 12);
    m.reset_prefix_cache();
    assert!(matches!(
        m.allocate_slots(SeqId(3), &a, Some(&pre), 1),
        Err(KvError::StalePrefix { .. })
    ));
    assert_eq!(m.prefix_stats().hit_tokens, 8);
}

#[test]
fn random_operations_keep_every_invariant() {
    for seed in 0..20u64 {
        let mut rng = TestRng(seed);
        let bs = rng.range(1, 8);
        let mut m = KvManager::new(rng.range(2, 30), bs).unwrap();
        let mut live: Vec<(u64, Vec<u32>, usize)> = Vec::new();
        for op in 0..400u64 {
            match rng.next() % 4 {
                0 | 1 if !live.is_empty() => {
                    let i = rng.range(0, live.len() - 1);
                    let (id, t, done) = &mut live[i];
                    let n = rng.range(0, t.len() - *done);
                    if m.allocate_slots(SeqId(*id), t, None, n).unwrap().is_some() {
                        *done += n;
                        m.commit_computed(SeqId(*id), t, *done).unwrap();
                    }
                }
                2 if !live.is_empty() => {
                    let (id, _, _) = live.swap_remove(rng.range(0, live.len() - 1));
                    if m.contains(SeqId(id)) {
                        m.free(SeqId(id)).unwrap();
                    }
                }
                _ => {
                    let t = toks(rng.range(0, 3) as u32, rng.range(1, 40));
                    let pre = m.find_cached_prefix(&t);
                    let n = rng.range(0, t.len() - pre.num_cached_tokens);
                    if m.allocate_slots(SeqId(op + 100), &t, Some(&pre), n)
                        .unwrap()
                        .is_some()
                    {
                        m.commit_computed(SeqId(op + 100), &t, pre.num_cached_tokens + n)
                            .unwrap();
                        live.push((op + 100, t, pre.num_cached_tokens + n));
                    }
                }
            }
            m.pool()
                .check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed}, op {op}: {e}"));
        }
        for (id, _, _) in live {
            if m.contains(SeqId(id)) {
                m.free(SeqId(id)).unwrap();
            }
        }
        assert_eq!(
            m.num_free_blocks(),
            m.num_usable_blocks(),
            "seed {seed}: blocks leaked"
        );
    }
}
