//! [`QuantKernels`]: records matrix products and embedding lookups over
//! packed quantized weights onto a [`WebGpuBackend`].
//!
//! Shapes (row-major, f32 activations):
//! - `y[m, n] = x[m, k] · W[n, k]ᵀ` ([`QuantKernels::encode_matmul`]);
//! - `y[count, k] = W[ids[t], :]` ([`QuantKernels::encode_get_rows`]).
//!
//! `W` is packed ([`crate::backend::packed`]) and may be split by rows into several
//! buffers ([`WeightPart`]); each part gets its own dispatch writing its
//! columns of `y`.

use std::sync::Mutex;

use bytemuck::{Pod, Zeroable};

use super::super::backend::{Bind, Dispatch, WebGpuBackend};
use super::super::buffer::GpuBuffer;
use super::super::caps::GpuCaps;
use super::super::fuse::{Held, QUANTIZE_X_GATED};
use super::super::shader::{ConstValue, PipelineKey};
use super::sources::{has_int8, item_w4_source, variant, Kernel, KernelConfig, MvShape};
use crate::backend::packed::{packed_layout, PackedLayout};
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// A byte position in a device buffer.
#[derive(Debug, Clone, Copy)]
pub struct BufRef<'a> {
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// Byte offset of the first element.
    pub offset: u64,
}

/// Rows `first_row .. first_row + rows` of a packed weight, laid out as a
/// `[rows, cols]` weight from byte `offset` of `buffer`.
#[derive(Debug, Clone, Copy)]
pub struct WeightPart<'a> {
    /// The buffer holding the rows.
    pub buffer: &'a wgpu::Buffer,
    /// First byte of the part (a multiple of the adapter's storage offset
    /// alignment; 0 for a part alone in its buffer).
    pub offset: u64,
    /// The part's first row in the whole weight.
    pub first_row: u64,
    /// Rows in this part.
    pub rows: u64,
}

/// `y[m, n] = x[m, k] · W[n, k]ᵀ`.
#[derive(Debug, Clone, Copy)]
pub struct MatmulArgs<'a> {
    /// Weight type.
    pub ty: GgmlType,
    /// Dot length: weight columns, x columns.
    pub k: u64,
    /// Weight rows: y columns.
    pub n: u64,
    /// Tokens: rows of x and y.
    pub m: u64,
    /// x: f32 `[m, k]`, contiguous; offset a multiple of 16 bytes.
    pub x: BufRef<'a>,
    /// The weight's parts, together covering rows `0..n` once.
    pub w: &'a [WeightPart<'a>],
    /// y: f32 `[m, n]`, contiguous; offset a multiple of 4 bytes.
    pub y: BufRef<'a>,
}

/// `y[t, :] = W[ids[t], :]` for `t < count`, as f32.
#[derive(Debug, Clone, Copy)]
pub struct GetRowsArgs<'a> {
    /// Table type.
    pub ty: GgmlType,
    /// Row length (embedding width).
    pub k: u64,
    /// Table rows (vocabulary).
    pub n: u64,
    /// Row ids: `count` u32 values; offset a multiple of 4 bytes. Ids at or
    /// past `n` leave their output row unwritten.
    pub ids: BufRef<'a>,
    /// Lookups.
    pub count: u64,
    /// The table's parts, together covering rows `0..n` once.
    pub w: &'a [WeightPart<'a>],
    /// y: f32 `[count, k]`, contiguous; offset a multiple of 4 bytes.
    pub y: BufRef<'a>,
}

