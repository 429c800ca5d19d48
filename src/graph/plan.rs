//! Plans: the ops of one forward pass over named buffers, and the generic
//! executor that runs a plan on any [`Backend`] op by op.
//!
//! A plan is a template: it depends only on the shape of a step (its
//! tokens, the logits rows it reads back, what it reads back), so a model
//! builds it once per shape, fuses it for its backend ([`super::fuse`]) and
//! runs it step after step with that step's host data ([`StepInputs`]:
//! token ids, positions, K/V slots, block tables) apart from it. A plan
//! owns no memory: it lists activation buffers (sizes in bytes, or the host
//! input that fills them) and refers to the model's weights and K/V cache
//! by index. [`execute`] allocates the activations, uploads the inputs,
//! records every step, submits once, and reads back ONE buffer (the
//! result), stopping at the plan's sync points ([`SyncPoint`]) where the
//! host must read something mid-step.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

use crate::backend::{Backend, BackendError, OpIo, RowsUpload};
use crate::graph::{Op, Prologue};

/// A buffer a step reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufId {
    /// The model's weight buffer `i`.
    Weight(usize),
    /// The plan's activation buffer `i`.
    Act(usize),
    /// Layer `i`'s K cache.
    KvK(usize),
    /// Layer `i`'s V cache.
    KvV(usize),
}

/// One op and its buffers, in the order its [`Op`] variant documents.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The op.
    pub op: Op,
    /// Inputs.
    pub inputs: Vec<BufId>,
    /// Outputs.
    pub outputs: Vec<BufId>,
}

/// The host data a step uploads, by what it is: each is u32 values, and
/// its size is the step's (a plan sizes the buffer from the data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Input {
    /// The token ids, `[tokens]`.
    TokenIds,
    /// Each token's position, `[tokens]`.
    Positions,
    /// Each token's flat K/V slot (`block * block_size + offset`), `[tokens]`.
    Slots,
    /// Per sequence: first row, tokens, start position, offset of its block
    /// table, `[n_seq, 4]`.
    Seqs,
    /// The block tables of every sequence, concatenated.
    BlockTables,
    /// The rows whose logits the step reads back, `[logits rows]`.
    LogitRows,
    /// The residual stream entering the plan's first block, f32 bits
    /// `[tokens, n_embd]`: the host's output, where the host runs the
    /// blocks before (a layer split, [`crate::model::load::LoadOptions::gpu_layers`]).
    Hidden,
}

impl Input {
    /// Every input, in [`StepInputs`]' order.
    pub const ALL: [Input; 7] = [
        Input::TokenIds,
        Input::Positions,
        Input::Slots,
        Input::Seqs,
        Input::BlockTables,
        Input::LogitRows,
        Input::Hidden,
    ];

    fn index(self) -> usize {
        self as usize
    }
}

/// The host data of one step: the values of each [`Input`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepInputs {
    data: [Vec<u32>; Input::ALL.len()],
}

impl StepInputs {
    /// Sets the values of `input`.
    pub fn set(&mut self, input: Input, values: Vec<u32>) {
        self.data[input.index()] = values;
    }

    /// The values of `input`.
    pub fn get(&self, input: Input) -> &[u32] {
        &self.data[input.index()]
    }
}

/// An activation buffer of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActBuf {
    /// Size in bytes (for an input: none in the plan; the step's data says).
    pub bytes: u64,
    /// The host input uploaded into it before the first step, if any.
    pub input: Option<Input>,
}

