//! The ops of one forward pass, as the [`ArchSpec`] describes them: builds
//! the [`Plan`] of a shape of step ([`StepShape`]) over the model's
//! weights, its K/V cache and activation buffers, and the host data of one
//! batch of that shape ([`step_inputs`]).
//!
//! Coarse ops: one matmul per weight over all rows of the batch, one
//! attention op per layer over all sequences (through their block tables).
//! Scratch buffers (`h`, `q`, `k`, ...) are shared by all layers.

use crate::backend::{Backend, BackendError};
use crate::graph::plan::{BufId, Input, Plan, StepInputs, SyncKind};
use crate::graph::KvCacheConfig;
use crate::graph::Op;
use crate::model::arch::ArchSpec;
use crate::model::generic::Model;
use crate::model::weights::{FfnWeights, LayerWeights, ModelWeights, WeightInfo};
use crate::model::{Batch, LogitsWanted, ModelConfig};
use crate::moe::ExpertPlacement;
use crate::quant::GgmlType;

/// What a plan is built from: the model's shapes and weights.
#[derive(Debug, Clone, Copy)]
pub struct PlanSource<'a> {
    /// Shapes.
    pub cfg: &'a ModelConfig,
    /// The architecture.
    pub spec: &'a ArchSpec,
    /// Weights, by buffer.
    pub weights: &'a ModelWeights,
    /// The K/V cache.
    pub kv: &'a KvCacheConfig,
    /// Exact-f32 mode.
    pub exact: bool,
}

impl<'a, B: Backend> From<&'a Model<B>> for PlanSource<'a> {
    fn from(m: &'a Model<B>) -> Self {
        Self {
            cfg: &m.cfg,
            spec: &m.spec,
            weights: &m.weights,
            kv: &m.kv_cfg,
            exact: m.exact,
        }
    }
}

/// What a plan depends on: the tokens of the step and the logits rows it
/// reads back. Batches of one shape share a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StepShape {
    /// Input tokens over all sequences.
    pub tokens: usize,
    /// Logits rows read back.
    pub logit_rows: usize,
}

impl StepShape {
    /// The shape of `batch`.
    pub fn of(batch: &Batch<'_>) -> Self {
        Self {
            tokens: batch.num_tokens(),
            logit_rows: batch.logits_rows(),
        }
    }
}

/// The step's buffers shared by all layers.
struct Bufs {
    /// Residual stream `[tokens, n_embd]`.
    x: BufId,
    /// Normed input of a block `[tokens, n_embd]`.
    h: BufId,
    /// Output of a block `[tokens, n_embd]`.
    o: BufId,
    q: BufId,
    k: BufId,
    v: BufId,
    att: BufId,
    /// Dense FFN gate and up `[tokens, n_ff]`.
    g: BufId,
    u: BufId,
    /// MoE router logits `[tokens, n_expert]`, chosen ids and weights `[tokens, k]`.
    router: BufId,
    ids: BufId,
    wts: BufId,
    /// The host's share of an MoE layer's output `[tokens, n_embd]` (the
    /// experts it computes; empty without device slots).
    part: BufId,
    pos: BufId,
    slots: BufId,
    seqs: BufId,
    tables: BufId,
}

/// What a plan is built with beyond the model: the blocks it runs, and
/// where the host stops the step ([`SyncKind`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanOptions {
    /// Where each MoE layer's routed experts are, indexed by layer
    /// ([`crate::moe::ExpertStore::placement`]); a layer past the end has
    /// them all on the device.
    pub experts: Vec<ExpertPlacement>,
    /// The blocks the plan runs (`None`: all of them), for a model split
    /// between two backends. A plan whose first block is not block 0
    /// starts from [`Input::Hidden`] instead of the token embeddings. Its
    /// K/V cache holds the plan's blocks only: block `il`'s is
    /// [`BufId::KvK`]`(il - start)`.
    pub blocks: Option<std::ops::Range<usize>>,
    /// The plan stops after its blocks and reads back the residual stream
    /// of every token (`[tokens, n_embd]` f32) instead of running the
    /// output head: the host's part of a split model.
    pub hidden_out: bool,
    /// The blocks' matrices stream through two sets of device buffers
    /// ([`crate::model::stream`]): the plan stops before block 0 to have
    /// blocks 0 and 1 written, and before each block `il` after it to have
    /// block `il + 1` written into the set block `il - 1` used.
    pub stream: bool,
    /// The model is one tensor-parallel shard ([`crate::model::shard`]):
    /// the plan stops after each block's attention output and FFN output
    /// products for the sum over the shards ([`SyncKind::AllReduce`]).
    pub all_reduce: bool,
}

impl PlanOptions {
    /// The blocks run, of a model of `n_layer`.
    pub fn blocks(&self, n_layer: usize) -> std::ops::Range<usize> {
        match &self.blocks {
            Some(r) => r.start.min(n_layer)..r.end.min(n_layer),
            None => 0..n_layer,
        }
    }