/// One product of a MoE layer's experts over routed entries
/// (`shaders/moe_matvec.wgsl`): `y[i, r] = W[e * n + r, :] · x[row(i), :]`
/// for each entry `i` (token `i / k_used`'s expert `e = ids[i]`) that
/// `route` lists under `e`, where `row(i)` is the token (`per_entry`
/// false) or the entry itself.
#[derive(Debug, Clone, Copy)]
pub struct MoeMatvecArgs<'a> {
    /// Weight type.
    pub ty: GgmlType,
    /// Dot length.
    pub k: u64,
    /// Rows of one expert.
    pub n: u64,
    /// Experts stacked in the weight.
    pub n_expert: u64,
    /// Entries: tokens times experts per token.
    pub entries: u64,
    /// Experts per token.
    pub k_used: u64,
    /// Tokens the step routes (1 in decode of one sequence).
    pub tokens: u64,
    /// Whether x has a row per entry (down) or per token (gate, up).
    pub per_entry: bool,
    /// x: f32 rows of `k`.
    pub x: &'a GpuBuffer,
    /// The stacked weight, one part.
    pub w: WeightPart<'a>,
    /// y: f32 `[entries, n]`.
    pub y: &'a GpuBuffer,
    /// The entries grouped by expert (`shaders/moe_route.wgsl`, mode 0).
    pub route: &'a GpuBuffer,
}

/// The uniform every kernel here reads; mirrors `Params` in
/// `shaders/matmul_params.wgsl` field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct KernelParams {
    /// Dot length.
    pub k: u32,
    /// Weight rows in this part.
    pub n: u32,
    /// Tokens.
    pub m: u32,
    /// Blocks per weight row.
    pub nb: u32,
    /// u32 words between weight rows.
    pub row_words: u32,
    /// First element of x (ids for get_rows).
    pub x_off: u32,
    /// Elements between tokens of x.
    pub x_stride: u32,
    /// First element of y.
    pub y_off: u32,
    /// Elements between tokens of y.
    pub y_stride: u32,
    /// Row groups of the grid (matvec, matmul).
    pub groups: u32,
    /// The part's first row.
    pub first_row: u32,
    /// Items of the one-thread-per-item kernels.
    pub count: u32,
    /// Joined matvec: the first weight's rows (all of `n` otherwise).
    pub n1: u32,
    /// Joined matvec: the first two weights' rows.
    pub n2: u32,
    /// Joined matvec: the second weight's first word in the binding.
    pub base1: u32,
    /// Joined matvec: the third weight's first word in the binding.
    pub base2: u32,
}

/// Device scratch of the int8 path: quantized activations and their scales.
#[derive(Debug)]
struct Scratch {
    /// int8 quants, `m * k` bytes.
    xq: wgpu::Buffer,
    /// (d, d * sum) per 8 values, `m * k` bytes.
    xs: wgpu::Buffer,
    bytes: u64,
}

/// The activations last quantized into the scratch: while nothing writes
/// `x` and no step boundary intervenes, a matmul over the same `x` (q, k and v
/// projections; gate and up) reuses them instead of quantizing again.
#[derive(Debug)]
struct QuantizedX {
    x: wgpu::Buffer,
    x_off: u32,
    k: u64,
    m: u64,
    /// [`WebGpuBackend::steps`] when recorded.
    submission: u64,
    xq: Bind,
    xs: Bind,
}

/// One weight of a held matvec.
#[derive(Debug)]
struct JoinPart {
    /// Its first byte in the held buffer.
    offset: u64,
    rows: u64,
    /// Its packed bytes.
    bytes: u64,
    /// Its output, `[tokens, rows]` from byte 0.
    y: wgpu::Buffer,
}

/// An int8 matvec held for the next one over the same activations, whose
/// weights follow in the same buffer ([`QuantKernels::join_matvec`]).
#[derive(Debug)]
struct Join {
    ty: GgmlType,
    /// The buffer holding every part's weight.
    w: wgpu::Buffer,
    /// The first part's parameters (x, shape; y_stride its rows).
    base: KernelParams,
    tokens: u32,
    aligned: bool,
    xq: Bind,
    xs: Bind,
    parts: Vec<JoinPart>,
}

