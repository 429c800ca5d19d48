//! [`CpuBackend`]: the [`Backend`] trait over host memory.
//!
//! The CPU executes each op as it is recorded (`submit` has nothing left to
//! do) and `download` is ready at once. Buffers are 4-byte aligned host
//! memory behind a `RefCell`, so an op may write a buffer it also reads.
//! The K/V cache, paged attention and expert ops need the model's cache and
//! block tables: [`CpuModel`](super::CpuModel) runs them directly, and
//! `supports` says no to them here.

use std::cell::RefCell;
use std::future::Future;
use std::ops::Range;

use super::kernels::KernelTable;
use super::matmul::{matmul, Weight};
use super::ops;
use super::threads::Threads;
use crate::backend::{Backend, BackendError, BufKind, Caps, OpIo};
use crate::graph::Op;

/// A host buffer.
#[derive(Debug)]
pub struct CpuBuffer {
    data: RefCell<Vec<u32>>,
    len: u64,
    /// What the buffer was allocated for.
    pub kind: BufKind,
}

impl CpuBuffer {
    fn bytes(&self) -> Vec<u8> {
        let d = self.data.borrow();
        bytemuck::cast_slice::<u32, u8>(&d)[..self.len as usize].to_vec()
    }

    fn f32s(&self) -> Vec<f32> {
        let d = self.data.borrow();
        bytemuck::cast_slice::<u32, f32>(&d)[..self.len as usize / 4].to_vec()
    }

    fn u32s(&self) -> Vec<u32> {
        self.data.borrow()[..self.len as usize / 4].to_vec()
    }

    fn set_f32s(&self, v: &[f32]) -> Result<(), BackendError> {
        let mut d = self.data.borrow_mut();
        let n = v.len();
        if n * 4 > self.len as usize {
            return Err(BackendError::OutOfBounds {
                range: 0..(n as u64) * 4,
                len: self.len,
            });
        }
        bytemuck::cast_slice_mut::<u32, f32>(&mut d)[..n].copy_from_slice(v);
        Ok(())
    }
}

/// The CPU as a [`Backend`].
#[derive(Debug)]
pub struct CpuBackend {
    caps: Caps,
    table: KernelTable,
    threads: Threads,
}

impl CpuBackend {
    /// A backend on `threads` threads (0 = all cores).
    pub fn new(threads: usize) -> Self {
        let threads = Threads::new(threads);
        let table = KernelTable::detect();
        let caps = Caps {
            name: format!("cpu {:?} x{}", table.isa(), threads.count()).to_lowercase(),
            max_buffer_bytes: isize::MAX as u64,
            f16: false,
            threads: threads.count(),
        };
        Self {
            caps,
            table,
            threads,
        }
    }
}

/// The `i`th buffer of `list`, or a shape error naming the op.
fn nth<'a>(list: &[&'a CpuBuffer], i: usize, op: &Op) -> Result<&'a CpuBuffer, BackendError> {
    list.get(i)
        .copied()
        .ok_or_else(|| BackendError::Shape(format!("{op:?} needs buffer {i}")))
}

/// Applies an element-wise binary op `f(x, y)` into output 0.
fn binary(
    io: &OpIo<'_, CpuBuffer>,
    op: &Op,
    f: fn(&mut [f32], &[f32]),
) -> Result<(), BackendError> {
    let mut x = nth(io.inputs, 0, op)?.f32s();
    let y = nth(io.inputs, 1, op)?.f32s();
    f(&mut x, &y);
    nth(io.outputs, 0, op)?.set_f32s(&x)
}

impl CpuBackend {
    fn get_rows(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        let Op::GetRows { ty, width } = op else {
            return Err(BackendError::UnsupportedOp(format!("{op:?}")));
        };
        let table = nth(io.inputs, 0, op)?;
        let rows = table.len as usize / (width / ty.block_elems() * ty.block_bytes()).max(1);
        let w = Weight::new(
            &self.table,
            "get_rows table",
            *ty,
            *width,
            rows,
            table.data.borrow().clone(),
            table.len as usize,
        )?;
        let ids = nth(io.inputs, 1, op)?.u32s();
        let mut out = vec![0.0f32; ids.len() * width];
        for (row, &id) in out.chunks_exact_mut(*width).zip(&ids) {
            if id as usize >= rows {
                return Err(BackendError::Shape(format!(
                    "get_rows: id {id} of {rows} rows"
                )));
            }
            w.dequantize_row(id as usize, row);
        }
        nth(io.outputs, 0, op)?.set_f32s(&out)
    }

