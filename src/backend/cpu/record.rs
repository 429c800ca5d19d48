//! The CPU backend's K/V and paged-attention ops: the kernels of
//! [`super::attention`] over the buffers of an [`OpIo`].

use crate::graph::KvType;
use half::f16;

use super::attention::{
    attend_slots_scalar, attend_slots_with, table_slots, write_rows, AttnSeq, AttnShape, KvMut,
    KvRef, LayerKv,
};
use super::backend::{nth, CpuBackend, CpuBuffer};
use crate::backend::{BackendError, OpIo};
use crate::graph::Op;
use crate::kv::BlockId;

fn busy() -> BackendError {
    BackendError::Shape("an op reads and writes the same buffer where it may not".into())
}

fn unsupported(op: &Op) -> BackendError {
    BackendError::UnsupportedOp {
        backend: "CPU".into(),
        op: op.describe(),
    }
}

/// Runs `f` on a cache buffer's values as `dtype`.
fn with_cache<R>(
    b: &CpuBuffer,
    dtype: KvType,
    f: impl FnOnce(KvRef<'_>) -> R,
) -> Result<R, BackendError> {
    let d = b.data.try_borrow().map_err(|_| busy())?;
    let bytes = &bytemuck::cast_slice::<u32, u8>(&d)[..b.len as usize];
    Ok(match dtype {
        KvType::F16 => f(KvRef::F16(bytemuck::cast_slice::<u8, f16>(
            &bytes[..bytes.len() / 2 * 2],
        ))),
        KvType::F32 => f(KvRef::F32(bytemuck::cast_slice::<u8, f32>(
            &bytes[..bytes.len() / 4 * 4],
        ))),
    })
}

/// Runs `f` on a cache buffer's values as `dtype`, mutably.
pub(super) fn with_cache_mut<R>(
    b: &CpuBuffer,
    dtype: KvType,
    f: impl FnOnce(KvMut<'_>) -> R,
) -> Result<R, BackendError> {
    let mut d = b.data.try_borrow_mut().map_err(|_| busy())?;
    let len = b.len as usize;
    let bytes = &mut bytemuck::cast_slice_mut::<u32, u8>(&mut d)[..len];
    Ok(match dtype {
        KvType::F16 => f(KvMut::F16(bytemuck::cast_slice_mut::<u8, f16>(
            &mut bytes[..len / 2 * 2],
        ))),
        KvType::F32 => f(KvMut::F32(bytemuck::cast_slice_mut::<u8, f32>(
            &mut bytes[..len / 4 * 4],
        ))),
    })
}

/// Writes rows of `src` into a cache buffer at `slots`.
pub(super) fn write_cache(
    b: &CpuBuffer,
    dtype: KvType,
    width: usize,
    slots: &[usize],
    src: &[f32],
) -> Result<(), BackendError> {
    with_cache_mut(b, dtype, |dst| write_rows(dst, width, slots, src))?
}

/// Bytes of one cache element.
fn elem_bytes(dtype: KvType) -> usize {
    match dtype {
        KvType::F16 => 2,
        KvType::F32 => 4,
    }
}

impl CpuBackend {
    pub(super) fn kv_write(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        let Op::KvWrite {
            k_width,
            v_width,
            dtype,
            ..
        } = *op
        else {
            return Err(unsupported(op));
        };
        let slots: Vec<usize> = nth(io.inputs, 2, op)?
            .u32s()?
            .iter()
            .map(|&s| s as usize)
            .collect();
        // K and V are read in place: copies of a prefill's rows (1 MiB
        // each for 512 tokens of a 1B model) were fresh allocations, page
        // faults and all, half of this op's time.
        nth(io.inputs, 0, op)?
            .with_f32s(|k| write_cache(nth(io.outputs, 0, op)?, dtype, k_width, &slots, k))??;
        nth(io.inputs, 1, op)?
            .with_f32s(|v| write_cache(nth(io.outputs, 1, op)?, dtype, v_width, &slots, v))?
    }

    pub(super) fn paged_attention(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
    ) -> Result<(), BackendError> {
        let Op::PagedAttention {
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            scale,
            window,
            softcap,
            block_size,
            dtype,
            ..
        } = *op
        else {
            return Err(unsupported(op));
        };
        let shape = AttnShape {
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            scale,
            window,
            softcap,
        };
        let kc = nth(io.inputs, 1, op)?;
        let row_bytes = n_head_kv * head_dim_k * elem_bytes(dtype);
        let num_blocks = kc.len as usize / (row_bytes * block_size).max(1);
        let (seqs, slots) = self.attn_seqs(op, io, block_size, num_blocks)?;
        let ob = nth(io.outputs, 0, op)?;
        let mut od = ob.data.try_borrow_mut().map_err(|_| busy())?;
        let out = &mut bytemuck::cast_slice_mut::<u32, f32>(&mut od)[..ob.len as usize / 4];
        let vc = nth(io.inputs, 2, op)?;
        // Q is read in place, as K/V writes read their rows.
        nth(io.inputs, 0, op)?.with_f32s(|q| {
            with_cache(kc, dtype, |k| {
                with_cache(vc, dtype, |v| {
                    let kv = LayerKv { k, v };
                    let t = &self.threads;
                    match &self.attn {
                        Some(k) => attend_slots_with(k, t, kv, &shape, &seqs, &slots, q, out),
                        None => attend_slots_scalar(t, kv, &shape, &seqs, &slots, q, out),
                    }
                })
            })
        })???
    }

    /// The sequences of an attention op and the slot of each of their positions.
    #[allow(clippy::type_complexity)]
    fn attn_seqs(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<(Vec<AttnSeq<'static>>, Vec<Vec<usize>>), BackendError> {
        let info = nth(io.inputs, 3, op)?.u32s()?;
        let tables: Vec<BlockId> = nth(io.inputs, 4, op)?
            .u32s()?
            .into_iter()
            .map(BlockId)
            .collect();
        let mut seqs = Vec::with_capacity(info.len() / 4);
        let mut slots = Vec::with_capacity(info.len() / 4);
        for s in info.chunks_exact(4) {
            let [row, len, start, at] = [s[0], s[1], s[2], s[3]].map(|v| v as usize);
            let n = start + len;
            let table = tables.get(at..).unwrap_or(&[]);
            let table = &table[..table.len().min(n.div_ceil(block_size.max(1)))];
            slots.push(table_slots(table, n, block_size, num_blocks)?);
            seqs.push(AttnSeq {
                row,
                len,
                start,
                block_table: &[],
            });
        }
        Ok((seqs, slots))
    }
}
