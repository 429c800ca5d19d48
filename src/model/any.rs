//! [`AnyModel`]: a model on any backend behind one type, for the front ends
//! that choose the backend at run time (the CLI, the browser facade) and for
//! backends in other crates, which compose with the core through it.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use crate::backend::Backend;
use crate::model::generic::Model;
use crate::model::shard::TensorParallel;
use crate::model::{Batch, ForwardModel, ModelConfig};

/// A future of the type-erased model's methods (not `Send`: browser GPU
/// handles are not).
type Fut<'a, T> = Pin<Box<dyn Future<Output = crate::Result<T>> + 'a>>;

/// What [`AnyModel`] needs of a model: [`ForwardModel`] with its futures
/// boxed, and the backend's name.
trait ErasedModel {
    fn config(&self) -> &ModelConfig;
    fn device_name(&self) -> String;
    fn forward<'a>(&'a mut self, batch: &'a Batch<'a>) -> Fut<'a, Vec<f32>>;
    fn forward_argmax<'a>(&'a mut self, batch: &'a Batch<'a>) -> Fut<'a, Vec<u32>>;
    fn forward_top_k<'a>(
        &'a mut self,
        batch: &'a Batch<'a>,
        k: usize,
    ) -> Fut<'a, Vec<Vec<(u32, f32)>>>;
    fn expert_stats(&self) -> Option<crate::moe::ExpertStats>;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn as_any(&self) -> &dyn Any;
}

impl<B: Backend + 'static> ErasedModel for Model<B> {
    fn config(&self) -> &ModelConfig {
        ForwardModel::config(self)
    }

    fn device_name(&self) -> String {
        self.backend().caps().name.clone()
    }

    fn forward<'a>(&'a mut self, batch: &'a Batch<'a>) -> Fut<'a, Vec<f32>> {
        Box::pin(self.run(batch))
    }

    fn forward_argmax<'a>(&'a mut self, batch: &'a Batch<'a>) -> Fut<'a, Vec<u32>> {
        Box::pin(self.run_argmax(batch))
    }

    fn forward_top_k<'a>(
        &'a mut self,
        batch: &'a Batch<'a>,
        k: usize,
    ) -> Fut<'a, Vec<Vec<(u32, f32)>>> {
        Box::pin(self.run_top_k(batch, k))
    }

    fn expert_stats(&self) -> Option<crate::moe::ExpertStats> {
        Model::expert_stats(self)
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<B: Backend + 'static> ErasedModel for TensorParallel<B> {
    fn config(&self) -> &ModelConfig {
        ForwardModel::config(self)
    }

    fn device_name(&self) -> String {
        TensorParallel::device_name(self)
    }

    fn forward<'a>(&'a mut self, batch: &'a Batch<'a>) -> Fut<'a, Vec<f32>> {
        Box::pin(ForwardModel::forward(self, batch))
    }

    fn forward_argmax<'a>(&'a mut self, batch: &'a Batch<'a>) -> Fut<'a, Vec<u32>> {
        Box::pin(ForwardModel::forward_argmax(self, batch))
    }

    fn forward_top_k<'a>(
        &'a mut self,
        batch: &'a Batch<'a>,
        k: usize,
    ) -> Fut<'a, Vec<Vec<(u32, f32)>>> {
        Box::pin(ForwardModel::forward_top_k(self, batch, k))
    }

    fn expert_stats(&self) -> Option<crate::moe::ExpertStats> {
        None
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A [`Model`] (or a [`TensorParallel`] one) on any backend, behind one type: what a front end holds
/// when the backend is chosen at run time. Boxing the futures costs one
/// allocation per forward pass.
pub struct AnyModel {
    inner: Box<dyn ErasedModel>,
}

impl AnyModel {
    /// Erases `model`'s backend type.
    pub fn new<B: Backend + 'static>(model: Model<B>) -> Self {
        Self {
            inner: Box::new(model),
        }
    }

    /// The device the model runs on, as its backend names it
    /// ([`crate::backend::Caps::name`]).
    pub fn device_name(&self) -> String {
        self.inner.device_name()
    }

    /// What the model's expert cache did so far, if it has one.
    pub fn expert_stats(&self) -> Option<crate::moe::ExpertStats> {
        self.inner.expert_stats()
    }

    /// The model, if it runs on backend `B` (for a backend's own settings
    /// and reports).
    pub fn downcast_ref<B: Backend + 'static>(&self) -> Option<&Model<B>> {
        self.inner.as_any().downcast_ref()
    }

    /// The model, mutably, if it runs on backend `B`.
    pub fn downcast_mut<B: Backend + 'static>(&mut self) -> Option<&mut Model<B>> {
        self.inner.as_any_mut().downcast_mut()
    }
}

impl fmt::Debug for AnyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnyModel")
            .field("arch", &self.inner.config().arch)
            .field("device", &self.inner.device_name())
            .finish()
    }
}

impl<B: Backend + 'static> From<TensorParallel<B>> for AnyModel {
    fn from(model: TensorParallel<B>) -> Self {
        Self {
            inner: Box::new(model),
        }
    }
}

impl<B: Backend + 'static> From<Model<B>> for AnyModel {
    fn from(model: Model<B>) -> Self {
        Self::new(model)
    }
}

impl ForwardModel for AnyModel {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }

    async fn forward(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>> {
        self.inner.forward(batch).await
    }

    async fn forward_argmax(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<u32>> {
        self.inner.forward_argmax(batch).await
    }

    async fn forward_top_k(
        &mut self,
        batch: &Batch<'_>,
        k: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        self.inner.forward_top_k(batch, k).await
    }
}
