//! A model's plans: one per shape of step and readout, built from the
//! architecture's spec, fused for the backend and kept, so that a step
//! builds only its host data ([`super::arch::plan::step_inputs`]) and a
//! backend sees the same plan, op for op, every time the shape comes back
//! (what a CUDA graph or a recorded WebGPU step would replay).

use crate::backend::{Backend, BackendError};
use crate::graph::fuse::fuse;
use crate::graph::plan::{HostSync, HostWrite, Plan, Step, SyncFuture, SyncKind, SyncPoint};
use crate::model::arch::plan::{build_template, PlanOptions, PlanSource, StepShape};
use crate::model::shard::HostReduce;
use crate::model::stream::BlockStream;
use crate::moe::{ExpertStore, Routes};

/// What a forward pass reads back of its logits rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Readout {
    /// The rows themselves.
    Logits,
    /// Each row's argmax ([`crate::graph::Op::Argmax`]).
    Argmax,
    /// Each row's `k` best pairs ([`crate::graph::Op::TopK`]).
    TopK(usize),
}

/// How a model's plans are built: the architecture and weights, and what
/// the model adds (sync points, fusion).
#[derive(Debug, Clone, Copy)]
pub struct PlanRecipe<'a> {
    /// The model's shapes, spec and weights.
    pub src: PlanSource<'a>,
    /// Weight buffers the model holds.
    pub n_weights: usize,
    /// Sync points.
    pub opts: &'a PlanOptions,
    /// Whether to fuse ops for the backend.
    pub fused: bool,
}

/// The plan of `shape` and `readout` on `backend`: built, its result
/// replaced by the readout, fused when the recipe says (with the fused ops
/// the backend supports) and checked against the model's buffers and
/// against the backend, once, so that running it needs no check of either.
pub fn plan_for<B: Backend>(
    recipe: &PlanRecipe<'_>,
    shape: StepShape,
    readout: Readout,
    backend: &B,
) -> Result<Plan, BackendError> {
    let plan = unchecked_plan_for(recipe, shape, readout, backend)?;
    match refused_step(&plan, backend) {
        Some(s) => Err(BackendError::unsupported_op(backend.caps(), &s.op)),
        None => Ok(plan),
    }
}

/// [`plan_for`] without the backend's check ([`refused_step`]), for the
/// load check, which names a refused weight's tensor.
pub(crate) fn unchecked_plan_for<B: Backend>(
    recipe: &PlanRecipe<'_>,
    shape: StepShape,
    readout: Readout,
    backend: &B,
) -> Result<Plan, BackendError> {
    let src = recipe.src;
    let mut plan = build_template(src, shape, recipe.opts)?;
    let width = src.cfg.n_vocab;
    let n_layer = src.weights.layers.len();
    // A plan ending before the head reads back the residual stream,
    // whatever the step's readout (the blocks after it read it out).
    match readout {
        _ if recipe.opts.hidden_out => {}
        Readout::Logits => {}
        Readout::Argmax => plan.argmax_result(width),
        Readout::TopK(k) => plan.top_k_result(width, k),
    }
    if recipe.fused {
        fuse(&mut plan, &|op| backend.supports(op));
    }
    plan.check(recipe.n_weights, recipe.opts.blocks(n_layer).len())?;
    Ok(plan)
}

/// The first step of `plan` that `backend` does not run.
pub(crate) fn refused_step<'p, B: Backend>(plan: &'p Plan, backend: &B) -> Option<&'p Step> {
    plan.steps.iter().find(|s| !backend.supports(&s.op))
}

/// The plans a model has built, most recent first.
#[derive(Debug, Default)]
pub(crate) struct Plans {
    entries: Vec<((StepShape, Readout), Plan)>,
}

impl Plans {
    /// Plans kept: a server's mix of decode batch sizes and prompt chunks
    /// comes back to a few shapes; others are rebuilt (a few hundred ops,
    /// microseconds).
    const KEEP: usize = 16;

    /// The plan of `key`, built by `build` if it is not kept.
    pub(crate) fn get_or_build(
        &mut self,
        key: (StepShape, Readout),
        build: impl FnOnce() -> Result<Plan, BackendError>,
    ) -> Result<&Plan, BackendError> {
        let i = match self.entries.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let plan = build()?;
                self.entries.truncate(Self::KEEP - 1);
                self.entries.insert(0, (key, plan));
                0
            }
        };
        if i > 0 {
            let e = self.entries.remove(i);
            self.entries.insert(0, e);
        }
        Ok(&self.entries[0].1)
    }

    /// Forgets every plan (what they were built with changed).
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
    }
}

