//! [`CpuBackend`]: the [`Backend`] trait over host memory.
//!
//! The CPU executes each op as it is recorded (`submit` has nothing left to
//! do) and `download` is ready at once. Buffers are 4-byte aligned host
//! memory behind a `RefCell`, so an op may write a buffer it also reads
//! ([`CpuBuffer`], in `buffer.rs`).
//! Weight buffers become a [`Weight`] (the kernels' view) the first time an
//! op reads them as one, so no op copies a weight. The K/V, attention and
//! expert ops are in `record.rs`.

use std::cell::{OnceCell, RefCell};
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, PoisonError};

use super::attn_kernels::AttnKernels;
pub use super::buffer::CpuBuffer;
use super::buffer::{busy, ActSlots};
use super::hostmem::{HostMem, LargePages};
use super::kernels::KernelTable;
use super::matmul::{matmul, Weight};
use super::options::CpuOptions;
use super::profile::Profile;
use super::rope::{Angles, RopeAngles};
use super::rowops::{RowOps, PAR_MIN};
use super::threads::Threads;
use crate::backend::{part_buffers, Backend, BackendError, BufKind, Caps, OpIo};
use crate::graph::fuse::expand;
use crate::graph::reference;
use crate::graph::{Op, Prologue};
use crate::quant::GgmlType;

/// The CPU as a [`Backend`].
#[derive(Debug)]
pub struct CpuBackend {
    caps: Caps,
    pub(super) table: KernelTable,
    pub(super) threads: Threads,
    /// Attention kernels of the same ISA as `table`; `None`: the scalar
    /// attention ([`CpuOptions::scalar_attention`], for comparisons).
    pub(super) attn: Option<AttnKernels>,
    profile: Profile,
    /// Whether the fused ops of steps of several tokens run fused
    /// ([`CpuOptions::fusion`]; the plans ask for them through
    /// [`Backend::supports`]).
    fuse: bool,
    /// RoPE's angles for the rope ops of a step.
    pub(super) rope: RefCell<RopeAngles>,
    /// Memory of the weights, the K/V cache and the step buffers (large
    /// pages where the OS has them: decode streams the first two).
    pages: LargePages,
    /// The step buffers' memory between steps.
    acts: ActSlots,
}

impl CpuBackend {
    /// The backend's name in [`Caps::backend`].
    pub const NAME: &'static str = "CPU";

    /// Rows `rows` of the weight buffer `buf` (rows of `cols` values of
    /// `ty`) as the GGUF file stores them, whatever layout the kernels keep
    /// them in: what the expert cache copies from host memory into a
    /// device slot.
    pub fn weight_rows(
        &self,
        buf: &CpuBuffer,
        ty: GgmlType,
        cols: usize,
        rows: Range<usize>,
    ) -> Result<Vec<u8>, BackendError> {
        let w = buf.weight(&self.table, ty, cols)?;
        if rows.end > w.rows {
            return Err(BackendError::OutOfBounds {
                range: rows.start as u64..rows.end as u64,
                len: w.rows as u64,
            });
        }
        let row_bytes = cols / ty.block_elems().max(1) * ty.block_bytes();
        let mut out = vec![0u8; rows.len() * row_bytes];
        let w: &Weight = &w;
        let first = rows.start;
        // Rows re-laid for the tiles are gathered one by one: side by
        // side, as a slot fill waits on it (rayon runs on the caller where
        // there is no pool, as in the single-threaded browser build).
        use rayon::prelude::*;
        out.par_chunks_mut(row_bytes.max(1))
            .enumerate()
            .for_each(|(i, o)| o.copy_from_slice(&w.row(first + i)));
        Ok(out)
    }
}

impl CpuBackend {
    /// A backend on `threads` threads (0 = all cores), with the default
    /// [`CpuOptions`].
    pub fn new(threads: usize) -> Self {
        Self::with_options(&CpuOptions::with_threads(threads))
    }

    /// A backend as `opts` says.
    pub fn with_options(opts: &CpuOptions) -> Self {
        let threads = Threads::with_pool(opts.threads, opts.pool);
        let table = KernelTable::for_isa_or_best(opts.isa);
        let caps = Caps {
            backend: Self::NAME,
            name: format!("cpu {:?} x{}", table.isa(), threads.count()).to_lowercase(),
            max_buffer_bytes: isize::MAX as u64,
            f16: false,
            threads: threads.count(),
        };
        let attn = (!opts.scalar_attention)
            .then(|| AttnKernels::for_isa(table.isa()).unwrap_or_else(AttnKernels::scalar));
        Self {
            caps,
            threads,
            attn,
            table,
            profile: Profile::new(opts.profile),
            // For steps of several tokens: docs/perf.md, "CPU fusion".
            fuse: opts.fusion,
            rope: RefCell::default(),
            pages: LargePages::new(opts.large_pages),
            acts: ActSlots::default(),
        }
    }
}

