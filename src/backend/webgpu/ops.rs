//! Recording of every op except the weight kernels: one function per op,
//! each checking its buffers' sizes, picking the pipeline variant and
//! queueing its dispatch (the fused ops are the `fuse` module's).

use super::backend::{Bind, Dispatch, WebGpuBackend};
use super::buffer::GpuBuffer;
use super::fuse::RopeJob;
use super::shader::{ConstValue, PipelineKey};
use super::KernelSource;
use crate::backend::{BackendError, OpIo};
use crate::graph::KvType;
use crate::graph::{Activation, Op, RopeMode};

/// Kernel sources, one file per op.
mod src {
    pub const BINARY_SRC: &str = include_str!("../../../shaders/binary.wgsl");
    pub const UNARY: &str = include_str!("../../../shaders/unary.wgsl");
    pub const RMS_NORM_SRC: &str = concat!(
        include_str!("../../../shaders/norm_row.wgsl"),
        "\n",
        include_str!("../../../shaders/rms_norm.wgsl")
    );
    pub const SOFTMAX: &str = concat!(
        include_str!("../../../shaders/norm_row.wgsl"),
        "\n",
        include_str!("../../../shaders/softmax.wgsl")
    );
    pub const KV_WRITE: &str = include_str!("../../../shaders/kv_write.wgsl");
    pub const ATTENTION: &str = include_str!("../../../shaders/attention.wgsl");
    pub const ATTENTION_MERGE: &str = include_str!("../../../shaders/attention_merge.wgsl");
    pub const MOE_TOP_K: &str = include_str!("../../../shaders/moe_top_k.wgsl");
    pub const ARGMAX: &str = include_str!("../../../shaders/argmax.wgsl");
    pub const TOP_K: &str = include_str!("../../../shaders/top_k.wgsl");
}

/// Every kernel file of this module with the constants its variants
/// need, for validation without a device: (name, source, constants).
pub fn kernel_sources() -> Vec<KernelSource> {
    let mode = |m| vec![("MODE", ConstValue::U32(m))];
    let f16c = |b| vec![("F16_CACHE", ConstValue::Bool(b))];
    let mut attn = f16c(true);
    attn.push(("VPT", ConstValue::U32(2)));
    vec![
        ("binary", src::BINARY_SRC, mode(2)),
        ("unary", src::UNARY, mode(1)),
        ("rms_norm", src::RMS_NORM_SRC, vec![]),
        ("softmax", src::SOFTMAX, vec![]),
        ("kv_write", src::KV_WRITE, f16c(true)),
        ("kv_write", src::KV_WRITE, f16c(false)),
        ("attention", src::ATTENTION, attn),
        ("attention_merge", src::ATTENTION_MERGE, vec![]),
        ("moe_top_k", src::MOE_TOP_K, vec![]),
        ("moe_route", super::moe::MOE_ROUTE, mode(0)),
        ("moe_route", super::moe::MOE_ROUTE, mode(1)),
        ("argmax", src::ARGMAX, mode(0)),
        ("argmax", src::ARGMAX, mode(1)),
        ("top_k", src::TOP_K, mode(0)),
        ("top_k", src::TOP_K, mode(1)),
    ]
}

/// Workgroup size of element-wise kernels.
const WG_ELEM: u32 = 256;
/// The RMS norm kernel.
pub const RMS_NORM: &str = src::RMS_NORM_SRC;

/// Workgroup size of row kernels (norms, softmax, argmax) and attention.
pub const WG_ROW: u32 = 64;

/// Workgroup size of row kernels over rows of thousands of values, which a
/// decode step runs on one workgroup: 64 invocations would leave the
/// memory latency exposed (48 us for one 4096-wide RMS norm on an H200).
const WG_WIDE_ROW: u32 = 256;

