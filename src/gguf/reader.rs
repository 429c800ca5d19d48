//! [`GgufFile`]: the parsed header of one GGUF file (v2 or v3).
//!
//! Layout of a GGUF file (all little-endian):
//! `"GGUF"`, `u32` version, `u64` tensor count, `u64` metadata count, the
//! metadata pairs, the tensor infos, zero padding up to `general.alignment`
//! (default 32), then the data section. Each tensor's offset is relative to
//! the data section and a multiple of the alignment.
//!
//! The header is read through a [`ByteSource`] in large chunks (1 MiB first,
//! growing), never one read per field, so a slow source (HTTP range requests)
//! costs a handful of round trips. Sources that expose a slice are parsed in
//! place.

use std::collections::HashSet;

use super::parse::{
    parse_kv, parse_preamble, parse_tensor_info, RawTensorInfo, SliceReader, Stop, MAX_PREALLOC,
};
use super::{ByteSource, GgufError, Metadata, Value};
use crate::quant::GgmlType;

/// Alignment of the data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// First header read size over a source without a slice: 1 MiB.
pub const FIRST_CHUNK: u64 = 1 << 20;
/// Largest header read size (chunks double up to this): 16 MiB.
pub const MAX_CHUNK: u64 = 16 << 20;
/// Largest single header unit (one metadata pair) the window may hold: 256 MiB.
pub const MAX_HEADER_UNIT: u64 = 256 << 20;

/// One tensor's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml order: `shape[0]` (`ne[0]`) is the row length, the
    /// fastest-varying index. At most 4 entries, all nonzero; none means a
    /// single element, as llama.cpp reads `n_dims = 0`.
    pub shape: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
    /// Absolute offset of the data in its file (data section start + stored offset).
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
    /// Index of the split file holding the data (0 for a single file).
    pub split: usize,
}

impl TensorInfo {
    /// Number of elements (the product of the shape; checked not to overflow at parse time).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Elements per row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of `ne[1..]`).
    pub fn n_rows(&self) -> u64 {
        self.shape.iter().skip(1).product()
    }

    /// Absolute end offset of the data (exclusive).
    pub fn end(&self) -> u64 {
        self.offset + self.size
    }
}

/// The parsed header of one GGUF file.
#[derive(Debug, Clone)]
pub struct GgufFile {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Metadata pairs, in file order.
    pub metadata: Metadata,
    /// Tensor infos, in header order (which is usually, not necessarily, file order).
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and of each tensor's data.
    pub alignment: u64,
    /// Absolute offset of the data section (the end of the header, padded).
    pub data_offset: u64,
    /// Size of the file in bytes.
    pub file_size: u64,
}

impl GgufFile {
    /// Parses and validates the header of the GGUF file in `src`.
    ///
    /// Every count, length and offset is checked against the file size before
    /// it is used; tensors are checked for known types, sane shapes, aligned
    /// offsets, bounds, overlaps and unique names. Tensor data is not read.
    pub async fn read<S: ByteSource>(src: &S) -> Result<Self, GgufError> {
        Self::read_split(src, 0).await
    }

    /// Like [`read`](Self::read), tagging every tensor with split index `split`.
    pub async fn read_split<S: ByteSource>(src: &S, split: usize) -> Result<Self, GgufError> {
        Self::read_with(
            src,
            &ReadOptions {
                split,
                ..ReadOptions::default()
            },
        )
        .await
    }

