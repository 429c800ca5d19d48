//! Tensor parallelism: one model split across `n` devices (Megatron-style).
//!
//! Each shard holds a slice of every block: its share of the attention
//! heads (the rows of `attn_q`, `attn_k`, `attn_v` and their biases: column
//! parallel) and of the FFN's hidden units (the rows of `ffn_gate` and
//! `ffn_up`, of every expert for an MoE layer), and the matching columns
//! of `attn_output` and `ffn_down` (row parallel). Its products then give
//! a partial sum of each block's two outputs; the shards' partials are
//! added (all-reduced) before the residual add, so every shard carries the
//! same residual stream. Norms, embeddings, the router and the output head
//! are whole on every shard, and every shard holds the K/V cache of its
//! own heads only.
//!
//! Key/value heads are split like the query heads where they divide by
//! `n`; where there are fewer than `n` (grouped-query attention with few
//! K/V heads) each is copied to the shards whose query heads read it.
//!
//! The sharding is plain data: [`shard_gguf`] writes shard `i` of a model
//! as a GGUF of its own (its metadata names the shard's head and unit
//! counts), which loads on any backend with [`crate::model::load_model`];
//! [`TensorParallel`] runs the shards side by side and adds their partial
//! sums on the host at each block's two sync points
//! ([`crate::graph::plan::SyncKind::AllReduce`]). A multi-GPU backend can
//! do the same adds on the devices (NCCL) and skip the host.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use thiserror::Error;

use crate::backend::{Backend, BackendError};
use crate::gguf::{
    read_tensor_data, write_gguf, ByteSource, GgufFile, GgufModel, MemSource, Metadata, TensorInfo,
    TensorSpec, Value,
};
use crate::model::{load_model, Batch, ForwardModel, LoadOptions, LoadProgress, ModelConfig};

use super::generic::Model;
use super::plans::Readout;

/// Why a model cannot be split as asked.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ShardError {
    /// The shard count does not divide the model.
    #[error("{what} do not split into {n} shards; pick a tensor-parallel size that divides them")]
    Indivisible {
        /// What does not divide (`4 query heads`).
        what: String,
        /// The shards asked for.
        n: usize,
    },
    /// A slice of a row-parallel weight would cut one of its blocks.
    #[error("tensor '{tensor}' ({ty}) rows of {cols} do not split into {n} whole blocks; pick another tensor-parallel size")]
    Blocks {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: String,
        /// Its row length.
        cols: u64,
        /// The shards asked for.
        n: usize,
    },
    /// Metadata the sharding needs is missing or of a form it cannot scale.
    #[error("cannot shard: {0}")]
    Metadata(String),
}

/// How an MoE layer's experts split across the shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertSplit {
    /// No experts.
    None,
    /// Every expert's FFN units split like a dense FFN's (tensor parallel).
    Units,
    /// Whole experts, `n_expert / n` a shard (expert parallel): a shard
    /// reads an expert's rows whole, and no quantized block is cut.
    Whole,
}

/// How one model splits across `n` shards: the counts each shard holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLayout {
    /// Shards.
    pub n: usize,
    /// Query heads of the model.
    pub n_head: usize,
    /// Key/value heads of the model.
    pub n_head_kv: usize,
    /// FFN hidden units of a dense layer (0: none).
    pub n_ff: usize,
    /// FFN hidden units of one expert (0: no experts).
    pub n_ff_expert: usize,
    /// Experts of an MoE layer.
    pub n_expert: usize,
    /// How the experts split.
    pub experts: ExpertSplit,
}

impl ShardLayout {
    /// The layout of `cfg` over `n` shards, or why it does not split. An
    /// MoE model's experts split whole where their count divides by `n`
    /// ([`ExpertSplit::Whole`]), else by their units.
    pub fn new(cfg: &ModelConfig, n: usize) -> Result<Self, ShardError> {
        let whole = cfg.n_expert > 0 && n > 0 && cfg.n_expert.is_multiple_of(n);
        Self::with_experts(
            cfg,
            n,
            if whole {
                ExpertSplit::Whole
            } else {
                ExpertSplit::Units
            },
        )
    }

