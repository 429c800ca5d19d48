//! The fused ops of the plan ([`crate::graph::fuse`]) in as few
//! dispatches as the kernels allow, where a decode step's layers pay a
//! launch (and a barrier) per dispatch:
//! - [`Op::RopeKvWrite`]: the ropes of q and k in one dispatch (`rope.wgsl`
//!   over two tensors), then the K/V write;
//! - [`Op::FusedMatMul`]: its prologue (an RMS norm with its residual add,
//!   `rms_norm.wgsl` writing both, or a gated activation) is offered to the
//!   products: when they quantize their activations to int8, the
//!   quantizer's dispatch does the prologue too (`norm_quantize.wgsl`,
//!   `matmul_quantize_x_gated.wgsl`, which also write the prologue's
//!   result); otherwise the prologue is queued just before the first
//!   product. One-token products of one input whose weights lie side by
//!   side join into one dispatch (the `quant` module).
//!
//! The offer lives only while the fused op records: no state crosses ops.

use super::backend::{Bind, Dispatch, WebGpuBackend};
use super::buffer::GpuBuffer;
use super::ops::nth;
use super::shader::{ConstValue, PipelineKey};
use crate::backend::{part_buffers, Backend, BackendError, BufKind, OpIo};
use crate::graph::fuse::expand;
use crate::graph::{Activation, Op, Prologue};

/// An RMS norm (of an add's sum or not) fused with the int8 quantizer
/// (after the row kernels' shared part and the quantizer).
pub const NORM_QUANTIZE: &str = concat!(
    include_str!("../../../shaders/norm_row.wgsl"),
    "\n",
    include_str!("../../../shaders/quantize_q8.wgsl"),
    "\n",
    include_str!("../../../shaders/norm_quantize.wgsl")
);
/// The rope kernel (one or two tensors).
pub const ROPE: &str = include_str!("../../../shaders/rope.wgsl");
/// The gated activation kernel.
pub const GATED: &str = include_str!("../../../shaders/gated.wgsl");
/// The gated activation fused into the int8 activation quantizer (with the
/// quantized kernels' parameter struct and the quantizer).
pub const QUANTIZE_X_GATED: &str = concat!(
    include_str!("../../../shaders/matmul_params.wgsl"),
    "\n",
    include_str!("../../../shaders/quantize_q8.wgsl"),
    "\n",
    include_str!("../../../shaders/matmul_quantize_x_gated.wgsl")
);

/// Workgroup size of element-wise kernels (as `ops`).
const WG_ELEM: u32 = 256;

/// A fused product's prologue, offered to its activation quantizer.
#[derive(Debug)]
pub enum Held {
    /// A gated activation.
    Gated(GatedJob),
    /// An RMS norm, of a residual add's sum if `add`.
    Norm(NormJob),
}

/// An RMS norm `out = rms_norm(x) * w` of `rows` rows of `width`; with
/// `add` = (a, b), x is the sum a + b, written to x first.
#[derive(Debug)]
pub struct NormJob {
    /// The summands, when the norm is of a residual add's sum.
    pub add: Option<[GpuBuffer; 2]>,
    /// x (the sum's buffer with `add`), w, out.
    pub bufs: [GpuBuffer; 3],
    /// Rows, width, eps.
    pub shape: (u32, u32, f32),
    /// A small buffer for the kernels' bindings the job leaves unused.
    pub spare: GpuBuffer,
}

impl NormJob {
    /// The norm kernels' a, b, sum and their `add` parameter: the
    /// summands and the sum's buffer, or x and the spare buffer.
    fn inputs(&self) -> ([&GpuBuffer; 3], u32) {
        match &self.add {
            Some([a, b]) => ([a, b, &self.bufs[0]], 1),
            None => ([&self.bufs[0], &self.spare, &self.spare], 0),
        }
    }
}

/// A gated activation `out = act(gate) * up` of `n` values.
#[derive(Debug)]
pub struct GatedJob {
    /// 0: SiLU, 1: GELU-tanh (the kernels' `MODE`).
    pub mode: u32,
    /// gate, up, out.
    pub bufs: [GpuBuffer; 3],
    /// Values.
    pub n: u64,
}

