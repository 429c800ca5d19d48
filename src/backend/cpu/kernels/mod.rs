//! The CPU kernel table: function pointers filled once at start.
//!
//! Every ISA file defines the same ggml-named kernels over block structs
//! (`vec_dot_q4_0_q8_0`, `quantize_row_q8_0`, ...). [`KernelTable`] wraps them
//! as byte-level entries per weight type, so the matmul and the embedding
//! lookup never match on types in their loops. A faster ISA (x86-64: AVX2,
//! AVX-512 VNNI, in `x86/`; aarch64: NEON with dotprod, in `arm/`; wasm32:
//! SIMD128, in `wasm/`) fills the same slots and keeps the scalar ones it
//! lacks; [`KernelTable::detect`] picks the best one the CPU has.

// Index loops mirror ggml's kernels lane for lane (and keep the shape the
// vectorizer recognises), so clippy's iterator rewrite is not wanted here.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "aarch64")]
mod arm;
pub mod float;
pub mod iq4;
pub mod kquants;
pub mod legacy;
// Visible in the backend for their attention and row-op kernels.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
pub(super) mod wasm;
#[cfg(target_arch = "x86_64")]
pub(super) mod x86;

use std::borrow::Cow;

use bytemuck::Pod;
use half::{bf16, f16};

use crate::quant::blocks::{
    cast_blocks, BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use crate::quant::GgmlType;

/// fp16 to f32 without a per-call CPU feature check (inlined into the kernels).
#[inline(always)]
pub fn fp16(h: f16) -> f32 {
    let h = u32::from(h.to_bits());
    let sign = (h & 0x8000) << 16;
    let exp = (h >> 10) & 0x1F;
    let man = h & 0x3FF;
    match exp {
        0 => {
            // Zero or subnormal: man * 2^-24.
            let v = man as f32 * (1.0 / 16_777_216.0);
            f32::from_bits(v.to_bits() | sign)
        }
        0x1F => f32::from_bits(sign | 0x7F80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 112) << 23) | (man << 13)),
    }
}

/// Dot of one weight row (raw blocks) with one activation row (raw blocks of
/// the weight's `vec_dot_type`) holding the same number of elements.
pub type DotFn = fn(weights: &[u8], acts: &[u8]) -> f32;
/// Expands one row of raw blocks into `out` (`out.len()` = the row's elements).
pub type DequantizeFn = fn(row: &[u8], out: &mut [f32]);
/// Quantizes `x` into raw blocks (`out.len()` = the blocks' bytes).
pub type QuantizeFn = fn(x: &[f32], out: &mut [u8]);
/// A tile of dots: every weight row `r` of `weights` (rows of `row_bytes`,
/// raw blocks) with every activation row `t` of `acts` (rows of `act_bytes`,
/// raw blocks of the weight's `vec_dot_type`, as many elements as a weight
/// row), written to `out[r * out.row_stride + t * out.tok_stride]`.
///
/// The kernel decodes each weight block once for several activation rows
/// and reads each activation block once for several weight rows (decode:
/// one activation row, several weight rows). Equal to [`DotFn`] per pair
/// within f32 rounding. Shapes that do not fit (`out` too short, rows of
/// different lengths) compute nothing.
pub type GemmFn = fn(weights: &[u8], row_bytes: usize, acts: &[u8], act_bytes: usize, out: Out<'_>);

/// Where a [`GemmFn`] writes: `out[r * row_stride + t * tok_stride]`.
#[derive(Debug)]
pub struct Out<'a> {
    /// The output values.
    pub out: &'a mut [f32],
    /// Distance between the results of consecutive weight rows.
    pub row_stride: usize,
    /// Distance between the results of consecutive activation rows.
    pub tok_stride: usize,
}

impl Out<'_> {
    /// Whether `rows x toks` results fit in `out`.
    pub fn fits(&self, rows: usize, toks: usize) -> bool {
        rows == 0
            || toks == 0
            || (rows - 1)
                .checked_mul(self.row_stride)
                .and_then(|a| (toks - 1).checked_mul(self.tok_stride)?.checked_add(a))
                .is_some_and(|last| last < self.out.len())
    }
}