/// The 4-byte words that hold `bytes`.
fn words_of(bytes: u64) -> Result<usize, BackendError> {
    usize::try_from(bytes.div_ceil(4)).map_err(|_| BackendError::OutOfBounds {
        range: 0..bytes,
        len: 0,
    })
}

/// The `i`th buffer of `list`, or a shape error naming the op.
pub(super) fn nth<'a>(
    list: &[&'a CpuBuffer],
    i: usize,
    op: &Op,
) -> Result<&'a CpuBuffer, BackendError> {
    list.get(i)
        .copied()
        .ok_or_else(|| BackendError::Shape(format!("{op:?} needs buffer {i}")))
}

/// Applies an element-wise binary op `f(x, y)` into output 0.
fn binary(
    io: &OpIo<'_, CpuBuffer>,
    op: &Op,
    f: impl FnOnce(&mut [f32], &[f32]),
) -> Result<(), BackendError> {
    let mut x = nth(io.inputs, 0, op)?.f32s()?;
    let y = nth(io.inputs, 1, op)?.f32s()?;
    let bias = matches!(op, Op::BiasAdd);
    if y.is_empty() || (bias && x.len() % y.len() != 0) || (!bias && x.len() != y.len()) {
        return Err(BackendError::Shape(format!(
            "{op:?}: inputs of {} and {} values",
            x.len(),
            y.len()
        )));
    }
    f(&mut x, &y);
    nth(io.outputs, 0, op)?.set_f32s(&x)
}

/// An element-wise op `x = f(x, y)` of two equal-length inputs into output
/// 0, on the row kernels and threads. Works in the output buffer itself
/// (after one copy of `x` when it is another buffer) rather than on copies
/// of all three; an output that is also `y` takes [`binary`]'s copies.
fn elementwise(
    io: &OpIo<'_, CpuBuffer>,
    op: &Op,
    f: impl FnOnce(&mut [f32], &[f32]),
) -> Result<(), BackendError> {
    let (xb, yb, ob) = (
        nth(io.inputs, 0, op)?,
        nth(io.inputs, 1, op)?,
        nth(io.outputs, 0, op)?,
    );
    let n = xb.len as usize / 4;
    if std::ptr::eq(yb, ob) || n == 0 || yb.len != xb.len || ob.len != xb.len {
        return binary(io, op, f);
    }
    let short = || BackendError::Shape(format!("{op:?}: a buffer shorter than its length"));
    let yd = yb.data.try_borrow().map_err(|_| busy())?;
    let y = bytemuck::cast_slice::<u32, f32>(&yd)
        .get(..n)
        .ok_or_else(short)?;
    let mut od = ob.data.try_borrow_mut().map_err(|_| busy())?;
    let out = bytemuck::cast_slice_mut::<u32, f32>(&mut od)
        .get_mut(..n)
        .ok_or_else(short)?;
    if !std::ptr::eq(xb, ob) {
        let xd = xb.data.try_borrow().map_err(|_| busy())?;
        out.copy_from_slice(
            bytemuck::cast_slice::<u32, f32>(&xd)
                .get(..n)
                .ok_or_else(short)?,
        );
    }
    f(out, y);
    Ok(())
}

impl CpuBackend {
    fn get_rows(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        let Op::GetRows { ty, width } = op else {
            return Err(BackendError::UnsupportedOp {
                backend: "CPU".into(),
                op: op.describe(),
            });
        };
        let w = nth(io.inputs, 0, op)?.weight(&self.table, *ty, *width)?;
        let ids = nth(io.inputs, 1, op)?.u32s()?;
        let mut out = vec![0.0f32; ids.len() * width];
        for (row, &id) in out.chunks_exact_mut(*width).zip(&ids) {
            if id as usize >= w.rows {
                return Err(BackendError::Shape(format!(
                    "get_rows: id {id} of {} rows",
                    w.rows
                )));
            }
            w.dequantize_row(id as usize, row);
        }
        nth(io.outputs, 0, op)?.set_f32s(&out)
    }

