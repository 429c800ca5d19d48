//! Tensor data in bounded chunks, in file order, with progress.
//!
//! [`TensorStream`] yields every tensor's bytes as [`TensorChunk`]s of at most
//! `chunk_bytes` each: a large tensor comes in several pieces, each with its
//! offset within the tensor. Peak memory is one chunk (none at all over a
//! source that exposes a slice, whose chunks borrow it). The loader repacks
//! and uploads each chunk, then drops it.

use super::{ByteSource, GgufError, GgufFile, GgufModel, TensorInfo};

/// How far a stream has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    /// Tensor bytes delivered so far.
    pub bytes_done: u64,
    /// Tensor bytes in the whole stream (without padding).
    pub bytes_total: u64,
    /// Tensors delivered completely.
    pub tensors_done: usize,
    /// Tensors in the stream.
    pub tensors_total: usize,
}

/// One piece of one tensor's data.
#[derive(Debug)]
pub struct TensorChunk<'a> {
    /// The tensor the bytes belong to.
    pub tensor: &'a TensorInfo,
    /// Offset of `data` within the tensor's data.
    pub offset: u64,
    /// The bytes: `tensor.size` split into pieces of at most the chunk size.
    pub data: &'a [u8],
    /// True for the tensor's last piece.
    pub last: bool,
    /// Progress including this chunk.
    pub progress: Progress,
}

/// An async, lending iterator over the chunks of a set of tensors in file order.
///
/// ```
/// use hearth::gguf::{write_gguf, GgufFile, MemSource, Metadata, TensorSpec, TensorStream};
/// use hearth::quant::GgmlType;
///
/// # fn main() -> Result<(), hearth::gguf::GgufError> {
/// let data: Vec<u8> = (0..=255).collect(); // 64 f32 values
/// let spec = TensorSpec { name: "w".into(), shape: vec![64], ty: GgmlType::F32 };
/// let bytes = write_gguf(Vec::new(), &Metadata::new(), &[(spec, &data[..])])?;
/// let src = MemSource::new(bytes);
/// pollster::block_on(async {
///     let file = GgufFile::read(&src).await?;
///     let mut stream = TensorStream::new(&file, &src, 100)?;
///     let mut sizes = Vec::new();
///     while let Some(chunk) = stream.next().await? {
///         assert_eq!(chunk.data, &data[chunk.offset as usize..][..chunk.data.len()]);
///         sizes.push(chunk.data.len());
///     }
///     assert_eq!(sizes, [100, 100, 56]);
///     Ok(())
/// })
/// # }
/// ```
pub struct TensorStream<'a, S> {
    /// Tensors in file order: by split, then offset.
    order: Vec<&'a TensorInfo>,
    sources: &'a [S],
    /// Whether `TensorInfo::split` picks the source (a split model) or the one source serves all.
    by_split: bool,
    chunk: u64,
    /// End of the last tensor's data in each split (index 0 only for one source).
    span_end: Vec<u64>,
    /// Read-ahead buffer for sources without a slice: file bytes
    /// `[buf_start, buf_start + buf.len())` of split `buf_split`.
    buf: Vec<u8>,
    buf_start: u64,
    buf_split: usize,
    next_tensor: usize,
    next_offset: u64,
    progress: Progress,
}

impl<'a, S: ByteSource> TensorStream<'a, S> {
    /// A stream over every tensor of `file`, read from `src`, in chunks of at
    /// most `chunk_bytes` (nonzero).
    pub fn new(file: &'a GgufFile, src: &'a S, chunk_bytes: usize) -> Result<Self, GgufError> {
        Self::build(
            file.tensors.iter().collect(),
            std::slice::from_ref(src),
            false,
            chunk_bytes,
        )
    }

    /// A stream over every tensor of a split model; `sources[i]` is split `i`.
    pub fn for_model(
        model: &'a GgufModel,
        sources: &'a [S],
        chunk_bytes: usize,
    ) -> Result<Self, GgufError> {
        if sources.len() != model.splits.len() {
            return Err(GgufError::Split(format!(
                "{} sources given for a model of {} splits",
                sources.len(),
                model.splits.len()
            )));
        }
        Self::build(model.tensors.iter().collect(), sources, true, chunk_bytes)
    }

    fn build(
        mut order: Vec<&'a TensorInfo>,
        sources: &'a [S],
        by_split: bool,
        chunk_bytes: usize,
    ) -> Result<Self, GgufError> {
        if chunk_bytes == 0 {
            return Err(GgufError::InvalidArgument(
                "the chunk size must be at least one byte".into(),
            ));
        }
        let key = |t: &TensorInfo| if by_split { t.split } else { 0 };
        order.sort_by_key(|t| (key(t), t.offset));
        let mut span_end = vec![0u64; order.last().map_or(0, |t| key(t) + 1)];
        for t in &order {
            span_end[key(t)] = span_end[key(t)].max(t.end());
        }
        let progress = Progress {
            bytes_done: 0,
            bytes_total: order.iter().map(|t| t.size).sum(),
            tensors_done: 0,
            tensors_total: order.len(),
        };
        let chunk = chunk_bytes as u64;
        Ok(Self {
            order,
            sources,
            by_split,
            chunk,
            span_end,
            buf: Vec::new(),
            buf_start: 0,
            buf_split: 0,
            next_tensor: 0,
            next_offset: 0,
            progress,
        })
    }

