//! Backends: where ops run. A small trait at the level of buffers, recorded
//! ops and whole plans, with [`Backend::supports`] deciding which ops (and
//! which fused variants) a backend gets; [`cpu`] is the portable one and
//! runs every op. A backend depends on [`crate::graph`] and [`crate::quant`]
//! only, so one can live in another crate (CUDA, ROCm) and compose with the
//! core through [`crate::model::load_model`] and [`crate::model::AnyModel`].

pub mod cpu;
pub(crate) mod memory;
pub mod packed;
#[cfg(feature = "webgpu")]
pub mod webgpu;

pub use memory::MemoryNeed;

use std::future::Future;
use std::ops::Range;

use thiserror::Error;

use crate::graph::fuse::{Arg, Part};
use crate::graph::plan::{Held, HostSync, Plan, StepInputs};
use crate::graph::Op;
use crate::quant::{GgmlType, WEIGHT_TYPES};

/// Errors of a backend.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The backend has no kernel for a weight's type.
    #[error("tensor '{tensor}' has type {ty}, which the {backend} backend cannot run; {}", type_hint(*ty))]
    UnsupportedType {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// The backend ([`Caps::backend`]).
        backend: String,
    },
    /// Buffers or shapes that do not fit an op.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// The backend has no kernel for an op.
    #[error("the {backend} backend cannot run {op}; run the model on another backend (the CPU runs every op)")]
    UnsupportedOp {
        /// The backend ([`Caps::backend`]).
        backend: String,
        /// What the op is, for a person.
        op: String,
    },
    /// The device failed, lacks something, or cannot hold the model: the
    /// backend's own error, with what to do in its message.
    #[error(transparent)]
    Device(Box<dyn std::error::Error + Send + Sync>),
    /// The host refused memory for a buffer.
    #[error("could not get {} MiB of host memory for {what}: {detail}; close other programs, or load a smaller model or a shorter context (--ctx)", bytes.div_ceil(1 << 20))]
    OutOfMemory {
        /// Bytes asked for.
        bytes: u64,
        /// What the memory was for.
        what: String,
        /// The OS's answer.
        detail: String,
    },
    /// A buffer access outside the buffer.
    #[error("buffer access {range:?} outside a buffer of {len} bytes")]
    OutOfBounds {
        /// Bytes asked for.
        range: Range<u64>,
        /// Buffer size.
        len: u64,
    },
}

impl BackendError {
    /// [`BackendError::UnsupportedOp`] of `op` on the backend of `caps`.
    pub fn unsupported_op(caps: &Caps, op: &Op) -> Self {
        BackendError::UnsupportedOp {
            backend: caps.backend.to_string(),
            op: op.describe(),
        }
    }
}

/// What to do about a weight of type `ty` that a backend cannot run.
fn type_hint(ty: GgmlType) -> String {
    let runs: Vec<String> = WEIGHT_TYPES.iter().map(ToString::to_string).collect();
    if WEIGHT_TYPES.contains(&ty) {
        format!(
            "run the model on another backend (the CPU runs {})",
            runs.join(", ")
        )
    } else {
        format!(
            "Hearth runs {}; requantize the model with `hearth quantize`",
            runs.join(", ")
        )
    }
}

/// What a backend can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caps {
    /// The backend, as errors and reports name it (`CPU`, `WebGPU`).
    pub backend: &'static str,
    /// The device, for a person (`cpu avx512 x4`, an adapter's name).
    pub name: String,
    /// Largest single buffer in bytes.
    pub max_buffer_bytes: u64,
    /// Whether f16 arithmetic is native.
    pub f16: bool,
    /// Worker threads (1 for GPUs).
    pub threads: usize,
}

/// What a buffer is for (placement hints).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufKind {
    /// Model weights: written once at load.
    Weights,
    /// Activations and scratch of a step.
    Activations,
    /// The K/V cache.
    KvCache,
    /// Results read back to the host.
    Readback,
}

/// The buffers an op reads and writes, in the order its [`Op`] variant documents.
#[derive(Debug)]
pub struct OpIo<'a, B> {
    /// Inputs.
    pub inputs: &'a [&'a B],
    /// Outputs.
    pub outputs: &'a [&'a B],
}