    /// Like [`read`](Self::read), with options.
    pub async fn read_with<S: ByteSource>(src: &S, opts: &ReadOptions) -> Result<Self, GgufError> {
        let file_size = src.len();
        let split = opts.split;
        let mut win = Window::new(file_size, opts.first_chunk.max(1), opts.max_chunk);
        let pre = win.run(src, parse_preamble).await?;
        let mut metadata = Metadata::new();
        for i in 0..pre.n_kv {
            let (key, value) = win.run(src, |r| parse_kv(r, i)).await?;
            if metadata.get(&key).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.insert(key, value);
        }
        let alignment = alignment_of(&metadata)?;
        // The count is only a claim (a remote file can be as large as it says),
        // so reserve a bounded amount and grow as infos actually parse.
        let cap = usize::try_from(pre.n_tensors)
            .unwrap_or(usize::MAX)
            .min(MAX_PREALLOC);
        let mut raw = Vec::with_capacity(cap);
        for i in 0..pre.n_tensors {
            raw.push(win.run(src, |r| parse_tensor_info(r, i)).await?);
        }
        let data_offset =
            align_up(win.offset(), alignment).ok_or_else(|| GgufError::Truncated {
                what: "the padding after the tensor infos".into(),
                offset: win.offset(),
                needed: alignment,
                available: file_size.saturating_sub(win.offset()),
            })?;
        let layout = Layout {
            alignment,
            data_offset,
            file_size,
            split,
        };
        let tensors = raw
            .into_iter()
            .map(|t| layout.tensor(t))
            .collect::<Result<Vec<_>, _>>()?;
        check_unique_and_disjoint(&tensors)?;
        Ok(Self {
            version: pre.version,
            metadata,
            tensors,
            alignment,
            data_offset,
            file_size,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Total bytes of tensor data (without padding).
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size).sum()
    }
}

/// How [`GgufFile::read_with`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadOptions {
    /// Split index recorded in every [`TensorInfo::split`] (0 for a single file).
    pub split: usize,
    /// Size of the first header read over a source without a slice (default
    /// [`FIRST_CHUNK`]); each further read doubles it, up to `max_chunk`.
    pub first_chunk: u64,
    /// Largest header read (default [`MAX_CHUNK`]); a single metadata pair
    /// may still need a larger one, up to [`MAX_HEADER_UNIT`].
    pub max_chunk: u64,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            split: 0,
            first_chunk: FIRST_CHUNK,
            max_chunk: MAX_CHUNK,
        }
    }
}

/// The alignment from `general.alignment`, or the default.
pub(crate) fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    let Some(value) = metadata.get(ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let bad = || GgufError::BadAlignment(format!("{value} ({})", value.value_type()));
    let is_unsigned = matches!(
        value,
        Value::U8(_) | Value::U16(_) | Value::U32(_) | Value::U64(_)
    );
    match value.as_u64() {
        Some(a) if is_unsigned && a.is_power_of_two() => Ok(a),
        _ => Err(bad()),
    }
}

/// `x` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
pub fn align_up(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// What a tensor info is checked against.
struct Layout {
    alignment: u64,
    data_offset: u64,
    file_size: u64,
    split: usize,
}

impl Layout {
    /// Validates a raw tensor info: type, shape, size, alignment, bounds.
    fn tensor(&self, raw: RawTensorInfo) -> Result<TensorInfo, GgufError> {
        let RawTensorInfo {
            name,
            dims,
            type_id,
            offset,
        } = raw;
        let Some(ty) = GgmlType::from_id(type_id) else {
            return Err(GgufError::UnknownTensorType {
                tensor: name,
                id: type_id,
            });
        };
        let size = match tensor_size(ty, &dims) {
            Ok(size) => size,
            Err(ShapeError::Bad(reason)) => {
                return Err(GgufError::BadShape {
                    tensor: name,
                    shape: dims,
                    reason,
                });
            }
            Err(ShapeError::Row { row_len, block }) => {
                return Err(GgufError::RowNotBlockMultiple {
                    tensor: name,
                    ty,
                    row_len,
                    block,
                });
            }
        };
        if offset % self.alignment != 0 {
            return Err(GgufError::MisalignedTensor {
                tensor: name,
                offset,
                alignment: self.alignment,
            });
        }
        let start = self.data_offset.checked_add(offset);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(start), Some(end)) if end <= self.file_size => Ok(TensorInfo {
                name,
                shape: dims,
                ty,
                offset: start,
                size,
                split: self.split,
            }),
            _ => Err(GgufError::TensorOutOfBounds {
                tensor: name,
                start: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                file_size: self.file_size,
            }),
        }
    }
}

