//! The streaming GGUF reader and writer.
//!
//! - [`ByteSource`]: where bytes come from ([`MemSource`], [`MmapSource`]
//!   natively; Blob and HTTP range sources in the browser facade).
//! - [`GgufFile::read`]: parse and validate one file's header (metadata and
//!   tensor infos) without reading tensor data; [`open_path`] natively.
//! - [`GgufModel`]: split models (`NAME-00001-of-0000N.gguf`) as one model.
//! - [`stream_tensors`] / [`read_tensor`]: tensor data in bounded chunks.
//! - [`GgufWriter`]: write GGUF v3.
//!
//! Headers are untrusted input: every count, length and offset is checked
//! against the file size and the limits ([`MAX_DIMS`], [`MAX_ARRAY_DEPTH`],
//! [`MAX_STRING_LEN`], [`MAX_ARRAY_BYTES`]) before it is used, and each
//! failure is a specific [`GgufError`] variant, never a panic.

mod error;
mod parse;
pub mod reader;
pub mod source;
pub mod split;
pub mod stream;
pub mod value;
pub mod writer;

pub use error::GgufError;
pub use parse::{GGUF_MAGIC, MAX_ARRAY_BYTES, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_STRING_LEN};
#[cfg(not(target_arch = "wasm32"))]
pub use reader::open_path;
pub use reader::{align_up, GgufFile, ReadOptions, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT};
#[cfg(not(target_arch = "wasm32"))]
pub use source::MmapSource;
pub use source::{ByteSource, MemSource};
#[cfg(not(target_arch = "wasm32"))]
pub use split::open_model;
pub use split::{parse_split_path, split_path, GgufModel, SplitInfo};
pub use stream::{
    read_tensor, read_tensor_data, stream_tensors, Progress, TensorChunk, TensorStream,
};
pub use value::{Array, Metadata, Value, ValueType};
pub use writer::{write_gguf, GgufWriter, TensorSpec};
