//! Fast paged attention: online softmax over tiles of keys, all query heads
//! of one K/V head in one pass, split over (sequence, K/V head, query tile,
//! key range) work items that run in parallel.
//!
//! Each item gathers a tile of [`TILE`] keys (and values) of its K/V head
//! from the paged cache into an f32 scratch tile once, then scores every
//! query of the item against it (the queries of a GQA group share the tile),
//! keeping per query the running max `m`, the running sum `l` and the
//! unnormalised output `acc`. Where the ISA has multi-query kernels
//! ([`super::attn_kernels::MultiKernels`]) the heads of one position, which
//! see the same keys, are scored and accumulated together against the key
//! tile transposed once per tile. Items of a long decode split the keys
//! (split-K) so every thread has work; [`merge`] combines the partial states
//! of one query with the usual rescaling. Scratch lives in thread-local
//! buffers that grow once, so the hot loop never allocates.

use std::cell::RefCell;

use super::attention::{AttnSeq, AttnShape, LayerKv};
use super::attn_kernels::{AttnKernels, MultiKernels, MULTI_TILE};
use super::threads::Threads;

/// Keys per tile.
const TILE: usize = MULTI_TILE;
/// Query rows (positions) per prefill item.
const Q_ROWS: usize = 16;
/// Fewest keys a split of a decode item gets.
const MIN_SPLIT_KEYS: usize = 128;

/// One unit of parallel work.
#[derive(Debug, Clone, Copy)]
struct Item {
    seq: usize,
    kvh: usize,
    /// Query rows `r0..r1` of the batch (all of `seq`).
    r0: usize,
    r1: usize,
    /// Key positions `k0..k1` of the sequence this item covers.
    k0: usize,
    k1: usize,
}

thread_local! {
    /// Per-thread scratch: the K and V tiles, scaled queries and scores.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Everything a work item reads.
struct Ctx<'a> {
    k: &'a AttnKernels,
    kv: LayerKv<'a>,
    shape: &'a AttnShape,
    seqs: &'a [AttnSeq<'a>],
    seq_slots: &'a [Vec<usize>],
    q: &'a [f32],
}

impl Ctx<'_> {
    fn group(&self) -> usize {
        self.shape.n_head / self.shape.n_head_kv.max(1)
    }

    /// Keys `first..=p` that position `p` sees.
    fn first_key(&self, p: usize) -> usize {
        self.shape.window.map_or(0, |w| (p + 1).saturating_sub(w))
    }
}

/// The work items of a call, and how many query states each holds.
fn plan_items(c: &Ctx<'_>, threads: usize) -> Vec<Item> {
    let mut items = Vec::new();
    let n_kv = c.shape.n_head_kv;
    let decode_items: usize = c.seqs.iter().map(|s| usize::from(s.len > 0) * n_kv).sum();
    for (si, s) in c.seqs.iter().enumerate() {
        let mut r = 0;
        while r < s.len {
            let r1 = (r + Q_ROWS).min(s.len);
            let (p0, p1) = (s.start + r, s.start + r1 - 1);
            let (k0, k1) = (c.first_key(p0), p1 + 1);
            // Split the keys of short query tiles (decode) when there are
            // fewer items than threads to keep busy.
            let splits = if s.len <= 2 && threads > 1 && decode_items < 2 * threads {
                ((2 * threads).div_ceil(decode_items.max(1)))
                    .min((k1 - k0) / MIN_SPLIT_KEYS)
                    .max(1)
            } else {
                1
            };
            let per = (k1 - k0).div_ceil(splits).next_multiple_of(TILE);
            for kvh in 0..n_kv {
                let mut a = k0;
                while a < k1 {
                    let b = (a + per).min(k1);
                    items.push(Item {
                        seq: si,
                        kvh,
                        r0: s.row + r,
                        r1: s.row + r1,
                        k0: a,
                        k1: b,
                    });
                    a = b;
                }
            }
            r = r1;
        }
    }
    items
}

/// Attention of every query row (see [`super::attention::attend_slots`]),
/// shapes already checked by the caller.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend(
    kernels: &AttnKernels,
    threads: &Threads,
    kv: LayerKv<'_>,
    shape: &AttnShape,
    seqs: &[AttnSeq<'_>],
    seq_slots: &[Vec<usize>],
    q: &[f32],
    out: &mut [f32],
) {
    let c = Ctx {
        k: kernels,
        kv,
        shape,
        seqs,
        seq_slots,
        q,
    };
    let items = plan_items(&c, threads.count());
    let hv = shape.head_dim_v;
    let stride = Q_ROWS * c.group() * (hv + 2);
    let mut partial = vec![0.0f32; items.len() * stride];
    threads.for_chunks(&mut partial, stride, |i, st| run_item(&c, &items[i], st));
    merge(&c, &items, &partial, stride, out);
}