    /// The layout of `cfg` over `n` shards with its experts split as
    /// `experts` says (ignored for a dense model).
    pub fn with_experts(
        cfg: &ModelConfig,
        n: usize,
        experts: ExpertSplit,
    ) -> Result<Self, ShardError> {
        let divides = |count: usize, what: &str| {
            if n == 0 || !count.is_multiple_of(n) {
                Err(ShardError::Indivisible {
                    what: format!("{count} {what}"),
                    n,
                })
            } else {
                Ok(())
            }
        };
        divides(cfg.n_head, "query heads")?;
        let kv = cfg.n_head_kv;
        if !kv.is_multiple_of(n) && !n.is_multiple_of(kv) {
            return Err(ShardError::Indivisible {
                what: format!("{kv} key/value heads (neither divides the other)"),
                n,
            });
        }
        divides(cfg.n_ff, "FFN units")?;
        let (n_ff_expert, experts) = if cfg.n_expert > 0 {
            let e = cfg.n_ff_expert.unwrap_or(cfg.n_ff);
            match experts {
                ExpertSplit::Whole => divides(cfg.n_expert, "experts")?,
                _ => divides(e, "expert FFN units")?,
            }
            let split = if experts == ExpertSplit::None {
                ExpertSplit::Units
            } else {
                experts
            };
            (e, split)
        } else {
            (0, ExpertSplit::None)
        };
        Ok(Self {
            n,
            n_head: cfg.n_head,
            n_head_kv: kv,
            n_ff: cfg.n_ff,
            n_ff_expert,
            n_expert: cfg.n_expert,
            experts,
        })
    }

    /// The experts shard `i` holds whole (all of them unless the experts
    /// split whole).
    pub fn experts(&self, i: usize) -> std::ops::Range<usize> {
        match self.experts {
            ExpertSplit::Whole => self.units(self.n_expert, i),
            _ => 0..self.n_expert,
        }
    }

    /// Query heads of shard `i`.
    pub fn heads(&self, i: usize) -> std::ops::Range<usize> {
        let per = self.n_head / self.n;
        i * per..(i + 1) * per
    }

    /// Key/value heads of shard `i` (one, shared with other shards, where
    /// there are fewer K/V heads than shards).
    pub fn kv_heads(&self, i: usize) -> std::ops::Range<usize> {
        if self.n_head_kv >= self.n {
            let per = self.n_head_kv / self.n;
            i * per..(i + 1) * per
        } else {
            let k = i * self.n_head_kv / self.n;
            k..k + 1
        }
    }

    /// Bytes of `model`'s weights shard `i` holds (whole tensors in full).
    pub fn shard_bytes(&self, model: &GgufModel, cfg: &ModelConfig, i: usize) -> u64 {
        model
            .tensors
            .iter()
            .map(|t| match cut_of(&t.name, cfg, self, i) {
                Cut::Whole => t.size,
                Cut::Rows { per_group, range } => {
                    t.size * range.len() as u64 / per_group.max(1) as u64
                }
                Cut::Cols(range) => {
                    let cols = t.shape.first().copied().unwrap_or(1).max(1);
                    t.size * range.len() as u64 / cols
                }
                Cut::Experts(range) => {
                    let all = t.shape.get(2).copied().unwrap_or(1).max(1);
                    t.size * range.len() as u64 / all
                }
            })
            .sum()
    }

    /// A shard's share of `count` units (FFN rows).
    fn units(&self, count: usize, i: usize) -> std::ops::Range<usize> {
        let per = count / self.n;
        i * per..(i + 1) * per
    }
}

/// How one tensor is cut for a shard.
enum Cut {
    /// Whole on every shard.
    Whole,
    /// Rows `range` of each of `groups` groups of `per_group` rows (one
    /// group, or one per expert).
    Rows {
        per_group: usize,
        range: std::ops::Range<usize>,
    },
    /// Columns `range` of every row.
    Cols(std::ops::Range<usize>),
    /// Experts `range` of a stacked expert tensor (dimension 2), whole.
    Experts(std::ops::Range<usize>),
}