/// The quantized weight kernels of one device.
#[derive(Debug)]
pub struct QuantKernels {
    caps: GpuCaps,
    cfg: KernelConfig,
    scratch: Mutex<Option<Scratch>>,
    last_x: Mutex<Option<QuantizedX>>,
    join: Mutex<Option<Join>>,
}

/// Locks `m`, whether or not a panic poisoned it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

fn u32_of(v: u64, what: &str) -> Result<u32, BackendError> {
    u32::try_from(v).map_err(|_| {
        BackendError::Shape(format!(
            "{what} = {v} does not fit the kernels' 32-bit indices; split the operation"
        ))
    })
}

impl QuantKernels {
    /// Kernels for a device with `caps`, tuned by `cfg` (adjusted to fit
    /// the adapter's limits).
    pub fn new(caps: &GpuCaps, cfg: KernelConfig) -> Self {
        Self {
            caps: caps.clone(),
            cfg: cfg.fit(caps),
            scratch: Mutex::new(None),
            last_x: Mutex::new(None),
            join: Mutex::new(None),
        }
    }

    /// Forgets the quantized activations if an op about to be recorded
    /// writes their source (any of `written`).
    pub fn forget_writes(&self, written: &[&wgpu::Buffer]) {
        let mut last = match self.last_x.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        if last.as_ref().is_some_and(|q| written.contains(&&q.x)) {
            *last = None;
        }
    }

    /// The tuning in use.
    pub fn config(&self) -> &KernelConfig {
        &self.cfg
    }

    /// Queues `y = x · Wᵀ` on `be`: matrix-vector kernels for up to
    /// `mv_max_tokens` tokens (int8 dots for quantized weights when
    /// enabled), the tiled kernel for more.
    pub fn encode_matmul(
        &self,
        be: &mut WebGpuBackend,
        a: &MatmulArgs<'_>,
    ) -> Result<(), BackendError> {
        let layout = packed_layout(a.ty, a.n, a.k)?;
        check_parts(a.w, a.n)?;
        if !a.x.offset.is_multiple_of(16) || !a.y.offset.is_multiple_of(4) {
            return Err(BackendError::Shape(format!(
                "matmul: x offset {} must be a multiple of 16 bytes and y offset {} of 4",
                a.x.offset, a.y.offset
            )));
        }
        if a.m == 0 {
            return Ok(());
        }
        let mut base = KernelParams {
            k: u32_of(a.k, "k")?,
            m: u32_of(a.m, "m")?,
            nb: u32_of(layout.blocks_per_row, "blocks per row")?,
            row_words: u32_of(layout.row_words(), "row words")?,
            x_off: u32_of(a.x.offset / 4, "x offset")?,
            x_stride: u32_of(a.k, "k")?,
            y_off: u32_of(a.y.offset / 4, "y offset")?,
            y_stride: u32_of(a.n, "n")?,
            ..KernelParams::default()
        };
        u32_of(a.m * a.k.max(a.n), "tokens x width")?;
        let x = Bind {
            buf: a.x.buffer.clone(),
            offset: 0,
            size: None,
        };
        let y = Bind {
            buf: a.y.buffer.clone(),
            offset: 0,
            size: None,
        };
        if a.m > u64::from(self.cfg.mv_max_tokens) {
            return self.encode_tiled(be, a, &layout, base, x, y);
        }
        let tokens = if a.m == 1 { 1 } else { 4 };
        let token_groups = base.m.div_ceil(tokens);
        let int8 = self.cfg.int8 && has_int8(a.ty);
        let (kernel, xbinds) = if int8 {
            let (xq, xs) = self.quantize_x(be, a, base)?;
            base.x_off = 0;
            (Kernel::MatVecI8, vec![xq, y, xs])
        } else {
            (Kernel::MatVec, vec![x, y])
        };
        // Rows (and parts) at multiples of 16 bytes may be read as vec4s.
        let aligned =
            layout.row_words().is_multiple_of(4) && a.w.iter().all(|p| p.offset.is_multiple_of(16));
        // The 16-byte item files take binding 5, which the several-rows
        // kernel gives to its joined outputs: they run one row per team.
        let w4 = int8 && self.cfg.mv_w4 && aligned && item_w4_source(a.ty).is_some();
        let teams = self.cfg.teams(int8, tokens);
        // Joined at one token per workgroup only: on the H200, joining
        // decoded one sequence at 180.2 tokens/s against 173.4 but four at
        // 537.3 against 570.9.
        if int8 && !w4 && tokens == 1 && a.w.len() == 1 && a.y.offset == 0 {
            let part = JoinPart {
                offset: a.w[0].offset,
                rows: a.n,
                bytes: layout.part_bytes(a.n),
                y: a.y.buffer.clone(),
            };
            let shape = (a.ty, base, tokens, aligned);
            return self.join_matvec(be, a.w[0].buffer, part, shape, &xbinds);
        }
        // Rows per team from the largest part (all parts share a pipeline).
        let lane_rows = if int8 && !w4 {
            let most = a.w.iter().map(|p| p.rows).max().unwrap_or(a.n);
            self.cfg.lane_rows_for(most, teams)
        } else {
            1
        };
        let shape = MvShape {
            tokens,
            aligned,
            lane_rows,
            joined: false,
        };
        let v = self.variant(kernel, a.ty, shape)?;
        let pipeline = be.pipeline(&v.key, &v.parts);
        let rows_per_group = u64::from(teams * lane_rows);
        let spare = if lane_rows > 1 {
            Some(Bind::whole(&be.unused_buffer()?))
        } else {
            None
        };
        for part in a.w {
            let groups = u32_of(part.rows.div_ceil(rows_per_group), "row groups")?;
            let n = u32_of(part.rows, "part rows")?;
            let params = KernelParams {
                n,
                n1: n,
                n2: n,
                first_row: u32_of(part.first_row, "first row")?,
                groups,
                ..base
            };
            let total = u32_of(u64::from(groups) * u64::from(token_groups), "workgroups")?;
            let mut binds = vec![weight_bind(part, &layout)];
            binds.extend(xbinds.iter().cloned());
            if v.w4 {
                binds.push(weight_bind(part, &layout));
            }
            if let Some(s) = &spare {
                binds.extend([s.clone(), s.clone()]);
            }
            be.enqueue(Dispatch {
                pipeline: pipeline.clone(),
                params: bytemuck::cast_slice(&[params]).to_vec(),
                binds,
                groups: be.grid(total),
            });
        }
        Ok(())
    }

