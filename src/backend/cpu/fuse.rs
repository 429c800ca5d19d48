//! The CPU backend's fused ops ([`crate::graph::fuse`] emits them where
//! [`CpuBackend::supports`](crate::backend::Backend::supports) accepts
//! them: steps of several tokens, with fusion on): each thread finishes
//! its rows while they are in its cache.
//!
//! - [`Op::FusedMatMul`]: the prologue (RMS norm, or a gated activation)
//!   and the quantizing of its rows for the first product run as one pass
//!   over the rows; every product reads those quantized rows (one
//!   quantizing per activation type, not one per product).
//! - [`Op::RopeKvWrite`]: the RoPE of q, then each thread rotates its
//!   tokens' K rows and writes them, and their V rows, into the cache.
//!
//! Each fused path computes every value with the kernels of the ops apart,
//! on the same rows (a gated product in pieces starting at multiples of
//! 16 values, as [`super::rowops`] splits it): the results are bit for bit
//! those of the ops one by one ([`crate::model::Model::set_fusion`] turns
//! fusion off, for comparisons). Where a fused path's preconditions do not
//! hold, the op runs as its parts ([`crate::graph::fuse::expand`]).

use super::backend::{nth, rope_inputs, rope_params, CpuBackend, CpuBuffer};
use super::matmul::{act_format, grow_bytes, product, quantize_into, Weight};
use super::record::{with_cache_mut, write_cache};
use super::rowops::PAR_MIN;
use crate::backend::{BackendError, OpIo};
use crate::graph::reference;
use crate::graph::{Activation, Op, Prologue};
use crate::quant::GgmlType;

