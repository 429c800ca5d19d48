//! The paged K/V cache and paged attention.
//!
//! Per layer, K and V live in one flat array of slots:
//! `[num_blocks * block_size, n_head_kv * head_dim]`, f16 or f32. A token's
//! K/V is written at its slot (`block * block_size + offset`); a sequence
//! reads position `p` at `block_table[p / block_size] * block_size + p % block_size`.

use crate::graph::{KvCacheConfig, KvType};
use half::f16;
use half::slice::HalfFloatSliceExt;

use super::attn_kernels::AttnKernels;
use super::kernels::fp16;
use super::threads::Threads;
use crate::backend::BackendError;
use crate::graph::reference;
use crate::kv::{BlockId, Slot};

/// One layer's K or V storage.
#[derive(Debug)]
enum Store {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl Store {
    fn new(dtype: KvType, n: usize) -> Self {
        match dtype {
            KvType::F16 => Store::F16(vec![f16::ZERO; n]),
            KvType::F32 => Store::F32(vec![0.0; n]),
        }
    }

    fn as_ref(&self) -> KvRef<'_> {
        match self {
            Store::F16(v) => KvRef::F16(v),
            Store::F32(v) => KvRef::F32(v),
        }
    }

    fn as_mut(&mut self) -> KvMut<'_> {
        match self {
            Store::F16(v) => KvMut::F16(v),
            Store::F32(v) => KvMut::F32(v),
        }
    }
}

/// A borrowed K or V array of one layer: `[slots, width]`.
#[derive(Debug, Clone, Copy)]
pub enum KvRef<'a> {
    /// Half precision.
    F16(&'a [f16]),
    /// Single precision.
    F32(&'a [f32]),
}

/// A mutably borrowed K or V array of one layer: `[slots, width]`.
#[derive(Debug)]
pub enum KvMut<'a> {
    /// Half precision.
    F16(&'a mut [f16]),
    /// Single precision.
    F32(&'a mut [f32]),
}

impl KvMut<'_> {
    fn len(&self) -> usize {
        match self {
            KvMut::F16(v) => v.len(),
            KvMut::F32(v) => v.len(),
        }
    }

    /// The `width`-wide rows at `slots`, in the order of `slots`: disjoint
    /// borrows that threads may write side by side. Fails where a slot is
    /// outside the array or named twice.
    pub(super) fn split_rows(
        self,
        width: usize,
        slots: &[usize],
    ) -> Result<Vec<Self>, BackendError> {
        match self {
            KvMut::F16(v) => Ok(rows_at(v, width, slots)?
                .into_iter()
                .map(KvMut::F16)
                .collect()),
            KvMut::F32(v) => Ok(rows_at(v, width, slots)?
                .into_iter()
                .map(KvMut::F32)
                .collect()),
        }
    }

    pub(super) fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            // The slice conversion runs F16C / NEON where the CPU has it,
            // eight values per instruction; `f16::from_f32` per value
            // checked the CPU and converted one at a time (4 ns a value).
            KvMut::F16(v) => v[at..at + src.len()].convert_from_f32_slice(src),
            KvMut::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }
}

impl KvRef<'_> {
    /// Values held.
    pub fn len(&self) -> usize {
        match self {
            KvRef::F16(v) => v.len(),
            KvRef::F32(v) => v.len(),
        }
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dot of the `q.len()` values at `at` with `q`.
    #[inline]
    fn dot(&self, at: usize, q: &[f32]) -> f32 {
        match self {
            KvRef::F16(v) => v[at..at + q.len()]
                .iter()
                .zip(q)
                .map(|(&k, &q)| fp16(k) * q)
                .sum(),
            KvRef::F32(v) => super::kernels::float::vec_dot_f32(&v[at..at + q.len()], q),
        }
    }

    /// `out += w * values at at`.
    #[inline]
    fn axpy(&self, at: usize, w: f32, out: &mut [f32]) {
        let n = out.len();
        match self {
            KvRef::F16(v) => {
                for (o, x) in out.iter_mut().zip(&v[at..at + n]) {
                    *o += w * fp16(*x);
                }
            }
            KvRef::F32(v) => {
                for (o, &x) in out.iter_mut().zip(&v[at..at + n]) {
                    *o += w * x;
                }
            }
        }
    }
}