    /// Where layer `il`'s routed experts are.
    pub fn placement(&self, il: usize) -> ExpertPlacement {
        self.experts
            .get(il)
            .copied()
            .unwrap_or(ExpertPlacement::Device)
    }

    /// Whether some layer's experts sit in device slots.
    fn has_slots(&self) -> bool {
        self.experts.contains(&ExpertPlacement::Slots)
    }
}

/// Builds the plan of steps of `shape` (unfused; see [`crate::graph::fuse`]).
pub fn build_template<'a>(
    src: impl Into<PlanSource<'a>>,
    shape: StepShape,
    opts: &PlanOptions,
) -> Result<Plan, BackendError> {
    let s = src.into();
    let mut p = Plan::default();
    let blocks = opts.blocks(s.weights.layers.len());
    let bufs = buffers(&s, &mut p, shape.tokens, opts, blocks.start > 0);
    if blocks.start == 0 {
        embed(&s, &mut p, &bufs);
    }
    for il in blocks.clone() {
        if opts.stream {
            let next = if il == 0 { 0..2 } else { il + 1..il + 2 };
            let end = next.end.min(blocks.end);
            if next.start < end {
                let kind = SyncKind::StreamBlocks {
                    first: next.start,
                    end,
                };
                p.sync(&[], &[], kind);
            }
        }
        let l = &s.weights.layers[il];
        attention(&s, &mut p, &bufs, il, il - blocks.start, l, opts);
        feed_forward(&s, &mut p, &bufs, il, l, opts)?;
    }
    if opts.hidden_out {
        // The next backend's blocks take the residual stream from here.
        if let BufId::Act(i) = bufs.x {
            p.result = Some((i, (shape.tokens * s.cfg.n_embd * 4) as u64));
        }
    } else {
        logits(&s, &mut p, &bufs, shape.logit_rows);
    }
    Ok(p)
}

/// Builds the plan of `batch`'s shape: [`build_template`] without sync points.
pub fn build_plan<'a>(
    src: impl Into<PlanSource<'a>>,
    batch: &Batch<'_>,
) -> Result<Plan, BackendError> {
    build_template(src, StepShape::of(batch), &PlanOptions::default())
}

/// The host data of `batch` for the plans of [`build_template`].
pub fn step_inputs(s: &PlanSource<'_>, batch: &Batch<'_>) -> StepInputs {
    let t = batch.num_tokens();
    let bs = s.kv.block_size as u32;
    let mut pos = Vec::with_capacity(t);
    let mut slots = Vec::with_capacity(t);
    let mut seqs = Vec::with_capacity(batch.seqs.len() * 4);
    let mut tables = Vec::new();
    let mut rows = Vec::with_capacity(batch.logits_rows());
    for q in batch.seqs {
        let row = pos.len() as u32;
        let n = q.tokens.len() as u32;
        seqs.extend([row, n, q.start as u32, tables.len() as u32]);
        tables.extend(q.block_table.iter().map(|b| b.0));
        pos.extend((q.start..q.start + q.tokens.len()).map(|p| p as u32));
        slots.extend(q.slots.iter().map(|s| s.block.0 * bs + s.offset));
        let wanted = match q.logits {
            LogitsWanted::None => 0..0,
            LogitsWanted::Last => n.saturating_sub(1)..n,
            LogitsWanted::All => 0..n,
        };
        rows.extend(wanted.map(|r| row + r));
    }
    let ids = batch
        .seqs
        .iter()
        .flat_map(|q| q.tokens.iter().copied())
        .collect();
    let mut inputs = StepInputs::default();
    inputs.set(Input::TokenIds, ids);
    inputs.set(Input::Positions, pos);
    inputs.set(Input::Slots, slots);
    inputs.set(Input::Seqs, seqs);
    inputs.set(Input::BlockTables, tables);
    inputs.set(Input::LogitRows, rows);
    inputs
}

/// The step's scratch buffers for `t` tokens, and its inputs (the
/// residual stream among them when the host computed it: `hidden_in`).
fn buffers(
    s: &PlanSource<'_>,
    p: &mut Plan,
    t: usize,
    opts: &PlanOptions,
    hidden_in: bool,
) -> Bufs {
    let c = s.cfg;
    let f32s = |p: &mut Plan, width: usize| p.act(t * width * 4);
    Bufs {
        x: if hidden_in {
            p.input(Input::Hidden)
        } else {
            f32s(p, c.n_embd)
        },
        h: f32s(p, c.n_embd),
        o: f32s(p, c.n_embd),
        q: f32s(p, c.n_head * c.head_dim_k),
        k: f32s(p, c.n_head_kv * c.head_dim_k),
        v: f32s(p, c.n_head_kv * c.head_dim_v),
        att: f32s(p, c.n_head * c.head_dim_v),
        g: f32s(p, if s.spec.moe { 0 } else { c.n_ff }),
        u: f32s(p, if s.spec.moe { 0 } else { c.n_ff }),
        router: f32s(p, c.n_expert),
        ids: f32s(p, c.n_expert_used),
        wts: f32s(p, c.n_expert_used),
        part: f32s(p, if opts.has_slots() { c.n_embd } else { 0 }),
        pos: p.input(Input::Positions),
        slots: p.input(Input::Slots),
        seqs: p.input(Input::Seqs),
        tables: p.input(Input::BlockTables),
    }
}