/// Activations quantized for one activation type: `rows` rows of
/// `row_bytes` in `data`.
struct Quantized {
    ty: GgmlType,
    row_bytes: usize,
    data: Vec<u32>,
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

/// The error of a buffer that cannot be borrowed as `op` needs it.
fn busy(op: &Op) -> BackendError {
    BackendError::Shape(format!("{op:?}: a buffer is in use or too short"))
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

    /// [`Op::FusedMatMul`]: the prologue fused with quantizing its rows for
    /// the first weight, then every product on the quantized rows.
    pub(super) fn fused_matmul(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
    ) -> Result<bool, BackendError> {
        let Op::FusedMatMul {
            pre,
            k,
            parts,
            exact: false,
            ..
        } = op
        else {
            return Ok(false);
        };
        let (ins, outs) = pre.arity();
        let weights = parts
            .iter()
            .enumerate()
            .map(|(i, &(ty, _))| nth(io.inputs, ins + i, op)?.weight(&self.table, ty, *k))
            .collect::<Result<Vec<_>, _>>()?;
        if weights.iter().zip(parts).any(|(w, &(_, n))| w.rows != n) {
            return Ok(false);
        }
        let first = match *pre {
            Prologue::RmsNorm { eps } => self.norm_quantize(op, io, &weights[0], eps)?,
            Prologue::Glu(act) => self.gated_quantize(op, io, &weights[0], act)?,
            Prologue::None => None,
            Prologue::AddRmsNorm { .. } => return Ok(false),
        };
        if first.is_none() && *pre != Prologue::None {
            return Ok(false);
        }
        // The products' input: the prologue's output, or input 0.
        let xb = if outs == 0 {
            nth(io.inputs, 0, op)?
        } else {
            nth(io.outputs, outs - 1, op)?
        };
        let mut quantized: Vec<Quantized> = first.into_iter().collect();
        for (i, w) in weights.iter().enumerate() {
            let at = w.act_type();
            if !quantized.iter().any(|q| q.ty == at) {
                let mut data = Vec::new();
                let row_bytes =
                    xb.with_f32s(|x| quantize_into(&self.threads, &self.table, w, x, &mut data))??;
                quantized.push(Quantized {
                    ty: at,
                    row_bytes,
                    data,
                });
            }
            let q = quantized
                .iter()
                .find(|q| q.ty == at)
                .ok_or_else(|| busy(op))?;
            let rows = xb.len as usize / 4 / k.max(&1);
            let a = &bytemuck::cast_slice::<u32, u8>(&q.data)[..rows * q.row_bytes];
            let yb = nth(io.outputs, outs + i, op)?;
            let mut yd = yb.data.try_borrow_mut().map_err(|_| busy(op))?;
            let y = bytemuck::cast_slice_mut::<u32, f32>(&mut yd)
                .get_mut(..rows * w.rows)
                .ok_or_else(|| busy(op))?;
            product(&self.threads, w, 0..w.rows, a, q.row_bytes, y);
        }
        Ok(true)
    }

    /// RMS norm (into output 0) fused with quantizing its rows for `w`.
    fn norm_quantize(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        w: &Weight,
        eps: f32,
    ) -> Result<Option<Quantized>, BackendError> {
        let norm = self.rows().norm_kernel();
        nth(io.inputs, 1, op)?.with_f32s(|gamma| match gamma.get(..w.cols) {
            Some(gamma) => self.then_quantize(op, io, w, |x, _| norm(x, gamma, eps)),
            None => Ok(None),
        })?
    }

    /// A gated product `x = act(x) * y` (into output 0) fused with
    /// quantizing its rows for `w`.
    fn gated_quantize(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        w: &Weight,
        act: Activation,
    ) -> Result<Option<Quantized>, BackendError> {
        let (gated, yb) = (self.rows().gated_kernel(act), nth(io.inputs, 1, op)?);
        // Pieces of whole rows then start at multiples of 16 values, where
        // `RowOps` starts its pieces (always: quantized rows are whole
        // blocks of 32 or 256).
        if !w.cols.is_multiple_of(16) || yb.len != nth(io.inputs, 0, op)?.len {
            return Ok(None);
        }
        // `in_output` declines an output that is input 1, so `y` may stay
        // borrowed.
        yb.with_f32s(|y| self.then_quantize(op, io, w, |x, at| gated(x, &y[at..at + x.len()])))?
    }

    /// Runs the row op `f(piece, offset)` on output 0 (input 0's values,
    /// [`CpuBackend::in_output`]) in pieces of whole rows of `w.cols`, each
    /// piece quantized for `w` as soon as `f` is done with it. `None` where
    /// output 0 cannot hold the work.
    fn then_quantize(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        w: &Weight,
        f: impl Fn(&mut [f32], usize) + Sync + Send,
    ) -> Result<Option<Quantized>, BackendError> {
        let (quantize, row_bytes) = act_format(&self.table, w)?;
        let (out, width) = (nth(io.outputs, 0, op)?, w.cols);
        if width == 0 || !(out.len as usize / 4).is_multiple_of(width) {
            return Ok(None);
        }
        let rows = out.len as usize / 4 / width;
        let mut data = Vec::new();
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
        Ok(done.then(|| Quantized {
            ty: w.act_type(),
            row_bytes,
            data,
        }))
    }

    /// [`Op::RopeKvWrite`]: the RoPE of q in place, then the RoPE of k in
    /// place fused with the K/V write: each thread rotates its tokens' K
    /// rows and writes them and their V rows to the cache.
    pub(super) fn rope_kv_write(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
    ) -> Result<bool, BackendError> {
        let Op::RopeKvWrite {
            rope,
            k_width,
            v_width,
            dtype,
            ..
        } = *op
        else {
            return Ok(false);
        };
        let rope_op = rope.op();
        // The rope's buffers: x, positions, factors (when given).
        let rope_ins = |x: usize| {
            let mut v = vec![nth(io.inputs, x, op), nth(io.inputs, 3, op)];
            v.extend(io.inputs.get(5).map(|&b| Ok(b)));
            v.into_iter().collect::<Result<Vec<_>, _>>()
        };
        let (kb, vb) = (nth(io.inputs, 1, op)?, nth(io.inputs, 2, op)?);
        let (kc, vc) = (nth(io.outputs, 2, op)?, nth(io.outputs, 3, op)?);
        let slots_b = nth(io.inputs, 4, op)?;
        let k_ins = rope_ins(1)?;
        let others = [vb, kc, vc, slots_b];
        // In place, and no buffer of the write one of the rope's.
        if !same(nth(io.outputs, 1, op)?, kb)
            || others
                .iter()
                .any(|&b| same(b, kb) || k_ins[1..].iter().any(|&i| same(i, b)))
            || same(kc, vc)
            || same(vb, kc)
            || same(vb, vc)
        {
            return Ok(false);
        }
        let slots: Vec<usize> = slots_b.u32s()?.iter().map(|&s| s as usize).collect();
        let tokens = slots.len();
        let k_io = OpIo {
            inputs: &k_ins,
            outputs: &[kb],
        };
        let (pos, factors) = rope_inputs(&rope_op, &k_io, kb.len as usize / 4)?;
        let p = rope_params(&rope_op, factors.as_deref()).ok_or_else(|| busy(op))?;
        if k_width == 0
            || v_width == 0
            || pos.len() != tokens
            || kb.len as usize / 4 != tokens * k_width
            || !p.rotates()
        {
            return Ok(false);
        }
        let q_ins = rope_ins(0)?;
        let q_io = OpIo {
            inputs: &q_ins,
            outputs: &[nth(io.outputs, 0, op)?],
        };
        self.run_op(&rope_op, &q_io)?;
        let mut kd = kb.data.try_borrow_mut().map_err(|_| busy(op))?;
        let k = bytemuck::cast_slice_mut::<u32, f32>(&mut kd)
            .get_mut(..tokens * k_width)
            .ok_or_else(|| busy(op))?;
        let angles = self.rope_angles(&pos, &p);
        let half = p.n_rot / 2;
        vb.with_f32s(|v| {
            if v.len() < tokens * v_width {
                return Err(BackendError::Shape(format!(
                    "{op:?}: {} V values for {tokens} tokens",
                    v.len()
                )));
            }
            let v = &v[..tokens * v_width];
            // Threads write the rows of distinct slots inside the caches;
            // a step's few rows, or slots outside or named twice, take the
            // ops' own order (the write reports the first and writes the
            // second in order).
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