/// Why a shape was rejected.
pub(crate) enum ShapeError {
    Bad(String),
    Row { row_len: u64, block: u64 },
}

/// Byte size of a tensor of type `ty` and shape `dims` (ggml order), checking
/// for zero dimensions, element counts above `i64::MAX` (ggml counts in
/// `int64_t`) and partial blocks.
pub(crate) fn tensor_size(ty: GgmlType, dims: &[u64]) -> Result<u64, ShapeError> {
    if dims.contains(&0) {
        return Err(ShapeError::Bad("a dimension is zero".into()));
    }
    let n = dims
        .iter()
        .try_fold(1u64, |acc, &d| {
            acc.checked_mul(d).filter(|&n| n <= i64::MAX as u64)
        })
        .ok_or_else(|| {
            ShapeError::Bad("the element count overflows a 64-bit signed integer".into())
        })?;
    let block = ty.block_elems() as u64;
    let row_len = dims.first().copied().unwrap_or(1);
    if row_len % block != 0 {
        return Err(ShapeError::Row { row_len, block });
    }
    ty.bytes_for(n)
        .filter(|&b| b <= i64::MAX as u64)
        .ok_or_else(|| ShapeError::Bad(format!("the byte size of {n} {ty} elements overflows")))
}

/// Rejects duplicate names and overlapping data ranges (within one file).
fn check_unique_and_disjoint(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut names = HashSet::with_capacity(tensors.len());
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(GgufError::DuplicateTensor(t.name.clone()));
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| (t.offset, t.end()));
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.offset < a.end() {
            return Err(GgufError::OverlappingTensors {
                first: a.name.clone(),
                first_end: a.end(),
                second: b.name.clone(),
                second_start: b.offset,
            });
        }
    }
    Ok(())
}

/// The header bytes read so far from a source, and the parse position in them.
///
/// Over a source with a slice the window is the whole file; otherwise it is a
/// buffer holding file bytes `[start, start + buf.len())` that grows in chunks
/// (doubling, by default from 1 MiB to 16 MiB) and drops what has been parsed.
struct Window {
    /// Buffered file bytes (sources without a slice only).
    buf: Vec<u8>,
    /// Absolute offset of `buf[0]`.
    start: u64,
    /// Absolute offset of the next unparsed byte (`>= start` when buffering).
    parsed: u64,
    chunk: u64,
    max_chunk: u64,
    file_size: u64,
}