/// The cut of tensor `name` for shard `i`, from its suffix.
fn cut_of(name: &str, cfg: &ModelConfig, l: &ShardLayout, i: usize) -> Cut {
    let Some(rest) = name.strip_prefix("blk.") else {
        return Cut::Whole;
    };
    let Some((_, part)) = rest.split_once('.') else {
        return Cut::Whole;
    };
    let rows = |heads: std::ops::Range<usize>, width: usize, per_group: usize| Cut::Rows {
        per_group,
        range: heads.start * width..heads.end * width,
    };
    let (hk, hv) = (cfg.head_dim_k, cfg.head_dim_v);
    match part {
        "attn_q.weight" | "attn_q.bias" => rows(l.heads(i), hk, l.n_head * hk),
        "attn_k.weight" | "attn_k.bias" => rows(l.kv_heads(i), hk, l.n_head_kv * hk),
        "attn_v.weight" | "attn_v.bias" => rows(l.kv_heads(i), hv, l.n_head_kv * hv),
        "attn_output.weight" => {
            let h = l.heads(i);
            Cut::Cols(h.start * hv..h.end * hv)
        }
        "ffn_gate.weight" | "ffn_up.weight" => Cut::Rows {
            per_group: l.n_ff,
            range: l.units(l.n_ff, i),
        },
        "ffn_down.weight" => Cut::Cols(l.units(l.n_ff, i)),
        "ffn_gate_exps.weight" | "ffn_up_exps.weight" | "ffn_down_exps.weight"
            if l.experts == ExpertSplit::Whole =>
        {
            Cut::Experts(l.experts(i))
        }
        "ffn_gate_exps.weight" | "ffn_up_exps.weight" => Cut::Rows {
            per_group: l.n_ff_expert,
            range: l.units(l.n_ff_expert, i),
        },
        "ffn_down_exps.weight" => Cut::Cols(l.units(l.n_ff_expert, i)),
        _ => Cut::Whole,
    }
}

/// Shard `i`'s copy of tensor `t` (`data`: its bytes): the spec and bytes.
fn cut_tensor(
    t: &TensorInfo,
    data: &[u8],
    cut: &Cut,
    n: usize,
) -> Result<(TensorSpec, Vec<u8>), ShardError> {
    // A vector (a bias) is cut like a matrix of rows of one value.
    let cols = if t.shape.len() == 1 {
        1
    } else {
        t.shape.first().copied().unwrap_or(1)
    };
    let row_bytes = t.ty.bytes_for(cols).ok_or_else(|| ShardError::Blocks {
        tensor: t.name.clone(),
        ty: t.ty.to_string(),
        cols,
        n,
    })? as usize;
    let n_rows = data.len().checked_div(row_bytes).unwrap_or(0);
    let mut shape = t.shape.clone();
    let bytes = match cut {
        Cut::Whole => data.to_vec(),
        Cut::Rows { per_group, range } => {
            let groups = n_rows / (*per_group).max(1);
            let mut out = Vec::with_capacity(groups * range.len() * row_bytes);
            for g in 0..groups {
                let first = (g * per_group + range.start) * row_bytes;
                out.extend_from_slice(&data[first..first + range.len() * row_bytes]);
            }
            // Rows are dimension 1 (a bias: its one dimension is the row).
            if shape.len() >= 2 {
                shape[1] = range.len() as u64;
            } else {
                shape[0] = (range.len() as u64).max(1);
            }
            out
        }
        Cut::Cols(range) => {
            let block = t.ty.block_elems();
            let aligned = block > 0 && range.start % block == 0 && range.end % block == 0;
            let (start, end) = match (
                t.ty.bytes_for(range.start as u64),
                t.ty.bytes_for(range.end as u64),
            ) {
                (Some(s), Some(e)) if aligned => (s as usize, e as usize),
                _ => {
                    return Err(ShardError::Blocks {
                        tensor: t.name.clone(),
                        ty: t.ty.to_string(),
                        cols,
                        n,
                    })
                }
            };
            let mut out = Vec::with_capacity(n_rows * (end - start));
            for r in 0..n_rows {
                out.extend_from_slice(&data[r * row_bytes + start..r * row_bytes + end]);
            }
            shape[0] = range.len() as u64;
            out
        }
        Cut::Experts(range) => {
            let all = t.shape.get(2).copied().unwrap_or(1).max(1) as usize;
            let slab = data.len() / all;
            if shape.len() >= 3 {
                shape[2] = range.len() as u64;
            }
            data[range.start * slab..range.end * slab].to_vec()
        }
    };
    let spec = TensorSpec {
        name: t.name.clone(),
        shape,
        ty: t.ty,
    };
    Ok((spec, bytes))
}

