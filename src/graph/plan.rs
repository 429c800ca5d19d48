//! A per-step plan: the ops of one forward pass over named buffers, and the
//! generic executor that runs it on any [`Backend`].
//!
//! A plan owns no memory: it lists activation buffers (sizes in bytes, some
//! with host data to upload first) and refers to the model's weights and
//! K/V cache by index. [`execute`] allocates the activations, records every
//! step, submits once, and downloads ONE buffer (the logits rows).

use crate::backend::{Backend, BackendError, OpIo};
use crate::graph::Op;

/// A buffer a step reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// An activation buffer of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ActBuf {
    /// Size in bytes.
    pub bytes: u64,
    /// Host data uploaded before the first step (inputs: ids, positions, slots).
    pub init: Option<Vec<u8>>,
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
}

impl Plan {
    /// A new activation buffer of `bytes` (contents unspecified: write it
    /// before reading it; see [`crate::backend::Backend::step_buffers`]).
    pub fn act(&mut self, bytes: usize) -> BufId {
        self.acts.push(ActBuf {
            bytes: bytes as u64,
            init: None,
        });
        BufId::Act(self.acts.len() - 1)
    }

    /// An activation buffer uploaded from `data` (u32 values).
    pub fn input_u32(&mut self, data: &[u32]) -> BufId {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        self.acts.push(ActBuf {
            bytes: bytes.len() as u64,
            init: Some(bytes.to_vec()),
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
        match self.result {
            Some((i, n)) if i >= self.acts.len() || n > self.acts[i].bytes => Err(
                BackendError::Shape(format!("result buffer {i} ({n} bytes) is not in the plan")),
            ),
            _ => Ok(()),
        }
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

/// Runs `plan` on `backend`: allocates and uploads its activations, records
/// every step, submits, and downloads the result buffer (empty when none).
pub async fn execute<B: Backend>(
    backend: &mut B,
    plan: &Plan,
    held: &Held<'_, B::Buffer>,
) -> Result<Vec<u8>, BackendError> {
    plan.check(held.weights.len(), held.kv.len())?;
    let sizes: Vec<u64> = plan.acts.iter().map(|a| a.bytes).collect();
    let acts = backend.step_buffers(&sizes)?;
    for (a, buf) in plan.acts.iter().zip(&acts) {
        if let Some(data) = &a.init {
            backend.upload(buf, 0, data)?;
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
    if let Some(s) = plan.steps.iter().find(|s| !backend.supports(&s.op)) {
        return Err(BackendError::unsupported_op(backend.caps(), &s.op));
    }
    type Bufs<'a, T> = Vec<(Vec<&'a T>, Vec<&'a T>)>;
    let bufs: Bufs<'_, B::Buffer> = plan
        .steps
        .iter()
        .map(|s| {
            (
                s.inputs.iter().map(get).collect(),
                s.outputs.iter().map(get).collect(),
            )
        })
        .collect();
    fn io<'a, T>((inputs, outputs): &'a (Vec<&'a T>, Vec<&'a T>)) -> OpIo<'a, T> {
        OpIo { inputs, outputs }
    }
    for (i, (s, b)) in plan.steps.iter().zip(&bufs).enumerate() {
        let next = plan.steps.get(i + 1).zip(bufs.get(i + 1).map(io));
        backend.record_with_next(&s.op, &io(b), next.as_ref().map(|(n, nio)| (&n.op, nio)))?;
    }
    match plan.result {
        Some((i, n)) => backend.submit_read(&acts[i], 0..n).await,
        None => {
            backend.submit()?;
            Ok(Vec::new())
        }
    }
}
