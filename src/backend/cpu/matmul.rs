//! Matrix multiplication with a quantized or float weight.
//!
//! ggml's CPU scheme: the activations are quantized ONCE per matmul to the
//! weight type's `vec_dot_type` (Q8_0, Q8_1, Q8_K, fp16, bf16), then every
//! output element is one `vec_dot` of a weight row with an activation row.
//! Weights stay in their GGUF blocks (never a dequantized copy; where the
//! tiles want it, each whole group of rows is rearranged once at load,
//! [`crate::backend::cpu::kernels::Layout`]). The exact-f32
//! mode instead expands one weight row at a time into scratch and dots it with
//! the f32 activations (for tests).

use std::borrow::Cow;
use std::ops::Range;

use super::hostmem::HostMem;
use super::kernels::{KernelTable, Layout, Out, QuantizeFn, ScaleKinds, WeightKernels, Widen};
use super::threads::Threads;
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// A weight matrix in its GGUF encoding: `rows` rows of `cols` elements
/// (ggml `ne[0] = cols`). 3-D expert tensors are `n_expert * rows_per_expert` rows.
#[derive(Debug)]
pub struct Weight {
    /// Tensor name, for errors.
    pub name: String,
    /// Element type (the GGUF tensor's).
    pub ty: GgmlType,
    /// The type the bytes are stored as: `ty`, or a lossless re-encoding
    /// whose kernels run faster here
    /// ([`crate::backend::cpu::kernels::WeightKernels::widen`]).
    pub stored: GgmlType,
    /// Elements per row (`ne[0]`).
    pub cols: usize,
    /// Number of rows (product of `ne[1..]`).
    pub rows: usize,
    /// Bytes per stored row.
    pub row_bytes: usize,
    /// The raw blocks, 4-byte aligned storage (`data_len` bytes used).
    data: HostMem,
    data_len: usize,
    kernels: WeightKernels,
    /// How the GGUF type was re-encoded as `stored`, if it was.
    widen: Option<Widen>,
}

impl Weight {
    /// Wraps raw tensor bytes. Fails when the CPU backend has no kernel for
    /// `ty` or the byte count does not match the shape.
    pub fn new(
        table: &KernelTable,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
        data: Vec<u32>,
        data_len: usize,
    ) -> Result<Self, BackendError> {
        Self::from_mem(table, name, ty, cols, rows, HostMem::Heap(data), data_len)
    }

    /// [`Weight::new`] over any host memory (the backend's large pages).
    pub fn from_mem(
        table: &KernelTable,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
        data: HostMem,
        data_len: usize,
    ) -> Result<Self, BackendError> {
        let unsupported = |ty| BackendError::UnsupportedType {
            tensor: name.to_string(),
            ty,
            backend: "CPU".into(),
        };
        let kernels = table.weight(ty).ok_or_else(|| unsupported(ty))?;
        let be = ty.block_elems();
        if !cols.is_multiple_of(be) {
            return Err(BackendError::Shape(format!(
                "tensor '{name}': rows of {cols} elements are not whole {ty} blocks of {be}"
            )));
        }
        let row_bytes = cols / be * ty.block_bytes();
        if row_bytes * rows != data_len || data.len() * 4 < data_len {
            return Err(BackendError::Shape(format!(
                "tensor '{name}': {data_len} bytes do not hold {rows} rows of {cols} {ty}"
            )));
        }
        let widen = kernels.widen.filter(|w| w.to.block_elems() == be);
        let (stored, mut kernels, mut data, data_len, row_bytes) = match widen {
            Some(w) => {
                let sk = table.weight(w.to).ok_or_else(|| unsupported(w.to))?;
                let rb = cols / be * w.to.block_bytes();
                let words = (rb * rows).div_ceil(4);
                let mut wide = Vec::new();
                wide.try_reserve_exact(words)
                    .map_err(|e| BackendError::OutOfMemory {
                        bytes: (words * 4) as u64,
                        what: format!("tensor '{name}' stored as {}", w.to),
                        detail: e.to_string(),
                    })?;
                wide.resize(words, 0u32);
                let from: &[u8] = &bytemuck::cast_slice(&data[..])[..data_len];
                (w.encode)(
                    from,
                    &mut bytemuck::cast_slice_mut(&mut wide[..])[..rb * rows],
                );
                (w.to, sk, HostMem::Heap(wide), rb * rows, rb)
            }
            _ => (ty, kernels, data, data_len, row_bytes),
        };
        if kernels.asks_scale_kinds() {
            let blocks = &bytemuck::cast_slice(&data[..])[..data_len];
            kernels = kernels.for_scales(ScaleKinds::of(stored, blocks));
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut data[..]);
        (kernels.layout).apply(&mut bytes[..data_len], row_bytes, stored.block_bytes());
        Ok(Self {
            name: name.to_string(),
            ty,
            stored,
            cols,
            rows,
            row_bytes,
            data,
            data_len,
            kernels,
            widen,
        })
    }