/// Why a plan stops for the host mid-step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// The routes of MoE layer `layer` ([`Op::MoeTopK`]'s ids and weights,
    /// and the layer's FFN input when the host computes experts) are read
    /// back, so that the expert store can make the routed experts resident
    /// before the layer's experts run; the host may rewrite the ids (to
    /// the device slots that hold the experts).
    MoeRoutes {
        /// The layer.
        layer: usize,
    },
    /// MoE layer `layer`'s experts are submitted to the device; the host
    /// writes its share of the layer's output (the experts it computed
    /// itself, zeros when none) while they run.
    MoeHostPart {
        /// The layer.
        layer: usize,
    },
    /// The blocks `first..end` are written into the device buffers they
    /// run from, whose earlier blocks' work is recorded before the stop
    /// (streamed blocks, [`crate::model::stream`]).
    StreamBlocks {
        /// The first block written.
        first: usize,
        /// The block after the last.
        end: usize,
    },
    /// Block `layer`'s partial attention output (`ffn` false) or FFN
    /// output (`ffn` true) of a tensor-parallel shard is read back, and
    /// the sum over every shard written in its place
    /// ([`crate::model::shard`]).
    AllReduce {
        /// The block.
        layer: usize,
        /// The FFN's output (else the attention's).
        ffn: bool,
    },
    /// MoE layer `layer`'s routes ([`Op::MoeTopK`]'s ids and weights) are
    /// read back by an expert-parallel shard and written as its own: the
    /// ids of the experts it holds made local, every other route's id set
    /// past them (left out, as an expert computed elsewhere is) and its
    /// weight 0: its share of the layer's output is then the shard's
    /// experts' alone, and the all-reduce after adds the others'.
    ExpertShard {
        /// The layer.
        layer: usize,
    },
}

/// A point where a plan stops for the host: the steps before `before` are
/// submitted, the buffers `read` read back and handed to the host
/// ([`HostSync`]), the host's writes into `write` (and the model's weights)
/// made, then the rest runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncPoint {
    /// The first step after the stop.
    pub before: usize,
    /// Activation buffers read back, in order.
    pub read: Vec<usize>,
    /// Activation buffers the host may write, in order
    /// ([`HostWrite::Act`]'s `index` is a position in this list).
    pub write: Vec<usize>,
    /// What the host does with them.
    pub kind: SyncKind,
}

/// What the host writes at a sync point before the rest of the plan runs,
/// in order (a backend's queue keeps that order against the steps
/// submitted before and after).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostWrite<'a> {
    /// `bytes` at the start of the sync point's `write[index]` buffer.
    Act {
        /// Position in [`SyncPoint::write`].
        index: usize,
        /// The bytes.
        bytes: Cow<'a, [u8]>,
    },
    /// Whole rows `first_row..` of the model's weight buffer `weight` (as
    /// the GGUF file stores them; [`Backend::upload_weight_rows`]).
    WeightRows {
        /// The weight buffer ([`BufId::Weight`]).
        weight: usize,
        /// Its type.
        ty: crate::quant::GgmlType,
        /// Values per row.
        cols: usize,
        /// The first row written.
        first_row: usize,
        /// The rows.
        bytes: Cow<'a, [u8]>,
    },
    /// Weight rows packed by the backend ([`Backend::pack_weight_rows`]),
    /// at `offset` in the model's weight buffer `weight`.
    PackedRows {
        /// The weight buffer ([`BufId::Weight`]).
        weight: usize,
        /// Its type.
        ty: crate::quant::GgmlType,
        /// Values per row.
        cols: usize,
        /// Where the bytes go in the buffer.
        offset: u64,
        /// The bytes.
        bytes: Cow<'a, [u8]>,
    },
}

/// The ops of one forward pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Activation buffers.
    pub acts: Vec<ActBuf>,
    /// Steps, in order.
    pub steps: Vec<Step>,
    /// The buffer read back at the end and its size, if any.
    pub result: Option<(usize, u64)>,
    /// Where the plan stops for the host, in step order.
    pub syncs: Vec<SyncPoint>,
}

impl Plan {
    /// A new activation buffer of `bytes` (contents unspecified: write it
    /// before reading it; see [`crate::backend::Backend::step_buffers`]).
    pub fn act(&mut self, bytes: usize) -> BufId {
        self.acts.push(ActBuf {
            bytes: bytes as u64,
            input: None,
        });
        BufId::Act(self.acts.len() - 1)
    }

    /// An activation buffer holding the step's `input`.
    pub fn input(&mut self, input: Input) -> BufId {
        self.acts.push(ActBuf {
            bytes: 0,
            input: Some(input),
        });
        BufId::Act(self.acts.len() - 1)
    }

    /// Appends a step.
    pub fn push(&mut self, op: Op, inputs: &[BufId], outputs: &[BufId]) {
        self.steps.push(Step {
            op,
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
        });
    }

