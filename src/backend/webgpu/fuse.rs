//! Fusion of neighbouring ops into one dispatch, where a decode step's
//! layers pay a launch (and a barrier) per dispatch: a rope or a residual
//! add is held back until the next op is recorded, and
//! - the rope of k at the positions of the rope of q joins it;
//! - an RMS norm of the add's result is done with the add
//!   (`add_rms_norm.wgsl`, which writes both);
//! - a gated activation (SwiGLU, GeGLU) is offered to the next matrix
//!   product: when that product quantizes it to int8, the quantizer
//!   computes the activation itself (`matmul_quantize_x_gated.wgsl`,
//!   which also writes the op's result); otherwise the activation is
//!   queued just before the product's first dispatch.
//!
//! Anything else first queues what is held, so the order of the dispatches
//! is the order of the ops.

use super::backend::WebGpuBackend;
use super::buffer::GpuBuffer;
use super::shader::{ConstValue, PipelineKey};
use crate::backend::{Backend, BackendError, BufKind};

/// The fused add and RMS norm kernel.
pub const ADD_RMS_NORM: &str = include_str!("../../../shaders/add_rms_norm.wgsl");
/// The rope kernel (one or two tensors).
pub const ROPE: &str = include_str!("../../../shaders/rope.wgsl");
/// The gated activation kernel.
pub const GATED: &str = include_str!("../../../shaders/gated.wgsl");
/// The gated activation fused into the int8 activation quantizer (with the
/// quantized kernels' parameter struct).
pub const QUANTIZE_X_GATED: &str = concat!(
    include_str!("../../../shaders/matmul_params.wgsl"),
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
            None => Ok(()),
        }
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

    /// Before a matrix product: offers a held gated activation to its
    /// activation quantizer ([`Self::take_offer`]); anything else held is
    /// queued.
    pub(super) fn offer_held(&mut self) -> Result<(), BackendError> {
        if let Some(Held::Gated(_)) = &self.held {
            if let Some(Held::Gated(job)) = self.held.take() {
                self.offer = Some(job);
            }
            return Ok(());
        }
        self.emit_held()
    }

    /// The offered gated activation, if it wrote exactly the `m x k`
    /// activations `x` from its start.
    pub(super) fn take_offer(
        &mut self,
        x: &wgpu::Buffer,
        x_off: u64,
        m: u64,
        k: u64,
    ) -> Option<GatedJob> {
        let fits = self.offer.as_ref().is_some_and(|g| {
            g.bufs[2].raw == *x && x_off == 0 && g.n == m * k && k.is_multiple_of(32)
        });
        if fits {
            self.offer.take()
        } else {
            None
        }
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

    /// The RMS norm of `x` (`rows` rows of `width`) into `out`, fused with
    /// the held add if that add wrote `x`: returns whether it was.
    pub(super) fn add_norm(
        &mut self,
        x: &GpuBuffer,
        w: &GpuBuffer,
        out: &GpuBuffer,
        (rows, width, eps): (u32, u32, f32),
    ) -> Result<bool, BackendError> {
        let fits = matches!(&self.held, Some(Held::Add { bufs, n, .. })
            if bufs[2].raw == x.raw && *n == u64::from(rows) * u64::from(width));
        if !fits {
            self.emit_held()?;
            return Ok(false);
        }
        let Some(Held::Add { bufs, .. }) = self.held.take() else {
            return Ok(false);
        };
        let [a, b, sum] = &bufs;
        let key = PipelineKey::new("add_rms_norm", super::ops::WG_ROW, &self.ctx.caps);
        let params = vec![rows, width, eps.to_bits(), 0];
        self.queue(&key, ADD_RMS_NORM, params, &[a, b, w, sum, out], rows, 1);
        Ok(true)
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
    fn unused_buffer(&mut self) -> Result<GpuBuffer, BackendError> {
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
        ("add_rms_norm", ADD_RMS_NORM, vec![]),
        ("rope", ROPE, vec![("MODE", ConstValue::U32(0))]),
        ("gated", GATED, vec![("MODE", ConstValue::U32(1))]),
        (
            "quantize_x_gated",
            QUANTIZE_X_GATED,
            vec![("MODE", ConstValue::U32(1))],
        ),
    ]
}
