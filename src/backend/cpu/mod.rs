//! The CPU backend: a [`kernels::KernelTable`] of scalar kernels (faster ISAs
//! slot into the same table), rayon threads, paged attention, and
//! [`CpuModel`], the generic [`Model`](crate::model::generic::Model)
//! on [`CpuBackend`].

pub mod attention;
pub mod backend;
pub mod kernels;
pub mod matmul;
pub mod model;
pub mod ops;
mod record;
pub mod threads;

pub use backend::{CpuBackend, CpuBuffer};
pub use model::CpuModel;