    /// Stops after the steps so far to read `read` back for the host,
    /// which may then write `write`.
    pub fn sync(&mut self, read: &[BufId], write: &[BufId], kind: SyncKind) {
        let acts = |bufs: &[BufId]| {
            bufs.iter()
                .filter_map(|b| match *b {
                    BufId::Act(i) => Some(i),
                    _ => None,
                })
                .collect()
        };
        self.syncs.push(SyncPoint {
            before: self.steps.len(),
            read: acts(read),
            write: acts(write),
            kind,
        });
    }

    /// Rows of `width` values a buffer of the plan holds (0 for an input
    /// or a buffer of the model).
    pub fn rows_of(&self, b: BufId, width: usize) -> usize {
        match b {
            BufId::Act(i) => self
                .acts
                .get(i)
                .map_or(0, |a| a.bytes as usize / 4 / width.max(1)),
            _ => 0,
        }
    }

    /// Replaces the result (rows of `width` f32 logits) by the argmax of
    /// each row (u32), computed on the device: a greedy step then reads
    /// back 4 bytes per row instead of the logits.
    pub fn argmax_result(&mut self, width: usize) {
        let Some((i, n)) = self.result else {
            return;
        };
        let rows = n as usize / 4 / width.max(1);
        let out = self.act(rows * 4);
        self.push(Op::Argmax { width }, &[BufId::Act(i)], &[out]);
        if let BufId::Act(o) = out {
            self.result = Some((o, (rows * 4) as u64));
        }
    }

    /// Replaces the result (rows of `width` f32 logits) by the `k` best
    /// `(index, value)` pairs of each row ([`Op::TopK`]), computed on the
    /// device: a sampled step then reads back `8 k` bytes per row.
    pub fn top_k_result(&mut self, width: usize, k: usize) {
        let Some((i, n)) = self.result else {
            return;
        };
        let rows = n as usize / 4 / width.max(1);
        let bytes = rows * k * 8;
        let out = self.act(bytes);
        self.push(Op::TopK { width, k }, &[BufId::Act(i)], &[out]);
        if let BufId::Act(o) = out {
            self.result = Some((o, bytes as u64));
        }
    }

    /// Checks that every step has the buffers its op takes and that every
    /// buffer exists (`weights`, `layers`: what the model holds).
    pub fn check(&self, weights: usize, layers: usize) -> Result<(), BackendError> {
        let exists = |b: &BufId| match *b {
            BufId::Weight(i) => i < weights,
            BufId::Act(i) => i < self.acts.len(),
            BufId::KvK(i) | BufId::KvV(i) => i < layers,
        };
        for (i, s) in self.steps.iter().enumerate() {
            let (ins, outs) = arity(&s.op);
            if !ins.contains(&s.inputs.len()) || s.outputs.len() != outs {
                return Err(BackendError::Shape(format!(
                    "step {i} ({:?}) has {} inputs and {} outputs; it takes {ins:?} and {outs}",
                    s.op,
                    s.inputs.len(),
                    s.outputs.len()
                )));
            }
            if let Some(b) = s.inputs.iter().chain(&s.outputs).find(|b| !exists(b)) {
                return Err(BackendError::Shape(format!(
                    "step {i} ({:?}) refers to {b:?}, which the model does not hold",
                    s.op
                )));
            }
        }
        let bad_sync = self.syncs.iter().enumerate().find(|(i, s)| {
            s.before > self.steps.len()
                || s.read.iter().chain(&s.write).any(|&r| r >= self.acts.len())
                || (*i > 0 && self.syncs[i - 1].before > s.before)
        });
        if let Some((_, s)) = bad_sync {
            return Err(BackendError::Shape(format!(
                "sync point {s:?} is out of order or refers to a buffer the plan does not have"
            )));
        }
        match self.result {
            Some((i, n)) if i >= self.acts.len() || n > self.acts[i].bytes => Err(
                BackendError::Shape(format!("result buffer {i} ({n} bytes) is not in the plan")),
            ),
            _ => Ok(()),
        }
    }