    fn mat_mul(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        let Op::MatMul { ty, k, n, exact } = op else {
            return Err(BackendError::UnsupportedOp {
                backend: "CPU".into(),
                op: op.describe(),
            });
        };
        let w = nth(io.inputs, 1, op)?.weight(&self.table, *ty, *k)?;
        if w.rows != *n {
            return Err(BackendError::Shape(format!(
                "{op:?}: the weight has {} rows",
                w.rows
            )));
        }
        let xb = nth(io.inputs, 0, op)?;
        let xd = xb.data.try_borrow().map_err(|_| busy())?;
        let x = &bytemuck::cast_slice::<u32, f32>(&xd)[..xb.len as usize / 4];
        let rows = x.len() / k.max(&1);
        let yb = nth(io.outputs, 0, op)?;
        let mut yd = yb.data.try_borrow_mut().map_err(|_| busy())?;
        let y = &mut bytemuck::cast_slice_mut::<u32, f32>(&mut yd)[..yb.len as usize / 4];
        if x.len() != rows * k || y.len() != rows * n {
            return Err(BackendError::Shape(format!(
                "{op:?}: x has {} values, y {}",
                x.len(),
                y.len()
            )));
        }
        matmul(&self.threads, &self.table, &w, 0..*n, x, y, *exact)
    }

    /// Runs `f` on input 0's values in output 0's buffer (copied there
    /// first unless output 0 is input 0), rather than on a copy written
    /// back; `false` where output 0 is one of the other inputs or of
    /// another length, for [`Self::unary`]'s copies.
    pub(super) fn in_output(
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
        f: impl FnOnce(&mut [f32]) -> Result<(), BackendError>,
    ) -> Result<bool, BackendError> {
        let (xb, ob) = (nth(io.inputs, 0, op)?, nth(io.outputs, 0, op)?);
        let n = xb.len as usize / 4;
        if n == 0 || ob.len != xb.len || io.inputs[1..].iter().any(|&b| std::ptr::eq(b, ob)) {
            return Ok(false);
        }
        let short = || BackendError::Shape(format!("{op:?}: a buffer shorter than its length"));
        let mut od = ob.data.try_borrow_mut().map_err(|_| busy())?;
        let out = bytemuck::cast_slice_mut::<u32, f32>(&mut od)
            .get_mut(..n)
            .ok_or_else(short)?;
        if !std::ptr::eq(xb, ob) {
            let xd = xb.data.try_borrow().map_err(|_| busy())?;
            out.copy_from_slice(
                bytemuck::cast_slice::<u32, f32>(&xd)
                    .get(..n)
                    .ok_or_else(short)?,
            );
        }
        f(out)?;
        Ok(true)
    }

    fn unary(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        let done = match *op {
            Op::RmsNorm { width, eps } => Self::in_output(op, io, |x| {
                let w = nth(io.inputs, 1, op)?.f32s()?;
                match w.get(..width) {
                    Some(w) if width > 0 && x.len().is_multiple_of(width) => {
                        self.rows().rms_norm(&self.threads, x, w, eps);
                        Ok(())
                    }
                    _ => Err(BackendError::Shape(format!(
                        "{op:?}: {} values, weight of {}",
                        x.len(),
                        w.len()
                    ))),
                }
            })?,
            Op::Rope { .. } => Self::in_output(op, io, |x| self.rope(op, io, x))?,
            _ => false,
        };
        if done {
            return Ok(());
        }
        let mut x = nth(io.inputs, 0, op)?.f32s()?;
        if x.is_empty() {
            return Ok(());
        }
        let row = match op {
            Op::RmsNorm { width, .. } | Op::Softmax { width } => *width,
            Op::Rope { head_dim, .. } => *head_dim,
            _ => 1,
        };
        if row == 0 || x.len() % row != 0 {
            return Err(BackendError::Shape(format!(
                "{op:?}: {} values are not whole rows",
                x.len()
            )));
        }
        match op {
            Op::RmsNorm { width, eps } => {
                let w = nth(io.inputs, 1, op)?.f32s()?;
                let w = w.get(..*width).ok_or_else(|| {
                    BackendError::Shape(format!("{op:?}: weight of {} values", w.len()))
                })?;
                self.rows().rms_norm(&self.threads, &mut x, w, *eps);
            }
            Op::Rope { .. } => self.rope(op, io, &mut x)?,
            Op::Scale(s) => reference::scale(&mut x, *s),
            Op::LogitSoftcap(c) => reference::softcap(&mut x, *c),
            Op::Softmax { width } => x.chunks_exact_mut(*width).for_each(reference::softmax),
            _ => {
                return Err(BackendError::UnsupportedOp {
                    backend: "CPU".into(),
                    op: op.describe(),
                })
            }
        }
        nth(io.outputs, 0, op)?.set_f32s(&x)
    }
}