/// Writes rows of `src` (`[slots.len(), width]`) at slot indices `slots` of `dst`.
pub fn write_rows(
    mut dst: KvMut<'_>,
    width: usize,
    slots: &[usize],
    src: &[f32],
) -> Result<(), BackendError> {
    if src.len() != slots.len() * width {
        return Err(BackendError::Shape(format!(
            "K/V write: {} values for {} rows of {width}",
            src.len(),
            slots.len()
        )));
    }
    for (i, &at) in slots.iter().enumerate() {
        if (at + 1) * width > dst.len() {
            return Err(BackendError::Shape(format!(
                "K/V slot {at} is outside a cache of {} rows",
                dst.len() / width.max(1)
            )));
        }
        dst.write(at * width, &src[i * width..(i + 1) * width]);
    }
    Ok(())
}

/// The `width`-wide rows of `v` at `slots`, in the order of `slots`.
fn rows_at<'a, T>(
    v: &'a mut [T],
    width: usize,
    slots: &[usize],
) -> Result<Vec<&'a mut [T]>, BackendError> {
    let total = v.len() / width.max(1);
    let mut order: Vec<usize> = (0..slots.len()).collect();
    order.sort_unstable_by_key(|&i| slots[i]);
    let mut rows: Vec<Option<&'a mut [T]>> = (0..slots.len()).map(|_| None).collect();
    let (mut rest, mut first) = (v, 0usize);
    for i in order {
        let at = slots[i];
        if at >= total {
            return Err(BackendError::Shape(format!(
                "K/V slot {at} is outside a cache of {total} rows"
            )));
        }
        if at < first {
            return Err(BackendError::Shape(format!(
                "K/V slot {at} is written twice in one step"
            )));
        }
        let (_, tail) = std::mem::take(&mut rest).split_at_mut((at - first) * width);
        let (row, tail) = tail.split_at_mut(width);
        rows[i] = Some(row);
        (rest, first) = (tail, at + 1);
    }
    Ok(rows.into_iter().flatten().collect())
}

/// Slot indices of positions `0..n` through `table` in a cache of
/// `num_blocks` blocks of `block_size`.
pub fn table_slots(
    table: &[BlockId],
    n: usize,
    block_size: usize,
    num_blocks: usize,
) -> Result<Vec<usize>, BackendError> {
    (0..n)
        .map(|p| {
            let block = *table.get(p / block_size).ok_or_else(|| {
                BackendError::Shape(format!(
                    "position {p} needs block {} but the block table has {}",
                    p / block_size,
                    table.len()
                ))
            })?;
            slot_index(block, p % block_size, block_size, num_blocks)
        })
        .collect()
}

/// The flat slot index of `offset` in `block`, checked against the cache size.
pub fn slot_index(
    block: BlockId,
    offset: usize,
    block_size: usize,
    num_blocks: usize,
) -> Result<usize, BackendError> {
    let b = block.0 as usize;
    if b >= num_blocks || offset >= block_size {
        return Err(BackendError::Shape(format!(
            "K/V slot (block {b}, offset {offset}) is outside the cache of {num_blocks} blocks of {block_size}"
        )));
    }
    Ok(b * block_size + offset)
}

/// For each batch row: (sequence index, position); every row must belong
/// to exactly one sequence whose slot list covers its positions.
fn row_positions(
    seqs: &[AttnSeq<'_>],
    seq_slots: &[Vec<usize>],
    rows: usize,
) -> Result<Vec<(usize, usize)>, BackendError> {
    let mut row_seq = vec![None; rows];
    for (si, s) in seqs.iter().enumerate() {
        if s.row + s.len > rows || seq_slots.get(si).map(Vec::len) != Some(s.start + s.len) {
            return Err(BackendError::Shape(format!(
                "attention: sequence {si} (rows {}..{}) does not fit {rows} rows",
                s.row,
                s.row + s.len
            )));
        }
        for (i, r) in row_seq[s.row..s.row + s.len].iter_mut().enumerate() {
            *r = Some((si, s.start + i));
        }
    }
    row_seq
        .into_iter()
        .enumerate()
        .map(|(r, s)| {
            s.ok_or_else(|| BackendError::Shape(format!("attention: row {r} has no sequence")))
        })
        .collect()
}

/// One layer's K and V as attention reads them.
#[derive(Debug, Clone, Copy)]
pub struct LayerKv<'a> {
    /// K: `[slots, k_width]`.
    pub k: KvRef<'a>,
    /// V: `[slots, v_width]`.
    pub v: KvRef<'a>,
}