/// `y = x · Wᵀ`.
fn matmul(s: &PlanSource<'_>, p: &mut Plan, w: &WeightInfo, x: BufId, y: BufId) {
    let op = Op::MatMul {
        ty: w.ty,
        k: w.cols,
        n: w.rows,
        exact: s.exact,
    };
    p.push(op, &[x, BufId::Weight(w.id)], &[y]);
}

/// `y = rms_norm(x) * w` over rows of `w.cols`.
fn norm(s: &PlanSource<'_>, p: &mut Plan, w: &WeightInfo, x: BufId, y: BufId) {
    let op = Op::RmsNorm {
        width: w.cols,
        eps: s.cfg.rms_eps,
    };
    p.push(op, &[x, BufId::Weight(w.id)], &[y]);
}

/// Token embeddings into `x`, scaled when the architecture says so.
fn embed(s: &PlanSource<'_>, p: &mut Plan, b: &Bufs) {
    let ids = p.input(Input::TokenIds);
    let t = &s.weights.tok_embd;
    let op = Op::GetRows {
        ty: t.ty,
        width: s.cfg.n_embd,
    };
    p.push(op, &[BufId::Weight(t.id), ids], &[b.x]);
    if let Some(scale) = s.spec.embd_scale {
        p.push(Op::Scale(scale), &[b.x], &[b.x]);
    }
}

/// The attention half of layer `il`, added into `x`; its K/V cache is the
/// plan's `kv`-th.
fn attention(
    s: &PlanSource<'_>,
    p: &mut Plan,
    b: &Bufs,
    il: usize,
    kv: usize,
    l: &LayerWeights,
    opts: &PlanOptions,
) {
    let (c, ls) = (s.cfg, s.spec.layers.get(il).copied());
    norm(s, p, &l.attn_norm, b.x, b.h);
    matmul(s, p, &l.wq, b.h, b.q);
    matmul(s, p, &l.wk, b.h, b.k);
    matmul(s, p, &l.wv, b.h, b.v);
    if let Some(bias) = &l.bias {
        for (w, y) in bias.iter().zip([b.q, b.k, b.v]) {
            p.push(Op::BiasAdd, &[y, BufId::Weight(w.id)], &[y]);
        }
    }
    if let Some(qk) = &l.qk_norm {
        norm(s, p, &qk[0], b.q, b.q);
        norm(s, p, &qk[1], b.k, b.k);
    }
    let rope = Op::Rope {
        mode: s.spec.rope_mode,
        head_dim: c.head_dim_k,
        n_rot: s.spec.n_rot,
        base: ls.map_or(c.rope_base, |l| l.rope_base),
        scale: s.spec.rope_freq_scale,
    };
    for y in [b.q, b.k] {
        let mut ins = vec![y, b.pos];
        ins.extend(s.weights.rope_freqs.map(|f| BufId::Weight(f.id)));
        p.push(rope.clone(), &ins, &[y]);
    }
    let kv = [BufId::KvK(kv), BufId::KvV(kv)];
    let write = Op::KvWrite {
        layer: il,
        k_width: c.n_head_kv * c.head_dim_k,
        v_width: c.n_head_kv * c.head_dim_v,
        dtype: s.kv.dtype,
    };
    p.push(write, &[b.k, b.v, b.slots], &kv);
    let attn = Op::PagedAttention {
        layer: il,
        n_head: c.n_head,
        n_head_kv: c.n_head_kv,
        head_dim_k: c.head_dim_k,
        head_dim_v: c.head_dim_v,
        scale: s.spec.attn_scale,
        window: ls.and_then(|l| l.window),
        softcap: None,
        block_size: s.kv.block_size,
        dtype: s.kv.dtype,
    };
    p.push(attn, &[b.q, kv[0], kv[1], b.seqs, b.tables], &[b.att]);
    matmul(s, p, &l.wo, b.att, b.o);
    block_output(s, p, b, (il, false), l.post_attn_norm.as_ref(), opts);
}

