//! Hearth runs GGUF language models on the hardware people actually have.
//!
//! One core serves every target: it compiles natively (CPU, wgpu, CUDA and
//! ROCm backends) and to `wasm32-unknown-unknown` for web pages. Nothing in
//! this crate assumes files, OS threads or blocking waits: those live behind
//! traits ([`gguf::ByteSource`]) or in the CLI and the wasm facade.
//!
//! The modules, in data-flow order:
//! - [`gguf`]: the streaming GGUF reader (metadata first, tensor data in bounded chunks);
//! - [`quant`]: the ggml type table, block layouts and the scalar reference oracle;
//! - [`model`]: model configuration, tokenizers and chat templates;
//! - [`kv`]: paged KV cache bookkeeping (block pool, block tables, prefix cache);
//! - [`sched`]: the continuous-batching scheduler;
//! - [`sample`]: the token sampler;
//! - [`backend`], [`graph`], [`moe`]: where ops run, the ops, and the expert seam;
//! - [`engine`]: requests in, token events out: the step loop every front end drives.

#![deny(missing_docs)]

pub mod backend;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod graph;
pub mod kv;
pub mod model;
pub mod moe;
pub mod quant;
pub mod sample;
pub mod sched;

pub use error::{Error, Result};