    /// Holds the int8 matvec of one weight (`part` of buffer `w`) until
    /// the next is recorded: a matvec over the same quantized activations
    /// whose weight has the same shape and follows in the same buffer
    /// (q, k, v; gate, up) joins it, up to three, as one dispatch; anything
    /// else queued first queues it ([`QuantKernels::flush_join`]).
    fn join_matvec(
        &self,
        be: &mut WebGpuBackend,
        w: &wgpu::Buffer,
        part: JoinPart,
        (ty, base, tokens, aligned): (GgmlType, KernelParams, u32, bool),
        xbinds: &[Bind],
    ) -> Result<(), BackendError> {
        let max = be.context().caps.max_storage_binding;
        let mut pending = lock(&self.join);
        if let Some(j) = pending.as_mut() {
            let last = j.parts.last().map_or(0, |p| p.offset + p.bytes);
            let first = j.parts.first().map_or(0, |p| p.offset);
            let fits = j.parts.len() < 3
                && j.ty == ty
                && j.w == *w
                && j.xq.buf == xbinds[0].buf
                && j.xs.buf == xbinds[2].buf
                && (j.base.k, j.base.m, j.base.row_words) == (base.k, base.m, base.row_words)
                && j.tokens == tokens
                && part.offset >= last
                && part.offset + part.bytes - first <= max;
            if fits {
                j.parts.push(part);
                return Ok(());
            }
        }
        let prev = pending.take();
        let job = Join {
            ty,
            w: w.clone(),
            base,
            tokens,
            aligned,
            xq: xbinds[0].clone(),
            xs: xbinds[2].clone(),
            parts: vec![part],
        };
        // An op offered to this product and not taken was recorded before
        // it and is queued before its first dispatch: no holding then.
        let now = if be.offer.is_none() {
            *pending = Some(job);
            None
        } else {
            Some(job)
        };
        drop(pending);
        if let Some(j) = prev {
            self.emit_join(be, j, true)?;
        }
        match now {
            Some(j) => self.emit_join(be, j, false),
            None => Ok(()),
        }
    }