    /// Progress so far.
    pub fn progress(&self) -> Progress {
        self.progress
    }

    /// Fills the buffer with one chunk of split `split` from `abs`: the rest
    /// of the current tensor and, when it is small, the tensors after it, so
    /// a remote source sees one request per chunk rather than per tensor.
    async fn read_ahead(&mut self, src: &S, split: usize, abs: u64) -> Result<(), GgufError> {
        let end = self.span_end.get(split).copied().unwrap_or(abs);
        // The caller's chunk lies in [abs, end), so this covers it; <= chunk, a usize.
        let len = self.chunk.min(end.saturating_sub(abs)) as usize;
        self.buf.resize(len, 0);
        self.buf_start = abs;
        self.buf_split = split;
        let read = src.read_at(abs, &mut self.buf).await;
        if read.is_err() {
            self.buf.clear();
        }
        read
    }

    /// The next chunk, or `None` after the last.
    pub async fn next(&mut self) -> Result<Option<TensorChunk<'_>>, GgufError> {
        let Some(&tensor) = self.order.get(self.next_tensor) else {
            return Ok(None);
        };
        let split = if self.by_split { tensor.split } else { 0 };
        let src = self.sources.get(split).ok_or_else(|| {
            GgufError::Split(format!(
                "tensor '{}' is in split {split}, which has no source",
                tensor.name
            ))
        })?;
        let offset = self.next_offset;
        let len = self.chunk.min(tensor.size - offset);
        let abs = tensor.offset + offset;
        let last = offset + len == tensor.size;
        // len <= chunk_bytes, a usize.
        let n = len as usize;
        let data = match src.as_slice() {
            Some(all) => slice_at(all, abs, n)?,
            None => {
                let in_buf = self.buf_split == split
                    && abs >= self.buf_start
                    && abs + len <= self.buf_start + self.buf.len() as u64;
                if !in_buf {
                    self.read_ahead(src, split, abs).await?;
                }
                let at = (abs - self.buf_start) as usize;
                &self.buf[at..at + n]
            }
        };
        // Advance only once the bytes are in hand, so a failed read can be retried.
        if last {
            self.next_tensor += 1;
            self.next_offset = 0;
            self.progress.tensors_done += 1;
        } else {
            self.next_offset += len;
        }
        self.progress.bytes_done += len;
        Ok(Some(TensorChunk {
            tensor,
            offset,
            data,
            last,
            progress: self.progress,
        }))
    }
}

/// `n` bytes of `all` at `offset`.
fn slice_at(all: &[u8], offset: u64, n: usize) -> Result<&[u8], GgufError> {
    usize::try_from(offset)
        .ok()
        .and_then(|s| all.get(s..s.checked_add(n)?))
        .ok_or(GgufError::OutOfRange {
            offset,
            len: n as u64,
            source_len: all.len() as u64,
        })
}

/// Calls `on_chunk` with every tensor's data of `file`, in file order, in
/// chunks of at most `chunk_bytes`. Returns the final progress.
///
/// The callback's error type only needs to absorb [`GgufError`], so a loader
/// can return its own errors (an upload failing) and stop the stream.
pub async fn stream_tensors<S, E, F>(
    file: &GgufFile,
    src: &S,
    chunk_bytes: usize,
    mut on_chunk: F,
) -> Result<Progress, E>
where
    S: ByteSource,
    E: From<GgufError>,
    F: FnMut(TensorChunk<'_>) -> Result<(), E>,
{
    let mut stream = TensorStream::new(file, src, chunk_bytes)?;
    while let Some(chunk) = stream.next().await? {
        on_chunk(chunk)?;
    }
    Ok(stream.progress())
}

/// The data of one tensor, read whole from `src`.
pub async fn read_tensor_data<S: ByteSource>(
    src: &S,
    tensor: &TensorInfo,
) -> Result<Vec<u8>, GgufError> {
    let too_big = || GgufError::LimitExceeded {
        what: format!("the size of tensor '{}'", tensor.name),
        value: tensor.size,
        limit: usize::MAX as u64,
    };
    let n = usize::try_from(tensor.size).map_err(|_| too_big())?;
    if let Some(all) = src.as_slice() {
        return Ok(slice_at(all, tensor.offset, n)?.to_vec());
    }
    let mut out = vec![0u8; n];
    src.read_at(tensor.offset, &mut out).await?;
    Ok(out)
}

/// The data of the tensor named `name` in `file`, read whole from `src`.
pub async fn read_tensor<S: ByteSource>(
    file: &GgufFile,
    src: &S,
    name: &str,
) -> Result<Vec<u8>, GgufError> {
    let tensor = file
        .tensor(name)
        .ok_or_else(|| GgufError::TensorNotFound(name.to_string()))?;
    read_tensor_data(src, tensor).await
}