/// The metadata of shard `i`: the model's, with the shard's head and unit
/// counts, and the head sizes written out (they no longer follow from the
/// width and the head count).
fn shard_metadata(
    md: &Metadata,
    cfg: &ModelConfig,
    l: &ShardLayout,
    i: usize,
) -> Result<Metadata, ShardError> {
    let arch = &cfg.arch;
    let mut out = md.clone();
    for key in ["split.no", "split.count", "split.tensors.count"] {
        out.remove(key);
    }
    let scalar = |key: &str, value: usize, out: &mut Metadata| -> Result<(), ShardError> {
        let full = format!("{arch}.{key}");
        if md.get_array(&full).is_some() {
            return Err(ShardError::Metadata(format!(
                "{full} differs per layer; sharding needs one count for every layer"
            )));
        }
        out.set(&full, Value::U32(value as u32));
        Ok(())
    };
    scalar("attention.head_count", l.heads(i).len(), &mut out)?;
    scalar("attention.head_count_kv", l.kv_heads(i).len(), &mut out)?;
    scalar("attention.key_length", cfg.head_dim_k, &mut out)?;
    scalar("attention.value_length", cfg.head_dim_v, &mut out)?;
    // An MoE model without an expert length sizes its experts by
    // `feed_forward_length`: whole experts keep it.
    let experts_sized_by_ff = cfg.n_expert > 0 && cfg.n_ff_expert.is_none();
    if cfg.n_ff > 0 && !(experts_sized_by_ff && l.experts == ExpertSplit::Whole) {
        scalar("feed_forward_length", l.units(l.n_ff, i).len(), &mut out)?;
    }
    match l.experts {
        ExpertSplit::Whole => {
            let e = l.experts(i);
            out.set("hearth.shard.expert_first", Value::U32(e.start as u32));
            out.set("hearth.shard.expert_count", Value::U32(e.len() as u32));
        }
        ExpertSplit::Units
            if md
                .get(&format!("{arch}.expert_feed_forward_length"))
                .is_some() =>
        {
            scalar(
                "expert_feed_forward_length",
                l.units(l.n_ff_expert, i).len(),
                &mut out,
            )?;
        }
        _ => {}
    }
    out.set("hearth.shard", Value::String(format!("{i} of {}", l.n)));
    Ok(out)
}

/// Shard `i` of `n` of `model` (read from `sources`, one per split) as the
/// bytes of a GGUF file of its own, reading each tensor once.
pub async fn shard_gguf<S: ByteSource>(
    model: &GgufModel,
    sources: &[S],
    layout: &ShardLayout,
    i: usize,
) -> crate::Result<Vec<u8>> {
    let cfg = ModelConfig::from_metadata(model.metadata())?;
    // The layout must be this model's (the counts it was made from).
    let layout = ShardLayout::with_experts(&cfg, layout.n, layout.experts)?;
    let n = layout.n;
    if i >= n {
        return Err(ShardError::Metadata(format!("shard {i} of {n}")).into());
    }
    let metadata = shard_metadata(model.metadata(), &cfg, &layout, i)?;
    let mut tensors = Vec::with_capacity(model.tensors.len());
    for t in &model.tensors {
        let src = sources.get(t.split).ok_or_else(|| {
            ShardError::Metadata(format!(
                "tensor {} lives in split {}, which was not given",
                t.name, t.split
            ))
        })?;
        let data = read_tensor_data(src, t).await?;
        tensors.push(cut_tensor(t, &data, &cut_of(&t.name, &cfg, &layout, i), n)?);
    }
    let parts: Vec<(TensorSpec, &[u8])> = tensors
        .iter()
        .map(|(s, b)| (s.clone(), b.as_slice()))
        .collect();
    Ok(write_gguf(Vec::new(), &metadata, &parts)?)
}