/// The instruction set a table was filled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable scalar Rust (every target).
    Scalar,
    /// x86-64 AVX2 with FMA and F16C.
    Avx2,
    /// x86-64 AVX-512 F+BW+VL with VNNI (plus everything [`Isa::Avx2`] needs).
    Avx512,
    /// aarch64 NEON (Advanced SIMD), using `sdot` where the CPU has dotprod.
    Neon,
    /// wasm32 SIMD128 (a build with `-C target-feature=+simd128`; with
    /// `+relaxed-simd` too, its int8 dots use the relaxed dot instruction).
    Simd128,
}

impl Isa {
    /// Every ISA, slowest first within each architecture.
    pub const ALL: [Isa; 5] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon, Isa::Simd128];

    /// The name `HEARTH_CPU_ISA` takes (`scalar`, `avx2`, `avx512`, `neon`, `simd128`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
            Isa::Simd128 => "simd128",
        }
    }

    /// The ISA called `name` (case-insensitive), `None` for an unknown name.
    pub fn parse(name: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether this CPU runs the ISA's kernels (checked at run time).
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            x86::available(self)
        }
        #[cfg(target_arch = "aarch64")]
        {
            arm::available(self)
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        {
            wasm::available(self)
        }
        #[cfg(not(any(
            target_arch = "x86_64",
            target_arch = "aarch64",
            all(target_arch = "wasm32", target_feature = "simd128")
        )))]
        {
            self == Isa::Scalar
        }
    }

    /// The fastest ISA this CPU runs.
    pub fn best() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.available())
            .unwrap_or(Isa::Scalar)
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The kernels of one weight type.
#[derive(Clone, Copy)]
pub struct WeightKernels {
    /// The type activations are quantized to before [`WeightKernels::vec_dot`].
    pub vec_dot_type: GgmlType,
    /// Weight row · activation row.
    pub vec_dot: DotFn,
    /// Weight row to f32 (embedding lookup, exact-f32 mode).
    pub dequantize_row: DequantizeFn,
    /// Several rows by several activation rows at once, `None` where the
    /// ISA has none (the matmul then calls [`WeightKernels::vec_dot`] per pair).
    pub gemm: Option<GemmFn>,
    /// Whether a one-token matmul runs [`WeightKernels::gemm`] (true) or
    /// [`WeightKernels::vec_dot`] per row (false: the per-row dot was
    /// measured faster for this format). With `false`, a token alone and the
    /// same token in a batch agree within f32 rounding, not bit for bit.
    pub gemm_one_token: bool,
    /// How [`WeightKernels::gemm`] wants the weight's whole groups of rows
    /// stored ([`Layout`]); rows past the last whole group stay plain.
    pub layout: Layout,
    /// A lossless re-encoding the weight is stored in instead, whose
    /// kernels run faster here ([`Widen`]); the other fields are then not
    /// used for it.
    pub widen: Option<Widen>,
    /// Whether [`WeightKernels::gemm`] gives the per-row dot's results for
    /// finite block scales only: it converts the f16 scales without the
    /// infinity / NaN case (SIMD128: fewer instructions in a tile bound by
    /// its arithmetic), or scales partial integer lanes apart (x86's
    /// eight-lane tiles: zero times infinity). A weight with a non-finite
    /// scale ([`ScaleKinds`]) then dots pair by pair instead, so its
    /// results still equal the per-row dot's.
    pub gemm_finite_scales: bool,
    /// A faster [`WeightKernels::gemm`] for weights none of whose f16
    /// block scales is subnormal ([`ScaleKinds`]; SIMD128: the scales
    /// convert without the subnormal case), with the same results. The
    /// weight picks it at load.
    pub gemm_normal_scales: Option<GemmFn>,
}

/// What kinds of values the f16 block scales of a weight hold (`d`, and
/// `m` / `dmin` for Q4_1, Q5_1, Q4_K and Q5_K): what
/// [`WeightKernels::gemm_finite_scales`] and
/// [`WeightKernels::gemm_normal_scales`] ask about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScaleKinds {
    /// Some scale is infinite or NaN.
    pub non_finite: bool,
    /// Some scale is subnormal (zero is not).
    pub subnormal: bool,
}