/// Workgroup size of the norm kernels (alone or fused) over `width`-wide
/// rows: wide rows (the hidden state, one row per decode token) take a
/// large workgroup; per-head QK norms keep the row size.
pub fn norm_wg(width: u32) -> u32 {
    if width >= 1024 {
        WG_WIDE_ROW
    } else {
        WG_ROW
    }
}
/// Values per workgroup of the argmax's first pass.
const ARGMAX_SLICE: u32 = 2048;
/// Values per workgroup of the top-k's first pass.
const TOP_K_SLICE: u32 = 4096;
/// Most spans of split-context attention.
const MAX_SPLITS: u64 = 64;
/// Most query rows for which attention splits the context (decode of a
/// few sequences; longer steps have workgroups enough).
const SPLIT_MAX_ROWS: u64 = 16;

fn shape(op: &Op, what: impl std::fmt::Display) -> BackendError {
    BackendError::Shape(format!("{op:?}: {what}"))
}

/// The `i`th buffer of `list`, or a shape error naming the op.
pub fn nth<'a>(list: &[&'a GpuBuffer], i: usize, op: &Op) -> Result<&'a GpuBuffer, BackendError> {
    list.get(i)
        .copied()
        .ok_or_else(|| shape(op, format!("needs buffer {i}")))
}

/// f32 values a buffer holds.
fn f32s(b: &GpuBuffer) -> u64 {
    b.len / 4
}

impl WebGpuBackend {
    /// Whether the op has a kernel here (weights: the 15 types of
    /// [`crate::quant::WEIGHT_TYPES`]).
    pub(super) fn supports_op(&self, op: &Op) -> bool {
        match op {
            Op::GetRows { ty, width } => super::weights::supports(*ty, *width),
            Op::MatMul { ty, k, .. } => super::weights::supports(*ty, *k),
            Op::MoeExperts { .. } => self.supports_moe(op),
            Op::FusedMatMul { k, parts, .. } => parts
                .iter()
                .all(|&(ty, _)| super::weights::supports(ty, *k)),
            Op::RopeKvWrite {
                k_width,
                v_width,
                dtype,
                ..
            } => *dtype == KvType::F32 || (k_width % 2 == 0 && v_width % 2 == 0),
            Op::KvWrite {
                k_width,
                v_width,
                dtype,
                ..
            } => *dtype == KvType::F32 || (k_width % 2 == 0 && v_width % 2 == 0),
            Op::PagedAttention {
                head_dim_k,
                n_head,
                n_head_kv,
                dtype,
                ..
            } => {
                *n_head_kv > 0
                    && n_head % n_head_kv == 0
                    && (*dtype == KvType::F32 || head_dim_k % 2 == 0)
            }
            _ => true,
        }
    }