/// A block half's output `o` into the residual stream `x`: summed over the
/// shards first (a tensor-parallel shard; `(il, ffn)`: which half of which
/// block), then normed where the architecture norms it.
fn block_output(
    s: &PlanSource<'_>,
    p: &mut Plan,
    b: &Bufs,
    (layer, ffn): (usize, bool),
    post_norm: Option<&WeightInfo>,
    opts: &PlanOptions,
) {
    if opts.all_reduce {
        p.sync(&[b.o], &[b.o], SyncKind::AllReduce { layer, ffn });
    }
    if let Some(w) = post_norm {
        norm(s, p, w, b.o, b.o);
    }
    p.push(Op::Add, &[b.x, b.o], &[b.x]);
}

/// The FFN half of layer `il`, added into `x`.
fn feed_forward(
    s: &PlanSource<'_>,
    p: &mut Plan,
    b: &Bufs,
    il: usize,
    l: &LayerWeights,
    opts: &PlanOptions,
) -> Result<(), BackendError> {
    norm(s, p, &l.ffn_norm, b.x, b.h);
    match &l.ffn {
        FfnWeights::Dense { gate, up, down } => {
            let (g, u) = (b.g, b.u);
            matmul(s, p, gate, b.h, g);
            matmul(s, p, up, b.h, u);
            let act = match s.spec.act {
                crate::graph::Activation::Silu => Op::SiluMul,
                crate::graph::Activation::GeluTanh => Op::GeluTanhMul,
            };
            p.push(act, &[g, u], &[g]);
            matmul(s, p, down, g, b.o);
        }
        FfnWeights::Moe {
            router,
            gate,
            up,
            down,
            n_ff,
        } => {
            let (ne, k) = (s.cfg.n_expert, s.cfg.n_expert_used);
            if k == 0 || k > ne || router.rows != ne {
                return Err(BackendError::Shape(format!(
                    "layer {il}: {k} of {ne} experts with a router of {}",
                    router.rows
                )));
            }
            let (logits, ids, wts) = (b.router, b.ids, b.wts);
            matmul(s, p, router, b.h, logits);
            p.push(Op::MoeTopK { n_expert: ne, k }, &[logits], &[ids, wts]);
            let placement = opts.placement(il);
            let (routes, part) = (
                SyncKind::MoeRoutes { layer: il },
                SyncKind::MoeHostPart { layer: il },
            );
            if s.cfg.expert_shard.is_some() {
                p.sync(
                    &[ids, wts],
                    &[ids, wts],
                    SyncKind::ExpertShard { layer: il },
                );
            }
            match placement {
                ExpertPlacement::Device => {}
                ExpertPlacement::Slots => p.sync(&[ids, wts, b.h], &[ids], routes),
                ExpertPlacement::Host => {
                    p.sync(&[ids, wts, b.h], &[], routes);
                    p.sync(&[], &[b.o], part);
                }
            }
            if placement != ExpertPlacement::Host {
                // The stacked weights hold the experts on the device: the
                // model's, or a pool of slots.
                let held = gate.rows / (*n_ff).max(1);
                let op = Op::MoeExperts {
                    layer: il,
                    n_expert: held,
                    k,
                    n_embd: s.cfg.n_embd,
                    n_ff: *n_ff,
                    act: s.spec.act,
                    tys: [gate.ty, up.ty, down.ty],
                    exact: s.exact,
                };
                let w = |w: &WeightInfo| BufId::Weight(w.id);
                p.push(op, &[b.h, ids, wts, w(gate), w(up), w(down)], &[b.o]);
            }
            if placement == ExpertPlacement::Slots {
                p.sync(&[], &[b.part], part);
                p.push(Op::Add, &[b.o, b.part], &[b.o]);
            }
        }
    }
    block_output(s, p, b, (il, true), l.post_ffn_norm.as_ref(), opts);
    Ok(())
}

/// Final norm and output projection of the `r` wanted rows
/// ([`Input::LogitRows`]); the plan's result.
fn logits(s: &PlanSource<'_>, p: &mut Plan, b: &Bufs, r: usize) {
    let (d, nv) = (s.cfg.n_embd, s.cfg.n_vocab);
    if r == 0 {
        return;
    }
    let ids = p.input(Input::LogitRows);
    let sel = p.act(r * d * 4);
    let get = Op::GetRows {
        ty: GgmlType::F32,
        width: d,
    };
    p.push(get, &[b.x, ids], &[sel]);
    norm(s, p, &s.weights.output_norm, sel, sel);
    let out = p.act(r * nv * 4);
    let w = s.weights.output.as_ref().unwrap_or(&s.weights.tok_embd);
    matmul(s, p, w, sel, out);
    if let Some(cap) = s.spec.final_softcap {
        p.push(Op::LogitSoftcap(cap), &[out], &[out]);
    }
    if let BufId::Act(i) = out {
        p.result = Some((i, (r * nv * 4) as u64));
    }
}