    /// The byte size of each activation buffer for a step with `inputs`.
    pub fn sizes(&self, inputs: &StepInputs) -> Vec<u64> {
        self.acts
            .iter()
            .map(|a| match a.input {
                Some(i) => inputs.get(i).len() as u64 * 4,
                None => a.bytes,
            })
            .collect()
    }
}

/// Inputs (allowed counts) and outputs an op takes.
pub fn arity(op: &Op) -> (std::ops::RangeInclusive<usize>, usize) {
    match op {
        Op::GetRows { .. } | Op::MatMul { .. } | Op::RmsNorm { .. } => (2..=2, 1),
        Op::Rope { .. } => (2..=3, 1),
        Op::Add | Op::Mul | Op::BiasAdd | Op::SiluMul | Op::GeluTanhMul => (2..=2, 1),
        Op::Scale(_) | Op::Softmax { .. } | Op::LogitSoftcap(_) => (1..=1, 1),
        Op::Argmax { .. } | Op::TopK { .. } => (1..=1, 1),
        Op::KvWrite { .. } => (3..=3, 2),
        Op::PagedAttention { .. } => (5..=5, 1),
        Op::MoeTopK { .. } => (1..=1, 2),
        Op::MoeExperts { .. } => (6..=6, 1),
        Op::FusedMatMul { pre, parts, .. } => {
            let (ins, outs) = Prologue::arity(*pre);
            let n = ins + parts.len();
            (n..=n, outs + parts.len())
        }
        Op::RopeKvWrite { .. } => (5..=6, 4),
    }
}

/// The model-held buffers a plan refers to.
#[derive(Debug)]
pub struct Held<'a, Buf> {
    /// Weights, by [`BufId::Weight`] index.
    pub weights: &'a [Buf],
    /// Per layer: K and V caches.
    pub kv: &'a [[Buf; 2]],
}

/// The future of [`HostSync::at_sync`]: what the host writes before the
/// rest of the plan runs (not `Send`: browser GPU handles are not).
pub type SyncFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<HostWrite<'a>>, BackendError>> + 'a>>;

/// What the host does at a plan's sync points.
pub trait HostSync {
    /// Acts on the buffers read back at `point` (`data[i]`: the bytes of
    /// `point.read[i]`) before the rest of the plan runs, and says what to
    /// write first.
    fn at_sync<'a>(&'a mut self, point: &'a SyncPoint, data: Vec<Vec<u8>>) -> SyncFuture<'a>;
}

/// The host of a plan without sync points: stopping is an error.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSync;

impl HostSync for NoSync {
    fn at_sync<'a>(&'a mut self, point: &'a SyncPoint, _: Vec<Vec<u8>>) -> SyncFuture<'a> {
        let e = BackendError::Shape(format!("the plan stops at {point:?}, which nothing serves"));
        Box::pin(std::future::ready(Err(e)))
    }
}

/// Runs `plan` on `backend` with the step's `inputs`, op by op (the
/// default [`Backend::run_plan`]): allocates and uploads its activations,
/// records every step, stops at each sync point for `host`, submits, and
/// reads back the result buffer (empty when none). The plan's shape is
/// checked against `held` here; whether the backend runs each op is
/// checked once, where the plan is made for it (a refused op still fails,
/// at its record).
pub async fn execute<B: Backend>(
    backend: &mut B,
    plan: &Plan,
    inputs: &StepInputs,
    held: &Held<'_, B::Buffer>,
    host: &mut dyn HostSync,
) -> Result<Vec<u8>, BackendError> {
    plan.check(held.weights.len(), held.kv.len())?;
    let sizes = plan.sizes(inputs);
    let acts = backend.step_buffers(&sizes)?;
    for (a, buf) in plan.acts.iter().zip(&acts) {
        if let Some(input) = a.input {
            backend.upload(buf, 0, bytemuck::cast_slice(inputs.get(input)))?;
        }
    }
    let get = |b: &BufId| -> &B::Buffer {
        match *b {
            BufId::Weight(i) => &held.weights[i],
            BufId::Act(i) => &acts[i],
            BufId::KvK(i) => &held.kv[i][0],
            BufId::KvV(i) => &held.kv[i][1],
        }
    };
    let mut syncs = plan.syncs.iter().peekable();
    for (i, s) in plan.steps.iter().enumerate() {
        while let Some(point) = syncs.next_if(|p| p.before == i) {
            let _span = crate::trace::span(crate::trace::Track::Host, "host sync");
            let data = read_back(backend, point, &acts, &sizes).await?;
            let writes = host.at_sync(point, data).await?;
            apply_writes(&*backend, point, &writes, &acts, held.weights)?;
        }
        let inputs: Vec<&B::Buffer> = s.inputs.iter().map(get).collect();
        let outputs: Vec<&B::Buffer> = s.outputs.iter().map(get).collect();
        let _span = crate::trace::span(crate::trace::Track::Host, s.op.name());
        backend.record(
            &s.op,
            &OpIo {
                inputs: &inputs,
                outputs: &outputs,
            },
        )?;
    }
    if let Some(point) = syncs.next() {
        return Err(BackendError::Shape(format!(
            "sync point {point:?} is past the plan's steps"
        )));
    }
    let _span = crate::trace::span(crate::trace::Track::Host, "submit + read back");
    match plan.result {
        Some((i, n)) => backend.submit_read(&acts[i], 0..n).await,
        None => {
            backend.submit()?;
            Ok(Vec::new())
        }
    }
}