/// The buffers of `part`, one of the ops a fused op over `io` stands for
/// ([`crate::graph::fuse::expand`]); an argument past the fused op's
/// buffers (rope factors it was given none of) is left out.
pub fn part_buffers<'a, B>(part: &Part, io: &OpIo<'a, B>) -> (Vec<&'a B>, Vec<&'a B>) {
    let get = |a: &Arg| match *a {
        Arg::In(i) => io.inputs.get(i).copied(),
        Arg::Out(i) => io.outputs.get(i).copied(),
    };
    (
        part.inputs.iter().filter_map(get).collect(),
        part.outputs.iter().filter_map(get).collect(),
    )
}

/// Host memory a backend copies from step after step (streamed blocks,
/// [`Backend::host_bytes`]): page-locked where its device copies faster
/// and beside its work from such memory.
pub trait HostBytes: std::fmt::Debug + Send {
    /// The bytes.
    fn bytes(&self) -> &[u8];
}

impl HostBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// One run of whole weight rows to upload
/// ([`Backend::upload_weight_rows_many`]).
#[derive(Debug)]
pub struct RowsUpload<'a, Buf> {
    /// The weight buffer.
    pub dst: &'a Buf,
    /// Its type.
    pub ty: GgmlType,
    /// Values per row.
    pub cols: usize,
    /// The first row written.
    pub first_row: usize,
    /// The rows, as the GGUF file stores them; or, with `packed_at`, as
    /// the backend stores them ([`Backend::pack_weight_rows`]).
    pub src: &'a [u8],
    /// Where packed rows go in the buffer (`None`: `src` is the file's).
    pub packed_at: Option<u64>,
}

