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

use super::backend::{nth, rope_inputs, rope_params, CpuBackend, CpuBuffer};
use super::matmul::{act_format, grow_bytes, product, quantize_into, Weight};
use super::record::{with_cache_mut, write_cache};
use super::rowops::PAR_MIN;
use crate::backend::{BackendError, OpIo};
use crate::graph::reference;
use crate::graph::Op;
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

    /// The quantized rows of `key` and their row length: those held, or
    /// what `fill` quantizes into a buffer (returning its row length),
    /// then held.
    fn get_or_fill(
        &mut self,
        key: Key,
        fill: impl FnOnce(&mut Vec<u32>) -> Result<usize, BackendError>,
    ) -> Result<(&[u8], usize), BackendError> {
        let i = match self.entries.iter().position(|e| e.key == key) {
            Some(i) => i,
            None => {
                let mut data = self.buffer();
                let row_bytes = fill(&mut data)?;
                self.put(key, row_bytes, data);
                0
            }
        };
        let e = &self.entries[i];
        let bytes: &[u8] = bytemuck::cast_slice(&e.data);
        Ok((&bytes[..key.rows * e.row_bytes], e.row_bytes))
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

/// A piece of [`CpuBackend::then_quantize`]'s work: its index, its rows
/// and their quantized bytes.
type Piece<'a> = (usize, (&'a mut [f32], &'a mut [u8]));

/// Rows per parallel task of a fused op over `rows` rows on `threads`:
/// about four tasks per thread, at most 8 rows (a prefill's quantizing
/// tasks).
fn rows_per_task(rows: usize, threads: usize) -> usize {
    rows.div_ceil(threads.max(1) * 4).clamp(1, 8)
}

/// Whether `a` and `b` are one buffer.
fn same(a: &CpuBuffer, b: &CpuBuffer) -> bool {
    std::ptr::eq(a, b)
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
        // Whether `out` holds one row of `width` values: a step of one
        // token (decode) runs apart. Fused, SmolLM2's and Gemma-3's decode
        // at one thread ran 3-6% slower; their prompts 1-4% faster.
        let one_row = |width: usize| out.len as usize <= 4 * width;
        match (op, nop) {
            (Op::RmsNorm { width, .. }, _) if one_row(*width) => Ok(false),
            (Op::SiluMul | Op::GeluTanhMul, Op::MatMul { k, .. }) if one_row(*k) => Ok(false),
            (Op::Rope { .. }, Op::KvWrite { k_width, .. }) if one_row(*k_width) => Ok(false),
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
        let key = Key::new(xb, w, x.len() / w.cols.max(1));
        let mut shared = self.shared.borrow_mut();
        let (a, row_bytes) = shared.get_or_fill(key, |data| {
            quantize_into(&self.threads, &self.table, w, x, data)
        })?;
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
        let norm = self.rows().norm_kernel();
        nth(io.inputs, 1, op)?.with_f32s(|gamma| match gamma.get(..w.cols) {
            Some(gamma) => self.then_quantize(op, io, w, |x, _| norm(x, gamma, eps)),
            None => Ok(false),
        })?
    }

    /// A gated product `x = act(x) * y` (into output 0) fused with
    /// quantizing its rows for `w`.
    fn gated_quantize(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        w: &Weight,
    ) -> Result<bool, BackendError> {
        let (Some(gated), yb) = (self.rows().gated_kernel(op), nth(io.inputs, 1, op)?) else {
            return Ok(false);
        };
        // Pieces of whole rows then start at multiples of 16 values, where
        // `RowOps` starts its pieces (always: quantized rows are whole
        // blocks of 32 or 256).
        if !w.cols.is_multiple_of(16) || yb.len != nth(io.inputs, 0, op)?.len {
            return Ok(false);
        }
        // `in_output` declines an output that is input 1, so `y` may stay
        // borrowed.
        yb.with_f32s(|y| self.then_quantize(op, io, w, |x, at| gated(x, &y[at..at + x.len()])))?
    }

    /// Runs the row op `f(piece, offset)` on output 0 (input 0's values,
    /// [`Self::in_output`]) in pieces of whole rows of `w.cols`, each piece
    /// quantized for `w` as soon as `f` is done with it; the quantized
    /// rows are held for the product that reads output 0. `false` where
    /// output 0 cannot hold the work.
    fn then_quantize(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        w: &Weight,
        f: impl Fn(&mut [f32], usize) + Sync + Send,
    ) -> Result<bool, BackendError> {
        let (quantize, row_bytes) = act_format(&self.table, w)?;
        let (out, width) = (nth(io.outputs, 0, op)?, w.cols);
        if width == 0 || !(out.len as usize / 4).is_multiple_of(width) {
            return Ok(false);
        }
        let rows = out.len as usize / 4 / width;
        let mut shared = self.shared.borrow_mut();
        let mut data = shared.buffer();
        let done = Self::in_output(op, io, |x| {
            let q = grow_bytes(&mut data, rows * row_bytes);
            let per = rows_per_task(rows, self.threads.count());
            let mut jobs: Vec<Piece<'_>> = x
                .chunks_mut(per * width)
                .zip(q.chunks_mut(per * row_bytes))
                .enumerate()
                .collect();
            self.run_jobs(&mut jobs, rows * width, |(i, (x, q))| {
                f(x, *i * per * width);
                for (xr, qr) in x.chunks_exact(width).zip(q.chunks_exact_mut(row_bytes)) {
                    quantize(xr, qr);
                }
            });
            Ok(())
        })?;
        if done {
            shared.put(Key::new(out, w, rows), row_bytes, data);
        } else {
            shared.spare.push(data);
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
        let mut kd = kb.data.try_borrow_mut().map_err(|_| busy(op))?;
        let k = bytemuck::cast_slice_mut::<u32, f32>(&mut kd)
            .get_mut(..kb.len as usize / 4)
            .ok_or_else(|| busy(op))?;
        let (pos, factors) = rope_inputs(op, io, k.len())?;
        let p = rope_params(op, factors.as_deref()).ok_or_else(|| busy(op))?;
        if k_width == 0
            || v_width == 0
            || pos.len() != tokens
            || k.len() != tokens * k_width
            || !p.rotates()
        {
            return Ok(false);
        }
        let angles = self.rope_angles(&pos, &p);
        let half = p.n_rot / 2;
        vb.with_f32s(|v| {
            if v.len() < tokens * v_width {
                return Err(BackendError::Shape(format!(
                    "{kv:?}: {} V values for {tokens} tokens",
                    v.len()
                )));
            }
            let v = &v[..tokens * v_width];
            // Threads write the rows of distinct slots inside the caches;
            // a step's few rows (decode), or slots outside or named twice,
            // take the ops' own order (the write reports the first and
            // writes the second in order).
            let parallel = tokens * (k_width + v_width) >= PAR_MIN && self.threads.count() > 1;
            let split = parallel
                && with_cache_mut(kc, dtype, |kcache| {
                    with_cache_mut(vc, dtype, |vcache| {
                        let (Ok(mut krows), Ok(mut vrows)) = (
                            kcache.split_rows(k_width, &slots),
                            vcache.split_rows(v_width, &slots),
                        ) else {
                            return false;
                        };
                        let per = rows_per_task(tokens, self.threads.count());
                        let mut jobs: Vec<_> = k
                            .chunks_mut(per * k_width)
                            .zip(v.chunks(per * v_width))
                            .zip(angles.chunks(per * half))
                            .zip(krows.chunks_mut(per).zip(vrows.chunks_mut(per)))
                            .collect();
                        self.run_jobs(&mut jobs, PAR_MIN, |(((k, v), angles), (kd, vd))| {
                            reference::rope_apply(k, angles, &p);
                            for (kr, d) in k.chunks_exact(k_width).zip(kd.iter_mut()) {
                                d.write(0, kr);
                            }
                            for (vr, d) in v.chunks_exact(v_width).zip(vd.iter_mut()) {
                                d.write(0, vr);
                            }
                        });
                        true
                    })
                })??;
            if !split {
                reference::rope_apply(k, &angles, &p);
                write_cache(kc, dtype, k_width, &slots, k)?;
                write_cache(vc, dtype, v_width, &slots, v)?;
            }
            Ok(())
        })??;
        Ok(true)
    }
}

/// The error of a buffer that cannot be borrowed as `op` needs it.
fn busy(op: &Op) -> BackendError {
    BackendError::Shape(format!("{op:?}: a buffer is in use or too short"))
}
