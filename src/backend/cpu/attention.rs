//! The paged K/V cache and paged attention.
//!
//! Per layer, K and V live in one flat array of slots:
//! `[num_blocks * block_size, n_head_kv * head_dim]`, f16 or f32. A token's
//! K/V is written at its slot (`block * block_size + offset`); a sequence
//! reads position `p` at `block_table[p / block_size] * block_size + p % block_size`.

use half::f16;

use super::kernels::fp16;
use super::ops;
use super::threads::Threads;
use crate::backend::BackendError;
use crate::kv::{BlockId, Slot};
use crate::model::{KvCacheConfig, KvType};

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

    fn write(&mut self, at: usize, src: &[f32]) {
        match self {
            Store::F16(v) => {
                for (d, &s) in v[at..at + src.len()].iter_mut().zip(src) {
                    *d = f16::from_f32(s);
                }
            }
            Store::F32(v) => v[at..at + src.len()].copy_from_slice(src),
        }
    }

    /// Dot of the `q.len()` values at `at` with `q`.
    #[inline]
    fn dot(&self, at: usize, q: &[f32]) -> f32 {
        match self {
            Store::F16(v) => v[at..at + q.len()]
                .iter()
                .zip(q)
                .map(|(&k, &q)| fp16(k) * q)
                .sum(),
            Store::F32(v) => super::kernels::float::vec_dot_f32(&v[at..at + q.len()], q),
        }
    }

    /// `out += w * values at at`.
    #[inline]
    fn axpy(&self, at: usize, w: f32, out: &mut [f32]) {
        let n = out.len();
        match self {
            Store::F16(v) => {
                for (o, x) in out.iter_mut().zip(&v[at..at + n]) {
                    *o += w * fp16(*x);
                }
            }
            Store::F32(v) => {
                for (o, &x) in out.iter_mut().zip(&v[at..at + n]) {
                    *o += w * x;
                }
            }
        }
    }
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

    fn slot_index(&self, block: BlockId, offset: usize) -> Result<usize, BackendError> {
        let b = block.0 as usize;
        if b >= self.cfg.num_blocks || offset >= self.cfg.block_size {
            return Err(BackendError::Shape(format!(
                "K/V slot (block {b}, offset {offset}) is outside the cache of {} blocks of {}",
                self.cfg.num_blocks, self.cfg.block_size
            )));
        }
        Ok(b * self.cfg.block_size + offset)
    }

    /// Writes K and V rows (`k: [slots.len(), k_width]`, `v: [slots.len(), v_width]`) of `layer`.
    pub fn write(
        &mut self,
        layer: usize,
        slots: &[Slot],
        k: &[f32],
        v: &[f32],
    ) -> Result<(), BackendError> {
        for (i, s) in slots.iter().enumerate() {
            let at = self.slot_index(s.block, s.offset as usize)?;
            self.k[layer].write(
                at * self.k_width,
                &k[i * self.k_width..(i + 1) * self.k_width],
            );
            self.v[layer].write(
                at * self.v_width,
                &v[i * self.v_width..(i + 1) * self.v_width],
            );
        }
        Ok(())
    }

    /// Slot indices of positions `0..n` through `table`.
    fn positions(&self, table: &[BlockId], n: usize) -> Result<Vec<usize>, BackendError> {
        let bs = self.cfg.block_size;
        (0..n)
            .map(|p| {
                let block = *table.get(p / bs).ok_or_else(|| {
                    BackendError::Shape(format!(
                        "position {p} needs block {} but the block table has {}",
                        p / bs,
                        table.len()
                    ))
                })?;
                self.slot_index(block, p % bs)
            })
            .collect()
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
        let (hk, hv) = (shape.head_dim_k, shape.head_dim_v);
        let group = shape.n_head / shape.n_head_kv.max(1);
        // For each batch row: (sequence index, position).
        let mut row_seq = vec![(0usize, 0usize); out.len() / (shape.n_head * hv).max(1)];
        let mut slots = Vec::with_capacity(seqs.len());
        for (si, s) in seqs.iter().enumerate() {
            for i in 0..s.len {
                row_seq[s.row + i] = (si, s.start + i);
            }
            slots.push(self.positions(s.block_table, s.start + s.len)?);
        }
        let (kc, vc) = (&self.k[layer], &self.v[layer]);
        threads.for_chunks(out, hv, |ri, o| {
            let (row, h) = (ri / shape.n_head, ri % shape.n_head);
            let (si, p) = row_seq[row];
            let kvh = h / group;
            let qh = &q[row * shape.n_head * hk + h * hk..][..hk];
            let first = shape.window.map_or(0, |w| (p + 1).saturating_sub(w));
            let slots = &slots[si][first..=p];
            let mut scores: Vec<f32> = slots
                .iter()
                .map(|&s| kc.dot(s * self.k_width + kvh * hk, qh) * shape.scale)
                .collect();
            if let Some(cap) = shape.softcap {
                ops::softcap(&mut scores, cap);
            }
            ops::softmax(&mut scores);
            o.fill(0.0);
            for (&s, &w) in slots.iter().zip(&scores) {
                vc.axpy(s * self.v_width + kvh * hv, w, o);
            }
        });
        Ok(())
    }
}
