//! Fusion of neighbouring ops into one dispatch, where a decode step's
//! layers pay a launch (and a barrier) per dispatch: a rope or a residual
//! add is held back until the next op is recorded, and
//! - the rope of k at the positions of the rope of q joins it;
//! - an RMS norm of the add's result is done with the add
//!   (`rms_norm.wgsl` with its add, which writes both);
//! - an RMS norm (with its add, if any) is offered to the next matrix
//!   product: when that product quantizes its activations to int8, the
//!   norm's workgroups quantize the rows they normed
//!   (`norm_quantize.wgsl`), one dispatch fewer;
//! - a gated activation (SwiGLU, GeGLU) is offered to the next matrix
//!   product: when that product quantizes it to int8, the quantizer
//!   computes the activation itself (`matmul_quantize_x_gated.wgsl`,
//!   which also writes the op's result); otherwise the activation is
//!   queued just before the product's first dispatch.
//!
//! Anything else first queues what is held, so the order of the dispatches
//! is the order of the ops.

use super::backend::{Bind, Dispatch, WebGpuBackend};
use super::buffer::GpuBuffer;
use super::shader::{ConstValue, PipelineKey};
use crate::backend::{Backend, BackendError, BufKind};

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

/// An op recorded but not yet queued.
#[derive(Debug)]
pub enum Held {
    /// A rope.
    Rope(RopeJob),
    /// A residual add `out = x + y` of `n` values each.
    Add {
        /// The binary kernel's key.
        key: PipelineKey,
        /// x, y, out.
        bufs: [GpuBuffer; 3],
        /// Values.
        n: u64,
    },
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
    /// Queues what is held, if anything.
    pub(super) fn emit_held(&mut self) -> Result<(), BackendError> {
        match self.held.take() {
            Some(Held::Rope(job)) => self.emit_rope(job, None),
            Some(Held::Add { key, bufs, n }) => {
                let [x, y, out] = &bufs;
                let params = vec![n as u32, n as u32, 0, 0];
                self.queue(
                    &key,
                    super::ops::BINARY,
                    params,
                    &[x, y, out],
                    n as u32,
                    WG_ELEM,
                );
                Ok(())
            }
            Some(Held::Gated(job)) => {
                self.emit_gated(job);
                Ok(())
            }
            Some(Held::Norm(job)) => {
                self.emit_norm(job);
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Queues the norm `job` on its own (with its add, if any).
    fn emit_norm(&mut self, job: NormJob) {
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
            Some(other) => {
                self.held = Some(other);
                let _ = self.emit_held();
            }
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

    /// Holds `job` (after queueing what was held).
    pub(super) fn hold_gated(&mut self, job: GatedJob) -> Result<(), BackendError> {
        self.emit_held()?;
        self.held = Some(Held::Gated(job));
        Ok(())
    }

    /// Before a matrix product: offers a held gated activation or norm
    /// to its activation quantizer ([`Self::take_offer`]); anything else
    /// held is queued.
    pub(super) fn offer_held(&mut self) -> Result<(), BackendError> {
        if let Some(Held::Gated(_) | Held::Norm(_)) = &self.held {
            self.offer = self.held.take();
            return Ok(());
        }
        self.emit_held()
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

    /// Holds the RMS norm of `x` (`shape` = rows, width, eps) into `out`,
    /// taking in the held add if that add wrote `x`.
    pub(super) fn hold_norm(
        &mut self,
        bufs: [GpuBuffer; 3],
        shape: (u32, u32, f32),
    ) -> Result<(), BackendError> {
        // First, so that a failure leaves what is held as it was.
        let spare = self.unused_buffer()?;
        let n = u64::from(shape.0) * u64::from(shape.1);
        let fits = matches!(&self.held, Some(Held::Add { bufs: add, n: an, .. })
            if add[2].raw == bufs[0].raw && *an == n);
        let add = if fits {
            match self.held.take() {
                Some(Held::Add {
                    bufs: [a, b, _], ..
                }) => Some([a, b]),
                _ => None,
            }
        } else {
            self.emit_held()?;
            None
        };
        self.held = Some(Held::Norm(NormJob {
            add,
            bufs,
            shape,
            spare,
        }));
        Ok(())
    }

    /// Holds `job`, or queues it with the held rope it joins.
    pub(super) fn hold_rope(&mut self, job: RopeJob) -> Result<(), BackendError> {
        if let Some(Held::Rope(prev)) = &self.held {
            if prev.joins(&job) {
                let Some(Held::Rope(prev)) = self.held.take() else {
                    return Ok(());
                };
                return self.emit_rope(prev, Some(job));
            }
        }
        self.emit_held()?;
        self.held = Some(Held::Rope(job));
        Ok(())
    }

    /// Holds the add `out = x + y` (`n` values each), after queueing what
    /// was held.
    pub(super) fn hold_add(
        &mut self,
        key: PipelineKey,
        bufs: [GpuBuffer; 3],
        n: u64,
    ) -> Result<(), BackendError> {
        self.emit_held()?;
        self.held = Some(Held::Add { key, bufs, n });
        Ok(())
    }

    /// Queues rope `a`, and `b` in the same dispatch if given.
    fn emit_rope(&mut self, a: RopeJob, b: Option<RopeJob>) -> Result<(), BackendError> {
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
    fn queue(
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