/// A rope: its kernel, parameters and buffers.
#[derive(Debug)]
pub struct RopeJob {
    /// The kernel's key.
    pub key: PipelineKey,
    /// The kernel's parameters (`width2` 0).
    pub params: Vec<u32>,
    /// x, positions, factors (or positions), out.
    pub bufs: [GpuBuffer; 4],
    /// Invocations.
    pub pairs: u64,
}

impl RopeJob {
    /// Whether `next` can run in the same dispatch: the same rotation at
    /// the same positions, on other buffers than `self` reads or writes.
    fn joins(&self, next: &RopeJob) -> bool {
        let same = |i: usize| self.params[i] == next.params[i];
        let ours = [&self.bufs[0].raw, &self.bufs[3].raw];
        self.key == next.key
            && (0..8).filter(|&i| i != 1).all(same)
            && self.bufs[1].raw == next.bufs[1].raw
            && self.bufs[2].raw == next.bufs[2].raw
            && !ours.contains(&&next.bufs[0].raw)
            && !ours.contains(&&next.bufs[3].raw)
    }
}

impl WebGpuBackend {
    /// Queues the norm `job` on its own (with its add, if any).
    pub(super) fn emit_norm(&mut self, job: NormJob) {
        let (rows, width, eps) = job.shape;
        let ([a, b, sum], add) = job.inputs();
        let [_, w, out] = &job.bufs;
        let params = vec![rows, width, eps.to_bits(), add];
        let key = PipelineKey::new("rms_norm", super::ops::norm_wg(width), &self.ctx.caps);
        let src = super::ops::RMS_NORM;
        self.queue(&key, src, params, &[a, b, w, sum, out], rows, 1);
    }

    /// Queues what was offered to a matrix product and not taken.
    pub(super) fn emit_offer(&mut self) {
        match self.offer.take() {
            Some(Held::Gated(job)) => self.emit_gated(job),
            Some(Held::Norm(job)) => self.emit_norm(job),
            None => {}
        }
    }

    /// The norm fused with the int8 quantization of its result into
    /// `xq` / `xs` (what the product's quantizer would write).
    pub(super) fn emit_norm_quantize(
        &mut self,
        job: NormJob,
        xq: &wgpu::Buffer,
        xs: &wgpu::Buffer,
    ) {
        let (rows, width, eps) = job.shape;
        let ([a, b, sum], add) = job.inputs();
        let [_, w, out] = &job.bufs;
        let caps = &self.ctx.caps;
        let key = PipelineKey::new("norm_quantize", super::ops::norm_wg(width), caps)
            .with_subgroups(caps.quad_subgroups());
        let pipeline = self.pipeline(&key, &[NORM_QUANTIZE]);
        let mut binds: Vec<Bind> = [a, b, w, sum, out].iter().map(|b| Bind::whole(b)).collect();
        binds.push(Bind::whole_raw(xq.clone()));
        binds.push(Bind::whole_raw(xs.clone()));
        let d = Dispatch {
            pipeline,
            params: vec![rows, width, eps.to_bits(), add],
            binds,
            groups: self.grid(rows),
        };
        self.enqueue(d);
    }

    /// Queues the gated activation `job` on its own.
    pub(super) fn emit_gated(&mut self, job: GatedJob) {
        let key = PipelineKey::new("gated", WG_ELEM, &self.ctx.caps)
            .with_const("MODE", ConstValue::U32(job.mode));
        let [g, u, out] = &job.bufs;
        let params = vec![job.n as u32, 0, 0, 0];
        self.queue(&key, GATED, params, &[g, u, out], job.n as u32, WG_ELEM);
    }