    /// Queues the op's dispatches.
    pub(super) fn record_op(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<(), BackendError> {
        if !self.supports_op(op) {
            return Err(BackendError::UnsupportedOp {
                backend: "WebGPU".into(),
                op: op.describe(),
            });
        }
        let written: Vec<&wgpu::Buffer> = io.outputs.iter().map(|b| &b.raw).collect();
        self.quant.forget_writes(&written);
        match op {
            Op::GetRows { .. } => self.record_weight(op, io),
            Op::MatMul { .. } => {
                self.record_product(op, io)?;
                let quant = self.quant.clone();
                quant.flush_join(self)
            }
            Op::FusedMatMul { .. } => self.fused_matmul(op, io),
            Op::RopeKvWrite { .. } => self.rope_kv_write(op, io),
            Op::Add => self.binary(op, io, 0),
            Op::Mul => self.binary(op, io, 1),
            Op::BiasAdd => self.binary(op, io, 2),
            Op::Scale(s) => self.unary(op, io, 0, *s),
            Op::LogitSoftcap(c) => self.unary(op, io, 1, *c),
            Op::SiluMul => self.gated(op, io, 0),
            Op::GeluTanhMul => self.gated(op, io, 1),
            Op::RmsNorm { width, eps } => self.rms_norm(op, io, *width, *eps),
            Op::Softmax { width } => self.softmax(op, io, *width),
            Op::Rope { .. } => self.rope(op, io),
            Op::KvWrite { .. } => self.kv_write(op, io),
            Op::PagedAttention { .. } => self.attention(op, io),
            Op::MoeTopK { n_expert, k } => self.moe_top_k(op, io, *n_expert, *k),
            Op::Argmax { width } => self.argmax(op, io, *width),
            Op::TopK { width, k } => self.top_k(op, io, *width, *k),
            Op::MoeExperts { .. } => self.moe_experts(op, io),
        }
    }

    /// Records one [`Op::MatMul`] (of a fused op or alone), noting its
    /// token rows for the profile.
    pub(super) fn record_product(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<(), BackendError> {
        if let (Op::MatMul { k, .. }, Some(x)) = (op, io.inputs.first()) {
            self.note_rows(f32s(x) / (*k as u64).max(1));
        }
        self.record_weight(op, io)
    }

    /// Queues `kernel` over `groups` workgroups.
    pub(super) fn dispatch(
        &mut self,
        key: &PipelineKey,
        source: &str,
        params: Vec<u32>,
        bufs: &[&GpuBuffer],
        groups: u32,
    ) {
        let pipeline = self.pipeline(key, &[source]);
        let d = Dispatch {
            pipeline,
            params,
            binds: bufs.iter().map(|b| Bind::whole(b)).collect(),
            groups: self.grid(groups),
        };
        self.enqueue(d);
    }

    pub(super) fn key(&self, kernel: &'static str, wg: u32) -> PipelineKey {
        PipelineKey::new(kernel, wg, &self.ctx.caps)
    }

    fn binary(&mut self, op: &Op, io: &OpIo<'_, GpuBuffer>, mode: u32) -> Result<(), BackendError> {
        let (x, y, out) = (
            nth(io.inputs, 0, op)?,
            nth(io.inputs, 1, op)?,
            nth(io.outputs, 0, op)?,
        );
        let (n, m) = (f32s(x), f32s(y));
        let ok = if mode == 2 {
            m > 0 && n % m == 0
        } else {
            n == m
        };
        if !ok || f32s(out) < n {
            return Err(shape(
                op,
                format!("inputs of {n} and {m} values, output of {}", f32s(out)),
            ));
        }
        let key = self
            .key("binary", WG_ELEM)
            .with_const("MODE", ConstValue::U32(mode));
        let params = vec![n as u32, m as u32, 0, 0];
        self.dispatch(
            &key,
            src::BINARY_SRC,
            params,
            &[x, y, out],
            (n as u32).div_ceil(WG_ELEM),
        );
        Ok(())
    }

    fn unary(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
        mode: u32,
        s: f32,
    ) -> Result<(), BackendError> {
        let (x, out) = (nth(io.inputs, 0, op)?, nth(io.outputs, 0, op)?);
        let n = f32s(x);
        if f32s(out) < n {
            return Err(shape(op, "output smaller than input"));
        }
        let key = self
            .key("unary", WG_ELEM)
            .with_const("MODE", ConstValue::U32(mode));
        let params = vec![n as u32, s.to_bits(), 0, 0];
        self.dispatch(
            &key,
            src::UNARY,
            params,
            &[x, out],
            (n as u32).div_ceil(WG_ELEM),
        );
        Ok(())
    }

    fn gated(&mut self, op: &Op, io: &OpIo<'_, GpuBuffer>, mode: u32) -> Result<(), BackendError> {
        let (g, u, out) = (
            nth(io.inputs, 0, op)?,
            nth(io.inputs, 1, op)?,
            nth(io.outputs, 0, op)?,
        );
        let act = if mode == 0 {
            Activation::Silu
        } else {
            Activation::GeluTanh
        };
        let job = self.gated_job(op, [g, u, out], act)?;
        self.emit_gated(job);
        Ok(())
    }

    fn rms_norm(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
        width: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let (x, w, out) = (
            nth(io.inputs, 0, op)?,
            nth(io.inputs, 1, op)?,
            nth(io.outputs, 0, op)?,
        );
        let job = self.norm_job(op, [x, w, out], width, eps, None)?;
        self.emit_norm(job);
        Ok(())
    }

    fn softmax(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
        width: usize,
    ) -> Result<(), BackendError> {
        let (x, out) = (nth(io.inputs, 0, op)?, nth(io.outputs, 0, op)?);
        let n = f32s(x);
        if width == 0 || !n.is_multiple_of(width as u64) || f32s(out) < n {
            return Err(shape(op, format!("{n} values are not whole rows")));
        }
        let rows = (n / width as u64) as u32;
        let key = self.key("softmax", WG_ROW);
        self.dispatch(
            &key,
            src::SOFTMAX,
            vec![rows, width as u32, 0, 0],
            &[x, out],
            rows,
        );
        Ok(())
    }

    fn rope(&mut self, op: &Op, io: &OpIo<'_, GpuBuffer>) -> Result<(), BackendError> {
        let job = self.rope_job(op, io)?;
        self.emit_rope(job, None)
    }

    /// The rope of `io`'s x at its positions, checked, as a job.
    pub(super) fn rope_job(
        &self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<RopeJob, BackendError> {
        let Op::Rope {
            mode,
            head_dim,
            n_rot,
            base,
            scale,
        } = *op
        else {
            return Err(shape(op, "not a rope"));
        };
        let (x, pos, out) = (
            nth(io.inputs, 0, op)?,
            nth(io.inputs, 1, op)?,
            nth(io.outputs, 0, op)?,
        );
        let factors = io.inputs.get(2).copied();
        let (n, rows) = (f32s(x), pos.len / 4);
        let width = n.checked_div(rows).unwrap_or(0);
        if rows == 0
            || n % rows != 0
            || head_dim == 0
            || width % head_dim as u64 != 0
            || n_rot > head_dim
            || n_rot < 2
            || head_dim % 2 != 0
            || factors.is_some_and(|f| f32s(f) < (n_rot / 2) as u64)
        {
            return Err(shape(op, format!("{n} values for {rows} positions")));
        }
        let key = self.key("rope", WG_ELEM).with_const(
            "MODE",
            ConstValue::U32(match mode {
                RopeMode::Norm => 0,
                RopeMode::Neox => 1,
            }),
        );
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        let params = vec![
            rows as u32,
            width as u32,
            head_dim as u32,
            n_rot as u32,
            theta_scale.to_bits(),
            scale.to_bits(),
            u32::from(factors.is_some()),
            0,
        ];
        let job = RopeJob {
            key,
            params,
            bufs: [x, pos, factors.unwrap_or(pos), out].map(|b| (*b).clone()),
            pairs: rows * (width / head_dim as u64) * (head_dim / 2) as u64,
        };
        Ok(job)
    }

    pub(super) fn kv_write(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<(), BackendError> {
        let Op::KvWrite {
            k_width,
            v_width,
            dtype,
            ..
        } = *op
        else {
            return Err(shape(op, "not a K/V write"));
        };
        let slots = nth(io.inputs, 2, op)?;
        let tokens = slots.len / 4;
        let f16 = dtype == KvType::F16;
        for (i, width) in [(0, k_width), (1, v_width)] {
            let src = nth(io.inputs, i, op)?;
            if f32s(src) != tokens * width as u64 {
                return Err(shape(
                    op,
                    format!("{} values for {tokens} rows of {width}", f32s(src)),
                ));
            }
        }
        let (ks, vs) = (nth(io.inputs, 0, op)?, nth(io.inputs, 1, op)?);
        let (kc, vc) = (nth(io.outputs, 0, op)?, nth(io.outputs, 1, op)?);
        let key = self
            .key("kv_write", WG_ELEM)
            .with_const("F16_CACHE", ConstValue::Bool(f16));
        let per = |w: usize| if f16 { w / 2 } else { w } as u64;
        let words = tokens * (per(k_width) + per(v_width));
        let params = vec![tokens as u32, k_width as u32, v_width as u32, 0];
        // K and V in one dispatch: one fewer dependent launch per layer.
        self.dispatch(
            &key,
            src::KV_WRITE,
            params,
            &[ks, vs, slots, kc, vc],
            (words as u32).div_ceil(WG_ELEM),
        );
        Ok(())
    }

    fn attention(&mut self, op: &Op, io: &OpIo<'_, GpuBuffer>) -> Result<(), BackendError> {
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
            return Err(shape(op, "not attention"));
        };
        let q = nth(io.inputs, 0, op)?;
        let (kc, vc) = (nth(io.inputs, 1, op)?, nth(io.inputs, 2, op)?);
        let (seqs, tables, out) = (
            nth(io.inputs, 3, op)?,
            nth(io.inputs, 4, op)?,
            nth(io.outputs, 0, op)?,
        );
        let rows = f32s(q) / (n_head * head_dim_k).max(1) as u64;
        if f32s(q) != rows * (n_head * head_dim_k) as u64
            || f32s(out) != rows * (n_head * head_dim_v) as u64
            || seqs.len % 16 != 0
            || block_size == 0
        {
            return Err(shape(
                op,
                format!("q of {} values, out of {}", f32s(q), f32s(out)),
            ));
        }
        let (splits, span) = self.attention_splits(rows, tables, block_size);
        let vpt = (head_dim_v as u32).div_ceil(WG_ROW).max(1);
        let key = self
            .key("attention", WG_ROW)
            .with_const("F16_CACHE", ConstValue::Bool(dtype == KvType::F16))
            .with_const("VPT", ConstValue::U32(vpt));
        let params = vec![
            rows as u32,
            n_head as u32,
            n_head_kv as u32,
            head_dim_k as u32,
            head_dim_v as u32,
            scale.to_bits(),
            softcap.unwrap_or(0.0).to_bits(),
            window.unwrap_or(0) as u32,
            block_size as u32,
            (seqs.len / 16) as u32,
            splits as u32,
            span as u32,
        ];
        let units = rows * n_head as u64;
        let target = if splits > 1 {
            self.scratch(units * splits * (head_dim_v as u64 + 2) * 4, |b| {
                &mut b.attn_partials
            })?
        } else {
            out.clone()
        };
        self.dispatch(
            &key,
            src::ATTENTION,
            params,
            &[q, kc, vc, seqs, tables, &target],
            (units * splits) as u32,
        );
        if splits > 1 {
            let key = self.key("attention_merge", WG_ELEM).with_subgroups(false);
            let total = units as u32 * head_dim_v as u32;
            let params = vec![units as u32, splits as u32, head_dim_v as u32, 0];
            self.dispatch(
                &key,
                src::ATTENTION_MERGE,
                params,
                &[&target, out],
                total.div_ceil(WG_ELEM),
            );
        }
        Ok(())
    }

    /// (spans, positions per span) of attention over `rows` query rows
    /// reading through `tables`: one span unless the step is a decode of a
    /// few rows whose tables reach past the split size.
    fn attention_splits(&self, rows: u64, tables: &GpuBuffer, block_size: usize) -> (u64, u64) {
        // Positions any row can attend to: the tables' blocks at most.
        let bound = tables.len / 4 * block_size as u64;
        let span = u64::from(self.attn_split_keys);
        let splits = if span > 0 && rows <= SPLIT_MAX_ROWS && bound > span {
            bound.div_ceil(span).min(MAX_SPLITS)
        } else {
            1
        };
        (splits, bound.div_ceil(splits))
    }

    /// A kept scratch buffer of at least `bytes`, grown in powers of two:
    /// steps reuse it, so their bind groups stay cached. `pick` chooses
    /// which of the backend's scratch slots.
    pub(super) fn scratch(
        &mut self,
        bytes: u64,
        pick: fn(&mut Self) -> &mut Option<GpuBuffer>,
    ) -> Result<GpuBuffer, BackendError> {
        if let Some(b) = pick(self).as_ref().filter(|b| b.len >= bytes) {
            return Ok(b.clone());
        }
        let b = crate::backend::Backend::alloc(
            self,
            bytes.next_power_of_two().max(256),
            crate::backend::BufKind::Activations,
        )?;
        *pick(self) = Some(b.clone());
        Ok(b)
    }

    fn moe_top_k(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
        ne: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        let logits = nth(io.inputs, 0, op)?;
        let (ids, wts) = (nth(io.outputs, 0, op)?, nth(io.outputs, 1, op)?);
        let tokens = f32s(logits) / ne.max(1) as u64;
        if ne == 0
            || k == 0
            || k > ne
            || f32s(logits) != tokens * ne as u64
            || ids.len / 4 < tokens * k as u64
            || f32s(wts) < tokens * k as u64
        {
            return Err(shape(op, format!("{} logits", f32s(logits))));
        }
        let key = self.key("moe_top_k", WG_ROW);
        let params = vec![tokens as u32, ne as u32, k as u32, 0];
        self.dispatch(
            &key,
            src::MOE_TOP_K,
            params,
            &[logits, ids, wts],
            (tokens as u32).div_ceil(WG_ROW),
        );
        Ok(())
    }

    fn argmax(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
        width: usize,
    ) -> Result<(), BackendError> {
        let (x, out) = (nth(io.inputs, 0, op)?, nth(io.outputs, 0, op)?);
        let n = f32s(x);
        if width == 0 || !n.is_multiple_of(width as u64) || out.len / 4 < n / width as u64 {
            return Err(shape(op, format!("{n} values are not whole rows")));
        }
        let rows = (n / width as u64) as u32;
        // Slices of about 2048 values: a 128K vocabulary is read by ~64
        // workgroups per row, then one more reduces their pairs.
        let slices = (width as u32).div_ceil(ARGMAX_SLICE).clamp(1, 64);
        let chunk = (width as u32).div_ceil(slices);
        let part = self.scratch(u64::from(rows) * u64::from(slices) * 8, |b| {
            &mut b.sel_partials
        })?;
        let params = vec![rows, width as u32, slices, chunk];
        for mode in 0..2u32 {
            let key = self
                .key("argmax", WG_WIDE_ROW)
                .with_subgroups(false)
                .with_const("MODE", ConstValue::U32(mode));
            let groups = if mode == 0 { rows * slices } else { rows };
            self.dispatch(&key, src::ARGMAX, params.clone(), &[x, &part, out], groups);
        }
        Ok(())
    }

    fn top_k(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
        width: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        let (x, out) = (nth(io.inputs, 0, op)?, nth(io.outputs, 0, op)?);
        let n = f32s(x);
        let most = width.min(crate::graph::MAX_TOP_K);
        if width == 0 || !n.is_multiple_of(width as u64) || k == 0 || k > most {
            return Err(shape(
                op,
                format!("{n} values are not whole rows, or k is out of 1..={most}"),
            ));
        }
        let rows = (n / width as u64) as u32;
        if out.len < u64::from(rows) * k as u64 * 8 {
            return Err(shape(
                op,
                format!("output of {} bytes is too small", out.len),
            ));
        }
        // Slices of about 4096 values: ~32 workgroups read a 128K row, one
        // more merges their k best each.
        let slices = (width as u32).div_ceil(TOP_K_SLICE).clamp(1, 64);
        let chunk = (width as u32).div_ceil(slices);
        let pairs = u64::from(rows) * u64::from(slices) * k as u64;
        let part = self.scratch(pairs * 8, |b| &mut b.sel_partials)?;
        let params = vec![rows, width as u32, k as u32, slices, chunk, 0, 0, 0];
        for mode in 0..2u32 {
            let key = self
                .key("top_k", WG_ROW)
                .with_subgroups(false)
                .with_const("MODE", ConstValue::U32(mode));
            let groups = if mode == 0 { rows * slices } else { rows };
            self.dispatch(&key, src::TOP_K, params.clone(), &[x, &part, out], groups);
        }
        Ok(())
    }
}
