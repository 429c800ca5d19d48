//! [`CpuModel`]: the generic [`Model`] on the [`CpuBackend`].

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use super::CpuBackend;
use crate::backend::{Backend, BackendError};
use crate::model::generic::Model;
use crate::model::Batch;

/// A model loaded for the CPU backend, with its K/V cache.
///
/// Built by [`crate::model::load::load_cpu_model`].
pub type CpuModel = Model<CpuBackend>;

impl Model<CpuBackend> {
    /// Threads the model runs on.
    pub fn threads(&self) -> usize {
        self.backend.caps().threads
    }

    /// The forward pass (synchronous: the CPU never waits on a device, so
    /// its future is ready on the first poll).
    pub fn forward_sync(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>> {
        let mut fut = pin!(self.run(batch));
        match fut.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(r) => r,
            Poll::Pending => Err(BackendError::UnsupportedOp(
                "a CPU forward pass waited on a device; report this as a bug".into(),
            )
            .into()),
        }
    }

    /// Turns the fusion of neighbouring ops on (natively the default) or
    /// off (see [`CpuBackend::set_fusion`]): the results are the same
    /// either way.
    pub fn set_fusion(&mut self, on: bool) {
        self.backend.set_fusion(on);
    }
}
