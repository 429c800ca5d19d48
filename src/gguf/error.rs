//! [`GgufError`]: everything that can go wrong reading or writing a GGUF file.
//!
//! Each variant carries enough context (offsets, names, limits) for the message
//! to say what is wrong and where; messages end with what to do next where
//! there is something to do.

use thiserror::Error;

use crate::quant::GgmlType;

/// Errors reading, validating or writing a GGUF file.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file does not start with `GGUF`.
    #[error("not a GGUF file (magic {0:02x?}); check that the path points at a .gguf model")]
    BadMagic([u8; 4]),

    /// A GGUF version this reader does not handle (v1 is too old, newer ones unknown).
    #[error("GGUF version {version} is not supported: {}", version_hint(*.version))]
    UnsupportedVersion {
        /// The version field as read (little-endian).
        version: u32,
    },

    /// The file ends before a field that the header says is there.
    #[error(
        "truncated GGUF file: reading {what} at offset {offset} needs {needed} bytes but only \
         {available} remain; the download or copy is probably incomplete"
    )]
    Truncated {
        /// What was being read.
        what: String,
        /// Absolute file offset of the read.
        offset: u64,
        /// Bytes the read needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },

    /// A read outside the byte source (a caller asked for bytes past its end).
    #[error("read of {len} bytes at offset {offset} is outside the source of {source_len} bytes")]
    OutOfRange {
        /// Requested offset.
        offset: u64,
        /// Requested length.
        len: u64,
        /// The source's length.
        source_len: u64,
    },

    /// A metadata value (or array element) type tag that GGUF does not define.
    #[error("unknown metadata value type {tag} for key '{key}' at offset {offset}; the file is corrupt or from a newer GGUF version")]
    UnknownValueType {
        /// The key whose value has the bad tag.
        key: String,
        /// The tag as read.
        tag: u32,
        /// Absolute offset of the tag.
        offset: u64,
    },

    /// A tensor type id that ggml does not define (or has removed).
    #[error("tensor '{tensor}' has unknown ggml type id {id}; the file may need a newer Hearth")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The type id as read.
        id: u32,
    },

    /// A tensor with more dimensions than ggml's four.
    #[error("tensor '{tensor}' has {n_dims} dimensions; GGUF allows at most 4")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// The dimension count as read.
        n_dims: u32,
    },

    /// A zero dimension, or an element count or byte size that overflows.
    #[error("tensor '{tensor}' has an invalid shape {shape:?}: {reason}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// The dimensions as read (ggml order).
        shape: Vec<u64>,
        /// What is wrong with it.
        reason: String,
    },

    /// A row length (`ne[0]`) that is not a whole number of quantization blocks.
    #[error("tensor '{tensor}' of type {ty} has rows of {row_len} elements, not a multiple of the block size {block}")]
    RowNotBlockMultiple {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// `ne[0]`.
        row_len: u64,
        /// Elements per block of `ty`.
        block: u64,
    },

    /// Two tensors with the same name.
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),

    /// Two metadata pairs with the same key.
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),

    /// Tensor data that extends past the end of the file.
    #[error(
        "tensor '{tensor}' data [{start}, {end}) lies outside the file of {file_size} bytes; \
         the file is truncated or corrupt"
    )]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Absolute start offset (saturated at `u64::MAX` on overflow).
        start: u64,
        /// Absolute end offset (saturated at `u64::MAX` on overflow).
        end: u64,
        /// The file size.
        file_size: u64,
    },

    /// Two tensors whose data ranges overlap.
    #[error("tensors '{first}' and '{second}' overlap: '{first}' ends at {first_end}, '{second}' starts at {second_start}")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// Its absolute end offset.
        first_end: u64,
        /// The tensor that starts inside it.
        second: String,
        /// Its absolute start offset.
        second_start: u64,
    },

    /// A tensor offset that is not a multiple of the file's alignment.
    #[error("tensor '{tensor}' offset {offset} (relative to the data section) is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// The offset as stored (relative to the data section).
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },

    /// `general.alignment` is not a nonzero power of two (or not an integer).
    #[error(
        "bad general.alignment {0}: it must be an unsigned integer that is a nonzero power of two"
    )]
    BadAlignment(String),

    /// A string that is not valid UTF-8.
    #[error("invalid UTF-8 in {what} at offset {offset}")]
    InvalidUtf8 {
        /// Which string.
        what: String,
        /// Absolute offset of the string's bytes.
        offset: u64,
    },

    /// A count, length or nesting depth beyond what this reader accepts.
    #[error("{what} is {value}, above the limit of {limit}; the file is corrupt or hostile")]
    LimitExceeded {
        /// What was too large.
        what: String,
        /// The value found.
        value: u64,
        /// The limit.
        limit: u64,
    },

    /// Split files that do not form one model.
    #[error("split GGUF model: {0}")]
    Split(String),

    /// A tensor asked for by name that the file does not have.
    #[error("no tensor named '{0}' in the model")]
    TensorNotFound(String),

    /// Input to the writer that cannot be written as a valid GGUF file.
    #[error("cannot write GGUF: {0}")]
    InvalidWrite(String),

    /// An I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done (`opening /path/model.gguf`).
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A byte source (HTTP, Blob, ...) failed for a reason of its own.
    #[error("reading the model failed: {0}")]
    Source(String),
}

/// The explanation that follows "GGUF version N is not supported".
fn version_hint(version: u32) -> &'static str {
    match version {
        0 => "version 0 does not exist; the file is corrupt",
        1 => "version 1 is too old; convert the model again with a current llama.cpp",
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            "the file looks big-endian; Hearth reads little-endian GGUF only"
        }
        _ => "this reader handles versions 2 and 3; the file is corrupt or from a newer GGUF",
    }
}