/// The positions (input 1) and frequency factors (input 2, if any) of a
/// rope op, checked against `x_len` values of input 0.
pub(super) fn rope_inputs(
    op: &Op,
    io: &OpIo<'_, CpuBuffer>,
    x_len: usize,
) -> Result<(Vec<usize>, Option<Vec<f32>>), BackendError> {
    let Op::Rope {
        head_dim, n_rot, ..
    } = op
    else {
        return Err(BackendError::UnsupportedOp {
            backend: "CPU".into(),
            op: op.describe(),
        });
    };
    let pos: Vec<usize> = nth(io.inputs, 1, op)?
        .u32s()?
        .iter()
        .map(|&p| p as usize)
        .collect();
    let factors = match io.inputs.get(2) {
        Some(b) => Some(b.f32s()?),
        None => None,
    };
    let tokens = pos.len().max(1);
    if (pos.is_empty() && x_len > 0)
        || !x_len.is_multiple_of(tokens)
        || !(x_len / tokens).is_multiple_of(*head_dim)
        || n_rot > head_dim
        || factors.as_ref().is_some_and(|f| f.len() < n_rot / 2)
    {
        return Err(BackendError::Shape(format!(
            "{op:?}: {x_len} values for {} positions",
            pos.len()
        )));
    }
    Ok((pos, factors))
}

/// The kernel parameters of a rope op (`None` for another op).
pub(super) fn rope_params<'a>(
    op: &Op,
    factors: Option<&'a [f32]>,
) -> Option<reference::RopeParams<'a>> {
    let Op::Rope {
        mode,
        head_dim,
        n_rot,
        base,
        scale,
    } = *op
    else {
        return None;
    };
    Some(reference::RopeParams {
        head_dim,
        n_rot,
        base,
        freq_scale: scale,
        freq_factors: factors,
        mode,
    })
}

impl CpuBackend {
    /// RoPE of `x` (read from input 0) with the positions and factors of
    /// `io`, the angles shared with the step's other rope ops.
    fn rope(&self, op: &Op, io: &OpIo<'_, CpuBuffer>, x: &mut [f32]) -> Result<(), BackendError> {
        let (pos, factors) = rope_inputs(op, io, x.len())?;
        let p = rope_params(op, factors.as_deref()).ok_or_else(|| BackendError::UnsupportedOp {
            backend: "CPU".into(),
            op: op.describe(),
        })?;
        if !p.rotates() {
            return Ok(());
        }
        let angles = self.rope_angles(&pos, &p);
        let angles: &[(f32, f32)] = &angles;
        // Rows rotate independently: a prompt's rows spread over the threads.
        let tokens = pos.len().max(1);
        let (width, half) = (x.len() / tokens, p.n_rot / 2);
        if x.len() < PAR_MIN || self.threads.count() == 1 || width == 0 {
            reference::rope_apply(x, angles, &p);
            return Ok(());
        }
        let per = tokens.div_ceil(self.threads.count() * 4);
        self.threads.for_chunks(x, per * width, |i, c| {
            let rows = i * per..i * per + c.len() / width;
            reference::rope_apply(c, &angles[rows.start * half..rows.end * half], &p);
        });
        Ok(())
    }

    /// The angles of `pos` under `p` ([`reference::rope_angles`]), computed once
    /// for all the rope ops that share them.
    pub(super) fn rope_angles(&self, pos: &[usize], p: &reference::RopeParams<'_>) -> Angles {
        self.rope.borrow_mut().get(&self.threads, pos, p)
    }
}

