//! Weights on the device: where the packed rows of a weight lie in its one
//! buffer, their upload (repacked from GGUF rows), and the recording of
//! [`Op::MatMul`] / [`Op::GetRows`] over them.
//!
//! A weight of `[rows, cols]` is packed ([`packed_layout`]) and split by
//! rows into parts of at most the adapter's storage binding limit
//! ([`PackedLayout::rows_per_part`]); the parts lie in one buffer, each
//! starting at a multiple of the storage offset alignment, and are bound
//! as byte ranges. A weight that fits one binding is one part at byte 0.
//!
//! F32 and F16 weights of one part run on the dense kernels (which honour
//! ggml's rounding of activations to f16 for F16 weights); every other
//! type, and F32/F16 weights of several parts, run on [`QuantKernels`].

use super::backend::WebGpuBackend;
use super::buffer::GpuBuffer;
use super::ops::nth;
use super::quant::{
    packed_layout, BufRef, GetRowsArgs, MatmulArgs, PackedLayout, Repacker, WeightPart,
};
use crate::backend::{BackendError, OpIo};
use crate::graph::Op;
use crate::quant::GgmlType;
use crate::quant::WEIGHT_TYPES;

/// Where the parts of one weight lie in its buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placement {
    /// The packed layout of the whole weight.
    pub layout: PackedLayout,
    /// Rows of every part but the last.
    pub rows_per_part: u64,
    /// Bytes from one part's start to the next's.
    pub stride: u64,
}

impl Placement {
    /// Parts the weight is split into.
    pub fn n_parts(&self) -> u64 {
        self.layout.rows.div_ceil(self.rows_per_part).max(1)
    }

    /// Bytes of the buffer holding every part.
    pub fn bytes(&self) -> u64 {
        let last = self.layout.rows - (self.n_parts() - 1) * self.rows_per_part;
        (self.n_parts() - 1) * self.stride + self.layout.part_bytes(last)
    }

    /// Byte offset of row `r` in the buffer.
    pub fn row_offset(&self, r: u64) -> u64 {
        (r / self.rows_per_part) * self.stride + (r % self.rows_per_part) * self.layout.row_bytes
    }

    /// The parts of the weight in `buf`.
    pub fn parts<'a>(&self, buf: &'a wgpu::Buffer) -> Vec<WeightPart<'a>> {
        (0..self.n_parts())
            .map(|p| {
                let first_row = p * self.rows_per_part;
                WeightPart {
                    buffer: buf,
                    offset: p * self.stride,
                    first_row,
                    rows: self.rows_per_part.min(self.layout.rows - first_row),
                }
            })
            .collect()
    }
}

/// Whether a weight of `ty` with rows of `cols` values has kernels here.
pub(super) fn supports(ty: GgmlType, cols: usize) -> bool {
    WEIGHT_TYPES.contains(&ty) && packed_layout(ty, 1, cols as u64).is_ok()
}

impl WebGpuBackend {
    /// The placement of a `[rows, cols]` weight of `ty` on this adapter.
    pub(super) fn placement(
        &self,
        ty: GgmlType,
        cols: usize,
        rows: usize,
    ) -> Result<Placement, BackendError> {
        let layout = packed_layout(ty, rows as u64, cols as u64)?;
        let max = self.ctx.caps.max_storage_binding;
        // Errors when one row exceeds the limit. Not capped by `rows`, so
        // that the rows of a chunk land where the whole weight's do.
        layout.rows_per_part(max)?;
        let rows_per_part = max / layout.row_bytes;
        let align = u64::from(self.ctx.caps.storage_offset_alignment.max(4));
        let stride = layout.part_bytes(rows_per_part).next_multiple_of(align);
        Ok(Placement {
            layout,
            rows_per_part,
            stride,
        })
    }

