//! [`CpuModel`]: a transformer on the CPU backend, one forward pass over a
//! ragged batch (one matmul per weight for all rows of all sequences,
//! attention per sequence through its block table).

use super::attention::{AttnSeq, AttnShape, KvCache};
use super::kernels::KernelTable;
use super::matmul::{matmul, Weight};
use super::ops;
use super::threads::Threads;
use crate::backend::BackendError;
use crate::kv::Slot;
use crate::model::arch::{Activation, ArchSpec};
use crate::model::{Batch, ForwardModel, LogitsWanted, ModelConfig};
use crate::moe::{moe_forward, ExpertFfn};

/// The feed-forward block of a layer.
#[derive(Debug)]
pub(crate) enum Ffn {
    /// `down(act(gate x) * up x)`.
    Dense {
        gate: Weight,
        up: Weight,
        down: Weight,
    },
    /// Router and stacked experts (`[n_expert * n_ff, n_embd]` gate/up,
    /// `[n_expert * n_embd, n_ff]` down).
    Moe {
        router: Weight,
        gate: Weight,
        up: Weight,
        down: Weight,
        n_ff: usize,
    },
}

/// One transformer block's weights.
#[derive(Debug)]
pub(crate) struct Layer {
    pub attn_norm: Vec<f32>,
    pub wq: Weight,
    pub wk: Weight,
    pub wv: Weight,
    pub wo: Weight,
    pub bias: Option<[Vec<f32>; 3]>,
    pub qk_norm: Option<[Vec<f32>; 2]>,
    pub post_attn_norm: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>,
    pub ffn: Ffn,
    pub post_ffn_norm: Option<Vec<f32>>,
}

/// A model loaded for the CPU backend, with its K/V cache.
///
/// Built by [`crate::model::load::load_cpu_model`].
#[derive(Debug)]
pub struct CpuModel {
    pub(crate) cfg: ModelConfig,
    pub(crate) spec: ArchSpec,
    pub(crate) table: KernelTable,
    pub(crate) threads: Threads,
    pub(crate) exact: bool,
    pub(crate) tok_embd: Weight,
    pub(crate) output_norm: Vec<f32>,
    /// `None`: tied to `tok_embd`.
    pub(crate) output: Option<Weight>,
    pub(crate) layers: Vec<Layer>,
    /// Llama 3.1+ per-pair RoPE divisors (`rope_freqs.weight`), when present.
    pub(crate) rope_freqs: Option<Vec<f32>>,
    pub(crate) kv: KvCache,
}

/// Expert FFNs over weights in memory: the host implementation of the MoE seam.
struct HostExperts<'a> {
    model: &'a CpuModel,
}

impl ExpertFfn for HostExperts<'_> {
    fn run_expert(&self, layer: usize, e: usize, x: &[f32], out: &mut [f32]) -> crate::Result<()> {
        let m = self.model;
        let Some(Ffn::Moe {
            gate,
            up,
            down,
            n_ff,
            ..
        }) = m.layers.get(layer).map(|l| &l.ffn)
        else {
            return Err(BackendError::Shape(format!("layer {layer} has no experts")).into());
        };
        let n = x.len() / m.cfg.n_embd;
        let (mut g, mut u) = (vec![0.0; n * n_ff], vec![0.0; n * n_ff]);
        m.mm(gate, e * n_ff..(e + 1) * n_ff, x, &mut g)?;
        m.mm(up, e * n_ff..(e + 1) * n_ff, x, &mut u)?;
        m.activate(&mut g, &u);
        let d = m.cfg.n_embd;
        m.mm(down, e * d..(e + 1) * d, &g, out)?;
        Ok(())
    }
}

impl CpuModel {
    /// Threads the model runs on.
    pub fn threads(&self) -> usize {
        self.threads.count()
    }

    fn mm(
        &self,
        w: &Weight,
        rows: std::ops::Range<usize>,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        matmul(&self.threads, &self.table, w, rows, x, y, self.exact)
    }