impl ScaleKinds {
    /// The kinds of the scales of the blocks of `ty` in `blocks`; types
    /// without f16 block scales have neither kind.
    pub fn of(ty: GgmlType, blocks: &[u8]) -> Self {
        use GgmlType as T;
        // (scales, their byte offset in the block)
        let (halves, at) = match ty {
            T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => (1, 0),
            T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => (2, 0),
            T::Q6_K => (1, std::mem::offset_of!(BlockQ6K, d)),
            _ => return Self::default(),
        };
        let mut kinds = Self::default();
        for b in blocks.chunks_exact(ty.block_bytes()) {
            for h in b[at..].chunks_exact(2).take(halves) {
                let h = u16::from_le_bytes([h[0], h[1]]);
                kinds.non_finite |= h & 0x7C00 == 0x7C00;
                kinds.subnormal |= h & 0x7C00 == 0 && h & 0x03FF != 0;
            }
        }
        kinds
    }
}

impl WeightKernels {
    /// Whether [`WeightKernels::for_scales`] needs the weight's
    /// [`ScaleKinds`] (a pass over its blocks at load).
    pub fn asks_scale_kinds(&self) -> bool {
        self.gemm.is_some() && (self.gemm_finite_scales || self.gemm_normal_scales.is_some())
    }

    /// These kernels for a weight whose scales are of `kinds`: no tiles
    /// (and the plain layout) where they would meet a non-finite scale
    /// they do not take, the [`WeightKernels::gemm_normal_scales`] tiles
    /// where no scale is subnormal.
    pub fn for_scales(mut self, kinds: ScaleKinds) -> Self {
        if self.gemm_finite_scales && kinds.non_finite {
            // The tiles skip the conversion's infinity / NaN case; such a
            // weight dots pair by pair, as the scalar kernels do.
            self.gemm = None;
            self.layout = Layout::Plain;
        } else if !kinds.subnormal && self.gemm.is_some() {
            self.gemm = self.gemm_normal_scales.or(self.gemm);
        }
        self
    }
}

/// A weight type stored as another that holds the same values exactly
/// (more bytes, cheaper to decode), and the conversions both ways between
/// rows of whole blocks.
#[derive(Clone, Copy, Debug)]
pub struct Widen {
    /// The type the weight is stored as.
    pub to: GgmlType,
    /// Blocks of the GGUF type to blocks of `to` (as many as both hold).
    pub encode: fn(from: &[u8], to: &mut [u8]),
    /// Blocks of `to` back to the GGUF type.
    pub decode: fn(from: &[u8], to: &mut [u8]),
}

/// Rows per group of the AVX-512 kernels' [`Layout::Bands`] (one
/// 512-bit register holds a 4-byte word of each).
pub const BAND_ROWS: usize = 16;

/// How the whole groups of a weight's rows are stored, for the tiles that
/// read them ([`WeightKernels::layout`]). Every layout keeps a group's
/// bytes in the group's place, so ranges of whole groups slice as plain
/// rows do; rows past the last whole group stay plain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// The GGUF rows, one after another.
    Plain,
    /// Groups of `rows` rows transposed block by block
    /// ([`Layout::apply`]): per block index, the group's first f16 scales
    /// (`rows` x 2 bytes), their second ones where the blocks have
    /// `halves = 2` (`m`, `dmin`), then each 4-byte word of the rest of
    /// the block (quants, packed sub-block scales), the rows side by side.
    /// One register is then one word of every row of the group (AVX-512:
    /// 16 rows in a zmm, [`BAND_ROWS`]; SIMD128: 4 rows in a v128), its
    /// partial sums land in lanes, one per row, and the scales convert in
    /// one go: the one-token kernels assemble nothing.
    Bands {
        /// Rows per group (a power of two).
        rows: usize,
        /// The f16 scales of each block (1 or 2).
        halves: usize,
        /// Their byte offset in the block (0 but for Q6_K's `d`, last; a
        /// multiple of 4).
        at: usize,
    },
}

impl Layout {
    /// Rows per group (1 for [`Layout::Plain`]).
    pub fn group_rows(self) -> usize {
        match self {
            Layout::Plain => 1,
            Layout::Bands { rows, .. } => rows,
        }
    }

