//! Fusion of neighbouring ops into one dispatch, where a decode step's
//! layers pay a launch (and a barrier) per dispatch: a rope or a residual
//! add is held back until the next op is recorded, and
//! - the rope of k at the positions of the rope of q joins it;
//! - an RMS norm of the add's result is done with the add
//!   (`add_rms_norm.wgsl`, which writes both).
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
            None => Ok(()),
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
    ]
}