/// Loads shard `i` of `layout` of `model` onto `backend` ([`shard_gguf`],
/// then [`load_model`] over the shard's bytes, which are dropped after).
pub async fn load_shard<B: Backend, S: ByteSource>(
    backend: B,
    model: &GgufModel,
    sources: &[S],
    (layout, i): (&ShardLayout, usize),
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<Model<B>> {
    let bytes = shard_gguf(model, sources, layout, i).await?;
    let src = MemSource::new(bytes);
    let file = GgufFile::read(&src).await?;
    let shard = GgufModel::from_files(vec![file])?;
    load_model(backend, &shard, std::slice::from_ref(&src), opts, progress).await
}

/// Loads `model` split across `backends` (one shard each, in order) as
/// one [`TensorParallel`] model, its experts split as
/// [`ShardLayout::new`] chooses.
pub async fn load_tensor_parallel<B: Backend, S: ByteSource>(
    backends: Vec<B>,
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<TensorParallel<B>> {
    load_tensor_parallel_as(None, backends, model, sources, opts, progress).await
}

/// [`load_tensor_parallel`] with the experts split as `experts` says
/// (`None`: as [`ShardLayout::new`] chooses).
pub async fn load_tensor_parallel_as<B: Backend, S: ByteSource>(
    experts: Option<ExpertSplit>,
    backends: Vec<B>,
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<TensorParallel<B>> {
    // Before any tensor is read: does the model split this way at all?
    let cfg = ModelConfig::from_metadata(model.metadata())?;
    let layout = match experts {
        Some(e) => ShardLayout::with_experts(&cfg, backends.len(), e)?,
        None => ShardLayout::new(&cfg, backends.len())?,
    };
    let mut shards = Vec::with_capacity(layout.n);
    for (i, backend) in backends.into_iter().enumerate() {
        let _span = crate::trace::span(crate::trace::Track::Load, "load shard").arg("shard", i);
        shards.push(load_shard(backend, model, sources, (&layout, i), opts, progress).await?);
    }
    Ok(TensorParallel::new(shards)?)
}

/// One all-reduce in progress: the shards' partial sums so far, then the
/// total, until every shard has taken it.
#[derive(Default)]
struct Round {
    parts: Vec<Option<Vec<f32>>>,
    total: Option<Arc<Vec<f32>>>,
    taken: usize,
    wakers: Vec<Waker>,
}

/// Adds the shards' partial sums on the host: the all-reduce of
/// [`TensorParallel`] (shard `i`'s `k`-th call of a step meets the other
/// shards' `k`-th). The shards' parts are added in shard order, so the
/// result does not depend on which shard came first.
pub struct HostReduce {
    n: usize,
    rounds: Mutex<HashMap<usize, Round>>,
}

impl std::fmt::Debug for HostReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostReduce").field("n", &self.n).finish()
    }
}

impl HostReduce {
    /// A reduce over `n` shards.
    pub fn new(n: usize) -> Self {
        Self {
            n,
            rounds: Mutex::new(HashMap::new()),
        }
    }

    /// Shard `shard`'s part of round `round`; resolves to the total once
    /// every shard gave its part.
    pub(crate) fn reduce(&self, round: usize, shard: usize, part: Vec<f32>) -> ReduceFuture<'_> {
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        let r = rounds.entry(round).or_default();
        if r.parts.len() < self.n {
            r.parts.resize(self.n, None);
        }
        if let Some(slot) = r.parts.get_mut(shard) {
            *slot = Some(part);
        }
        if r.parts.iter().all(Option::is_some) {
            let mut parts = r.parts.iter_mut().map(|p| p.take().unwrap_or_default());
            let mut total = parts.next().unwrap_or_default();
            for p in parts {
                for (t, v) in total.iter_mut().zip(&p) {
                    *t += v;
                }
            }
            r.total = Some(Arc::new(total));
            for w in r.wakers.drain(..) {
                w.wake();
            }
        }
        ReduceFuture {
            reduce: self,
            round,
        }
    }
}

/// The total of one round of [`HostReduce`].
pub(crate) struct ReduceFuture<'a> {
    reduce: &'a HostReduce,
    round: usize,
}