    /// Whether the layout applies to rows of `row_bytes` made of blocks of
    /// `block_bytes` (else the rows stay plain).
    fn fits(self, row_bytes: usize, block_bytes: usize) -> bool {
        let whole_blocks =
            block_bytes > 0 && row_bytes > 0 && row_bytes.is_multiple_of(block_bytes);
        match self {
            Layout::Plain => false,
            Layout::Bands { rows, halves, at } => {
                whole_blocks
                    && rows.is_power_of_two()
                    && at.is_multiple_of(4)
                    && block_bytes >= at + 2 * halves
                    && block_bytes > 2 * halves
                    && (block_bytes - 2 * halves).is_multiple_of(4)
            }
        }
    }

    /// Stores the whole groups of `bytes` (rows of `row_bytes`, blocks of
    /// `block_bytes`) in this layout; nothing changes where it does not
    /// fit the sizes.
    pub fn apply(self, bytes: &mut [u8], row_bytes: usize, block_bytes: usize) {
        match self {
            Layout::Plain => {}
            Layout::Bands { rows, halves, at } => {
                if self.fits(row_bytes, block_bytes) {
                    band_rows(bytes, rows, row_bytes, block_bytes, halves, at);
                }
            }
        }
    }

    /// Row `r` of `bytes` stored in this layout (`rows` rows in all, of
    /// `row_bytes`, blocks of `block_bytes`), in the plain layout: borrowed
    /// past the last whole group, gathered inside one. Empty when `r` is
    /// out of range.
    pub fn plain_row(
        self,
        bytes: &[u8],
        rows: usize,
        row_bytes: usize,
        block_bytes: usize,
        r: usize,
    ) -> Cow<'_, [u8]> {
        let g = self.group_rows();
        let whole = rows / g * g;
        if r >= whole || !self.fits(row_bytes, block_bytes) {
            return Cow::Borrowed(bytes.get(r * row_bytes..(r + 1) * row_bytes).unwrap_or(&[]));
        }
        let Layout::Bands { rows, halves, at } = self else {
            return Cow::Borrowed(&bytes[r * row_bytes..(r + 1) * row_bytes]);
        };
        let group = &bytes[r / g * g * row_bytes..][..g * row_bytes];
        let mut out = vec![0u8; row_bytes];
        for (block, packed) in out
            .chunks_exact_mut(block_bytes)
            .zip(group.chunks_exact(rows * block_bytes))
        {
            for (from, to, len) in band_pieces(rows, block_bytes, halves, at, r % g) {
                block[from..from + len].copy_from_slice(&packed[to..to + len]);
            }
        }
        Cow::Owned(out)
    }
}

/// Where the pieces of row `r`'s block go in the block step of a
/// [`Layout::Bands`] group of `rows` rows: `(offset in the block, offset in
/// the step, length)`, the `halves` f16 scales (at byte `at` of the block)
/// first, then the words of the other bytes in their order.
fn band_pieces(
    rows: usize,
    block_bytes: usize,
    halves: usize,
    at: usize,
    r: usize,
) -> impl Iterator<Item = (usize, usize, usize)> {
    let head = 2 * halves;
    let scales = (0..halves).map(move |f| (at + 2 * f, 2 * rows * f + 2 * r, 2));
    let words = (0..(block_bytes - head) / 4).map(move |k| {
        let from = if 4 * k < at { 4 * k } else { 4 * k + head };
        (from, 2 * rows * halves + 4 * rows * k + 4 * r, 4)
    });
    scales.chain(words)
}

/// Rearranges each whole group of `rows` rows of `bytes` into
/// [`Layout::Bands`] (`halves` f16 scales at the head of each block of
/// `block_bytes`, the rest 4-byte words); rows past the last whole group
/// stay as they are. The caller checks that the sizes fit.
fn band_rows(
    bytes: &mut [u8],
    rows: usize,
    row_bytes: usize,
    block_bytes: usize,
    halves: usize,
    at: usize,
) {
    let mut plain = vec![0u8; rows * row_bytes];
    let pieces: Vec<Vec<(usize, usize, usize)>> = (0..rows)
        .map(|r| band_pieces(rows, block_bytes, halves, at, r).collect())
        .collect();
    for g in bytes.chunks_exact_mut(rows * row_bytes) {
        plain.copy_from_slice(g);
        for (r, row) in plain.chunks_exact(row_bytes).enumerate() {
            for (block, step) in row
                .chunks_exact(block_bytes)
                .zip(g.chunks_exact_mut(rows * block_bytes))
            {
                for &(from, to, len) in &pieces[r] {
                    step[to..to + len].copy_from_slice(&block[from..from + len]);
                }
            }
        }
    }
}

