//! Fused row ops of the CPU backend: where an op's result is read at once
//! by the next op, the two run as one pass over the rows, each thread
//! finishing its rows while they are in its cache. The backend sees the
//! next op through [`Backend::record_with_next`](crate::backend::Backend::record_with_next).
//!
//! - An RMS norm read by a matrix product: each thread norms its rows and
//!   quantizes them at once to the product's activation type; the product
//!   takes them quantized ([`SharedActs`]).
//! - A gated activation (SwiGLU, GeGLU) read by a product: likewise.
//! - The RoPE of K followed by the K/V write: each thread rotates its
//!   tokens' K rows and writes them, and their V rows, into the cache.
//!
//! Quantized activations are also shared: the Q, K and V products (gate
//! and up) of one normed input quantize it once, not three times (twice).
//!
//! Each fused path computes every value with the kernels of the ops apart,
//! on the same rows (a gated product in pieces starting at multiples of
//! 16 values, as [`super::rowops`] splits it): the results are bit for bit
//! those of the ops one by one ([`CpuBackend::set_fusion`] turns fusion
//! off, for comparisons).

use super::attention::{write_rows, KvMut};
use super::backend::{nth, rope_inputs, rope_params, CpuBackend, CpuBuffer};
use super::matmul::{act_format, grow_bytes, product, quantize_into, Weight};
use super::ops;
use super::rowops::PAR_MIN;
use crate::backend::{BackendError, OpIo};
use crate::graph::Op;
use crate::model::KvType;
use crate::quant::GgmlType;

/// What a set of quantized activations was made from: the rows of one
/// buffer (by address; valid until an op writes the buffer, or the step
/// ends) for one activation type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    src: usize,
    ty: GgmlType,
    cols: usize,
    rows: usize,
}

impl Key {
    fn new(src: &CpuBuffer, w: &Weight, rows: usize) -> Self {
        Self {
            src: std::ptr::from_ref(src) as usize,
            ty: w.act_type(),
            cols: w.cols,
            rows,
        }
    }
}

/// Quantized activations of one buffer's rows.
#[derive(Debug)]
struct Entry {
    key: Key,
    row_bytes: usize,
    data: Vec<u32>,
}

/// The activations quantized last, for the products that read the same
/// rows after the first (and the quantizing a fused op did for them).
#[derive(Debug, Default)]
pub(super) struct SharedActs {
    /// Most recent first, at most [`Self::KEEP`].
    entries: Vec<Entry>,
    /// Buffers of forgotten entries, reused.
    spare: Vec<Vec<u32>>,
}

impl SharedActs {
    /// Entries kept: a model whose products want two activation types
    /// (Q8_0 beside Q8_K) then still quantizes each input once per type.
    const KEEP: usize = 2;

    /// The quantized rows of `key` and their row length, if held.
    fn get(&self, key: Key) -> Option<(&[u8], usize)> {
        let e = self.entries.iter().find(|e| e.key == key)?;
        let bytes: &[u8] = bytemuck::cast_slice(&e.data);
        Some((bytes.get(..key.rows * e.row_bytes)?, e.row_bytes))
    }

    /// A buffer to quantize into (a forgotten entry's, when there is one).
    fn buffer(&mut self) -> Vec<u32> {
        self.spare.pop().unwrap_or_default()
    }

    /// Holds `data` as the rows of `key`, dropping the oldest entry past
    /// [`Self::KEEP`].
    fn put(&mut self, key: Key, row_bytes: usize, data: Vec<u32>) {
        self.entries.retain(|e| e.key != key);
        self.entries.insert(
            0,
            Entry {
                key,
                row_bytes,
                data,
            },
        );
        while self.entries.len() > Self::KEEP {
            if let Some(e) = self.entries.pop() {
                self.spare.push(e.data);
            }
        }
    }

    /// Forgets what was quantized from `buf` (about to be written).
    pub(super) fn forget(&mut self, buf: &CpuBuffer) {
        let src = std::ptr::from_ref(buf) as usize;
        while let Some(i) = self.entries.iter().position(|e| e.key.src == src) {
            let e = self.entries.remove(i);
            self.spare.push(e.data);
        }
    }

    /// Forgets everything (the end of a step: its buffers may be freed, and
    /// their addresses reused).
    pub(super) fn clear(&mut self) {
        for e in self.entries.drain(..) {
            self.spare.push(e.data);
        }
    }
}

