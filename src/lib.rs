//! Hearth runs GGUF language models on the hardware people actually have.
//!
//! One core serves every target: it compiles natively (the CPU backend
//! with x86 and Arm kernels chosen at run time, and the WebGPU backend on
//! wgpu's Vulkan, Metal and DX12) and to `wasm32-unknown-unknown` for web
//! pages (WebGPU, or the CPU backend's SIMD128 kernels). Other backends
//! live in crates of their own and implement [`backend::Backend`]. Nothing
//! in this crate assumes files, OS threads or blocking waits, and nothing
//! reads the environment: those live behind traits
//! ([`gguf::ByteSource`]) or in the CLI and the wasm facade, which pass
//! typed options in ([`backend::cpu::CpuOptions`]).
//!
//! The modules, in data-flow order (`ARCHITECTURE.md` in the repository
//! draws the whole):
//! - [`gguf`]: the streaming GGUF reader (metadata first, tensor data in bounded chunks);
//! - [`quant`]: the ggml type table, the weight types Hearth runs, block
//!   layouts and the scalar reference oracle;
//! - [`graph`]: the vocabulary every layer shares: ops, plans (a step's
//!   ops as a reusable template), the fusion pass and the scalar reference
//!   of the row ops;
//! - [`backend`]: where plans run (the [`backend::Backend`] trait, the CPU
//!   and WebGPU backends);
//! - [`model`]: configuration, weights, the plans of each architecture,
//!   loading onto any backend, tokenizers and chat templates;
//! - [`moe`]: the expert-store seam of mixture-of-experts models;
//! - [`kv`]: paged KV cache bookkeeping (block pool, block tables, prefix cache);
//! - [`sched`]: the continuous-batching scheduler;
//! - [`sample`]: the token sampler;
//! - [`engine`]: requests in, token events out: the step loop every front end drives;
//! - [`platform`]: what the machine is (CPU tiers, memory, GPUs) and the defaults chosen from it;
//! - [`trace`]: Perfetto traces of loading, scheduler steps, requests, ops and kernels;
//! - [`tune`]: per-device choices measured once and stored, keyed by the device and kernel build.

#![deny(missing_docs)]

pub mod backend;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod graph;
pub mod kv;
pub mod model;
pub mod moe;
pub mod platform;
pub mod quant;
pub mod sample;
pub mod sched;
pub mod trace;
pub mod tune;

pub use error::{Error, Result};