impl std::fmt::Debug for WeightKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightKernels(vec_dot_type = {})", self.vec_dot_type)
    }
}

/// Function pointers for every kernel, chosen once.
#[derive(Debug, Clone)]
pub struct KernelTable {
    isa: Isa,
}

/// `bytes` as blocks: borrowed when aligned, else copied (callers keep rows
/// aligned, so the copy is a fallback that never changes results).
#[inline]
pub(crate) fn blocks<B: Pod>(bytes: &[u8]) -> Cow<'_, [B]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(b) => Cow::Borrowed(b),
        Err(_) => Cow::Owned(cast_blocks(bytes).unwrap_or_default()),
    }
}

#[inline]
pub(crate) fn dot<W: Pod, A: Pod>(w: &[u8], a: &[u8], f: fn(&[W], &[A]) -> f32) -> f32 {
    f(&blocks::<W>(w), &blocks::<A>(a))
}

#[inline]
fn deq<W: Pod>(w: &[u8], out: &mut [f32], f: fn(&[W], &mut [f32])) {
    f(&blocks::<W>(w), out)
}

#[inline]
pub(crate) fn quant<A: Pod>(x: &[f32], out: &mut [u8], f: fn(&[f32], &mut [A])) {
    match bytemuck::try_cast_slice_mut::<u8, A>(out) {
        Ok(y) => f(x, y),
        Err(_) => {
            let mut y = vec![A::zeroed(); out.len() / std::mem::size_of::<A>()];
            f(x, &mut y);
            out.copy_from_slice(bytemuck::cast_slice(&y));
        }
    }
}

fn dequantize_row_f32(x: &[f32], y: &mut [f32]) {
    y.copy_from_slice(x);
}

fn quantize_row_f32(x: &[f32], y: &mut [f32]) {
    y.copy_from_slice(x);
}

/// The scalar kernels of weight type `ty`, or `None` when it has none
/// (float and 32-element formats here, the rest in [`scalar_kquant_kernels`]).
fn scalar_weight_kernels(ty: GgmlType) -> Option<WeightKernels> {
    use GgmlType as T;
    let (vec_dot_type, vec_dot, dequantize_row): (GgmlType, DotFn, DequantizeFn) = match ty {
        T::F32 => (
            T::F32,
            |w, a| dot(w, a, float::vec_dot_f32),
            |w, o| deq(w, o, dequantize_row_f32),
        ),
        T::F16 => (
            T::F16,
            |w, a| dot::<f16, f16>(w, a, float::vec_dot_f16),
            |w, o| deq::<f16>(w, o, float::dequantize_row_f16),
        ),
        T::BF16 => (
            T::BF16,
            |w, a| dot::<bf16, bf16>(w, a, float::vec_dot_bf16),
            |w, o| deq::<bf16>(w, o, float::dequantize_row_bf16),
        ),
        T::Q4_0 => (
            T::Q8_0,
            |w, a| dot::<BlockQ4_0, BlockQ8_0>(w, a, legacy::vec_dot_q4_0_q8_0),
            |w, o| deq::<BlockQ4_0>(w, o, legacy::dequantize_row_q4_0),
        ),
        T::Q4_1 => (
            T::Q8_1,
            |w, a| dot::<BlockQ4_1, BlockQ8_1>(w, a, legacy::vec_dot_q4_1_q8_1),
            |w, o| deq::<BlockQ4_1>(w, o, legacy::dequantize_row_q4_1),
        ),
        T::Q5_0 => (
            T::Q8_0,
            |w, a| dot::<BlockQ5_0, BlockQ8_0>(w, a, legacy::vec_dot_q5_0_q8_0),
            |w, o| deq::<BlockQ5_0>(w, o, legacy::dequantize_row_q5_0),
        ),
        T::Q5_1 => (
            T::Q8_1,
            |w, a| dot::<BlockQ5_1, BlockQ8_1>(w, a, legacy::vec_dot_q5_1_q8_1),
            |w, o| deq::<BlockQ5_1>(w, o, legacy::dequantize_row_q5_1),
        ),
        T::Q8_0 => (
            T::Q8_0,
            |w, a| dot::<BlockQ8_0, BlockQ8_0>(w, a, legacy::vec_dot_q8_0_q8_0),
            |w, o| deq::<BlockQ8_0>(w, o, legacy::dequantize_row_q8_0),
        ),
        T::IQ4_NL => (
            T::Q8_0,
            |w, a| dot::<BlockIQ4NL, BlockQ8_0>(w, a, iq4::vec_dot_iq4_nl_q8_0),
            |w, o| deq::<BlockIQ4NL>(w, o, iq4::dequantize_row_iq4_nl),
        ),
        _ => return scalar_kquant_kernels(ty),
    };
    Some(WeightKernels {
        vec_dot_type,
        vec_dot,
        dequantize_row,
        gemm: None,
        gemm_one_token: false,
        layout: Layout::Plain,
        widen: None,
        gemm_finite_scales: false,
        gemm_normal_scales: None,
    })
}