    fn mat_mul(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        let Op::MatMul { ty, k, n, exact } = op else {
            return Err(BackendError::UnsupportedOp(format!("{op:?}")));
        };
        let x = nth(io.inputs, 0, op)?.f32s();
        let wb = nth(io.inputs, 1, op)?;
        let w = Weight::new(
            &self.table,
            "matmul weight",
            *ty,
            *k,
            *n,
            wb.data.borrow().clone(),
            wb.len as usize,
        )?;
        let rows = x.len() / k;
        let mut y = vec![0.0f32; rows * n];
        matmul(
            &self.threads,
            &self.table,
            &w,
            0..*n,
            &x[..rows * k],
            &mut y,
            *exact,
        )?;
        nth(io.outputs, 0, op)?.set_f32s(&y)
    }

    fn unary(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        let mut x = nth(io.inputs, 0, op)?.f32s();
        match op {
            Op::RmsNorm { width, eps } => {
                let w = nth(io.inputs, 1, op)?.f32s();
                ops::rms_norm(&mut x, &w[..*width], *eps);
            }
            Op::Rope {
                mode,
                head_dim,
                n_rot,
                base,
                scale,
            } => {
                let pos: Vec<usize> = nth(io.inputs, 1, op)?
                    .u32s()
                    .iter()
                    .map(|&p| p as usize)
                    .collect();
                ops::rope_scaled(&mut x, &pos, *head_dim, *n_rot, *base, *scale, *mode);
            }
            Op::Scale(s) => ops::scale(&mut x, *s),
            Op::LogitSoftcap(c) => ops::softcap(&mut x, *c),
            Op::Softmax { width } => x.chunks_exact_mut(*width).for_each(ops::softmax),
            _ => return Err(BackendError::UnsupportedOp(format!("{op:?}"))),
        }
        nth(io.outputs, 0, op)?.set_f32s(&x)
    }
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn alloc(&self, bytes: u64, kind: BufKind) -> Result<CpuBuffer, BackendError> {
        let words = usize::try_from(bytes.div_ceil(4)).map_err(|_| BackendError::OutOfBounds {
            range: 0..bytes,
            len: 0,
        })?;
        Ok(CpuBuffer {
            data: RefCell::new(vec![0; words]),
            len: bytes,
            kind,
        })
    }

    fn upload(&self, dst: &CpuBuffer, offset: u64, src: &[u8]) -> Result<(), BackendError> {
        let end = offset + src.len() as u64;
        if end > dst.len {
            return Err(BackendError::OutOfBounds {
                range: offset..end,
                len: dst.len,
            });
        }
        let mut d = dst.data.borrow_mut();
        bytemuck::cast_slice_mut::<u32, u8>(&mut d)[offset as usize..end as usize]
            .copy_from_slice(src);
        Ok(())
    }

    fn supports(&self, op: &Op) -> bool {
        match op {
            Op::GetRows { ty, .. } | Op::MatMul { ty, .. } => self.table.weight(*ty).is_some(),
            Op::KvWrite { .. }
            | Op::PagedAttention { .. }
            | Op::MoeTopK { .. }
            | Op::MoeExperts { .. } => false,
            _ => true,
        }
    }

    fn record(&mut self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        match op {
            Op::GetRows { .. } => self.get_rows(op, io),
            Op::MatMul { .. } => self.mat_mul(op, io),
            Op::Add => binary(io, op, ops::add),
            Op::Mul => binary(io, op, |x, y| {
                x.iter_mut().zip(y).for_each(|(a, b)| *a *= b)
            }),
            Op::BiasAdd => binary(io, op, ops::add_bias),
            Op::SiluMul => binary(io, op, ops::silu_mul),
            Op::GeluTanhMul => binary(io, op, ops::gelu_mul),
            _ if self.supports(op) => self.unary(op, io),
            _ => Err(BackendError::UnsupportedOp(format!("{op:?}"))),
        }
    }

    fn submit(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    fn download(
        &self,
        src: &CpuBuffer,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        let result = if range.start <= range.end && range.end <= src.len {
            Ok(src.bytes()[range.start as usize..range.end as usize].to_vec())
        } else {
            Err(BackendError::OutOfBounds {
                range,
                len: src.len,
            })
        };
        std::future::ready(result)
    }
}