    /// Queues the held matvec, if any (before any other dispatch, and
    /// before a submission).
    pub fn flush_join(&self, be: &mut WebGpuBackend) -> Result<(), BackendError> {
        let held = lock(&self.join).take();
        match held {
            Some(j) => self.emit_join(be, j, true),
            None => Ok(()),
        }
    }

    /// Queues `j` as one dispatch: the one-row kernel for a lone weight
    /// that gets one row per team, the several-rows kernel otherwise.
    /// `held`: it was held, so it goes straight into the queue, ahead of
    /// any op offered to a later product.
    fn emit_join(&self, be: &mut WebGpuBackend, j: Join, held: bool) -> Result<(), BackendError> {
        let rows: Vec<u64> = j.parts.iter().map(|p| p.rows).collect();
        let n: u64 = rows.iter().sum();
        let teams = self.cfg.teams(true, j.tokens);
        let lane_rows = self.cfg.lane_rows_for(n, teams);
        let joined = j.parts.len() > 1;
        let shape = MvShape {
            tokens: j.tokens,
            aligned: j.aligned,
            lane_rows,
            joined,
        };
        let v = self.variant(Kernel::MatVecI8, j.ty, shape)?;
        let pipeline = be.pipeline(&v.key, &v.parts);
        let first = j.parts[0].offset;
        let end = j.parts.last().map_or(first, |p| p.offset + p.bytes);
        let words = |p: Option<&JoinPart>| {
            p.map_or(Ok(0), |p| u32_of((p.offset - first) / 4, "weight offset"))
        };
        let n1 = rows[0];
        let n2 = n1 + rows.get(1).copied().unwrap_or(0);
        let n2 = if j.parts.len() > 2 { n2 } else { n };
        let groups = u32_of(n.div_ceil(u64::from(teams * lane_rows)), "row groups")?;
        let params = KernelParams {
            n: u32_of(n, "rows")?,
            n1: u32_of(n1, "rows")?,
            n2: u32_of(n2, "rows")?,
            base1: words(j.parts.get(1))?,
            base2: words(j.parts.get(2))?,
            y_stride: u32_of(n1, "rows")?,
            first_row: 0,
            groups,
            ..j.base
        };
        let token_groups = j.base.m.div_ceil(j.tokens);
        let total = u32_of(u64::from(groups) * u64::from(token_groups), "workgroups")?;
        let y = |i: usize| Bind::whole_raw(j.parts[i].y.clone());
        let mut binds = vec![
            Bind {
                buf: j.w.clone(),
                offset: first,
                size: std::num::NonZeroU64::new(end - first),
            },
            j.xq.clone(),
            y(0),
            j.xs.clone(),
        ];
        if lane_rows > 1 || joined {
            let spare = Bind::whole(&be.unused_buffer()?);
            for i in 1..3 {
                binds.push(if i < j.parts.len() {
                    y(i)
                } else {
                    spare.clone()
                });
            }
        }
        let d = Dispatch {
            pipeline,
            params: bytemuck::cast_slice(&[params]).to_vec(),
            binds,
            groups: be.grid(total),
        };
        if held {
            be.enqueue_held(d);
        } else {
            be.enqueue(d);
        }
        Ok(())
    }