/// One task of a fused gated product: its rows of `x` and `y`, and of the
/// quantized result.
type GatedJob<'a> = ((&'a mut [f32], &'a [f32]), &'a mut [u8]);

/// Rows per parallel task of a fused op over `rows` rows on `threads`:
/// about four tasks per thread, at most 8 rows (a prefill's quantizing
/// tasks), a multiple of `step`.
fn rows_per_task(rows: usize, threads: usize, step: usize) -> usize {
    rows.div_ceil(threads.max(1) * 4)
        .clamp(1, 8)
        .next_multiple_of(step.max(1))
}

impl CpuBackend {
    /// Runs `f` on each job: on the threads, or on the calling thread
    /// where the work is below [`PAR_MIN`] values (a decode step's rows,
    /// whose parallel region would cost more than it saves).
    fn run_jobs<T: Send>(&self, jobs: &mut [T], values: usize, f: impl Fn(&mut T) + Sync + Send) {
        if values < PAR_MIN || self.threads.count() == 1 || jobs.len() < 2 {
            jobs.iter_mut().for_each(f);
        } else {
            self.threads
                .for_chunks(jobs, 1, |_, js| js.iter_mut().for_each(&f));
        }
    }
}

/// Whether `a` and `b` are one buffer.
fn same(a: &CpuBuffer, b: &CpuBuffer) -> bool {
    std::ptr::eq(a, b)
}

