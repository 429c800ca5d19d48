//! [`Model`]: a transformer on any [`Backend`]. A forward pass takes the
//! plan of its shape of step (built and fused once, [`super::plans`]),
//! builds the step's host data, has the backend run the plan
//! ([`Backend::run_plan`]), and reads back the logits rows (or what the
//! device picked of them) with ONE download.

use std::fmt;

use crate::backend::cpu::CpuBackend;
use crate::backend::{Backend, BackendError};
use crate::graph::plan::Held;
use crate::graph::plan::Input;
use crate::graph::KvCacheConfig;
use crate::model::arch::plan::{step_inputs, PlanOptions, PlanSource, StepShape};
use crate::model::arch::ArchSpec;
use crate::model::plans::{plan_for, PlanRecipe, Plans, Readout, StoreSync};
use crate::model::stream::BlockStream;
use crate::model::weights::ModelWeights;
use crate::model::{Batch, ForwardModel, LogitsWanted, ModelConfig};
use crate::moe::ExpertStore;

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
    /// Whether plans fuse ops for the backend ([`Model::set_fusion`]).
    pub(crate) fuse: bool,
    /// Where routed experts live, when not all on the device.
    pub(crate) experts: Option<Box<dyn ExpertStore>>,
    /// The plans built so far.
    pub(crate) plans: Plans,
    /// The blocks the plans run, and where they stop for the host (from
    /// the expert store).
    pub(crate) plan_opts: PlanOptions,
    /// The model's first blocks on the host's CPU, when it is split
    /// ([`crate::model::load::LoadOptions::gpu_layers`]): each step runs
    /// them first and hands their residual stream to this model's blocks.
    pub(crate) host: Option<Box<Model<CpuBackend>>>,
    /// The blocks' matrices in host memory, when they stream through the
    /// device ([`crate::model::load::LoadOptions::stream_layers`]).
    pub(crate) stream: Option<BlockStream>,
    /// The all-reduce this model takes part in as a tensor-parallel shard,
    /// and its index ([`crate::model::shard::TensorParallel`]).
    pub(crate) reduce: Option<(std::sync::Arc<crate::model::shard::HostReduce>, usize)>,
}