    /// The type activations are quantized to for this weight's kernels.
    pub fn act_type(&self) -> GgmlType {
        self.kernels.vec_dot_type
    }

    /// All bytes of the weight, as the kernels read them: whole groups of
    /// rows rearranged where the tiles want that
    /// ([`crate::backend::cpu::kernels::WeightKernels::layout`]).
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.data[..])[..self.data_len]
    }

    /// All bytes of the weight in the GGUF encoding and layout (a copy
    /// where the stored ones differ).
    pub fn plain_bytes(&self) -> Cow<'_, [u8]> {
        if self.stored == self.ty && self.kernels.layout == Layout::Plain {
            return Cow::Borrowed(self.bytes());
        }
        Cow::Owned(
            (0..self.rows)
                .flat_map(|r| self.row(r).into_owned())
                .collect(),
        )
    }

    /// The bytes of row `r` (`r < rows`) in the GGUF encoding and layout:
    /// borrowed, or gathered from a rearranged group and decoded from the
    /// stored type.
    pub fn row(&self, r: usize) -> Cow<'_, [u8]> {
        let row = self.stored_row(r);
        match self.widen {
            Some(Widen { decode, .. }) => {
                let mut out = vec![0u8; self.cols / self.ty.block_elems() * self.ty.block_bytes()];
                decode(&row, &mut out);
                Cow::Owned(out)
            }
            None => row,
        }
    }

    /// Row `r` as stored (type [`Weight::stored`]), in the plain layout.
    fn stored_row(&self, r: usize) -> Cow<'_, [u8]> {
        let bb = self.stored.block_bytes();
        (self.kernels.layout).plain_row(self.bytes(), self.rows, self.row_bytes, bb, r)
    }

    /// Whether a one-token matmul runs the tiled kernel (as batches do, so
    /// its results equal the batched ones bit for bit) or the per-row dot
    /// (equal to the batched results within f32 rounding): the tile where
    /// the format's tile decodes at least as fast
    /// ([`crate::backend::cpu::kernels::WeightKernels::gemm_one_token`]).
    pub fn one_token_runs_tiles(&self) -> bool {
        self.kernels.gemm.is_some() && self.kernels.gemm_one_token
    }

    /// Expands row `r` to f32 into `out` (`out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        (self.kernels.dequantize_row)(&self.stored_row(r), out);
    }
}

/// Activations quantized for one weight type: `n` rows of `row_bytes`.
#[derive(Debug)]
pub struct QuantizedActs {
    data: Vec<u32>,
    row_bytes: usize,
}

impl QuantizedActs {
    /// The quantized activation row `t` (`t < n`).
    pub fn row(&self, t: usize) -> &[u8] {
        &bytemuck::cast_slice(&self.data)[t * self.row_bytes..(t + 1) * self.row_bytes]
    }
}

/// Quantizes `x` (`[n, cols]`) to the `vec_dot_type` of `w`.
pub fn quantize_acts(
    table: &KernelTable,
    w: &Weight,
    x: &[f32],
) -> Result<QuantizedActs, BackendError> {
    let mut data = Vec::new();
    let row_bytes = quantize_into(&Threads::new(1), table, w, x, &mut data)?;
    Ok(QuantizedActs { data, row_bytes })
}

/// Activation rows quantized per parallel task (prefill).
const QUANT_ROWS_PER_TASK: usize = 8;

