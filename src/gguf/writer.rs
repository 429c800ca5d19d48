//! [`GgufWriter`]: writes GGUF v3 to any [`std::io::Write`].
//!
//! The layout is the one llama.cpp's `gguf_write_to_file` and gguf-py's
//! `GGUFWriter` produce: header, metadata pairs in the given order, tensor
//! infos, zero padding to the alignment, then each tensor's data followed by
//! zero padding to the alignment (the last one included). A file read by
//! [`GgufFile::read`](super::GgufFile::read) and written back with its own
//! metadata and tensor order is therefore byte-identical when the original
//! was packed that way (every llama.cpp / gguf-py file is).
//!
//! Data is written in order, in pieces of any size, so `hearth quantize` can
//! stream a model through without holding it.

use std::collections::HashSet;
use std::io::Write;

use super::reader::{alignment_of, tensor_size, ShapeError};
use super::{align_up, Array, GgufError, GgufFile, Metadata, Value, GGUF_MAGIC, MAX_DIMS};
use crate::quant::GgmlType;

/// The GGUF version this writer produces.
pub const WRITE_VERSION: u32 = 3;

/// What the writer needs to know about a tensor before its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Dimensions in ggml order (`shape[0]` is the row length).
    pub shape: Vec<u64>,
    /// Element type.
    pub ty: GgmlType,
}

impl TensorSpec {
    /// The specs of every tensor of `file`, in header order.
    pub fn all_of(file: &GgufFile) -> Vec<Self> {
        file.tensors
            .iter()
            .map(|t| Self {
                name: t.name.clone(),
                shape: t.shape.clone(),
                ty: t.ty,
            })
            .collect()
    }
}

/// A GGUF v3 file being written: header first ([`new`](Self::new)), then
/// tensor data in spec order ([`write_data`](Self::write_data)), then
/// [`finish`](Self::finish).
pub struct GgufWriter<W: Write> {
    out: W,
    written: u64,
    alignment: u64,
    /// Each tensor's name and data size, in spec order.
    sizes: Vec<(String, u64)>,
    current: usize,
    current_done: u64,
}