impl<B: Backend> fmt::Debug for Model<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("arch", &self.cfg.arch)
            .field("backend", &self.backend.caps().name)
            .field("exact", &self.exact)
            .field("kv", &self.kv_cfg)
            .field("blocks", &self.blocks())
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

    /// Whether plans fuse runs of ops into the fused variants the backend
    /// supports ([`crate::graph::fuse`]; on by default). A backend's fused
    /// kernels give the results of the ops apart, bit for bit on the CPU,
    /// which the tests check with this.
    pub fn set_fusion(&mut self, on: bool) {
        self.fuse = on;
        self.plans.clear();
        if let Some(h) = self.host.as_deref_mut() {
            h.set_fusion(on);
        }
    }

    /// Gives the model an expert store (`None`: every expert on the
    /// device): plans then stop after the routing of each MoE layer whose
    /// experts the store keeps off the device, and the store prepares the
    /// routed experts.
    ///
    /// The store's [`ExpertStore::placement`] is asked here, once per
    /// layer: set the store again when its answers change. A layer whose
    /// experts sit in device slots must have been loaded so (its stacked
    /// weights are the slots: [`crate::model::load::LoadOptions::experts`]).
    pub fn set_expert_store(&mut self, store: Option<Box<dyn ExpertStore>>) {
        self.plan_opts.experts = match (&store, self.spec.moe) {
            (Some(s), true) => (0..self.cfg.n_layer).map(|l| s.placement(l)).collect(),
            _ => Vec::new(),
        };
        self.experts = store;
        self.plans.clear();
    }

    /// Takes the model's expert store out (the model then has every expert
    /// on the device, as far as its plans know: give a store back before
    /// running a model loaded with its experts off the device), for a
    /// caller that wraps it.
    pub fn take_expert_store(&mut self) -> Option<Box<dyn ExpertStore>> {
        let store = self.experts.take();
        self.set_expert_store(None);
        store
    }

    /// Where layer `layer`'s routed experts are.
    pub fn expert_placement(&self, layer: usize) -> crate::moe::ExpertPlacement {
        self.plan_opts.placement(layer)
    }

    /// The blocks this model's backend runs: all of them, or the last ones
    /// of a model split with the host ([`Model::host_blocks`]).
    pub fn blocks(&self) -> std::ops::Range<usize> {
        self.plan_opts.blocks(self.cfg.n_layer)
    }

    /// The blocks the host's CPU runs before this model's backend does,
    /// for a model split between them (empty when it is not).
    pub fn host_blocks(&self) -> std::ops::Range<usize> {
        match &self.host {
            Some(h) => h.blocks(),
            None => 0..0,
        }
    }

    /// Bytes of streamed blocks written to the device so far (0 when the
    /// blocks do not stream).
    pub fn streamed_bytes(&self) -> u64 {
        self.stream.as_ref().map_or(0, BlockStream::bytes_written)
    }

    /// What the model's expert store did so far, if it has one that keeps
    /// count (the expert cache).
    pub fn expert_stats(&self) -> Option<crate::moe::ExpertStats> {
        self.experts.as_ref().and_then(|s| s.stats())
    }

    /// One forward pass reading back `readout`: the bytes read back (none
    /// for a batch without tokens).
    pub(crate) async fn forward_plan(
        &mut self,
        batch: &Batch<'_>,
        readout: Readout,
    ) -> crate::Result<Vec<u8>> {
        self.check_batch(batch)?;
        if batch.num_tokens() == 0 {
            return Ok(Vec::new());
        }
        let _span = crate::trace::span(crate::trace::Track::Host, "forward")
            .arg("tokens", batch.num_tokens())
            .arg("seqs", batch.seqs.len());
        // A split model's first blocks run on the host; their residual
        // stream is this backend's input (the one crossing of the step).
        let hidden = match self.host.as_deref_mut() {
            Some(h) => Some(Box::pin(h.forward_plan(batch, Readout::Logits)).await?),
            None => None,
        };
        let Model {
            cfg,
            spec,
            backend,
            exact,
            buffers,
            weights,
            kv,
            kv_cfg,
            fuse,
            experts,
            plans,
            plan_opts,
            host: _,
            stream,
            reduce,
        } = self;
        let src = PlanSource {
            cfg,
            spec,
            weights,
            kv: kv_cfg,
            exact: *exact,
        };
        let mut inputs = step_inputs(&src, batch);
        if let Some(h) = hidden {
            inputs.set(Input::Hidden, bytemuck::pod_collect_to_vec(&h));
        }
        let recipe = PlanRecipe {
            src,
            n_weights: buffers.len(),
            opts: plan_opts,
            fused: *fuse,
        };
        let shape = StepShape::of(batch);
        let plan = plans.get_or_build((shape, readout), || {
            plan_for(&recipe, shape, readout, &*backend)
        })?;
        let held = Held {
            weights: buffers,
            kv,
        };
        let mut host = StoreSync {
            store: experts.as_deref_mut(),
            k: cfg.n_expert_used,
            stream: stream.as_mut(),
            reduce: reduce.as_ref().map(|(r, i)| (&**r, *i)),
            round: 0,
            expert_shard: cfg.expert_shard,
        };
        Ok(backend.run_plan(plan, &inputs, &held, &mut host).await?)
    }

    /// One forward pass: builds the step's plan, runs it, returns the
    /// wanted logits rows `[batch.logits_rows()][n_vocab]`.
    pub async fn run(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>> {
        let bytes = self.forward_plan(batch, Readout::Logits).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// A greedy forward pass: the argmax of each wanted logits row,
    /// computed on the backend, so the step reads back one u32 per row.
    pub async fn run_argmax(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<u32>> {
        let bytes = self.forward_plan(batch, Readout::Argmax).await?;
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
        let bytes = self.forward_plan(batch, Readout::TopK(k)).await?;
        Ok(top_k_rows(&bytes, k))
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

/// The rows of a [`Readout::TopK`] read back: `k` `(token, logit)` pairs
/// each.
pub(crate) fn top_k_rows(bytes: &[u8], k: usize) -> Vec<Vec<(u32, f32)>> {
    let words: Vec<u32> = bytemuck::pod_collect_to_vec(bytes);
    words
        .chunks_exact(2 * k.max(1))
        .map(|row| {
            row.chunks_exact(2)
                .map(|p| (p[0], f32::from_bits(p[1])))
                .collect()
        })
        .collect()
}