impl CpuBackend {
    /// Runs `op` fused with `next` where they fuse, and says whether it did
    /// (`false`: nothing was run, the caller runs `op` alone).
    pub(super) fn try_fused(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        next: (&Op, &OpIo<'_, CpuBuffer>),
    ) -> Result<bool, BackendError> {
        let (nop, nio) = next;
        let (Some(&out), Some(&read)) = (io.outputs.first(), nio.inputs.first()) else {
            return Ok(false);
        };
        if !same(out, read) {
            return Ok(false);
        }
        match (op, nop) {
            (
                Op::RmsNorm { width, eps },
                Op::MatMul {
                    ty,
                    k,
                    exact: false,
                    ..
                },
            ) if width == k => {
                let w = nth(nio.inputs, 1, nop)?.weight(&self.table, *ty, *k)?;
                self.norm_quantize(op, io, &w, *eps)
            }
            (
                Op::SiluMul | Op::GeluTanhMul,
                Op::MatMul {
                    ty,
                    k,
                    exact: false,
                    ..
                },
            ) => {
                let w = nth(nio.inputs, 1, nop)?.weight(&self.table, *ty, *k)?;
                self.gated_quantize(op, io, &w)
            }
            (Op::Rope { .. }, Op::KvWrite { .. }) => self.rope_kv_write(op, io, nop, nio),
            _ => Ok(false),
        }
    }

    /// A matrix product whose activations may have been quantized already
    /// (by a fused op, or the product before it on the same rows); what it
    /// quantizes itself is kept for the next.
    pub(super) fn shared_product(
        &self,
        w: &Weight,
        xb: &CpuBuffer,
        x: &[f32],
        y: &mut [f32],
    ) -> Result<(), BackendError> {
        let rows = x.len() / w.cols.max(1);
        let key = Key::new(xb, w, rows);
        let mut shared = self.shared.borrow_mut();
        if shared.get(key).is_none() {
            let mut data = shared.buffer();
            let row_bytes = quantize_into(&self.threads, &self.table, w, x, &mut data)?;
            shared.put(key, row_bytes, data);
        }
        let (a, row_bytes) = shared
            .get(key)
            .ok_or_else(|| BackendError::Shape(format!("{}: activations lost", w.name)))?;
        product(&self.threads, w, 0..w.rows, a, row_bytes, y);
        Ok(())
    }

    /// RMS norm (into output 0) fused with quantizing its rows for `w`.
    fn norm_quantize(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        w: &Weight,
        eps: f32,
    ) -> Result<bool, BackendError> {
        let (quantize, row_bytes) = act_format(&self.table, w)?;
        let width = w.cols;
        let gamma = nth(io.inputs, 1, op)?.f32s()?;
        let (Some(gamma), true) = (gamma.get(..width), width > 0) else {
            return Ok(false);
        };
        let norm = self.rows().norm_kernel();
        let mut shared = self.shared.borrow_mut();
        let mut data = shared.buffer();
        let mut rows = 0;
        let done = Self::in_output(op, io, |x| {
            if !x.len().is_multiple_of(width) {
                return Err(BackendError::Shape(format!(
                    "{op:?}: {} values are not rows of {width}",
                    x.len()
                )));
            }
            rows = x.len() / width;
            let q = grow_bytes(&mut data, rows * row_bytes);
            let per = rows_per_task(rows, self.threads.count(), 1);
            let mut jobs: Vec<(&mut [f32], &mut [u8])> = x
                .chunks_mut(per * width)
                .zip(q.chunks_mut(per * row_bytes))
                .collect();
            self.run_jobs(&mut jobs, rows * width, |(x, q)| {
                norm(x, gamma, eps);
                for (xr, qr) in x.chunks_exact(width).zip(q.chunks_exact_mut(row_bytes)) {
                    quantize(xr, qr);
                }
            });
            Ok(())
        })?;
        match (done, nth(io.outputs, 0, op)) {
            (true, Ok(out)) => shared.put(Key::new(out, w, rows), row_bytes, data),
            _ => shared.spare.push(data),
        }
        Ok(done)
    }

    /// A gated product `x = act(x) * y` (into output 0) fused with
    /// quantizing its rows for `w`.
    fn gated_quantize(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        w: &Weight,
    ) -> Result<bool, BackendError> {
        let Some(gated) = self.rows().gated_kernel(op) else {
            return Ok(false);
        };
        let (quantize, row_bytes) = act_format(&self.table, w)?;
        let (yb, width) = (nth(io.inputs, 1, op)?, w.cols);
        if width == 0 || yb.len != nth(io.inputs, 0, op)?.len {
            return Ok(false);
        }
        let mut shared = self.shared.borrow_mut();
        let mut data = shared.buffer();
        let mut rows = 0;
        // `in_output` declines an output that is input 1, so `y` is free
        // to borrow here.
        let done = Self::in_output(op, io, |x| {
            yb.with_f32s(|y| {
                if !x.len().is_multiple_of(width) || y.len() < x.len() {
                    return Err(BackendError::Shape(format!(
                        "{op:?}: {} and {} values for rows of {width}",
                        x.len(),
                        y.len()
                    )));
                }
                rows = x.len() / width;
                let q = grow_bytes(&mut data, rows * row_bytes);
                // Pieces of whole rows starting at multiples of 16 values,
                // where `RowOps` starts its pieces.
                let step = 16 / gcd(width, 16);
                let per = rows_per_task(rows, self.threads.count(), step) * width;
                let mut jobs: Vec<GatedJob<'_>> = x
                    .chunks_mut(per)
                    .zip(y.chunks(per))
                    .zip(q.chunks_mut(per / width * row_bytes))
                    .collect();
                self.run_jobs(&mut jobs, rows * width, |((x, y), q)| {
                    gated(x, &y[..x.len()]);
                    for (xr, qr) in x.chunks_exact(width).zip(q.chunks_exact_mut(row_bytes)) {
                        quantize(xr, qr);
                    }
                });
                Ok(())
            })?
        })?;
        match (done, nth(io.outputs, 0, op)) {
            (true, Ok(out)) => shared.put(Key::new(out, w, rows), row_bytes, data),
            _ => shared.spare.push(data),
        }
        Ok(done)
    }

    /// The RoPE of K in place fused with the K/V write after it (`kv`,
    /// `kv_io`): each thread rotates its tokens' K rows and writes them and
    /// their V rows to the cache. The write is then done, and
    /// [`CpuBackend::record_with_next`](crate::backend::Backend::record_with_next)
    /// skips it when it is recorded.
    fn rope_kv_write(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        kv: &Op,
        kv_io: &OpIo<'_, CpuBuffer>,
    ) -> Result<bool, BackendError> {
        let Op::KvWrite {
            k_width,
            v_width,
            dtype,
            ..
        } = *kv
        else {
            return Ok(false);
        };
        let kb = nth(io.outputs, 0, op)?;
        let vb = nth(kv_io.inputs, 1, kv)?;
        let (kc, vc) = (nth(kv_io.outputs, 0, kv)?, nth(kv_io.outputs, 1, kv)?);
        let others = [vb, kc, vc, nth(kv_io.inputs, 2, kv)?];
        // In place, and no buffer of the write one of the rope's.
        if !same(nth(io.inputs, 0, op)?, kb)
            || others
                .iter()
                .any(|&b| same(b, kb) || io.inputs[1..].iter().any(|&i| same(i, b)))
            || same(kc, vc)
            || same(vb, kc)
            || same(vb, vc)
        {
            return Ok(false);
        }
        let slots: Vec<usize> = others[3].u32s()?.iter().map(|&s| s as usize).collect();
        let tokens = slots.len();
        // Slots outside the caches, or named twice, go to the write alone
        // (which reports the first, and writes the second in order).
        let elem = match dtype {
            KvType::F16 => 2,
            KvType::F32 => 4,
        };
        let cache_rows = (kc.len as usize / (elem * k_width).max(1))
            .min(vc.len as usize / (elem * v_width).max(1));
        let mut sorted = slots.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1])
            || sorted.last().is_some_and(|&s| s >= cache_rows)
        {
            return Ok(false);
        }
        let mut kd = kb.data.try_borrow_mut().map_err(|_| busy(op))?;
        let k = bytemuck::cast_slice_mut::<u32, f32>(&mut kd)
            .get_mut(..kb.len as usize / 4)
            .ok_or_else(|| busy(op))?;
        let (pos, factors) = rope_inputs(op, io, k.len())?;
        let p = rope_params(op, factors.as_deref()).ok_or_else(|| busy(op))?;
        if k_width == 0 || v_width == 0 || pos.len() != tokens || k.len() != tokens * k_width {
            return Ok(false);
        }
        vb.with_f32s(|v| {
            if v.len() < tokens * v_width {
                return Err(BackendError::Shape(format!(
                    "{kv:?}: {} V values for {tokens} tokens",
                    v.len()
                )));
            }
            let v = &v[..tokens * v_width];
            if tokens * (k_width + v_width) < PAR_MIN || self.threads.count() == 1 {
                // A decode step's few rows: rotated and written in order.
                ops::rope_with(k, &pos, &p);
                with_cache(kc, dtype, |c| write_rows(c, k_width, &slots, k))??;
                return with_cache(vc, dtype, |c| write_rows(c, v_width, &slots, v))?;
            }
            with_cache(kc, dtype, |kcache| {
                with_cache(vc, dtype, |vcache| {
                    let mut krows = kcache.split_rows(k_width, &slots)?;
                    let mut vrows = vcache.split_rows(v_width, &slots)?;
                    let per = rows_per_task(tokens, self.threads.count(), 1);
                    let mut jobs: Vec<_> = k
                        .chunks_mut(per * k_width)
                        .zip(v.chunks(per * v_width))
                        .zip(pos.chunks(per))
                        .zip(krows.chunks_mut(per).zip(vrows.chunks_mut(per)))
                        .collect();
                    self.run_jobs(&mut jobs, PAR_MIN, |(((k, v), pos), (kd, vd))| {
                        ops::rope_with(k, pos, &p);
                        for (kr, d) in k.chunks_exact(k_width).zip(kd.iter_mut()) {
                            d.write(0, kr);
                        }
                        for (vr, d) in v.chunks_exact(v_width).zip(vd.iter_mut()) {
                            d.write(0, vr);
                        }
                    });
                    Ok(())
                })?
            })?
        })??;
        Ok(true)
    }
}

/// Runs `f` on a cache buffer's values as `dtype`.
fn with_cache<R>(
    b: &CpuBuffer,
    dtype: KvType,
    f: impl FnOnce(KvMut<'_>) -> R,
) -> Result<R, BackendError> {
    let mut d = b
        .data
        .try_borrow_mut()
        .map_err(|_| BackendError::Shape("a K/V cache is in use".into()))?;
    let len = b.len as usize;
    let bytes = &mut bytemuck::cast_slice_mut::<u32, u8>(&mut d)[..len];
    Ok(f(match dtype {
        KvType::F16 => KvMut::F16(bytemuck::cast_slice_mut(&mut bytes[..len / 2 * 2])),
        KvType::F32 => KvMut::F32(bytemuck::cast_slice_mut(&mut bytes[..len / 4 * 4])),
    }))
}

/// The error of a buffer that cannot be borrowed as `op` needs it.
fn busy(op: &Op) -> BackendError {
    BackendError::Shape(format!("{op:?}: a buffer is in use or too short"))
}

/// Greatest common divisor.
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
    }
}