/// [`Op::Argmax`]: the index of each row's largest value (lowest on ties;
/// [`crate::graph::NON_FINITE_ROW`] for a row with a NaN or an infinity).
fn argmax_rows(op: &Op, io: &OpIo<'_, CpuBuffer>, width: usize) -> Result<(), BackendError> {
    let ids = nth(io.inputs, 0, op)?.with_f32s(|x| {
        if width == 0 || x.len() % width != 0 {
            return Err(BackendError::Shape(format!(
                "{op:?}: {} values are not whole rows",
                x.len()
            )));
        }
        Ok(x.chunks_exact(width)
            .map(super::rowops::argmax_row)
            .collect::<Vec<u32>>())
    })??;
    nth(io.outputs, 0, op)?.set_f32s(bytemuck::cast_slice(&ids))
}

/// [`Op::TopK`]: the `k` best `(index, value)` pairs of each row.
fn top_k_rows(
    op: &Op,
    io: &OpIo<'_, CpuBuffer>,
    width: usize,
    k: usize,
) -> Result<(), BackendError> {
    let pairs = nth(io.inputs, 0, op)?.with_f32s(|x| {
        if width == 0 || x.len() % width != 0 || k == 0 || k > width.min(crate::graph::MAX_TOP_K) {
            return Err(BackendError::Shape(format!(
                "{op:?}: {} values are not whole rows, or k is out of 1..={}",
                x.len(),
                width.min(crate::graph::MAX_TOP_K)
            )));
        }
        Ok(x.chunks_exact(width)
            .flat_map(|row| crate::graph::reference::top_k_row(row, k))
            .flat_map(|(i, v)| [f32::from_bits(i), v])
            .collect::<Vec<f32>>())
    })??;
    nth(io.outputs, 0, op)?.set_f32s(&pairs)
}

impl CpuBackend {
    /// The row-op kernels of the table's ISA.
    pub(super) fn rows(&self) -> RowOps {
        RowOps::for_isa(self.table.isa())
    }

    /// Runs the ops a fused `op` stands for, one by one.
    fn run_parts(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        for part in expand(op).unwrap_or_default() {
            let (inputs, outputs) = part_buffers(&part, io);
            self.run_op(
                &part.op,
                &OpIo {
                    inputs: &inputs,
                    outputs: &outputs,
                },
            )?;
        }
        Ok(())
    }

    /// Runs one op.
    pub(super) fn run_op(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        match op {
            Op::GetRows { .. } => self.get_rows(op, io),
            Op::MatMul { .. } => self.mat_mul(op, io),
            Op::Add => elementwise(io, op, |x, y| self.rows().add(&self.threads, x, y)),
            Op::Mul => binary(io, op, |x, y| {
                x.iter_mut().zip(y).for_each(|(a, b)| *a *= b)
            }),
            Op::BiasAdd => binary(io, op, reference::add_bias),
            Op::SiluMul => elementwise(io, op, |x, y| self.rows().silu_mul(&self.threads, x, y)),
            Op::GeluTanhMul => {
                elementwise(io, op, |x, y| self.rows().gelu_mul(&self.threads, x, y))
            }
            Op::KvWrite { .. } => self.kv_write(op, io),
            Op::PagedAttention { .. } => self.paged_attention(op, io),
            Op::MoeTopK { .. } => self.moe_top_k(op, io),
            Op::MoeExperts { .. } => self.moe_experts(op, io),
            Op::Argmax { width } => argmax_rows(op, io, *width),
            Op::TopK { width, k } => top_k_rows(op, io, *width, *k),
            Op::FusedMatMul { .. } => {
                if !self.fused_matmul(op, io)? {
                    self.run_parts(op, io)?;
                }
                Ok(())
            }
            Op::RopeKvWrite { .. } => {
                if !self.rope_kv_write(op, io)? {
                    self.run_parts(op, io)?;
                }
                Ok(())
            }
            _ if self.supports(op) => self.unary(op, io),
            _ => Err(BackendError::UnsupportedOp {
                backend: "CPU".into(),
                op: op.describe(),
            }),
        }
    }
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn alloc(&self, bytes: u64, kind: BufKind) -> Result<CpuBuffer, BackendError> {
        let words = words_of(bytes)?;
        let data = match kind {
            BufKind::Weights => self.pages.alloc(words, "weights")?,
            BufKind::KvCache => self.pages.alloc(words, "the K/V cache")?,
            BufKind::Activations | BufKind::Readback => HostMem::Heap(vec![0; words]),
        };
        Ok(CpuBuffer {
            data: RefCell::new(data),
            len: bytes,
            weight: OnceCell::new(),
            kind,
            home: None,
        })
    }