/// Makes the host's `writes` at `point` into the step's `acts` and the
/// model's `weights`.
pub fn apply_writes<B: Backend>(
    backend: &B,
    point: &SyncPoint,
    writes: &[HostWrite<'_>],
    acts: &[B::Buffer],
    weights: &[B::Buffer],
) -> Result<(), BackendError> {
    // Runs of weight rows go to the backend together (a slot fill is
    // three, a step's fills many).
    let mut runs: Vec<RowsUpload<'_, B::Buffer>> = Vec::new();
    for w in writes {
        match w {
            HostWrite::Act { index, bytes } => {
                backend.upload_weight_rows_many(&runs)?;
                runs.clear();
                let buf = point
                    .write
                    .get(*index)
                    .and_then(|&a| acts.get(a))
                    .ok_or_else(|| {
                        BackendError::Shape(format!(
                            "the host writes buffer {index} of {point:?}, which it does not list"
                        ))
                    })?;
                backend.upload(buf, 0, bytes)?;
            }
            HostWrite::WeightRows {
                weight,
                ty,
                cols,
                first_row,
                bytes,
            } => runs.push(RowsUpload {
                dst: weight_buf(weights, *weight)?,
                ty: *ty,
                cols: *cols,
                first_row: *first_row,
                src: bytes,
                packed_at: None,
            }),
            HostWrite::PackedRows {
                weight,
                ty,
                cols,
                offset,
                bytes,
            } => runs.push(RowsUpload {
                dst: weight_buf(weights, *weight)?,
                ty: *ty,
                cols: *cols,
                first_row: 0,
                src: bytes,
                packed_at: Some(*offset),
            }),
        }
    }
    backend.upload_weight_rows_many(&runs)
}

/// The model's weight buffer `i`, which a host write names.
fn weight_buf<Buf>(weights: &[Buf], i: usize) -> Result<&Buf, BackendError> {
    weights.get(i).ok_or_else(|| {
        BackendError::Shape(format!(
            "the host writes weight {i}, which the model does not hold"
        ))
    })
}

/// Submits what was recorded and reads back the buffers of `point`
/// (`sizes`: the plan's activation sizes); with nothing to read, only
/// submits, so the device works while the host does.
async fn read_back<B: Backend>(
    backend: &mut B,
    point: &SyncPoint,
    acts: &[B::Buffer],
    sizes: &[u64],
) -> Result<Vec<Vec<u8>>, BackendError> {
    if point.read.is_empty() {
        backend.submit()?;
        return Ok(Vec::new());
    }
    let mut data = Vec::with_capacity(point.read.len());
    for (j, &r) in point.read.iter().enumerate() {
        let (buf, len) = (&acts[r], sizes[r]);
        let bytes = if j == 0 {
            backend.submit_read(buf, 0..len).await?
        } else {
            backend.download(buf, 0..len).await?
        };
        data.push(bytes);
    }
    Ok(data)
}
