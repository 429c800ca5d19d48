//! The CPU backend: a [`kernels::KernelTable`] of scalar kernels (faster ISAs
//! slot into the same table), a worker pool, and paged attention.

pub mod attention;
mod attn_fast;
pub mod attn_kernels;
pub mod backend;
mod buffer;
mod fuse;
pub mod hostmem;
pub mod kernels;
pub mod matmul;
mod moe;
pub mod options;
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
mod pool;
mod profile;
mod record;
mod rope;
pub mod rowops;
pub mod threads;

pub use backend::{CpuBackend, CpuBuffer};
pub use options::{CpuOptions, CpuProfile, PoolKind};