    fn encode_tiled(
        &self,
        be: &mut WebGpuBackend,
        a: &MatmulArgs<'_>,
        layout: &PackedLayout,
        base: KernelParams,
        x: Bind,
        y: Bind,
    ) -> Result<(), BackendError> {
        let v = self.variant(Kernel::Tiled, a.ty, MvShape::new(1, false))?;
        let pipeline = be.pipeline(&v.key, &v.parts);
        let token_tiles = base.m.div_ceil(self.cfg.tile_m);
        for part in a.w {
            let groups = u32_of(part.rows.div_ceil(u64::from(self.cfg.tile_n)), "row tiles")?;
            let params = KernelParams {
                n: u32_of(part.rows, "part rows")?,
                first_row: u32_of(part.first_row, "first row")?,
                groups,
                ..base
            };
            let total = u32_of(u64::from(groups) * u64::from(token_tiles), "workgroups")?;
            be.enqueue(Dispatch {
                pipeline: pipeline.clone(),
                params: bytemuck::cast_slice(&[params]).to_vec(),
                binds: vec![weight_bind(part, layout), x.clone(), y.clone()],
                groups: be.grid(total),
            });
        }
        Ok(())
    }

    /// Queues the activation quantizer, unless the same activations were
    /// quantized since the last submission with nothing writing them;
    /// returns the bindings of its output.
    fn quantize_x(
        &self,
        be: &mut WebGpuBackend,
        a: &MatmulArgs<'_>,
        base: KernelParams,
    ) -> Result<(Bind, Bind), BackendError> {
        let mut last = match self.last_x.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        if let Some(q) = last.as_ref() {
            if q.x == *a.x.buffer
                && q.x_off == base.x_off
                && q.k == a.k
                && q.m == a.m
                && q.submission == be.steps()
            {
                return Ok((q.xq.clone(), q.xs.clone()));
            }
        }
        let fused = be.take_offer(a.x.buffer, a.x.offset, a.m, a.k);
        let (xq, xs) = self.record_quantize_x(be, a, base, fused)?;
        *last = Some(QuantizedX {
            x: a.x.buffer.clone(),
            x_off: base.x_off,
            k: a.k,
            m: a.m,
            submission: be.steps(),
            xq: xq.clone(),
            xs: xs.clone(),
        });
        Ok((xq, xs))
    }

    /// Queues the activation quantizer (fused with the gated activation
    /// or the norm that writes `x`, if given); returns the bindings of its
    /// output.
    fn record_quantize_x(
        &self,
        be: &mut WebGpuBackend,
        a: &MatmulArgs<'_>,
        base: KernelParams,
        fused: Option<Held>,
    ) -> Result<(Bind, Bind), BackendError> {
        let bytes = a.m * a.k;
        let (xq, xs) = self.scratch(be, bytes)?;
        // One invocation per 8 values (four per block of 32).
        let count = u32_of(a.m * a.k / 8, "activation groups")?;
        let params = KernelParams { count, ..base };
        match fused {
            Some(Held::Gated(g)) => {
                let key =
                    PipelineKey::new("quantize_x_gated", self.cfg.flat_wg, &be.context().caps)
                        .with_subgroups(be.context().caps.quad_subgroups())
                        .with_const("MODE", ConstValue::U32(g.mode));
                let pipeline = be.pipeline(&key, &[QUANTIZE_X_GATED]);
                let [gate, up, out] = g.bufs.each_ref().map(Bind::whole);
                let (xq, xs) = (Bind::whole_raw(xq), Bind::whole_raw(xs));
                be.enqueue(Dispatch {
                    pipeline,
                    params: bytemuck::cast_slice(&[params]).to_vec(),
                    binds: vec![gate, up, out, xq.clone(), xs.clone()],
                    groups: be.grid(count.div_ceil(self.cfg.flat_wg)),
                });
                return Ok((xq, xs));
            }
            Some(Held::Norm(n)) => {
                be.emit_norm_quantize(n, &xq, &xs);
                return Ok((Bind::whole_raw(xq), Bind::whole_raw(xs)));
            }
            _ => {}
        }
        let v = self.variant(Kernel::QuantizeX, a.ty, MvShape::new(1, false))?;
        let pipeline = be.pipeline(&v.key, &v.parts);
        let xq = Bind {
            buf: xq,
            offset: 0,
            size: None,
        };
        let xs = Bind {
            buf: xs,
            offset: 0,
            size: None,
        };
        be.enqueue(Dispatch {
            pipeline,
            params: bytemuck::cast_slice(&[params]).to_vec(),
            binds: vec![
                Bind {
                    buf: a.x.buffer.clone(),
                    offset: 0,
                    size: None,
                },
                xq.clone(),
                xs.clone(),
            ],
            groups: be.grid(count.div_ceil(self.cfg.flat_wg)),
        });
        Ok((xq, xs))
    }

