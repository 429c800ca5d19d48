//! The CPU backend: a [`kernels::KernelTable`] of scalar kernels (faster ISAs
//! slot into the same table), a worker pool, paged attention, and
//! [`CpuModel`], the generic [`Model`](crate::model::generic::Model)
//! on [`CpuBackend`].

pub mod attention;
mod attn_fast;
pub mod attn_kernels;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod attn_wasm;
#[cfg(target_arch = "x86_64")]
mod attn_x86;
pub mod backend;
mod fuse;
pub mod hostmem;
pub mod kernels;
pub mod matmul;
pub mod model;
pub mod ops;
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
mod pool;
mod profile;
mod record;
mod rope;
pub mod rowops;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod rowops_wasm;
#[cfg(target_arch = "x86_64")]
mod rowops_x86;
pub mod threads;

pub use backend::{CpuBackend, CpuBuffer};
pub use model::CpuModel;