/// The activation quantizer `w`'s kernels want, and the bytes of one
/// quantized activation row.
pub(super) fn act_format(
    table: &KernelTable,
    w: &Weight,
) -> Result<(QuantizeFn, usize), BackendError> {
    let at = w.kernels.vec_dot_type;
    let quantize = table
        .quantizer(at)
        .ok_or_else(|| BackendError::UnsupportedType {
            tensor: format!("activations of {}", w.name),
            ty: at,
            backend: "CPU".into(),
        })?;
    Ok((quantize, w.cols / at.block_elems() * at.block_bytes()))
}

/// Quantizes `x` (`[n, cols]`) for `w` into `data` (grown, never shrunk, so a
/// reused buffer stops allocating) and returns the bytes per row.
pub(super) fn quantize_into(
    threads: &Threads,
    table: &KernelTable,
    w: &Weight,
    x: &[f32],
    data: &mut Vec<u32>,
) -> Result<usize, BackendError> {
    let (quantize, row_bytes) = act_format(table, w)?;
    let n = x.len() / w.cols.max(1);
    let bytes = grow_bytes(data, row_bytes * n);
    let per_task = if n >= 2 * QUANT_ROWS_PER_TASK {
        QUANT_ROWS_PER_TASK
    } else {
        n
    };
    threads.for_chunks(bytes, (row_bytes * per_task).max(1), |ci, out| {
        let x = &x[ci * per_task * w.cols..];
        for (xr, o) in x.chunks_exact(w.cols).zip(out.chunks_exact_mut(row_bytes)) {
            quantize(xr, o);
        }
    });
    Ok(row_bytes)
}

/// The first `len` bytes of `data`, grown to hold them (never shrunk).
pub(super) fn grow_bytes(data: &mut Vec<u32>, len: usize) -> &mut [u8] {
    let words = len.div_ceil(4);
    if data.len() < words {
        data.resize(words, 0);
    }
    &mut bytemuck::cast_slice_mut(&mut data[..words])[..len]
}

/// The least weight bytes a one-token parallel task reads.
const TASK_BYTES: usize = 256 << 10;

/// Rows of the output computed per parallel task in the exact-f32 mode.
const ROWS_PER_TASK: usize = 16;

/// Activation rows per tile the tiled kernels use (a multiple of every
/// ISA's tile height), and the most per parallel task in prefill.
const TOKEN_TILE: usize = 4;
const MAX_TOKENS_PER_TASK: usize = 64;
/// Batches up to this many tokens by a weight of at least
/// [`STREAM_ONCE_BYTES`] split the work over weight rows (every task takes
/// all tokens, so the weight streams from memory once); others over tokens.
/// A 16-sequence decode step split over tokens read Gemma 3's 137 MB output
/// matrix four times and ran at one sequence's speed; weights that stay in
/// the cache run faster split over tokens (pp64 3x).
const ROW_SPLIT_MAX_TOKENS: usize = 128;
/// See [`ROW_SPLIT_MAX_TOKENS`]: larger than a last-level cache.
const STREAM_ONCE_BYTES: usize = 16 << 20;