    /// `x · Wᵀ` over all of W's rows into a new `[n, W.rows]` buffer.
    fn linear(&self, w: &Weight, x: &[f32]) -> Result<Vec<f32>, BackendError> {
        let n = x.len() / w.cols;
        let mut y = vec![0.0; n * w.rows];
        self.mm(w, 0..w.rows, x, &mut y)?;
        Ok(y)
    }

    fn activate(&self, gate: &mut [f32], up: &[f32]) {
        match self.spec.act {
            Activation::Silu => ops::silu_mul(gate, up),
            Activation::GeluTanh => ops::gelu_mul(gate, up),
        }
    }

    /// Checks the batch against the model and cache; returns the slots of
    /// all tokens in batch order.
    fn check_batch(&self, batch: &Batch<'_>) -> Result<Vec<Slot>, BackendError> {
        let mut slots = Vec::with_capacity(batch.num_tokens());
        for (i, s) in batch.seqs.iter().enumerate() {
            if s.slots.len() != s.tokens.len() {
                return Err(BackendError::Shape(format!(
                    "sequence {i}: {} tokens but {} slots",
                    s.tokens.len(),
                    s.slots.len()
                )));
            }
            if s.tokens.is_empty() && s.logits != LogitsWanted::None {
                return Err(BackendError::Shape(format!(
                    "sequence {i} has no tokens but wants logits"
                )));
            }
            if let Some(&t) = s.tokens.iter().find(|&&t| t as usize >= self.cfg.n_vocab) {
                return Err(BackendError::Shape(format!(
                    "sequence {i}: token id {t} is outside the vocabulary of {}",
                    self.cfg.n_vocab
                )));
            }
            slots.extend_from_slice(s.slots);
        }
        Ok(slots)
    }

    /// Input embeddings `[tokens, n_embd]`.
    fn embed(&self, batch: &Batch<'_>) -> Vec<f32> {
        let d = self.cfg.n_embd;
        let mut x = vec![0.0f32; batch.num_tokens() * d];
        let ids = batch.seqs.iter().flat_map(|s| s.tokens.iter());
        for (row, &id) in x.chunks_exact_mut(d).zip(ids) {
            self.tok_embd.dequantize_row(id as usize, row);
        }
        if let Some(s) = self.spec.embd_scale {
            ops::scale(&mut x, s);
        }
        x
    }