impl Window {
    fn new(file_size: u64, chunk: u64, max_chunk: u64) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            parsed: 0,
            chunk,
            max_chunk,
            file_size,
        }
    }

    /// Absolute offset of the next unparsed byte.
    fn offset(&self) -> u64 {
        self.parsed
    }

    /// Index in `buf` of the next unparsed byte (`parsed - start` fits usize
    /// because it never exceeds `buf.len()`).
    fn pos(&self) -> usize {
        (self.parsed - self.start) as usize
    }

    /// Runs one parse unit, reading more of the source as the unit needs.
    async fn run<S, T, F>(&mut self, src: &S, mut unit: F) -> Result<T, GgufError>
    where
        S: ByteSource,
        F: FnMut(&mut SliceReader<'_>) -> Result<T, Stop>,
    {
        if let Some(all) = src.as_slice() {
            return self.run_in_slice(all, unit);
        }
        loop {
            let mut r = SliceReader::new(&self.buf[self.pos()..], self.parsed, self.file_size);
            match unit(&mut r) {
                Ok(t) => {
                    self.parsed += r.consumed() as u64;
                    return Ok(t);
                }
                Err(Stop::Fail(e)) => return Err(e),
                Err(Stop::More(n)) => self.fill(src, n).await?,
            }
        }
    }

    fn run_in_slice<T, F>(&mut self, all: &[u8], mut unit: F) -> Result<T, GgufError>
    where
        F: FnMut(&mut SliceReader<'_>) -> Result<T, Stop>,
    {
        let rest = usize::try_from(self.parsed)
            .ok()
            .and_then(|s| all.get(s..))
            .unwrap_or(&[]);
        // The slice is the whole file, so `Stop::More` cannot happen unless the
        // source's `len` and slice disagree; that reads as truncation.
        let mut r = SliceReader::new(rest, self.parsed, all.len() as u64);
        match unit(&mut r) {
            Ok(t) => {
                self.parsed += r.consumed() as u64;
                Ok(t)
            }
            Err(Stop::Fail(e)) => Err(e),
            Err(Stop::More(n)) => Err(GgufError::Truncated {
                what: "the header (the source's length and bytes disagree)".into(),
                offset: self.parsed,
                needed: n,
                available: 0,
            }),
        }
    }

    /// Reads at least `need` more bytes after the window (a whole chunk when the
    /// file has it), first dropping the parsed prefix.
    async fn fill<S: ByteSource>(&mut self, src: &S, need: u64) -> Result<(), GgufError> {
        self.buf.drain(..self.pos());
        self.start = self.parsed;
        let end = self.start + self.buf.len() as u64;
        // At least double what is buffered: a unit that keeps asking for more
        // (a huge vocabulary array) is then re-parsed O(log n) times, not O(n).
        let grow = need.max(self.chunk).max(self.buf.len() as u64);
        let want = grow.min(self.file_size.saturating_sub(end));
        let new_len = self.buf.len() as u64 + want;
        if want < need || new_len > MAX_HEADER_UNIT {
            return Err(GgufError::LimitExceeded {
                what: format!("the size of one header entry at offset {}", self.start),
                value: new_len,
                limit: MAX_HEADER_UNIT,
            });
        }
        let old_len = self.buf.len();
        // new_len <= MAX_HEADER_UNIT (256 MiB), which fits usize on every target.
        self.buf.resize(new_len as usize, 0);
        src.read_at(end, &mut self.buf[old_len..]).await?;
        self.chunk = self.chunk.saturating_mul(2).min(self.max_chunk.max(1));
        Ok(())
    }
}

/// Opens and parses the GGUF file at `path` (native only): the file is
/// memory-mapped, so reads complete at once and the async reader runs to
/// completion on the calling thread. Opening errors name the path; parse
/// errors are the reader's (the caller knows which path it passed).
#[cfg(not(target_arch = "wasm32"))]
pub fn open_path(path: &std::path::Path) -> Result<(GgufFile, super::MmapSource), GgufError> {
    let src = super::MmapSource::open(path)?;
    let file = pollster::block_on(GgufFile::read(&src))?;
    Ok((file, src))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_and_detects_overflow() {
        assert_eq!(align_up(0, 32), Some(0));
        assert_eq!(align_up(33, 32), Some(64));
        assert_eq!(align_up(64, 32), Some(64));
        assert_eq!(align_up(u64::MAX - 3, 32), None);
    }

    #[test]
    fn shape_checks() {
        assert_eq!(tensor_size(GgmlType::Q4_0, &[64, 3]).ok(), Some(2 * 3 * 18));
        assert!(matches!(
            tensor_size(GgmlType::Q4_0, &[48, 2]),
            Err(ShapeError::Row {
                row_len: 48,
                block: 32
            })
        ));
        assert!(matches!(
            tensor_size(GgmlType::F32, &[4, 0]),
            Err(ShapeError::Bad(_))
        ));
        assert!(matches!(
            tensor_size(GgmlType::F32, &[1 << 32, 1 << 32]),
            Err(ShapeError::Bad(_))
        ));
        // The element count fits but the byte size does not.
        assert!(matches!(
            tensor_size(GgmlType::F64, &[1 << 62]),
            Err(ShapeError::Bad(_))
        ));
    }
}