    /// Scratch buffers of at least `bytes` each, grown as needed. Earlier
    /// dispatches keep the buffers they were recorded with.
    fn scratch(
        &self,
        be: &WebGpuBackend,
        bytes: u64,
    ) -> Result<(wgpu::Buffer, wgpu::Buffer), BackendError> {
        let mut guard = self.scratch.lock().map_err(|_| {
            BackendError::Shape("the int8 scratch lock was poisoned by a panic".into())
        })?;
        if let Some(s) = guard.as_ref() {
            if s.bytes >= bytes {
                return Ok((s.xq.clone(), s.xs.clone()));
            }
        }
        let size = bytes.next_power_of_two().max(4096);
        let make = |label| {
            be.context().device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        };
        let s = Scratch {
            xq: make("matmul int8 x"),
            xs: make("matmul int8 x scales"),
            bytes: size,
        };
        let out = (s.xq.clone(), s.xs.clone());
        *guard = Some(s);
        Ok(out)
    }

    /// Queues one product of a MoE layer's experts on `be`: a workgroup
    /// per row group of each expert, which walks the entries routed to it
    /// (none, for most experts of a decode step: such workgroups exit at once).
    pub fn encode_moe_matvec(
        &self,
        be: &mut WebGpuBackend,
        a: &MoeMatvecArgs<'_>,
    ) -> Result<(), BackendError> {
        let rows = a.n_expert * a.n;
        let layout = packed_layout(a.ty, rows, a.k)?;
        check_parts(std::slice::from_ref(&a.w), rows)?;
        if a.entries == 0 {
            return Ok(());
        }
        let tokens = if a.tokens > 1 { 4 } else { 1 };
        let v = self.variant(Kernel::MoeMatVec, a.ty, MvShape::new(tokens, false))?;
        let pipeline = be.pipeline(&v.key, &v.parts);
        let groups = u32_of(a.n.div_ceil(u64::from(self.cfg.mv_rows)), "row groups")?;
        u32_of(rows * layout.row_words(), "weight words")?;
        u32_of(a.entries * a.k.max(a.n), "entries x width")?;
        let params = KernelParams {
            k: u32_of(a.k, "k")?,
            n: u32_of(a.n, "expert rows")?,
            m: u32_of(a.entries, "entries")?,
            nb: u32_of(layout.blocks_per_row, "blocks per row")?,
            row_words: u32_of(layout.row_words(), "row words")?,
            x_stride: u32_of(a.k, "k")?,
            y_stride: u32_of(a.n, "expert rows")?,
            groups,
            count: u32_of(a.k_used, "experts per token")?,
            n1: u32::from(a.per_entry),
            n2: u32_of(a.n_expert, "experts")?,
            ..KernelParams::default()
        };
        let total = u32_of(u64::from(groups) * a.n_expert, "workgroups")?;
        be.enqueue(Dispatch {
            pipeline,
            params: bytemuck::cast_slice(&[params]).to_vec(),
            binds: vec![
                weight_bind(&a.w, &layout),
                Bind::whole(a.x),
                Bind::whole(a.y),
                Bind::whole(a.route),
            ],
            groups: be.grid(total),
        });
        Ok(())
    }