    /// The attention half of layer `il`: returns its output `[tokens, n_embd]`.
    fn attention(
        &mut self,
        il: usize,
        x: &[f32],
        pos: &[usize],
        slots: &[Slot],
        seqs: &[AttnSeq<'_>],
    ) -> Result<Vec<f32>, BackendError> {
        let (cfg, l, ls) = (&self.cfg, &self.layers[il], self.spec.layers[il]);
        let mut h = x.to_vec();
        ops::rms_norm(&mut h, &l.attn_norm, cfg.rms_eps);
        let mut q = self.linear(&l.wq, &h)?;
        let mut k = self.linear(&l.wk, &h)?;
        let mut v = self.linear(&l.wv, &h)?;
        if let Some([bq, bk, bv]) = &l.bias {
            ops::add_bias(&mut q, bq);
            ops::add_bias(&mut k, bk);
            ops::add_bias(&mut v, bv);
        }
        if let Some([qn, kn]) = &l.qk_norm {
            ops::rms_norm(&mut q, qn, cfg.rms_eps);
            ops::rms_norm(&mut k, kn, cfg.rms_eps);
        }
        let rope = ops::RopeParams {
            head_dim: cfg.head_dim_k,
            n_rot: self.spec.n_rot,
            base: ls.rope_base,
            freq_scale: self.spec.rope_freq_scale,
            freq_factors: self.rope_freqs.as_deref(),
            mode: self.spec.rope_mode,
        };
        ops::rope_with(&mut q, pos, &rope);
        ops::rope_with(&mut k, pos, &rope);
        self.kv.write(il, slots, &k, &v)?;
        let shape = AttnShape {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            head_dim_k: cfg.head_dim_k,
            head_dim_v: cfg.head_dim_v,
            scale: self.spec.attn_scale,
            window: ls.window,
            softcap: None,
        };
        let mut attn = vec![0.0f32; pos.len() * cfg.n_head * cfg.head_dim_v];
        self.kv
            .attend(&self.threads, il, &shape, seqs, &q, &mut attn)?;
        let mut o = self.linear(&l.wo, &attn)?;
        if let Some(w) = &l.post_attn_norm {
            ops::rms_norm(&mut o, w, cfg.rms_eps);
        }
        Ok(o)
    }

    /// The FFN half of layer `il`: returns its output `[tokens, n_embd]`.
    fn feed_forward(&self, il: usize, x: &[f32]) -> crate::Result<Vec<f32>> {
        let (cfg, l) = (&self.cfg, &self.layers[il]);
        let mut h = x.to_vec();
        ops::rms_norm(&mut h, &l.ffn_norm, cfg.rms_eps);
        let mut out = match &l.ffn {
            Ffn::Dense { gate, up, down } => {
                let mut g = self.linear(gate, &h)?;
                let u = self.linear(up, &h)?;
                self.activate(&mut g, &u);
                self.linear(down, &g)?
            }
            Ffn::Moe { router, .. } => {
                let logits = self.linear(router, &h)?;
                let mut out = vec![0.0f32; h.len()];
                let experts = HostExperts { model: self };
                let (ne, k) = (cfg.n_expert, cfg.n_expert_used);
                moe_forward(&experts, il, &logits, ne, k, &h, &mut out)?;
                out
            }
        };
        if let Some(w) = &l.post_ffn_norm {
            ops::rms_norm(&mut out, w, cfg.rms_eps);
        }
        Ok(out)
    }

    /// Final norm and output projection of the wanted rows.
    fn logits(&self, batch: &Batch<'_>, x: &[f32]) -> Result<Vec<f32>, BackendError> {
        let d = self.cfg.n_embd;
        let mut rows = Vec::with_capacity(batch.logits_rows() * d);
        let mut row = 0;
        for s in batch.seqs {
            let n = s.tokens.len();
            let wanted = match s.logits {
                LogitsWanted::None => 0..0,
                LogitsWanted::Last => n.saturating_sub(1)..n,
                LogitsWanted::All => 0..n,
            };
            rows.extend_from_slice(&x[(row + wanted.start) * d..(row + wanted.end) * d]);
            row += n;
        }
        ops::rms_norm(&mut rows, &self.output_norm, self.cfg.rms_eps);
        let mut logits = self.linear(self.output.as_ref().unwrap_or(&self.tok_embd), &rows)?;
        if let Some(cap) = self.spec.final_softcap {
            ops::softcap(&mut logits, cap);
        }
        Ok(logits)
    }

    /// The forward pass (synchronous: the CPU never waits on a device).
    pub fn forward_sync(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>> {
        let slots = self.check_batch(batch)?;
        let mut x = self.embed(batch);
        let mut pos = Vec::with_capacity(slots.len());
        let mut seqs = Vec::with_capacity(batch.seqs.len());
        for s in batch.seqs {
            seqs.push(AttnSeq {
                row: pos.len(),
                len: s.tokens.len(),
                start: s.start,
                block_table: s.block_table,
            });
            pos.extend(s.start..s.start + s.tokens.len());
        }
        for il in 0..self.layers.len() {
            let o = self.attention(il, &x, &pos, &slots, &seqs)?;
            ops::add(&mut x, &o);
            let f = self.feed_forward(il, &x)?;
            ops::add(&mut x, &f);
        }
        Ok(self.logits(batch, &x)?)
    }
}

impl ForwardModel for CpuModel {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    async fn forward(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>> {
        self.forward_sync(batch)
    }
}
