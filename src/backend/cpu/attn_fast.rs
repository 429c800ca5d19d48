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
use std::ops::Range;

use super::attention::{AttnSeq, AttnShape, LayerKv};
use super::attn_kernels::{AttnKernels, MultiKernels, MULTI_TILE};
use super::threads::Threads;
use crate::graph::reference;

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
        let need = TILE * (hk + hv) + nq * hk + sc_len;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let (kt, rest) = buf.split_at_mut(TILE * hk);
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
        let tiles = Tiles { kt, vt, qs, sc };
        run_tiles(c, it, seq, slots, tiles, State { accs, mls });
    });
}

/// The scratch of one item.
struct Tiles<'a> {
    /// The key tile: `[keys, hk]`, or with the multi-query kernels
    /// transposed, `[hk, TILE]` (zero past the tile's keys).
    kt: &'a mut [f32],
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

/// Folds the scores `sc` (of keys past the running state, softcap already
/// applied) into a query's `ml = [m, l]` and rescales its `acc`; leaves
/// `sc` holding the probabilities `exp(score - m)` for the accumulation.
fn softmax_step(c: &Ctx<'_>, sc: &mut [f32], ml: &mut [f32], acc: &mut [f32]) {
    // A comparison, not `f32::max`: the same for scores that are not NaN,
    // and no libm call per score in wasm.
    let mx = sc
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let m_new = ml[0].max(mx);
    let corr = (ml[0] - m_new).exp();
    if corr != 1.0 {
        (c.k.scale)(acc, corr);
    }
    let sum = (c.k.exp_sum)(sc, m_new);
    ml[1] = ml[1] * corr + sum;
    ml[0] = m_new;
}

/// The tile loop of one item: per tile of keys, the K and V rows gathered
/// once, then each position's `group` heads (which see the same keys)
/// scored, soft-maxed and accumulated. With the multi-query kernels the key
/// tile is gathered transposed, the heads go through `m` in calls of up to
/// `m.max_queries`, and the next tile's rows are prefetched; otherwise
/// each head runs the one-query kernels.
fn run_tiles(
    c: &Ctx<'_>,
    it: &Item,
    seq: &AttnSeq<'_>,
    slots: &[usize],
    mut t: Tiles<'_>,
    mut st: State<'_>,
) {
    let s = c.shape;
    let (hk, hv, g) = (s.head_dim_k, s.head_dim_v, c.group());
    let (kw, vw) = (s.n_head_kv * hk, s.n_head_kv * hv);
    let pos = |r: usize| seq.start + (r - seq.row);
    let (koff, voff) = (it.kvh * hk, it.kvh * hv);
    if let Some(m) = &c.k.multi {
        // The first tile's rows, all asked for at once (the ones after are
        // asked for a tile ahead, below): its gathers would otherwise wait
        // on them a few lines at a time. In decode the cache was last read
        // a token ago, and the weights read since have pushed it out of
        // the caches.
        let first = &slots[it.k0..(it.k0 + TILE).min(it.k1)];
        (m.prefetch)(c.kv.k, first, kw, koff, hk);
        (m.prefetch)(c.kv.v, first, vw, voff, hv);
    }
    let mut a = it.k0;
    while a < it.k1 {
        let b = (a + TILE).min(it.k1);
        // Skip tiles no query of the item sees (before every window).
        if c.first_key(pos(it.r1 - 1)) >= b {
            a = b;
            continue;
        }
        let n = b - a;
        match &c.k.multi {
            Some(m) => (m.gather_t)(c.kv.k, &slots[a..b], kw, koff, t.kt),
            None => (c.k.gather)(c.kv.k, &slots[a..b], kw, koff, &mut t.kt[..n * hk]),
        }
        (c.k.gather)(c.kv.v, &slots[a..b], vw, voff, &mut t.vt[..n * hv]);
        if let Some(m) = &c.k.multi {
            // The cache rows are scattered over pages: ask for the next
            // tile's while this one is scored.
            let next = &slots[b..(b + TILE).min(it.k1)];
            (m.prefetch)(c.kv.k, next, kw, koff, hk);
            (m.prefetch)(c.kv.v, next, vw, voff, hv);
        }
        for row in it.r0..it.r1 {
            let p = pos(row);
            let (lo, hi) = (c.first_key(p).max(a), (p + 1).min(b));
            if lo >= hi {
                continue;
            }
            let (q0, keys) = ((row - it.r0) * g, lo - a..hi - a);
            match &c.k.multi {
                Some(m) => heads_multi(c, m, q0, keys, &mut t, &mut st),
                None => heads_one(c, q0, keys, &mut t, &mut st),
            }
        }
        a = b;
    }
}

/// The `group` heads from query `q0` over keys `keys` of the tile (in
/// tile positions), one query per kernel call.
fn heads_one(c: &Ctx<'_>, q0: usize, keys: Range<usize>, t: &mut Tiles<'_>, st: &mut State<'_>) {
    let (hk, hv) = (c.shape.head_dim_k, c.shape.head_dim_v);
    for qi in q0..q0 + c.group() {
        let sc = &mut t.sc[..keys.len()];
        let q = &t.qs[qi * hk..][..hk];
        (c.k.scores)(q, &t.kt[keys.start * hk..keys.end * hk], sc);
        if let Some(cap) = c.shape.softcap {
            reference::softcap(sc, cap);
        }
        let acc = &mut st.accs[qi * hv..][..hv];
        softmax_step(c, sc, &mut st.mls[2 * qi..2 * qi + 2], acc);
        (c.k.accum)(sc, &t.vt[keys.start * hv..keys.end * hv], acc);
    }
}

/// The `group` heads from query `q0` over keys `keys` of the transposed
/// tile, up to `m.max_queries` per call of the multi-query kernels.
fn heads_multi(
    c: &Ctx<'_>,
    m: &MultiKernels,
    q0: usize,
    keys: Range<usize>,
    t: &mut Tiles<'_>,
    st: &mut State<'_>,
) {
    let (hk, hv, g) = (c.shape.head_dim_k, c.shape.head_dim_v, c.group());
    let per_call = m.max_queries.clamp(1, g.max(1));
    let mut q = q0;
    while q < q0 + g {
        let nq = per_call.min(q0 + g - q);
        let sc = &mut t.sc[..nq * TILE];
        (m.scores)(&t.qs[q * hk..(q + nq) * hk], t.kt, sc);
        if let Some(cap) = c.shape.softcap {
            for row in sc.chunks_exact_mut(TILE) {
                reference::softcap(&mut row[keys.clone()], cap);
            }
        }
        let accs = &mut st.accs[q * hv..(q + nq) * hv];
        (m.softmax)(
            sc,
            keys.start,
            keys.end,
            &mut st.mls[2 * q..2 * (q + nq)],
            accs,
        );
        let v = &t.vt[keys.start * hv..keys.end * hv];
        (m.accum)(&sc[keys.start..], v, hv, accs);
        q += nq;
    }
}