/// The scalar kernels of the 256-element formats (k-quants, IQ4_XS).
fn scalar_kquant_kernels(ty: GgmlType) -> Option<WeightKernels> {
    use GgmlType as T;
    let (vec_dot_type, vec_dot, dequantize_row): (GgmlType, DotFn, DequantizeFn) = match ty {
        T::Q2_K => (
            T::Q8_K,
            |w, a| dot::<BlockQ2K, BlockQ8K>(w, a, kquants::vec_dot_q2_k_q8_k),
            |w, o| deq::<BlockQ2K>(w, o, kquants::dequantize_row_q2_k),
        ),
        T::Q3_K => (
            T::Q8_K,
            |w, a| dot::<BlockQ3K, BlockQ8K>(w, a, kquants::vec_dot_q3_k_q8_k),
            |w, o| deq::<BlockQ3K>(w, o, kquants::dequantize_row_q3_k),
        ),
        T::Q4_K => (
            T::Q8_K,
            |w, a| dot::<BlockQ4K, BlockQ8K>(w, a, kquants::vec_dot_q4_k_q8_k),
            |w, o| deq::<BlockQ4K>(w, o, kquants::dequantize_row_q4_k),
        ),
        T::Q5_K => (
            T::Q8_K,
            |w, a| dot::<BlockQ5K, BlockQ8K>(w, a, kquants::vec_dot_q5_k_q8_k),
            |w, o| deq::<BlockQ5K>(w, o, kquants::dequantize_row_q5_k),
        ),
        T::Q6_K => (
            T::Q8_K,
            |w, a| dot::<BlockQ6K, BlockQ8K>(w, a, kquants::vec_dot_q6_k_q8_k),
            |w, o| deq::<BlockQ6K>(w, o, kquants::dequantize_row_q6_k),
        ),
        T::IQ4_XS => (
            T::Q8_K,
            |w, a| dot::<BlockIQ4XS, BlockQ8K>(w, a, iq4::vec_dot_iq4_xs_q8_k),
            |w, o| deq::<BlockIQ4XS>(w, o, iq4::dequantize_row_iq4_xs),
        ),
        _ => return None,
    };
    Some(WeightKernels {
        vec_dot_type,
        vec_dot,
        dequantize_row,
        gemm: None,
        gemm_one_token: false,
        layout: Layout::Plain,
        widen: None,
        gemm_finite_scales: false,
        gemm_normal_scales: None,
    })
}

/// The scalar quantizer to activation type `ty`.
fn scalar_quantizer(ty: GgmlType) -> Option<QuantizeFn> {
    use GgmlType as T;
    let f: QuantizeFn = match ty {
        T::F32 => |x, o| quant(x, o, quantize_row_f32),
        T::F16 => |x, o| quant::<f16>(x, o, float::quantize_row_f16),
        T::BF16 => |x, o| quant::<bf16>(x, o, float::quantize_row_bf16),
        T::Q8_0 => |x, o| quant::<BlockQ8_0>(x, o, legacy::quantize_row_q8_0),
        T::Q8_1 => |x, o| quant::<BlockQ8_1>(x, o, legacy::quantize_row_q8_1),
        T::Q8_K => |x, o| quant::<BlockQ8K>(x, o, kquants::quantize_row_q8_k),
        _ => return None,
    };
    Some(f)
}