thread_local! {
    /// Quantized activations, reused across calls on the calling thread.
    static ACTS: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Transposed results of small batches, reused likewise.
    static RESULTS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `y = x · W[rows]ᵀ` for the weight rows `rows` (all rows of a matrix, or
/// one expert's slice of a 3-D tensor).
///
/// x: `[n, w.cols]`, y: `[n, rows.len()]`. `exact` selects the exact-f32 mode.
pub fn matmul(
    threads: &Threads,
    table: &KernelTable,
    w: &Weight,
    rows: std::ops::Range<usize>,
    x: &[f32],
    y: &mut [f32],
    exact: bool,
) -> Result<(), BackendError> {
    let n = x.len() / w.cols.max(1);
    let m = rows.len();
    if x.len() != n * w.cols || y.len() != n * m || rows.end > w.rows {
        return Err(BackendError::Shape(format!(
            "matmul with '{}' ([{}, {}]): x has {} values, y {}, rows {rows:?}",
            w.name,
            w.rows,
            w.cols,
            x.len(),
            y.len()
        )));
    }
    if n == 0 || m == 0 {
        return Ok(());
    }
    if exact {
        matmul_exact(threads, w, rows, x, y);
        return Ok(());
    }
    let mut acts = ACTS.take();
    let act_bytes = quantize_into(threads, table, w, x, &mut acts);
    if let Ok(act_bytes) = act_bytes {
        let a: &[u8] = &bytemuck::cast_slice(&acts)[..n * act_bytes];
        product(threads, w, rows, a, act_bytes, y);
    }
    ACTS.set(acts);
    act_bytes.map(|_| ())
}

/// `y = a · W[rows]ᵀ` for activations `a` already quantized for `w`
/// ([`quantize_into`]: `n` rows of `act_bytes`), y: `[n, rows.len()]`.
/// The caller has checked the shapes (as [`matmul`] does).
pub(super) fn product(
    threads: &Threads,
    w: &Weight,
    rows: Range<usize>,
    a: &[u8],
    act_bytes: usize,
    y: &mut [f32],
) {
    let (n, m) = (a.len() / act_bytes.max(1), rows.len());
    if n == 0 || m == 0 {
        return;
    }
    // A range that cuts a group of rearranged rows cannot go to the tiles
    // (no model asks for one; experts' ranges are whole groups).
    let group = w.kernels.layout.group_rows();
    let whole = |r: usize| r.is_multiple_of(group) || r == w.rows;
    let cuts_group = !(whole(rows.start) && whole(rows.end));
    let wr = &w.bytes()[rows.start * w.row_bytes..rows.end * w.row_bytes];
    let p = Product {
        w,
        wr,
        a,
        act_bytes,
        n,
        m,
        first: rows.start,
        tiles: !cuts_group,
        one_token_tiles: w.one_token_runs_tiles(),
    };
    p.run(threads, y);
}

/// One quantized product: the weight rows `wr` (`m` rows) by the quantized
/// activations `a` (`n` rows of `act_bytes`).
struct Product<'a> {
    w: &'a Weight,
    wr: &'a [u8],
    a: &'a [u8],
    act_bytes: usize,
    n: usize,
    m: usize,
    /// The weight row `wr` starts at.
    first: usize,
    /// Whether the tiles may run (not where the rows cut an interleaved group).
    tiles: bool,
    /// [`Weight::one_token_runs_tiles`] for the rows in use.
    one_token_tiles: bool,
}

impl Product<'_> {
    /// Splits the work into tasks and writes `y` (`[n, m]`).
    ///
    /// One token: tasks of consecutive rows, straight into `y`. Enough
    /// tokens for every thread: tasks of consecutive tokens (each streams
    /// the weight once per up to 64 tokens, straight into `y`). A few
    /// tokens: tasks of rows into a transposed `[m, n]` scratch, then a
    /// small transpose.
    fn run(&self, threads: &Threads, y: &mut [f32]) {
        let (n, m, nt) = (self.n, self.m, threads.count());
        if n == 1 {
            let rows = self.rows_per_task(nt);
            threads.for_chunks(y, rows, |ci, out| {
                self.block(ci * rows..ci * rows + out.len(), 0..1, out, 1, 1);
            });
        } else if n >= TOKEN_TILE * nt && !self.streams_once() {
            let per = n.div_ceil(2 * nt).next_multiple_of(TOKEN_TILE);
            let toks = per.clamp(TOKEN_TILE, MAX_TOKENS_PER_TASK);
            threads.for_chunks(y, toks * m, |ci, out| {
                self.block(0..m, ci * toks..ci * toks + out.len() / m, out, 1, m);
            });
        } else {
            let mut yt = RESULTS.take();
            if yt.len() < m * n {
                yt.resize(m * n, 0.0);
            }
            let rows = self.rows_per_task(nt);
            threads.for_chunks(&mut yt[..m * n], rows * n, |ci, out| {
                self.block(ci * rows..ci * rows + out.len() / n, 0..n, out, n, 1);
            });
            for (r, col) in yt[..m * n].chunks_exact(n).enumerate() {
                for (t, &v) in col.iter().enumerate() {
                    y[t * m + r] = v;
                }
            }
            RESULTS.set(yt);
        }
    }

    /// Whether the work splits over weight rows so the weight streams once
    /// (see [`ROW_SPLIT_MAX_TOKENS`]).
    fn streams_once(&self) -> bool {
        self.n <= ROW_SPLIT_MAX_TOKENS && self.m * self.w.row_bytes >= STREAM_ONCE_BYTES
    }

    /// Rows per task when splitting over rows: one task per thread would
    /// leave a slow thread's share undone; eight per thread balance, in
    /// multiples of the kernels' bands of eight rows (rows past the last
    /// whole band take a kernel's slower one-row path) and of the layout's
    /// groups (a task starts at a group), at least 16.
    fn rows_per_task(&self, nt: usize) -> usize {
        if nt <= 1 {
            return self.m;
        }
        let least = if self.n == 1 {
            // A one-token task reads at least TASK_BYTES of weights: the
            // kernels stream ~30 GB/s, so smaller tasks cost about as much
            // to hand out as to run.
            TASK_BYTES.div_ceil(self.w.row_bytes.max(1))
        } else {
            16
        };
        let step = self.w.kernels.layout.group_rows().max(8);
        self.m.div_ceil(8 * nt).max(least).next_multiple_of(step)
    }

    /// Results of weight rows `rows` with activation rows `toks`, at
    /// `out[r * row_stride + t * tok_stride]` (r, t counted from the starts).
    fn block(
        &self,
        rows: Range<usize>,
        toks: Range<usize>,
        out: &mut [f32],
        row_stride: usize,
        tok_stride: usize,
    ) {
        let rb = self.w.row_bytes;
        let wr = &self.wr[rows.start * rb..rows.end * rb];
        let a = &self.a[toks.start * self.act_bytes..toks.end * self.act_bytes];
        // The tiles for every batch size, and for one token where the
        // format's tile is the faster: a pair's arithmetic is the same in
        // every tile shape, so then a token's results do not depend on the
        // batch it is in. Elsewhere one token dots row by row (the same
        // products, summed in another order: equal within f32 rounding).
        let tiles = if !self.tiles || (self.n == 1 && !self.one_token_tiles) {
            None
        } else {
            self.w.kernels.gemm
        };
        match tiles {
            // A few tokens where the one-token tile is the fast one: one
            // token at a time (the tile of 4 costs about as much for 2).
            Some(gemm) if self.one_token_tiles && toks.len() > 1 && toks.len() <= TOKEN_TILE => {
                for (t, arow) in a.chunks_exact(self.act_bytes).enumerate() {
                    let out = Out {
                        out: &mut out[t * tok_stride..],
                        row_stride,
                        tok_stride,
                    };
                    gemm(wr, rb, arow, self.act_bytes, out);
                }
            }
            Some(gemm) => {
                let out = Out {
                    out,
                    row_stride,
                    tok_stride,
                };
                gemm(wr, rb, a, self.act_bytes, out);
            }
            None => {
                // Rows in the plain layout (gathered where rearranged).
                let dot = self.w.kernels.vec_dot;
                for (r, wr) in rows.map(|r| self.w.stored_row(self.first + r)).enumerate() {
                    for (t, arow) in a.chunks_exact(self.act_bytes).enumerate() {
                        out[r * row_stride + t * tok_stride] = dot(&wr, arow);
                    }
                }
            }
        }
    }
}

/// The exact-f32 mode: each weight row expanded into scratch and dotted
/// with the f32 activations (tests); rows in parallel, then transposed.
fn matmul_exact(
    threads: &Threads,
    w: &Weight,
    rows: std::ops::Range<usize>,
    x: &[f32],
    y: &mut [f32],
) {
    let (n, m) = (x.len() / w.cols.max(1), rows.len());
    let mut yt = vec![0.0f32; m * n];
    threads.for_chunks(&mut yt, ROWS_PER_TASK * n, |ci, out| {
        let mut scratch = vec![0.0f32; w.cols];
        for (k, orow) in out.chunks_exact_mut(n).enumerate() {
            w.dequantize_row(rows.start + ci * ROWS_PER_TASK + k, &mut scratch);
            for (t, o) in orow.iter_mut().enumerate() {
                let xr = &x[t * w.cols..(t + 1) * w.cols];
                *o = super::kernels::float::vec_dot_f32(&scratch, xr);
            }
        }
    });
    for (r, col) in yt.chunks_exact(n).enumerate() {
        for (t, &v) in col.iter().enumerate() {
            y[t * m + r] = v;
        }
    }
}