    /// The offered gated activation or norm, if it wrote exactly the
    /// `m x k` activations `x` from its start (a norm: rows of `k`).
    pub(super) fn take_offer(
        &mut self,
        x: &wgpu::Buffer,
        x_off: u64,
        m: u64,
        k: u64,
    ) -> Option<Held> {
        let fits = x_off == 0
            && k.is_multiple_of(32)
            && match &self.offer {
                Some(Held::Gated(g)) => g.bufs[2].raw == *x && g.n == m * k,
                Some(Held::Norm(n)) => {
                    let (rows, width, _) = n.shape;
                    n.bufs[2].raw == *x && u64::from(rows) == m && u64::from(width) == k
                }
                _ => false,
            };
        if fits {
            self.offer.take()
        } else {
            None
        }
    }

    /// Queues rope `a`, and `b` in the same dispatch if given.
    pub(super) fn emit_rope(&mut self, a: RopeJob, b: Option<RopeJob>) -> Result<(), BackendError> {
        let mut params = a.params.clone();
        let (x2, out2, pairs) = match &b {
            Some(b) => {
                params[7] = b.params[1];
                (b.bufs[0].clone(), b.bufs[3].clone(), a.pairs + b.pairs)
            }
            None => {
                let unused = self.unused_buffer()?;
                (unused.clone(), unused, a.pairs)
            }
        };
        let [x, pos, f, out] = &a.bufs;
        let bufs = [x, pos, f, out, &x2, &out2];
        self.queue(&a.key, ROPE, params, &bufs, pairs as u32, WG_ELEM);
        Ok(())
    }

    /// Queues `source` over `items.div_ceil(per_group)` workgroups.
    pub(super) fn queue(
        &mut self,
        key: &PipelineKey,
        source: &str,
        params: Vec<u32>,
        bufs: &[&GpuBuffer],
        items: u32,
        per_group: u32,
    ) {
        let pipeline = self.pipeline(key, &[source]);
        let d = super::backend::Dispatch {
            pipeline,
            params,
            binds: bufs
                .iter()
                .map(|b| super::backend::Bind::whole(b))
                .collect(),
            groups: self.grid(items.div_ceil(per_group)),
        };
        self.enqueue(d);
    }

    /// A small buffer bound where a kernel reads and writes nothing.
    pub(super) fn unused_buffer(&mut self) -> Result<GpuBuffer, BackendError> {
        if let Some(b) = &self.unused {
            return Ok(b.clone());
        }
        let b = self.alloc(16, BufKind::Activations)?;
        self.unused = Some(b.clone());
        Ok(b)
    }
}