/// The host side of a model's sync points: the routes of each MoE layer
/// go to its expert store, the streamed blocks come from their stream.
pub(crate) struct StoreSync<'a> {
    /// The store, if the model has one.
    pub(crate) store: Option<&'a mut (dyn ExpertStore + 'static)>,
    /// Experts per token.
    pub(crate) k: usize,
    /// The streamed blocks, if the model streams them.
    pub(crate) stream: Option<&'a mut BlockStream>,
    /// The all-reduce of a tensor-parallel shard, and the shard's index.
    pub(crate) reduce: Option<(&'a HostReduce, usize)>,
    /// All-reduces of this step so far.
    pub(crate) round: usize,
    /// The first expert and the count an expert-parallel shard holds.
    pub(crate) expert_shard: Option<(usize, usize)>,
}

impl HostSync for StoreSync<'_> {
    fn at_sync<'a>(&'a mut self, point: &'a SyncPoint, data: Vec<Vec<u8>>) -> SyncFuture<'a> {
        let k = self.k;
        if let SyncKind::AllReduce { .. } = point.kind {
            let round = self.round;
            self.round += 1;
            let (Some((reduce, shard)), [part]) = (self.reduce, data.as_slice()) else {
                let e = BackendError::Shape(format!(
                    "the plan stops at {point:?}, but the model is not a tensor-parallel shard"
                ));
                return Box::pin(std::future::ready(Err(e)));
            };
            let part: Vec<f32> = bytemuck::pod_collect_to_vec(part);
            let total = reduce.reduce(round, shard, part);
            return Box::pin(async move {
                let total = total.await;
                Ok(vec![HostWrite::Act {
                    index: 0,
                    bytes: std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(&total)),
                }])
            });
        }
        if let SyncKind::ExpertShard { .. } = point.kind {
            let r = match (self.expert_shard, data.as_slice()) {
                (Some(held), [ids, weights]) => Ok(local_routes(held, ids, weights)),
                _ => Err(BackendError::Shape(format!(
                    "the plan stops at {point:?}, but the model is not an expert-parallel shard"
                ))),
            };
            return Box::pin(std::future::ready(r));
        }
        if let SyncKind::StreamBlocks { first, end } = point.kind {
            let r = match self.stream.as_deref_mut() {
                Some(s) => Ok(s.writes(first..end)),
                None => Err(BackendError::Shape(format!(
                    "the plan stops at {point:?}, but the model streams no blocks"
                ))),
            };
            return Box::pin(std::future::ready(r));
        }
        let Some(store) = self.store.as_deref_mut() else {
            let e = BackendError::Shape(format!(
                "the plan stops at {point:?} without an expert store"
            ));
            return Box::pin(std::future::ready(Err(e)));
        };
        match (point.kind, data.as_slice()) {
            (SyncKind::MoeRoutes { layer }, [ids, weights, input]) => {
                let routes = match Routes::from_bytes(k, ids, weights) {
                    Ok(r) => r,
                    Err(e) => return Box::pin(std::future::ready(Err(e))),
                };
                store.prepare(layer, routes, bytemuck::pod_collect_to_vec(input))
            }
            (SyncKind::MoeHostPart { layer }, []) => store.host_part(layer),
            _ => {
                let e = BackendError::Shape(format!(
                    "the plan stops at {point:?} with {} buffers read back",
                    data.len()
                ));
                Box::pin(std::future::ready(Err(e)))
            }
        }
    }
}

/// The routes of an expert-parallel shard holding `count` experts from
/// `first`: a held expert's id made local (its weight kept), any other
/// route's id set past the held experts (every backend's expert op leaves
/// such a route out, as it does the expert cache's host experts) with
/// weight 0.
fn local_routes(
    (first, count): (usize, usize),
    ids: &[u8],
    weights: &[u8],
) -> Vec<HostWrite<'static>> {
    let mut ids: Vec<u32> = bytemuck::pod_collect_to_vec(ids);
    let mut weights: Vec<f32> = bytemuck::pod_collect_to_vec(weights);
    for (id, w) in ids.iter_mut().zip(weights.iter_mut()) {
        match (*id as usize).checked_sub(first) {
            Some(local) if local < count => *id = local as u32,
            _ => {
                *id = count as u32;
                *w = 0.0;
            }
        }
    }
    vec![
        HostWrite::Act {
            index: 0,
            bytes: std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(&ids)),
        },
        HostWrite::Act {
            index: 1,
            bytes: std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(&weights)),
        },
    ]
}