/// Combines the partial states of each query into `out`.
fn merge(c: &Ctx<'_>, items: &[Item], partial: &[f32], stride: usize, out: &mut [f32]) {
    let (hv, g, nh) = (c.shape.head_dim_v, c.group(), c.shape.n_head);
    out.fill(0.0);
    // (m, l) of the state merged so far, per output head of every row.
    let rows = out.len() / (nh * hv).max(1);
    let mut ml = vec![(f32::NEG_INFINITY, 0.0f32); rows * nh];
    for (it, st) in items.iter().zip(partial.chunks_exact(stride)) {
        let (accs, mls) = st.split_at(Q_ROWS * g * hv);
        for qi in 0..(it.r1 - it.r0) * g {
            let (row, h) = (it.r0 + qi / g, it.kvh * g + qi % g);
            let (m, l, acc) = (mls[2 * qi], mls[2 * qi + 1], &accs[qi * hv..][..hv]);
            if l == 0.0 {
                continue;
            }
            let o = &mut out[(row * nh + h) * hv..][..hv];
            let (om, ol) = &mut ml[row * nh + h];
            let mn = om.max(m);
            let (a, b) = ((*om - mn).exp(), (m - mn).exp());
            if a != 1.0 {
                (c.k.scale)(o, a);
            }
            for (o, &x) in o.iter_mut().zip(acc) {
                *o += b * x;
            }
            *ol = *ol * a + l * b;
            *om = mn;
        }
    }
    for (o, &(_, l)) in out.chunks_exact_mut(hv.max(1)).zip(&ml) {
        if l > 0.0 {
            (c.k.scale)(o, 1.0 / l);
        }
    }
}

/// Runs one item into its state block `st`: `[Q_ROWS * group, hv]` outputs
/// `acc`, then `[Q_ROWS * group, 2]` running maxima `m` and sums `l`.
fn run_item(c: &Ctx<'_>, it: &Item, st: &mut [f32]) {
    SCRATCH.with(|cell| {
        let Ok(mut buf) = cell.try_borrow_mut() else {
            return;
        };
        let s = c.shape;
        let (hk, hv, g) = (s.head_dim_k, s.head_dim_v, c.group());
        let nq = (it.r1 - it.r0) * g;
        // Scores: one row of TILE per query of a multi-query call.
        let sc_len = TILE * c.k.multi.map_or(1, |m| m.max_queries.max(1));
        let need = 2 * TILE * hk + TILE * hv + nq * hk + sc_len;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let (kt, rest) = buf.split_at_mut(TILE * hk);
        let (ktt, rest) = rest.split_at_mut(TILE * hk);
        let (vt, rest) = rest.split_at_mut(TILE * hv);
        let (qs, rest) = rest.split_at_mut(nq * hk);
        let sc = &mut rest[..sc_len];
        // Scaled queries of the item: rows r0..r1, heads of kvh's group.
        for (qi, d) in qs.chunks_exact_mut(hk).enumerate() {
            let (row, h) = (it.r0 + qi / g, it.kvh * g + qi % g);
            d.copy_from_slice(&c.q[(row * s.n_head + h) * hk..][..hk]);
            (c.k.scale)(d, s.scale);
        }
        let (accs, mls) = st.split_at_mut(Q_ROWS * g * hv);
        accs[..nq * hv].fill(0.0);
        for ml in mls.chunks_exact_mut(2).take(nq) {
            ml[0] = f32::NEG_INFINITY;
            ml[1] = 0.0;
        }
        let seq = &c.seqs[it.seq];
        let slots = &c.seq_slots[it.seq];
        let tiles = Tiles {
            kt,
            ktt,
            vt,
            qs,
            sc,
        };
        let state = State { accs, mls };
        match c.k.multi {
            Some(m) => run_tiles_multi(c, &m, it, seq, slots, tiles, state),
            None => run_tiles(c, it, seq, slots, tiles, state),
        }
    });
}

/// The scratch of one item.
struct Tiles<'a> {
    kt: &'a mut [f32],
    /// The key tile transposed (`[hk, TILE]`, zero past the tile's keys),
    /// for the multi-query kernels.
    ktt: &'a mut [f32],
    vt: &'a mut [f32],
    qs: &'a mut [f32],
    sc: &'a mut [f32],
}

/// The online-softmax state of an item's queries.
struct State<'a> {
    /// `[queries, hv]`: unnormalised outputs.
    accs: &'a mut [f32],
    /// `[queries, 2]`: running max `m` and sum `l`.
    mls: &'a mut [f32],
}

/// Folds the scores `sc` (of keys past the running state, softcap not yet
/// applied) into a query's `ml = [m, l]` and rescales its `acc`; leaves
/// `sc` holding the probabilities `exp(score - m)` for the accumulation.
fn softmax_step(c: &Ctx<'_>, sc: &mut [f32], ml: &mut [f32], acc: &mut [f32]) {
    if let Some(cap) = c.shape.softcap {
        for v in sc.iter_mut() {
            *v = cap * (*v / cap).tanh();
        }
    }
    let mx = sc.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let m_new = ml[0].max(mx);
    let corr = (ml[0] - m_new).exp();
    if corr != 1.0 {
        (c.k.scale)(acc, corr);
    }
    let sum = (c.k.exp_sum)(sc, m_new);
    ml[1] = ml[1] * corr + sum;
    ml[0] = m_new;
}