impl<W: Write> GgufWriter<W> {
    /// Writes the header, `metadata` in order, the tensor infos and the
    /// padding before the data. The alignment is `general.alignment` when
    /// `metadata` has it, else 32. Tensors are checked like the reader checks
    /// them (known shape and type, unique names).
    pub fn new(out: W, metadata: &Metadata, tensors: &[TensorSpec]) -> Result<Self, GgufError> {
        let alignment = alignment_of(metadata)?;
        let sizes = check_specs(tensors)?;
        let mut w = Self {
            out,
            written: 0,
            alignment,
            sizes,
            current: 0,
            current_done: 0,
        };
        w.put(&GGUF_MAGIC)?;
        w.put(&WRITE_VERSION.to_le_bytes())?;
        w.put(&(tensors.len() as u64).to_le_bytes())?;
        w.put(&(metadata.len() as u64).to_le_bytes())?;
        for (key, value) in metadata.iter() {
            w.put_str(key)?;
            w.put(&(value.value_type() as u32).to_le_bytes())?;
            w.put_value(value)?;
        }
        let mut offset = 0u64;
        for (spec, &(_, size)) in tensors.iter().zip(&w.sizes.clone()) {
            w.put_str(&spec.name)?;
            w.put(&(spec.shape.len() as u32).to_le_bytes())?;
            for d in &spec.shape {
                w.put(&d.to_le_bytes())?;
            }
            w.put(&spec.ty.id().to_le_bytes())?;
            w.put(&offset.to_le_bytes())?;
            offset = padded(offset, size, alignment)?;
        }
        w.pad()?;
        w.skip_empty();
        Ok(w)
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Writes the next `bytes` of tensor data. Pieces may split or span
    /// tensors; padding is inserted after each tensor completes.
    pub fn write_data(&mut self, mut bytes: &[u8]) -> Result<(), GgufError> {
        while !bytes.is_empty() {
            let Some((name, size)) = self.sizes.get(self.current).cloned() else {
                return Err(GgufError::InvalidWrite(format!(
                    "{} bytes of data past the last tensor",
                    bytes.len()
                )));
            };
            let take = ((size - self.current_done) as usize).min(bytes.len());
            let (now, rest) = bytes.split_at(take);
            self.put(now)?;
            self.current_done += take as u64;
            bytes = rest;
            if self.current_done == size {
                self.pad().map_err(|e| match e {
                    GgufError::Io { source, .. } => {
                        io_err(&format!("padding after tensor '{name}'"), source)
                    }
                    other => other,
                })?;
                self.current += 1;
                self.current_done = 0;
                self.skip_empty();
            }
        }
        Ok(())
    }

    /// Checks that every tensor's data was written and returns the output.
    pub fn finish(mut self) -> Result<W, GgufError> {
        if let Some((name, size)) = self.sizes.get(self.current) {
            return Err(GgufError::InvalidWrite(format!(
                "tensor '{name}' has {} of its {size} bytes written, and {} tensors follow",
                self.current_done,
                self.sizes.len() - self.current - 1
            )));
        }
        self.out.flush().map_err(|e| io_err("flushing", e))?;
        Ok(self.out)
    }

    /// Tensors of zero bytes cannot exist (the reader rejects zero dimensions),
    /// but keep the cursor correct regardless.
    fn skip_empty(&mut self) {
        while self.sizes.get(self.current).is_some_and(|(_, s)| *s == 0) {
            self.current += 1;
        }
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        self.out
            .write_all(bytes)
            .map_err(|e| io_err("writing", e))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn put_str(&mut self, s: &str) -> Result<(), GgufError> {
        self.put(&(s.len() as u64).to_le_bytes())?;
        self.put(s.as_bytes())
    }

    /// Zeros up to the next multiple of the alignment.
    fn pad(&mut self) -> Result<(), GgufError> {
        const ZEROS: [u8; 64] = [0; 64];
        let mut n = align_up(self.written, self.alignment).unwrap_or(self.written) - self.written;
        while n > 0 {
            let k = n.min(ZEROS.len() as u64) as usize;
            self.put(&ZEROS[..k])?;
            n -= k as u64;
        }
        Ok(())
    }

    fn put_value(&mut self, value: &Value) -> Result<(), GgufError> {
        match value {
            Value::U8(x) => self.put(&x.to_le_bytes()),
            Value::I8(x) => self.put(&x.to_le_bytes()),
            Value::U16(x) => self.put(&x.to_le_bytes()),
            Value::I16(x) => self.put(&x.to_le_bytes()),
            Value::U32(x) => self.put(&x.to_le_bytes()),
            Value::I32(x) => self.put(&x.to_le_bytes()),
            Value::F32(x) => self.put(&x.to_le_bytes()),
            Value::U64(x) => self.put(&x.to_le_bytes()),
            Value::I64(x) => self.put(&x.to_le_bytes()),
            Value::F64(x) => self.put(&x.to_le_bytes()),
            Value::Bool(b) => self.put(&[*b as u8]),
            Value::String(s) => self.put_str(s),
            Value::Array(a) => self.put_array(a),
        }
    }

    /// Element type, count, elements (inner arrays the same, recursively).
    fn put_array(&mut self, a: &Array) -> Result<(), GgufError> {
        self.put(&(a.elem_type() as u32).to_le_bytes())?;
        self.put(&(a.len() as u64).to_le_bytes())?;
        macro_rules! each {
            ($v:expr) => {{
                for x in $v {
                    self.put(&x.to_le_bytes())?;
                }
                Ok(())
            }};
        }
        match a {
            Array::U8(v) => self.put(v),
            Array::I8(v) => each!(v),
            Array::U16(v) => each!(v),
            Array::I16(v) => each!(v),
            Array::U32(v) => each!(v),
            Array::I32(v) => each!(v),
            Array::F32(v) => each!(v),
            Array::U64(v) => each!(v),
            Array::I64(v) => each!(v),
            Array::F64(v) => each!(v),
            Array::Bool(v) => each!(v.iter().map(|&b| b as u8)),
            Array::String(v) => v.iter().try_for_each(|s| self.put_str(s)),
            Array::Array(v) => v.iter().try_for_each(|inner| self.put_array(inner)),
        }
    }
}

/// Writes a whole GGUF v3 file: `metadata`, then `tensors` with their data.
pub fn write_gguf<W: Write>(
    out: W,
    metadata: &Metadata,
    tensors: &[(TensorSpec, &[u8])],
) -> Result<W, GgufError> {
    let specs: Vec<TensorSpec> = tensors.iter().map(|(s, _)| s.clone()).collect();
    let mut w = GgufWriter::new(out, metadata, &specs)?;
    for ((spec, data), &(_, size)) in tensors.iter().zip(&w.sizes.clone()) {
        if data.len() as u64 != size {
            return Err(GgufError::InvalidWrite(format!(
                "tensor '{}' ({} {:?}) needs {size} bytes of data, got {}",
                spec.name,
                spec.ty,
                spec.shape,
                data.len()
            )));
        }
        w.write_data(data)?;
    }
    w.finish()
}

/// Checks every spec as the reader would and returns `(name, size)` for each.
fn check_specs(tensors: &[TensorSpec]) -> Result<Vec<(String, u64)>, GgufError> {
    let mut names = HashSet::with_capacity(tensors.len());
    let mut sizes = Vec::with_capacity(tensors.len());
    for t in tensors {
        if !names.insert(t.name.as_str()) {
            return Err(GgufError::DuplicateTensor(t.name.clone()));
        }
        if t.shape.len() > MAX_DIMS as usize {
            return Err(GgufError::TooManyDims {
                tensor: t.name.clone(),
                n_dims: t.shape.len() as u32,
            });
        }
        let size = tensor_size(t.ty, &t.shape).map_err(|e| match e {
            ShapeError::Bad(reason) => GgufError::BadShape {
                tensor: t.name.clone(),
                shape: t.shape.clone(),
                reason,
            },
            ShapeError::Row { row_len, block } => GgufError::RowNotBlockMultiple {
                tensor: t.name.clone(),
                ty: t.ty,
                row_len,
                block,
            },
        })?;
        sizes.push((t.name.clone(), size));
    }
    Ok(sizes)
}

/// `offset + size` rounded up to the alignment, or an error on overflow.
fn padded(offset: u64, size: u64, alignment: u64) -> Result<u64, GgufError> {
    offset
        .checked_add(size)
        .and_then(|end| align_up(end, alignment))
        .ok_or_else(|| GgufError::InvalidWrite("the tensor data exceeds 2^64 bytes".into()))
}

fn io_err(what: &str, source: std::io::Error) -> GgufError {
    GgufError::Io {
        context: format!("{what} GGUF output"),
        source,
    }
}