/// Causal attention of every query row against K/V read through the slot
/// lists of its sequence (`seq_slots[i]`: slot of each position
/// `0 .. seqs[i].start + seqs[i].len`; the `block_table` field is unused),
/// with the fastest kernels this CPU has.
///
/// q: `[tokens, n_head * head_dim_k]`, out: `[tokens, n_head * head_dim_v]`.
pub fn attend_slots(
    threads: &Threads,
    kv: LayerKv<'_>,
    shape: &AttnShape,
    seqs: &[AttnSeq<'_>],
    seq_slots: &[Vec<usize>],
    q: &[f32],
    out: &mut [f32],
) -> Result<(), BackendError> {
    let k = AttnKernels::best();
    attend_slots_with(&k, threads, kv, shape, seqs, seq_slots, q, out)
}

/// [`attend_slots`] with the kernels `k`: tiled online softmax, every query
/// head of a K/V head per pass (`super::attn_fast`).
#[allow(clippy::too_many_arguments)]
pub fn attend_slots_with(
    k: &AttnKernels,
    threads: &Threads,
    kv: LayerKv<'_>,
    shape: &AttnShape,
    seqs: &[AttnSeq<'_>],
    seq_slots: &[Vec<usize>],
    q: &[f32],
    out: &mut [f32],
) -> Result<(), BackendError> {
    check_attn(kv, shape, seqs, seq_slots, q, out)?;
    super::attn_fast::attend(k, threads, kv, shape, seqs, seq_slots, q, out);
    Ok(())
}

/// Checks the shapes of an attention call; returns each row's (sequence, position).
fn check_attn(
    kv: LayerKv<'_>,
    shape: &AttnShape,
    seqs: &[AttnSeq<'_>],
    seq_slots: &[Vec<usize>],
    q: &[f32],
    out: &[f32],
) -> Result<Vec<(usize, usize)>, BackendError> {
    let (hk, hv) = (shape.head_dim_k, shape.head_dim_v);
    let (k_width, v_width) = (shape.n_head_kv * hk, shape.n_head_kv * hv);
    let group = shape.n_head / shape.n_head_kv.max(1);
    let rows = out.len() / (shape.n_head * hv).max(1);
    let max_slot = seq_slots
        .iter()
        .flatten()
        .copied()
        .max()
        .map_or(0, |s| s + 1);
    if q.len() != rows * shape.n_head * hk
        || out.len() != rows * shape.n_head * hv
        || kv.k.len() < max_slot * k_width
        || kv.v.len() < max_slot * v_width
        || group * shape.n_head_kv != shape.n_head
        || group == 0
    {
        return Err(BackendError::Shape(format!(
            "attention: q has {} values for {rows} rows of {} heads of {hk}; caches {} / {}",
            q.len(),
            shape.n_head,
            kv.k.len(),
            kv.v.len()
        )));
    }
    row_positions(seqs, seq_slots, rows)
}

/// The scalar attention: per (row, head), all scores, a two-pass softmax,
/// then the weighted sum of values. Slow; the oracle of the fast one.
pub fn attend_slots_scalar(
    threads: &Threads,
    kv: LayerKv<'_>,
    shape: &AttnShape,
    seqs: &[AttnSeq<'_>],
    seq_slots: &[Vec<usize>],
    q: &[f32],
    out: &mut [f32],
) -> Result<(), BackendError> {
    let row_seq = check_attn(kv, shape, seqs, seq_slots, q, out)?;
    let (hk, hv) = (shape.head_dim_k, shape.head_dim_v);
    let (k_width, v_width) = (shape.n_head_kv * hk, shape.n_head_kv * hv);
    let group = shape.n_head / shape.n_head_kv.max(1);
    threads.for_chunks(out, hv, |ri, o| {
        let (row, h) = (ri / shape.n_head, ri % shape.n_head);
        let (si, p) = row_seq[row];
        let kvh = h / group;
        let qh = &q[row * shape.n_head * hk + h * hk..][..hk];
        let first = shape.window.map_or(0, |w| (p + 1).saturating_sub(w));
        let slots = &seq_slots[si][first..=p];
        let mut scores: Vec<f32> = slots
            .iter()
            .map(|&s| kv.k.dot(s * k_width + kvh * hk, qh) * shape.scale)
            .collect();
        if let Some(cap) = shape.softcap {
            reference::softcap(&mut scores, cap);
        }
        reference::softmax(&mut scores);
        o.fill(0.0);
        for (&s, &w) in slots.iter().zip(&scores) {
            kv.v.axpy(s * v_width + kvh * hv, w, o);
        }
    });
    Ok(())
}

/// K and V of every layer.
#[derive(Debug)]
pub struct KvCache {
    cfg: KvCacheConfig,
    k: Vec<Store>,
    v: Vec<Store>,
    k_width: usize,
    v_width: usize,
}

/// Shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    /// Query heads.
    pub n_head: usize,
    /// K/V heads (divides `n_head`; query head h reads K/V head `h / (n_head / n_head_kv)`).
    pub n_head_kv: usize,
    /// Width of a query / key head.
    pub head_dim_k: usize,
    /// Width of a value head.
    pub head_dim_v: usize,
    /// Multiplier of the scores (usually `1 / sqrt(head_dim_k)`).
    pub scale: f32,
    /// Sliding window: a query at p sees keys p' with `p - p' < window`.
    pub window: Option<usize>,
    /// Softcap of the scores (`cap * tanh(s / cap)`), when set.
    pub softcap: Option<f32>,
}

/// One sequence of a batch as attention sees it.
#[derive(Debug, Clone, Copy)]
pub struct AttnSeq<'a> {
    /// Row of the sequence's first token in the batch.
    pub row: usize,
    /// Tokens of the sequence in the batch.
    pub len: usize,
    /// Position of its first token.
    pub start: usize,
    /// Its block table.
    pub block_table: &'a [BlockId],
}

impl KvCache {
    /// Allocates `n_layer` layers of `cfg.num_blocks * cfg.block_size` slots.
    pub fn new(cfg: KvCacheConfig, n_layer: usize, k_width: usize, v_width: usize) -> Self {
        let slots = cfg.num_blocks * cfg.block_size;
        Self {
            cfg,
            k: (0..n_layer)
                .map(|_| Store::new(cfg.dtype, slots * k_width))
                .collect(),
            v: (0..n_layer)
                .map(|_| Store::new(cfg.dtype, slots * v_width))
                .collect(),
            k_width,
            v_width,
        }
    }

    /// The cache's configuration.
    pub fn config(&self) -> &KvCacheConfig {
        &self.cfg
    }

    /// Writes K and V rows (`k: [slots.len(), k_width]`, `v: [slots.len(), v_width]`) of `layer`.
    pub fn write(
        &mut self,
        layer: usize,
        slots: &[Slot],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), BackendError> {
        let (bs, nb) = (self.cfg.block_size, self.cfg.num_blocks);
        let at = slots
            .iter()
            .map(|s| slot_index(s.block, s.offset as usize, bs, nb))
            .collect::<Result<Vec<_>, _>>()?;
        let (Some(kc), Some(vc)) = (self.k.get_mut(layer), self.v.get_mut(layer)) else {
            return Err(BackendError::Shape(format!("no K/V layer {layer}")));
        };
        write_rows(kc.as_mut(), self.k_width, &at, k)?;
        write_rows(vc.as_mut(), self.v_width, &at, v)
    }

    /// Causal attention of every query row against the cached K/V of its sequence.
    ///
    /// q: `[tokens, n_head * head_dim_k]`, out: `[tokens, n_head * head_dim_v]`.
    /// K/V of the batch's tokens must already be written.
    pub fn attend(
        &self,
        threads: &Threads,
        layer: usize,
        shape: &AttnShape,
        seqs: &[AttnSeq<'_>],
        q: &[f32],
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let (bs, nb) = (self.cfg.block_size, self.cfg.num_blocks);
        let slots = seqs
            .iter()
            .map(|s| table_slots(s.block_table, s.start + s.len, bs, nb))
            .collect::<Result<Vec<_>, _>>()?;
        let (Some(k), Some(v)) = (self.k.get(layer), self.v.get(layer)) else {
            return Err(BackendError::Shape(format!("no K/V layer {layer}")));
        };
        let kv = LayerKv {
            k: k.as_ref(),
            v: v.as_ref(),
        };
        attend_slots(threads, kv, shape, seqs, &slots, q, out)
    }
}