    /// Queues the embedding lookup `y[t, :] = W[ids[t], :]` on `be`.
    pub fn encode_get_rows(
        &self,
        be: &mut WebGpuBackend,
        a: &GetRowsArgs<'_>,
    ) -> Result<(), BackendError> {
        let layout = packed_layout(a.ty, a.n, a.k)?;
        check_parts(a.w, a.n)?;
        if !a.ids.offset.is_multiple_of(4) || !a.y.offset.is_multiple_of(4) {
            return Err(BackendError::Shape(format!(
                "get_rows: ids offset {} and y offset {} must be multiples of 4 bytes",
                a.ids.offset, a.y.offset
            )));
        }
        if a.count == 0 {
            return Ok(());
        }
        let v = self.variant(Kernel::GetRows, a.ty, MvShape::new(1, false))?;
        let pipeline = be.pipeline(&v.key, &v.parts);
        let items = u32_of(a.count * (a.k / 8), "lookups x groups")?;
        for part in a.w {
            let params = KernelParams {
                k: u32_of(a.k, "k")?,
                n: u32_of(part.rows, "part rows")?,
                nb: u32_of(layout.blocks_per_row, "blocks per row")?,
                row_words: u32_of(layout.row_words(), "row words")?,
                x_off: u32_of(a.ids.offset / 4, "ids offset")?,
                y_off: u32_of(a.y.offset / 4, "y offset")?,
                y_stride: u32_of(a.k, "k")?,
                first_row: u32_of(part.first_row, "first row")?,
                count: u32_of(a.count, "count")?,
                ..KernelParams::default()
            };
            be.enqueue(Dispatch {
                pipeline: pipeline.clone(),
                params: bytemuck::cast_slice(&[params]).to_vec(),
                binds: vec![
                    weight_bind(part, &layout),
                    Bind {
                        buf: a.ids.buffer.clone(),
                        offset: 0,
                        size: None,
                    },
                    Bind {
                        buf: a.y.buffer.clone(),
                        offset: 0,
                        size: None,
                    },
                ],
                groups: be.grid(items.div_ceil(self.cfg.flat_wg)),
            });
        }
        Ok(())
    }

    fn variant(
        &self,
        kernel: Kernel,
        ty: GgmlType,
        mv: MvShape,
    ) -> Result<super::sources::Variant, BackendError> {
        variant(kernel, ty, &self.caps, &self.cfg, mv).ok_or_else(|| {
            BackendError::UnsupportedType {
                tensor: format!("{} weight", kernel.name()),
                ty,
                backend: "WebGPU".into(),
            }
        })
    }
}

/// The part's rows as a binding: its byte range when it shares a buffer
/// (`rows * row_bytes`), else the whole buffer.
fn weight_bind(part: &WeightPart<'_>, layout: &PackedLayout) -> Bind {
    Bind {
        buf: part.buffer.clone(),
        offset: part.offset,
        size: std::num::NonZeroU64::new(layout.part_bytes(part.rows)),
    }
}

/// Checks that `parts` cover rows `0..n` exactly once.
fn check_parts(parts: &[WeightPart<'_>], n: u64) -> Result<(), BackendError> {
    let mut ranges: Vec<(u64, u64)> = parts.iter().map(|p| (p.first_row, p.rows)).collect();
    ranges.sort_unstable();
    let mut next = 0;
    for (first, rows) in ranges {
        if first != next || rows == 0 {
            return Err(BackendError::Shape(format!(
                "weight parts must cover rows 0..{n} once without gaps; got a part at row {first} ({rows} rows) where row {next} was expected"
            )));
        }
        next = first + rows;
    }
    if next != n {
        return Err(BackendError::Shape(format!(
            "weight parts cover rows 0..{next} but the weight has {n} rows"
        )));
    }
    Ok(())
}