    /// The memory of the last step's buffer `i` where it is large enough
    /// (its contents left as they were, as the trait allows; NaNs in debug
    /// builds, so that a read before a write shows), else new memory in
    /// large pages. Against memory allocated and zeroed each step, the 1B
    /// Q4_K_M prompt at one thread ran 153 -> 155 tokens/s.
    fn step_buffers(&mut self, sizes: &[u64]) -> Result<Vec<CpuBuffer>, BackendError> {
        let mut slots = self.acts.lock().unwrap_or_else(PoisonError::into_inner);
        if slots.len() < sizes.len() {
            slots.resize_with(sizes.len(), || None);
        }
        let mut out = Vec::with_capacity(sizes.len());
        for (i, &bytes) in sizes.iter().enumerate() {
            let words = words_of(bytes)?;
            let data = match slots[i].take() {
                Some(mut mem) if mem.len() >= words => {
                    if cfg!(debug_assertions) {
                        mem[..words].fill(f32::NAN.to_bits());
                    }
                    mem
                }
                _ => self.pages.alloc(words, "activations")?,
            };
            out.push(CpuBuffer {
                data: RefCell::new(data),
                len: bytes,
                weight: OnceCell::new(),
                kind: BufKind::Activations,
                home: Some((Arc::clone(&self.acts), i)),
            });
        }
        Ok(out)
    }

    /// Builds the kernels' view of a weight buffer (its rows re-laid for
    /// the tiles: `Weight::from_mem`) at load time, where the first op that
    /// used it built it before: `hearth run`'s first prompt paid for the
    /// whole model's rearrangement (SmolLM2: prefill 15 tok/s for a first
    /// 5-token prompt, 44-48 later).
    fn finish_weight(
        &self,
        dst: &CpuBuffer,
        ty: GgmlType,
        cols: usize,
    ) -> Result<(), BackendError> {
        if dst.kind != BufKind::Weights {
            return Ok(());
        }
        dst.weight(&self.table, ty, cols).map(|_| ())
    }

    fn upload(&self, dst: &CpuBuffer, offset: u64, src: &[u8]) -> Result<(), BackendError> {
        let end = offset + src.len() as u64;
        if end > dst.len {
            return Err(BackendError::OutOfBounds {
                range: offset..end,
                len: dst.len,
            });
        }
        if dst.weight.get().is_some() {
            return Err(BackendError::Shape(
                "a weight buffer cannot be written once its kernel view is built (at load, or by the first op that used it)".into(),
            ));
        }
        let mut d = dst.data.try_borrow_mut().map_err(|_| busy())?;
        bytemuck::cast_slice_mut::<u32, u8>(&mut d)[offset as usize..end as usize]
            .copy_from_slice(src);
        Ok(())
    }

    /// Every op; the fused ops where fusion is on, for steps of several
    /// tokens (decode steps ran 3-6% slower fused: docs/perf.md, "CPU
    /// fusion"), with quantized activations, and without the residual add
    /// (it has no fused kernel here).
    fn supports(&self, op: &Op) -> bool {
        match op {
            Op::GetRows { ty, .. } | Op::MatMul { ty, .. } => self.table.supports(*ty),
            Op::MoeExperts { tys, .. } => tys.iter().all(|t| self.table.supports(*t)),
            Op::FusedMatMul {
                pre,
                parts,
                exact,
                rows,
                ..
            } => {
                self.fuse
                    && !exact
                    && *rows > 1
                    && !matches!(pre, Prologue::AddRmsNorm { .. })
                    && parts.iter().all(|&(t, _)| self.table.supports(t))
            }
            Op::RopeKvWrite { rows, .. } => self.fuse && *rows > 1,
            _ => true,
        }
    }

    fn record(&mut self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        if !self.profile.on() {
            return self.run_op(op, io);
        }
        let tokens = match (op, io.inputs) {
            (Op::GetRows { .. }, [table, ids]) if table.kind == BufKind::Weights => {
                Some(ids.len / 4)
            }
            _ => None,
        };
        self.profile.time(op, tokens, || self.run_op(op, io))
    }

    fn submit(&mut self) -> Result<(), BackendError> {
        self.profile.end_pass();
        Ok(())
    }

    fn download(
        &self,
        src: &CpuBuffer,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        let result = if range.start <= range.end && range.end <= src.len {
            src.bytes()
                .map(|b| b[range.start as usize..range.end as usize].to_vec())
        } else {
            Err(BackendError::OutOfBounds {
                range,
                len: src.len,
            })
        };
        std::future::ready(result)
    }
}
