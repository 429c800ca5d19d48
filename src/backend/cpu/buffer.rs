//! [`CpuBuffer`]: a host buffer of the CPU backend, and the view of it as
//! a weight ([`WeightRef`]).

use std::cell::{OnceCell, RefCell};
use std::sync::{Arc, Mutex, PoisonError};

use super::hostmem::HostMem;
use super::kernels::KernelTable;
use super::matmul::Weight;
use crate::backend::{BackendError, BufKind};
use crate::quant::GgmlType;

/// A host buffer.
#[derive(Debug)]
pub struct CpuBuffer {
    pub(super) data: RefCell<HostMem>,
    pub(super) len: u64,
    /// The kernels' view of a weight buffer, once an op used it as one (the
    /// data moves there from `data`).
    pub(super) weight: OnceCell<Weight>,
    /// What the buffer was allocated for.
    pub kind: BufKind,
    /// Where a step's activation buffer hands its memory back when dropped
    /// ([`CpuBackend::step_buffers`](super::backend::CpuBackend::step_buffers)): the pool and its slot.
    pub(super) home: Option<(ActSlots, usize)>,
}

/// Activation memory kept from one step to the next: slot `i` holds plan
/// buffer `i`'s memory while no step uses it. Allocated fresh each step,
/// a prompt's buffers (tens of MB) were zeroed and faulted in again every
/// step.
pub(super) type ActSlots = Arc<Mutex<Vec<Option<HostMem>>>>;

impl Drop for CpuBuffer {
    fn drop(&mut self) {
        if let Some((slots, i)) = self.home.take() {
            let mem = std::mem::take(self.data.get_mut());
            let mut slots = slots.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(slot) = slots.get_mut(i) {
                *slot = Some(mem);
            }
        }
    }
}

/// The error of a buffer an op reads while another op's borrow is live
/// (an op whose output is also one of its inputs where it may not be).
pub(super) fn busy() -> BackendError {
    BackendError::Shape("an op reads and writes the same buffer where it may not".into())
}

impl CpuBuffer {
    pub(super) fn bytes(&self) -> Result<Vec<u8>, BackendError> {
        if let Some(w) = self.weight.get() {
            return Ok(w.plain_bytes().into_owned());
        }
        let d = self.data.try_borrow().map_err(|_| busy())?;
        Ok(bytemuck::cast_slice::<u32, u8>(&d)[..self.len as usize].to_vec())
    }

    pub(super) fn f32s(&self) -> Result<Vec<f32>, BackendError> {
        let d = self.data.try_borrow().map_err(|_| busy())?;
        Ok(bytemuck::cast_slice::<u32, f32>(&d)[..self.len as usize / 4].to_vec())
    }

    /// Runs `f` on the buffer's values in place: no copy, for the ops that
    /// only read a large input (a 262144-value row of logits copied cost
    /// a fresh allocation and its page faults, a third of a millisecond).
    pub(super) fn with_f32s<R>(&self, f: impl FnOnce(&[f32]) -> R) -> Result<R, BackendError> {
        let d = self.data.try_borrow().map_err(|_| busy())?;
        Ok(f(
            &bytemuck::cast_slice::<u32, f32>(&d)[..self.len as usize / 4]
        ))
    }

    pub(super) fn u32s(&self) -> Result<Vec<u32>, BackendError> {
        let d = self.data.try_borrow().map_err(|_| busy())?;
        Ok(d[..self.len as usize / 4].to_vec())
    }

    /// The buffer as a weight of `ty` with rows of `cols`: cached for weight
    /// buffers, built from a copy for others.
    pub(super) fn weight(
        &self,
        table: &KernelTable,
        ty: GgmlType,
        cols: usize,
    ) -> Result<WeightRef<'_>, BackendError> {
        if let Some(w) = self.weight.get() {
            if w.ty != ty || w.cols != cols {
                return Err(BackendError::Shape(format!(
                    "weight buffer of {} rows of {} {} used as rows of {cols} {ty}",
                    w.rows, w.cols, w.ty
                )));
            }
            return Ok(WeightRef::Cached(w));
        }
        let len = self.len as usize;
        let row_bytes = (cols / ty.block_elems().max(1)) * ty.block_bytes();
        if row_bytes == 0
            || !len.is_multiple_of(row_bytes)
            || !cols.is_multiple_of(ty.block_elems().max(1))
        {
            return Err(BackendError::Shape(format!(
                "a buffer of {len} bytes does not hold rows of {cols} {ty}"
            )));
        }
        let rows = len / row_bytes;
        if self.kind != BufKind::Weights {
            let data = self.data.try_borrow().map_err(|_| busy())?.clone();
            let w = Weight::from_mem(table, "buffer", ty, cols, rows, data, len)?;
            return Ok(WeightRef::Owned(Box::new(w)));
        }
        if !table.supports(ty) {
            return Err(BackendError::UnsupportedType {
                tensor: "weight buffer".into(),
                ty,
                backend: "CPU".into(),
            });
        }
        let data = std::mem::take(&mut *self.data.try_borrow_mut().map_err(|_| busy())?);
        let w = Weight::from_mem(table, "weight buffer", ty, cols, rows, data, len)?;
        Ok(WeightRef::Cached(self.weight.get_or_init(|| w)))
    }

    pub(super) fn set_f32s(&self, v: &[f32]) -> Result<(), BackendError> {
        let mut d = self.data.try_borrow_mut().map_err(|_| busy())?;
        let n = v.len();
        if n * 4 != self.len as usize {
            return Err(BackendError::OutOfBounds {
                range: 0..(n as u64) * 4,
                len: self.len,
            });
        }
        bytemuck::cast_slice_mut::<u32, f32>(&mut d)[..n].copy_from_slice(v);
        Ok(())
    }
}

/// A weight view: the cached one of a weight buffer, or a copy (boxed:
/// a copy of the whole matrix is made anyway).
#[derive(Debug)]
pub(super) enum WeightRef<'a> {
    Cached(&'a Weight),
    Owned(Box<Weight>),
}

impl std::ops::Deref for WeightRef<'_> {
    type Target = Weight;
    fn deref(&self) -> &Weight {
        match self {
            WeightRef::Cached(w) => w,
            WeightRef::Owned(w) => w,
        }
    }
}