impl WebGpuBackend {
    /// Records [`Op::FusedMatMul`]: the prologue offered to the products'
    /// quantizer (queued before the first product where not taken), the
    /// products, and their joined dispatch where they join.
    pub(super) fn fused_matmul(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<(), BackendError> {
        let Op::FusedMatMul { pre, k, .. } = *op else {
            return Err(BackendError::Shape(format!("{op:?}: not a fused product")));
        };
        let parts = expand(op).unwrap_or_default();
        // The prologue's parts run as the offer; the rest are products.
        let (prologue, products) = parts.split_at(parts.len() - products_of(op));
        let offer = match pre {
            Prologue::None => None,
            Prologue::Glu(act) => {
                let (g, u, out) = (
                    nth(io.inputs, 0, op)?,
                    nth(io.inputs, 1, op)?,
                    nth(io.outputs, 0, op)?,
                );
                Some(Held::Gated(self.gated_job(op, [g, u, out], act)?))
            }
            Prologue::RmsNorm { eps } | Prologue::AddRmsNorm { eps } => {
                let [.., norm] = prologue else {
                    return Err(BackendError::Shape(format!("{op:?}: no norm")));
                };
                let (ins, outs) = part_buffers(norm, io);
                let add = match pre {
                    Prologue::AddRmsNorm { .. } => Some([
                        nth(io.inputs, 0, op)?.clone(),
                        nth(io.inputs, 1, op)?.clone(),
                    ]),
                    _ => None,
                };
                let (x, w, out) = (nth(&ins, 0, op)?, nth(&ins, 1, op)?, nth(&outs, 0, op)?);
                Some(Held::Norm(self.norm_job(op, [x, w, out], k, eps, add)?))
            }
        };
        self.offer = offer;
        let mut result = Ok(());
        for part in products {
            let (inputs, outputs) = part_buffers(part, io);
            let io = OpIo {
                inputs: &inputs,
                outputs: &outputs,
            };
            result = self.record_product(&part.op, &io);
            if result.is_err() {
                break;
            }
        }
        // Not taken and nothing queued (empty products): queue it.
        self.emit_offer();
        let quant = self.quant.clone();
        result.and(quant.flush_join(self))
    }

    /// Records [`Op::RopeKvWrite`]: both ropes in one dispatch where they
    /// join, then the K/V write.
    pub(super) fn rope_kv_write(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<(), BackendError> {
        let parts = expand(op).unwrap_or_default();
        let [rq, rk, write] = parts.as_slice() else {
            return Err(BackendError::Shape(format!("{op:?}: not a fused rope")));
        };
        let job = |be: &Self, part: &crate::graph::fuse::Part| {
            let (inputs, outputs) = part_buffers(part, io);
            be.rope_job(
                &part.op,
                &OpIo {
                    inputs: &inputs,
                    outputs: &outputs,
                },
            )
        };
        let (q, k) = (job(self, rq)?, job(self, rk)?);
        if q.joins(&k) {
            self.emit_rope(q, Some(k))?;
        } else {
            self.emit_rope(q, None)?;
            self.emit_rope(k, None)?;
        }
        let (inputs, outputs) = part_buffers(write, io);
        self.kv_write(
            &write.op,
            &OpIo {
                inputs: &inputs,
                outputs: &outputs,
            },
        )
    }

    /// The norm job of `x` into `out` with weight `w` (rows of `width`),
    /// of `add`'s sum (written to `x`) when given; checked.
    pub(super) fn norm_job(
        &mut self,
        op: &Op,
        [x, w, out]: [&GpuBuffer; 3],
        width: usize,
        eps: f32,
        add: Option<[GpuBuffer; 2]>,
    ) -> Result<NormJob, BackendError> {
        let n = x.len / 4;
        if width == 0
            || !n.is_multiple_of(width as u64)
            || w.len / 4 < width as u64
            || out.len / 4 < n
        {
            return Err(BackendError::Shape(format!(
                "{op:?}: {n} values, weight of {}",
                w.len / 4
            )));
        }
        let rows = (n / width as u64) as u32;
        Ok(NormJob {
            add,
            bufs: [x, w, out].map(|b| b.clone()),
            shape: (rows, width as u32, eps),
            spare: self.unused_buffer()?,
        })
    }

    /// The gated activation job `out = act(g) * u`; checked.
    pub(super) fn gated_job(
        &self,
        op: &Op,
        [g, u, out]: [&GpuBuffer; 3],
        act: Activation,
    ) -> Result<GatedJob, BackendError> {
        let n = g.len / 4;
        if u.len / 4 != n || out.len / 4 < n {
            return Err(BackendError::Shape(format!(
                "{op:?}: gate of {n} values, up of {}",
                u.len / 4
            )));
        }
        let mode = match act {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
        };
        Ok(GatedJob {
            mode,
            bufs: [g, u, out].map(|b| b.clone()),
            n,
        })
    }
}

/// Products a fused product op has.
fn products_of(op: &Op) -> usize {
    match op {
        Op::FusedMatMul { parts, .. } => parts.len(),
        _ => 0,
    }
}

/// Kernel files of this module with the constants of one variant each.
pub fn kernel_sources() -> Vec<super::KernelSource> {
    vec![
        ("norm_quantize", NORM_QUANTIZE, vec![]),
        ("rope", ROPE, vec![("MODE", ConstValue::U32(0))]),
        ("gated", GATED, vec![("MODE", ConstValue::U32(1))]),
        (
            "quantize_x_gated",
            QUANTIZE_X_GATED,
            vec![("MODE", ConstValue::U32(1))],
        ),
    ]
}
