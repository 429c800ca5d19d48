//! [`Model`]: a transformer on any [`Backend`]. Each forward pass builds the
//! step's [`Plan`] from the architecture's spec
//! ([`super::arch::plan`]), runs it through the generic executor, and reads
//! back the logits rows with ONE download.

use crate::graph::KvCacheConfig;
use std::fmt;

use crate::backend::{Backend, BackendError};
use crate::graph::plan::{execute, Held, Plan};
use crate::model::arch::{plan::build_plan, ArchSpec};
use crate::model::{Batch, ForwardModel, LogitsWanted, ModelConfig};
use crate::quant::GgmlType;

/// One weight the model holds on its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightInfo {
    /// Index of its buffer ([`crate::graph::plan::BufId::Weight`]).
    pub id: usize,
    /// Element type (norm weights and biases are F32).
    pub ty: GgmlType,
    /// Elements per row.
    pub cols: usize,
    /// Rows (product of the other dimensions).
    pub rows: usize,
}

/// The feed-forward weights of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnWeights {
    /// `down(act(gate x) * up x)`.
    Dense {
        /// `[n_ff, n_embd]`.
        gate: WeightInfo,
        /// `[n_ff, n_embd]`.
        up: WeightInfo,
        /// `[n_embd, n_ff]`.
        down: WeightInfo,
    },
    /// Router and stacked experts.
    Moe {
        /// `[n_expert, n_embd]`.
        router: WeightInfo,
        /// `[n_expert * n_ff, n_embd]`.
        gate: WeightInfo,
        /// `[n_expert * n_ff, n_embd]`.
        up: WeightInfo,
        /// `[n_expert * n_embd, n_ff]`.
        down: WeightInfo,
        /// Hidden width of one expert.
        n_ff: usize,
    },
}

/// One transformer block's weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerWeights {
    /// Attention input norm.
    pub attn_norm: WeightInfo,
    /// Query projection.
    pub wq: WeightInfo,
    /// Key projection.
    pub wk: WeightInfo,
    /// Value projection.
    pub wv: WeightInfo,
    /// Output projection.
    pub wo: WeightInfo,
    /// q/k/v biases (qwen2).
    pub bias: Option<[WeightInfo; 3]>,
    /// q/k head norms (qwen3, gemma3).
    pub qk_norm: Option<[WeightInfo; 2]>,
    /// Norm of the attention output (gemma3).
    pub post_attn_norm: Option<WeightInfo>,
    /// FFN input norm.
    pub ffn_norm: WeightInfo,
    /// The FFN.
    pub ffn: FfnWeights,
    /// Norm of the FFN output (gemma3).
    pub post_ffn_norm: Option<WeightInfo>,
}

/// Every weight of a model, by buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelWeights {
    /// Token embeddings `[n_vocab, n_embd]`.
    pub tok_embd: WeightInfo,
    /// Final norm.
    pub output_norm: WeightInfo,
    /// Output projection; `None`: tied to `tok_embd`.
    pub output: Option<WeightInfo>,
    /// Llama 3.1+ per-pair RoPE divisors, when present.
    pub rope_freqs: Option<WeightInfo>,
    /// The blocks.
    pub layers: Vec<LayerWeights>,
}

/// A model loaded on backend `B`, with its K/V cache.
///
/// Built by [`crate::model::load::load_model`].
pub struct Model<B: Backend> {
    pub(crate) cfg: ModelConfig,
    pub(crate) spec: ArchSpec,
    pub(crate) backend: B,
    pub(crate) exact: bool,
    pub(crate) buffers: Vec<B::Buffer>,
    pub(crate) weights: ModelWeights,
    pub(crate) kv: Vec<[B::Buffer; 2]>,
    pub(crate) kv_cfg: KvCacheConfig,
}

impl<B: Backend> fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("arch", &self.cfg.arch)
            .field("backend", &self.backend.caps().name)
            .field("exact", &self.exact)
            .field("kv", &self.kv_cfg)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Model<B> {
    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably (for its own settings).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The architecture's spec.
    pub fn spec(&self) -> &ArchSpec {
        &self.spec
    }

    /// The model's weights, by buffer.
    pub fn weights(&self) -> &ModelWeights {
        &self.weights
    }

    /// The K/V cache's configuration.
    pub fn kv_config(&self) -> &KvCacheConfig {
        &self.kv_cfg
    }

    /// Whether the exact-f32 mode is on.
    pub fn exact(&self) -> bool {
        self.exact
    }

    /// The weight and K/V buffers the model's plans refer to.
    pub fn held(&self) -> Held<'_, B::Buffer> {
        Held {
            weights: &self.buffers,
            kv: &self.kv,
        }
    }

    /// Checks the batch against the model before anything runs.
    fn check_batch(&self, batch: &Batch<'_>) -> Result<(), BackendError> {
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
        }
        Ok(())
    }

    /// One forward pass: builds the step's plan, lets `finish` replace its
    /// result (the logits rows) by what the caller reads back, runs it, and
    /// returns the bytes read back (none for a batch without tokens).
    async fn run_plan(
        &mut self,
        batch: &Batch<'_>,
        finish: impl FnOnce(&mut Plan, usize),
    ) -> crate::Result<Vec<u8>> {
        self.check_batch(batch)?;
        if batch.num_tokens() == 0 {
            return Ok(Vec::new());
        }
        let mut plan = build_plan(&*self, batch)?;
        finish(&mut plan, self.cfg.n_vocab);
        let held = Held {
            weights: &self.buffers,
            kv: &self.kv,
        };
        Ok(execute(&mut self.backend, &plan, &held).await?)
    }

    /// One forward pass: builds the step's plan, runs it, returns the
    /// wanted logits rows `[batch.logits_rows()][n_vocab]`.
    pub async fn run(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>> {
        let bytes = self.run_plan(batch, |_, _| {}).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// A greedy forward pass: the argmax of each wanted logits row,
    /// computed on the backend, so the step reads back one u32 per row.
    pub async fn run_argmax(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<u32>> {
        let bytes = self.run_plan(batch, Plan::argmax_result).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// A sampling forward pass: the `k` best `(token, logit)` pairs of each
    /// wanted logits row, best first ([`crate::graph::reference::top_k_row`]), picked
    /// on the backend, so the step reads back `8 k` bytes per row.
    pub async fn run_top_k(
        &mut self,
        batch: &Batch<'_>,
        k: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        let bytes = self
            .run_plan(batch, |plan, width| plan.top_k_result(width, k))
            .await?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(words
            .chunks_exact(2 * k.max(1))
            .map(|row| {
                row.chunks_exact(2)
                    .map(|p| (p[0], f32::from_bits(p[1])))
                    .collect()
            })
            .collect())
    }
}

impl<B: Backend> ForwardModel for Model<B> {
    fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    async fn forward(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>> {
        self.run(batch).await
    }

    async fn forward_argmax(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<u32>> {
        self.run_argmax(batch).await
    }

    async fn forward_top_k(
        &mut self,
        batch: &Batch<'_>,
        k: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        self.run_top_k(batch, k).await
    }
}