    /// Repacks GGUF rows `first_row..` of a weight (`src`: whole rows) and
    /// writes them where [`Placement::row_offset`] puts them.
    pub(super) fn upload_rows(
        &self,
        dst: &GpuBuffer,
        ty: GgmlType,
        cols: usize,
        first_row: usize,
        src: &[u8],
    ) -> Result<(), BackendError> {
        let row_src = cols / ty.block_elems().max(1) * ty.block_bytes();
        if row_src == 0 || !src.len().is_multiple_of(row_src) {
            return Err(BackendError::Shape(format!(
                "upload of {ty} rows of {cols} values: {} bytes are not whole rows",
                src.len()
            )));
        }
        let rows = src.len() / row_src;
        let place = self.placement(ty, cols, first_row + rows)?;
        let mut rep = Repacker::new(ty, rows as u64, cols as u64)?;
        let mut packed = Vec::with_capacity(rows * place.layout.row_bytes as usize);
        rep.push_rows(src, &mut packed)?;
        let rb = place.layout.row_bytes as usize;
        let mut r = first_row as u64;
        let mut done = 0usize;
        while done < rows {
            // Rows up to the end of the part holding row `r` are contiguous.
            let left_in_part = place.rows_per_part - r % place.rows_per_part;
            let n = (left_in_part as usize).min(rows - done);
            let bytes = &packed[done * rb..(done + n) * rb];
            crate::backend::Backend::upload(self, dst, place.row_offset(r), bytes)?;
            done += n;
            r += n as u64;
        }
        Ok(())
    }

    /// Records a [`Op::MatMul`] or [`Op::GetRows`] over a weight of any
    /// supported type.
    pub(super) fn record_weight(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<(), BackendError> {
        let (ty, cols, w) = match *op {
            Op::MatMul { ty, k, .. } => (ty, k, nth(io.inputs, 1, op)?),
            Op::GetRows { ty, width } => (ty, width, nth(io.inputs, 0, op)?),
            _ => {
                return Err(BackendError::UnsupportedOp {
                    backend: "WebGPU".into(),
                    op: op.describe(),
                })
            }
        };
        let rows = self.weight_rows(ty, cols, w.len)?;
        let place = self.placement(ty, cols, rows as usize)?;
        if place.bytes() != w.len {
            return Err(BackendError::Shape(format!(
                "{op:?}: a weight buffer of {} bytes is not a packed {ty} weight of {rows} rows",
                w.len
            )));
        }
        if matches!(ty, GgmlType::F32 | GgmlType::F16) && place.n_parts() == 1 {
            return self.record_dense(op, io);
        }
        let kernels = self.quant.clone();
        let mut parts = place.parts(&w.raw);
        for p in &mut parts {
            p.offset += w.offset;
        }
        match *op {
            Op::MatMul { k, .. } => {
                let (x, y) = (nth(io.inputs, 0, op)?, nth(io.outputs, 0, op)?);
                let m = x.len / 4 / k.max(1) as u64;
                if x.len != m * k as u64 * 4 || y.len != m * rows * 4 {
                    return Err(BackendError::Shape(format!(
                        "{op:?}: x of {} bytes, {rows} weight rows, y of {} bytes",
                        x.len, y.len
                    )));
                }
                let args = MatmulArgs {
                    ty,
                    k: k as u64,
                    n: rows,
                    m,
                    x: BufRef {
                        buffer: &x.raw,
                        offset: 0,
                    },
                    w: &parts,
                    y: BufRef {
                        buffer: &y.raw,
                        offset: 0,
                    },
                };
                kernels.encode_matmul(self, &args)
            }
            _ => {
                let (ids, y) = (nth(io.inputs, 1, op)?, nth(io.outputs, 0, op)?);
                let count = ids.len / 4;
                if y.len != count * cols as u64 * 4 {
                    return Err(BackendError::Shape(format!(
                        "{op:?}: {count} ids into an output of {} bytes",
                        y.len
                    )));
                }
                let args = GetRowsArgs {
                    ty,
                    k: cols as u64,
                    n: rows,
                    ids: BufRef {
                        buffer: &ids.raw,
                        offset: 0,
                    },
                    count,
                    w: &parts,
                    y: BufRef {
                        buffer: &y.raw,
                        offset: 0,
                    },
                };
                kernels.encode_get_rows(self, &args)
            }
        }
    }

    /// Rows of a packed weight of `ty` with rows of `cols` values held in
    /// `bytes` bytes (the inverse of [`Placement::bytes`]).
    fn weight_rows(&self, ty: GgmlType, cols: usize, bytes: u64) -> Result<u64, BackendError> {
        let one = self.placement(ty, cols, 1)?;
        let rb = one.layout.row_bytes;
        Ok((bytes / one.stride) * one.rows_per_part + (bytes % one.stride) / rb)
    }
}