impl Future for ReduceFuture<'_> {
    type Output = Vec<f32>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<f32>> {
        let mut rounds = self.reduce.rounds.lock().unwrap_or_else(|e| e.into_inner());
        let n = self.reduce.n;
        let Some(r) = rounds.get_mut(&self.round) else {
            return Poll::Ready(Vec::new());
        };
        match r.total.clone() {
            Some(total) => {
                r.taken += 1;
                if r.taken >= n {
                    rounds.remove(&self.round);
                }
                Poll::Ready(total.as_ref().clone())
            }
            None => {
                r.wakers.push(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Polls every future of `futs` until all are done (the shards of one
/// step, which wait for each other at their all-reduces).
struct JoinAll<'a, T> {
    futs: Vec<Option<Pin<Box<dyn Future<Output = T> + 'a>>>>,
    out: Vec<Option<T>>,
}

// The futures are boxed and pinned on their own, and the results are
// never pinned: moving a `JoinAll` moves neither.
impl<T> Unpin for JoinAll<'_, T> {}

impl<T> Future for JoinAll<'_, T> {
    type Output = Vec<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<T>> {
        let this = self.get_mut();
        for (slot, out) in this.futs.iter_mut().zip(this.out.iter_mut()) {
            if let Some(f) = slot {
                if let Poll::Ready(v) = f.as_mut().poll(cx) {
                    *out = Some(v);
                    *slot = None;
                }
            }
        }
        if this.out.iter().all(Option::is_some) {
            Poll::Ready(this.out.iter_mut().filter_map(Option::take).collect())
        } else {
            Poll::Pending
        }
    }
}

/// One shard's step: the bytes it reads back.
type StepFuture<'a> = Pin<Box<dyn Future<Output = crate::Result<Vec<u8>>> + 'a>>;

/// A model split across shards ([`shard_gguf`]), each a [`Model`] on a
/// backend of its own, run side by side with the host adding their
/// partial sums. Its logits are shard 0's (every shard computes them: the
/// output head is whole on each).
pub struct TensorParallel<B: Backend> {
    shards: Vec<Model<B>>,
}

impl<B: Backend> std::fmt::Debug for TensorParallel<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorParallel")
            .field("shards", &self.shards.len())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> TensorParallel<B> {
    /// The model of `shards` (shard `i` loaded from [`shard_gguf`]`(.., i)`),
    /// its plans stopping after each block's two row-parallel products.
    pub fn new(mut shards: Vec<Model<B>>) -> Result<Self, BackendError> {
        if shards.is_empty() {
            return Err(BackendError::Shape(
                "tensor parallelism over no shards".into(),
            ));
        }
        let reduce = Arc::new(HostReduce::new(shards.len()));
        for (i, m) in shards.iter_mut().enumerate() {
            if m.host.is_some() || m.stream.is_some() {
                return Err(BackendError::Shape(
                    "a tensor-parallel shard cannot also be split with the host or stream its blocks".into(),
                ));
            }
            m.plan_opts.all_reduce = true;
            m.plans = Default::default();
            m.reduce = Some((reduce.clone(), i));
        }
        Ok(Self { shards })
    }

    /// The device shard 0 runs on, and how many shards there are.
    pub fn device_name(&self) -> String {
        format!(
            "{} x{} shards",
            self.shards[0].backend().caps().name,
            self.shards.len()
        )
    }

    /// The shards.
    pub fn shards(&self) -> &[Model<B>] {
        &self.shards
    }

    /// The shards, mutably (a backend's own settings).
    pub fn shards_mut(&mut self) -> &mut [Model<B>] {
        &mut self.shards
    }

    /// One step on every shard; shard 0's result.
    async fn run(&mut self, batch: &Batch<'_>, readout: Readout) -> crate::Result<Vec<u8>> {
        let futs: Vec<Option<StepFuture<'_>>> = self
            .shards
            .iter_mut()
            .map(|m| {
                let f: StepFuture<'_> = Box::pin(m.forward_plan(batch, readout));
                Some(f)
            })
            .collect();
        let n = futs.len();
        let results = JoinAll {
            futs,
            out: (0..n).map(|_| None).collect(),
        }
        .await;
        let mut first = None;
        for r in results {
            let bytes = r?;
            first.get_or_insert(bytes);
        }
        Ok(first.unwrap_or_default())
    }
}

impl<B: Backend> ForwardModel for TensorParallel<B> {
    fn config(&self) -> &ModelConfig {
        // Shard 0's shapes but the model's vocabulary and width, which is
        // what callers read; the head counts are the shard's.
        &self.shards[0].cfg
    }

    async fn forward(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>> {
        let bytes = self.run(batch, Readout::Logits).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    async fn forward_argmax(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<u32>> {
        let bytes = self.run(batch, Readout::Argmax).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    async fn forward_top_k(
        &mut self,
        batch: &Batch<'_>,
        k: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        let bytes = self.run(batch, Readout::TopK(k)).await?;
        Ok(super::generic::top_k_rows(&bytes, k))
    }
}

#[cfg(test)]
mod tests;