impl KernelTable {
    /// The table for this machine: the fastest ISA the CPU has.
    pub fn detect() -> Self {
        Self { isa: Isa::best() }
    }

    /// The table of `isa` where this CPU has it, else [`KernelTable::detect`]'s.
    pub fn for_isa_or_best(isa: Option<Isa>) -> Self {
        isa.and_then(Self::with_isa).unwrap_or_else(Self::detect)
    }

    /// The table for an ISA request (the value of `HEARTH_CPU_ISA`, `None`
    /// or empty for "the fastest available"), with the warning to show when
    /// the request cannot be honoured and the fastest ISA is used instead.
    pub fn for_request(request: Option<&str>) -> (Self, Option<String>) {
        let best = Self { isa: Isa::best() };
        let Some(name) = request.filter(|r| !r.trim().is_empty()) else {
            return (best, None);
        };
        match Isa::parse(name) {
            Some(isa) if isa.available() => (Self { isa }, None),
            Some(isa) => {
                let w = format!(
                    "HEARTH_CPU_ISA={name}: this CPU lacks {isa}; using {}",
                    best.isa
                );
                (best, Some(w))
            }
            None => {
                let w = format!(
                    "HEARTH_CPU_ISA={name} is not one of {}; using {}",
                    Isa::ALL.map(Isa::name).join(", "),
                    best.isa
                );
                (best, Some(w))
            }
        }
    }

    /// The table of `isa`, `None` when this CPU lacks it.
    pub fn with_isa(isa: Isa) -> Option<Self> {
        isa.available().then_some(Self { isa })
    }

    /// The scalar table (every target).
    pub fn scalar() -> Self {
        Self { isa: Isa::Scalar }
    }

    /// The ISA the table runs.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Whether the backend runs weights of type `ty`: whether
    /// [`KernelTable::weight`] has kernels for it (every ISA runs the types
    /// the scalar kernels do), without choosing them. The graph checks
    /// this for every op of every step.
    pub fn supports(&self, ty: GgmlType) -> bool {
        scalar_weight_kernels(ty).is_some()
    }

    /// The kernels for weights of type `ty`, `None` when the backend cannot
    /// run it ([`KernelTable::supports`]).
    pub fn weight(&self, ty: GgmlType) -> Option<WeightKernels> {
        #[allow(unused_mut)] // only the SIMD architectures replace slots
        let mut k = scalar_weight_kernels(ty)?;
        // The table only holds an ISA that `Isa::available` confirmed.
        #[cfg(target_arch = "x86_64")]
        if let Some(vec_dot) = x86::vec_dot(self.isa, ty) {
            k.vec_dot = vec_dot;
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(vec_dot) = arm::vec_dot(self.isa, ty) {
            k.vec_dot = vec_dot;
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        if let Some(vec_dot) = wasm::vec_dot(self.isa, ty) {
            k.vec_dot = vec_dot;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(gemm) = x86::gemm(self.isa, ty) {
            k.gemm = Some(gemm);
            k.gemm_one_token = x86::gemm_one_token(self.isa, ty);
            k.gemm_finite_scales = x86::gemm_finite_scales(self.isa, ty);
            k.layout = x86::layout(self.isa, ty);
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        if let Some(gemm) = wasm::gemm(self.isa, ty) {
            k.gemm = Some(gemm);
            k.gemm_one_token = true;
            k.layout = wasm::layout(self.isa, ty);
            k.gemm_finite_scales = true;
            k.gemm_normal_scales = wasm::gemm_normal_scales(self.isa, ty);
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        {
            k.widen = wasm::widen(self.isa, ty);
        }
        Some(k)
    }

    /// The quantizer of activations to `ty` (a `vec_dot_type`).
    pub fn quantizer(&self, ty: GgmlType) -> Option<QuantizeFn> {
        // As in `weight`: the ISA was confirmed available.
        #[cfg(target_arch = "x86_64")]
        if let Some(q) = x86::quantizer(self.isa, ty) {
            return Some(q);
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(q) = arm::quantizer(self.isa, ty) {
            return Some(q);
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        if let Some(q) = wasm::quantizer(self.isa, ty) {
            return Some(q);
        }
        scalar_quantizer(ty)
    }
}