/// The tile loop of one item, with the multi-query kernels: per tile the
/// keys are transposed once, then the `group` heads of each position (the
/// same keys visible to each) go through `m` in calls of up to
/// `m.max_queries`.
fn run_tiles_multi(
    c: &Ctx<'_>,
    m: &MultiKernels,
    it: &Item,
    seq: &AttnSeq<'_>,
    slots: &[usize],
    t: Tiles<'_>,
    st: State<'_>,
) {
    let s = c.shape;
    let (hk, hv, g) = (s.head_dim_k, s.head_dim_v, c.group());
    let (kw, vw) = (s.n_head_kv * hk, s.n_head_kv * hv);
    let per_call = m.max_queries.clamp(1, g.max(1));
    let pos = |r: usize| seq.start + (r - seq.row);
    let mut a = it.k0;
    while a < it.k1 {
        let b = (a + TILE).min(it.k1);
        if c.first_key(pos(it.r1 - 1)) >= b {
            a = b;
            continue;
        }
        let n = b - a;
        (m.gather_t)(c.kv.k, &slots[a..b], kw, it.kvh * hk, t.ktt);
        (c.k.gather)(c.kv.v, &slots[a..b], vw, it.kvh * hv, &mut t.vt[..n * hv]);
        // The cache rows are scattered over pages: ask for the next tile's
        // while this one is scored.
        let next = &slots[b..(b + TILE).min(it.k1)];
        (m.prefetch)(c.kv.k, next, kw, it.kvh * hk, hk);
        (m.prefetch)(c.kv.v, next, vw, it.kvh * hv, hv);
        for row in it.r0..it.r1 {
            let p = pos(row);
            let (lo, hi) = (c.first_key(p).max(a), (p + 1).min(b));
            if lo >= hi {
                continue;
            }
            let q_first = (row - it.r0) * g;
            let mut h = 0;
            while h < g {
                let nq = per_call.min(g - h);
                let q0 = q_first + h;
                let sc = &mut t.sc[..nq * TILE];
                (m.scores)(&t.qs[q0 * hk..(q0 + nq) * hk], t.ktt, sc);
                if let Some(cap) = s.softcap {
                    for i in 0..nq {
                        for v in &mut sc[i * TILE + (lo - a)..i * TILE + (hi - a)] {
                            *v = cap * (*v / cap).tanh();
                        }
                    }
                }
                let mls = &mut st.mls[2 * q0..2 * (q0 + nq)];
                let accs = &mut st.accs[q0 * hv..(q0 + nq) * hv];
                (m.softmax)(sc, lo - a, hi - a, mls, accs);
                let v = &t.vt[(lo - a) * hv..(hi - a) * hv];
                let accs = &mut st.accs[q0 * hv..(q0 + nq) * hv];
                (m.accum)(&sc[lo - a..], v, hv, accs);
                h += nq;
            }
        }
        a = b;
    }
}

/// The tile loop of one item.
fn run_tiles(
    c: &Ctx<'_>,
    it: &Item,
    seq: &AttnSeq<'_>,
    slots: &[usize],
    t: Tiles<'_>,
    st: State<'_>,
) {
    let s = c.shape;
    let (hk, hv, g) = (s.head_dim_k, s.head_dim_v, c.group());
    let (kw, vw) = (s.n_head_kv * hk, s.n_head_kv * hv);
    let pos = |r: usize| seq.start + (r - seq.row);
    let mut a = it.k0;
    while a < it.k1 {
        let b = (a + TILE).min(it.k1);
        // Skip tiles no query of the item sees (before every window).
        if c.first_key(pos(it.r1 - 1)) >= b {
            a = b;
            continue;
        }
        let n = b - a;
        (c.k.gather)(c.kv.k, &slots[a..b], kw, it.kvh * hk, &mut t.kt[..n * hk]);
        (c.k.gather)(c.kv.v, &slots[a..b], vw, it.kvh * hv, &mut t.vt[..n * hv]);
        for qi in 0..(it.r1 - it.r0) * g {
            let p = pos(it.r0 + qi / g);
            let (lo, hi) = (c.first_key(p).max(a), (p + 1).min(b));
            if lo >= hi {
                continue;
            }
            let sc = &mut t.sc[..hi - lo];
            let q = &t.qs[qi * hk..][..hk];
            (c.k.scores)(q, &t.kt[(lo - a) * hk..(hi - a) * hk], sc);
            let acc = &mut st.accs[qi * hv..][..hv];
            softmax_step(c, sc, &mut st.mls[2 * qi..2 * qi + 2], acc);
            (c.k.accum)(sc, &t.vt[(lo - a) * hv..(hi - a) * hv], acc);
        }
        a = b;
    }
}