/// A device that holds buffers and executes recorded ops.
pub trait Backend {
    /// A device buffer.
    type Buffer;
    /// What the backend can do.
    fn caps(&self) -> &Caps;
    /// Allocates `bytes` of zeroed memory.
    fn alloc(&self, bytes: u64, kind: BufKind) -> Result<Self::Buffer, BackendError>;
    /// Allocates the zeroed buffers of a model's weights, of `sizes` bytes
    /// each, in order (a backend may place neighbours side by side).
    fn alloc_weights(&self, sizes: &[u64]) -> Result<Vec<Self::Buffer>, BackendError> {
        sizes
            .iter()
            .map(|&b| self.alloc(b, BufKind::Weights))
            .collect()
    }
    /// Copies `src` into `dst` at `offset`.
    fn upload(&self, dst: &Self::Buffer, offset: u64, src: &[u8]) -> Result<(), BackendError>;
    /// Bytes a weight of `rows` rows of `cols` values of `ty` takes on the
    /// backend (a backend that repacks blocks may need more or fewer).
    fn weight_bytes(&self, ty: GgmlType, cols: usize, rows: usize) -> u64 {
        (cols / ty.block_elems().max(1) * ty.block_bytes() * rows) as u64
    }
    /// Uploads whole rows `first_row..` of a weight (`src`: the rows as the
    /// GGUF file stores them) into `dst`, repacking them if the backend
    /// wants another layout.
    fn upload_weight_rows(
        &self,
        dst: &Self::Buffer,
        ty: GgmlType,
        cols: usize,
        first_row: usize,
        src: &[u8],
    ) -> Result<(), BackendError> {
        let row_bytes = cols / ty.block_elems().max(1) * ty.block_bytes();
        self.upload(dst, (first_row * row_bytes) as u64, src)
    }
    /// Uploads several runs of weight rows, in order, as
    /// [`Backend::upload_weight_rows`] does each (the expert cache's slot
    /// fills): a backend that repacks may repack them side by side and wait
    /// once. The default uploads them one by one.
    fn upload_weight_rows_many(
        &self,
        runs: &[RowsUpload<'_, Self::Buffer>],
    ) -> Result<(), BackendError>
    where
        Self: Sized,
    {
        for r in runs {
            match r.packed_at {
                Some(at) => self.upload(r.dst, at, r.src)?,
                None => self.upload_weight_rows(r.dst, r.ty, r.cols, r.first_row, r.src)?,
            }
        }
        Ok(())
    }
    /// Whole weight rows as [`Backend::upload_weight_rows`] would store
    /// them, with their offset in the weight's buffer, for host memory that
    /// uploads the same rows again and again (streamed blocks): such a
    /// backend repacks once, at load. `None` (the default): the backend
    /// stores the file's bytes as they are, or repacks them in parts
    /// `upload` cannot write in one go.
    fn pack_weight_rows(
        &self,
        ty: GgmlType,
        cols: usize,
        first_row: usize,
        src: &[u8],
    ) -> Result<Option<(u64, Vec<u8>)>, BackendError> {
        let _ = (ty, cols, first_row, src);
        Ok(None)
    }
    /// `bytes` moved into host memory this backend copies from often
    /// (streamed blocks): page-locked memory on CUDA, whose copies run
    /// beside the device's work. The default keeps them as they are.
    fn host_bytes(&self, bytes: Vec<u8>) -> Result<Box<dyn HostBytes>, BackendError> {
        Ok(Box::new(bytes))
    }
    /// Called once every row of a weight is uploaded (the loader calls it
    /// after a tensor's last chunk): a backend that keeps weights in a
    /// layout of its own prepares it here, so that the first step does not
    /// pay for it. The default does nothing.
    fn finish_weight(
        &self,
        dst: &Self::Buffer,
        ty: GgmlType,
        cols: usize,
    ) -> Result<(), BackendError> {
        let _ = (dst, ty, cols);
        Ok(())
    }
    /// Checks that a model needing `need` fits the device, before anything
    /// is allocated: an error says what does not fit and what to do. The
    /// default accepts (host memory fails at allocation, with
    /// [`BackendError::OutOfMemory`]).
    fn check_memory(&self, need: &MemoryNeed) -> Result<(), BackendError> {
        let _ = need;
        Ok(())
    }
    /// The device memory a model may use, where the backend knows it (a
    /// GPU's free memory, or a budget it was given); `None`: unknown, or
    /// host memory. The loader offloads an MoE model's routed experts by
    /// itself when the model needs more ([`crate::model::load::LoadOptions::experts`]).
    fn memory_budget(&self) -> Option<u64> {
        None
    }
    /// Whether [`Backend::record`] accepts `op`.
    fn supports(&self, op: &Op) -> bool;
    /// Records (the CPU: executes) `op` over `io`.
    fn record(&mut self, op: &Op, io: &OpIo<'_, Self::Buffer>) -> Result<(), BackendError>;
    /// Submits what was recorded.
    fn submit(&mut self) -> Result<(), BackendError>;
    /// The activation buffers of one step, `sizes[i]` bytes each. Their
    /// contents are unspecified (a plan writes each before reading it), so
    /// a backend may hand out the same memory step after step.
    fn step_buffers(&mut self, sizes: &[u64]) -> Result<Vec<Self::Buffer>, BackendError> {
        sizes
            .iter()
            .map(|&b| self.alloc(b, BufKind::Activations))
            .collect()
    }
    /// Submits what was recorded and reads `range` of `src` back, in one
    /// submission where the backend can (a GPU then waits once per step).
    fn submit_read(
        &mut self,
        src: &Self::Buffer,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        async move {
            self.submit()?;
            self.download(src, range).await
        }
    }
    /// Runs a whole plan with a step's `inputs` over the model's `held`
    /// buffers, stopping for `host` at the plan's sync points, and returns
    /// the bytes of its result (as ggml's `graph_compute`). The default
    /// records op by op ([`crate::graph::plan::execute`]); a backend may
    /// override it to run the plan its own way (capture it once, replay
    /// it), as long as the results are those of the ops in order.
    fn run_plan(
        &mut self,
        plan: &Plan,
        inputs: &StepInputs,
        held: &Held<'_, Self::Buffer>,
        host: &mut dyn HostSync,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>>
    where
        Self: Sized,
    {
        crate::graph::plan::execute(self, plan, inputs, held, host)
    }
    /// Reads `range` of `src` back (async: WebGPU cannot block on the web).
    fn download(
        &self,
        src: &Self::Buffer,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>>;
}
