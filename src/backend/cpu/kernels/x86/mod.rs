//! x86-64 kernels, chosen at run time.
//!
//! Each ISA file defines kernels under the scalar names
//! (`vec_dot_q4_0_q8_0`, ...) as `unsafe` `#[target_feature]` functions and
//! a `vec_dot(ty)` that wraps them as table entries. Those entries are only
//! reachable through [`vec_dot`] here, which the kernel table calls only for
//! an [`Isa`] whose features it has detected: that is the safety argument of
//! every `unsafe` call in the entries.
//!
//! Agreement with the scalar kernels: the integer sum of each block (or
//! sub-block) is computed exactly and then scaled and summed in the same
//! float order as the scalar kernel, so the 32-element formats, Q2_K and
//! IQ4_XS give bit-identical results. Q3_K, Q4_K, Q5_K and Q6_K sum each block's
//! integer parts exactly but scale them once per block (the scalar kernel
//! scales eight partial lanes), so they differ by f32 rounding only: within
//! `1e-6 * sum |w * a|` (a few ulps of the magnitude; tested).
//!
//! Precondition shared with ggml's x86 code: int8 activations lie in
//! -127..=127 (what every activation quantizer produces); -128 multiplies
//! wrongly in the sign trick of `maddubs`.

mod avx2;
mod avx512;
mod band_decode;
mod decode512;
mod gemm;
mod gemm16;
mod gemm16_legacy;
mod gemm8;
mod gemm8_k;
mod gemm_float;
mod gemm_k;

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use bytemuck::{Pod, Zeroable};

use super::{DotFn, GemmFn, Isa, Layout, QuantizeFn};
use crate::quant::GgmlType;

/// The micro-architectures whose kernels are tuned apart from the rest
/// (where a measured setting differs from the one measured elsewhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CpuModel {
    /// AMD Zen 5 (family 1Ah).
    Zen5,
    /// Any other x86-64 CPU: the settings measured on Intel Ice Lake.
    Other,
}

/// This CPU's [`CpuModel`], from `cpuid`'s vendor and family (read once:
/// in a virtual machine each `cpuid` traps to the hypervisor).
pub(super) fn cpu_model() -> CpuModel {
    static MODEL: std::sync::OnceLock<CpuModel> = std::sync::OnceLock::new();
    *MODEL.get_or_init(read_cpu_model)
}

/// [`cpu_model`], read.
fn read_cpu_model() -> CpuModel {
    use std::arch::x86_64::__cpuid;
    let leaf0 = __cpuid(0);
    let word = |s: &[u8; 4]| u32::from_le_bytes(*s);
    let amd = [leaf0.ebx, leaf0.edx, leaf0.ecx] == [word(b"Auth"), word(b"enti"), word(b"cAMD")];
    if !amd || leaf0.eax < 1 {
        return CpuModel::Other;
    }
    let eax = __cpuid(1).eax;
    let base = (eax >> 8) & 0xF;
    let family = if base == 0xF {
        base + ((eax >> 20) & 0xFF)
    } else {
        base
    };
    match family {
        0x1A => CpuModel::Zen5,
        _ => CpuModel::Other,
    }
}

/// The most groups of 16 rows the AVX-512 one-token passes
/// (`gemm16::run_bands`, `gemm16_legacy::run_bands`) read side by side:
/// each group is one stream through memory, and how many streams keep the
/// most reads in flight depends on the core's prefetchers.
/// - Intel Ice Lake (where the kernels were first tuned), 2048x8192
///   weights from DRAM, four groups against one or two: the 32-element
///   formats 10-11 -> 12-14 GB/s at one thread, 17-19 -> 22-25 at two;
///   Q4_K 13.8 -> 15.0-15.2 at one thread, Q6_K and IQ4_XS alike.
/// - AMD Zen 5: one, for every format, once each stream prefetches far
///   enough ahead ([`bands_ahead`]). Whole models decoding, alternating
///   with the build that read four groups (`hearth bench -p 0 -n 64 -r 3`,
///   three rounds; 1B: `hearth synth --shape llama-3.2-1b`), tokens/s at
///   one thread / two:
///   - the 32-element formats: SmolLM2 (Q4_1) 320-327 against 255-268 /
///     397-439 against 373-381; Gemma-3 (Q5_0, Q8_0 and Q4_K, Q6_K)
///     131-136 against 102-107 / 204-217 against 177-181; 1B Q4_0
///     40.9-42.0 against 37.0-37.9 / 53-54 against 47-48; 1B Q8_0
///     27.7-28.1 against 24.7-25.4 / 36-39 against 34-35;
///   - IQ4_XS (its Q6_K embedding at two): 42.5-43.7 against 37.8-38.1 /
///     66-78 against 51-61;
///   - Q4_K and Q6_K, against the build that read four and two groups of
///     them (Q6_K 3072 bytes ahead, `decode512::q6k_ahead`): 1B Q4_K_M
///     34.8-35.0 -> 44.9-45.1 / 62.8-75.2 -> 66.5-80.1; 1B Q6_K
///     28.3-28.8 -> 32.8-33.0 / 52.3-53.1 -> 58.5-60.5; 1B IQ4_XS
///     46.6-46.9 -> 50.3-50.7 / 81.1-83.1 -> 89.1-90.2; Gemma-3
///     146.7-148.0 -> 151.7-154.7 / alike. Of the 1B Q4_K_M's 29%, its
///     Q4_K tensors at one group give 21% and its Q6_K ones 5%. (While
///     each of four streams prefetched 2048 bytes ahead, Q4_K at two
///     groups had read 2-5% slower than at four, and one group was faster
///     only with several threads.)
///
/// Other CPUs keep Ice Lake's four.
pub(super) fn one_token_groups() -> usize {
    match cpu_model() {
        CpuModel::Zen5 => 1,
        CpuModel::Other => 4,
    }
}

/// How far ahead of its reads each of the `groups` streams of a one-token
/// pass prefetches (`gemm16_legacy::one_token_bands`, and `decode512.rs`'s
/// Q4_K and IQ4_XS kernels; its Q6_K kernel with a floor,
/// `decode512::q6k_ahead`): [`PASS_AHEAD`] bytes over them all.
const fn bands_ahead(groups: usize) -> usize {
    PASS_AHEAD / groups
}

/// Bytes a one-token pass prefetches ahead of its reads, over all its
/// streams ([`bands_ahead`]). On Intel Ice Lake, four streams, the
/// hardware prefetchers alone left decode from DRAM at 8-9 GB/s of one
/// core's ~15, prefetching the next pass's rows (as
/// `gemm16_legacy::one_token` does) 9-11, 2048 bytes ahead of each stream
/// 12-14 (2048x8192 Q4_0 / Q8_0; 1024 to 8192 bytes alike within the
/// noise). AMD Zen 5 reads more than twice as fast and its passes read one
/// stream ([`one_token_groups`]), where 2048 bytes came too late: one
/// thread, 2048x8192 from DRAM, 2048 -> 8192 bytes ahead, GB/s, two
/// rounds: Q4_0 37.6-38.5 -> 40.1-40.4, Q4_1 37.8-38.2 -> 41.8-43.7,
/// IQ4_XS 37.5-37.8 -> 43.2-43.3, Q8_0 40.5-41.1 -> 40.6-43.2, Q4_K (four
/// streams, 2048 each either way) alike; 16384 read slower than 8192.
/// Whole models, alternating with the build that read 2048 bytes ahead
/// of each stream, three rounds, one thread / two, tokens/s: SmolLM2
/// 341-358 -> 381-419 / 455-481 -> 559-571; Gemma-3 144-148 -> 155-158 /
/// 182-194 -> 194-196; 1B Q4_0 43.6-44.0 -> 45.5-46.6 / alike; IQ4_XS
/// 43.9-44.4 -> 47.4-47.6 / alike; Q4_K_M and Q6_K alike or 1-3% faster;
/// Q8_0 29.9-30.9 -> 29.5-30.2 / 38.6-39.0 -> 37.7-38.1. Once Q4_K and
/// Q6_K read one stream too, 2048x8192 from DRAM at one thread, GB/s,
/// two rounds, 8192 / 12288 / 16384 bytes ahead: Q4_K 40.3-40.7 /
/// 38.6-39.2 / 36.9-38.0 (four streams of 2048 bytes: 29.4-30.5), Q6_K
/// 35.5-36.0 / 33.4-34.4 / 32.4-33.1, the other formats likewise slower
/// beyond 8192.
const PASS_AHEAD: usize = 8192;

/// A one-token pass of the AVX-512 kernels over whole rows of a weight
/// (`gemm16::run_bands`, `gemm16_legacy::run_bands` at some width).
#[cfg(test)]
type PassFn = unsafe fn(&[u8], usize, &[u8], usize, super::Out<'_>);

/// Asserts that each of `passes` (`(groups per pass, pass)`) gives the
/// first one's results bit for bit, and that those are finite: 91 rows of
/// 3 random blocks of `ty` (seeded by `seed`; the f16 scales at the byte
/// offsets `f16_at` of each block kept finite and small), laid out as
/// [`layout`] says, by the one activation row `acts` makes from the same
/// generator (3 blocks). Prints a reason and checks nothing where the CPU
/// lacks AVX-512 VNNI.
#[cfg(test)]
pub(super) fn assert_passes_agree(
    ty: GgmlType,
    f16_at: &[usize],
    seed: u64,
    acts: impl FnOnce(&mut crate::quant::reference::testutil::Rng, usize) -> Vec<u8>,
    passes: &[(usize, PassFn)],
) {
    if !available(Isa::Avx512) {
        eprintln!("skipped: this CPU lacks AVX-512 VNNI");
        return;
    }
    let (bb, nb, rows) = (ty.block_bytes(), 3, 91);
    let mut rng = crate::quant::reference::testutil::Rng::new(seed);
    let mut w: Vec<u8> = (0..rows * nb * bb).map(|_| rng.next_u32() as u8).collect();
    for block in w.chunks_exact_mut(bb) {
        for &at in f16_at {
            // Finite and small: exponent well below all ones.
            block[at + 1] &= 0x3B;
        }
    }
    layout(Isa::Avx512, ty).apply(&mut w, nb * bb, bb);
    let a = acts(&mut rng, nb);
    let run = |f: PassFn| {
        let mut out = vec![f32::NAN; rows];
        let o = super::Out {
            out: &mut out,
            row_stride: 1,
            tok_stride: rows,
        };
        // SAFETY: AVX-512 VNNI is available (checked above); `w` is `rows`
        // rows laid out as the passes read them.
        unsafe { f(&w, nb * bb, &a, a.len(), o) };
        out
    };
    let Some(&(g0, first)) = passes.first() else {
        return;
    };
    let want = run(first);
    assert!(
        want.iter().all(|x| x.is_finite()),
        "{ty} seed {seed}: {want:?}"
    );
    for &(g, pass) in &passes[1..] {
        let got = run(pass);
        for (r, (x, y)) in want.iter().zip(&got).enumerate() {
            assert_eq!(
                x.to_bits(),
                y.to_bits(),
                "{ty} seed {seed} row {r}: {x} by {g0} groups per pass, {y} by {g}"
            );
        }
    }
}

/// One cache line of words.
#[repr(C, align(64))]
#[derive(Clone, Copy, Zeroable, Pod)]
struct Line([u32; 16]);

/// A run of 4-byte values (`u32`, `i32`, `f32`) that starts a cache line:
/// the tiles' scratch (packed activations, their sums and scales), which
/// they load 32 or 64 bytes at a time. In a plain `Vec` the start was
/// wherever the allocator put it (4- or 16-byte aligned), every such load
/// then straddled two lines, and the speed of a prompt depended on the
/// heap: the 1B Q4_K_M prompt at one thread ran 126-128 tokens/s with
/// the packed activations 4, 16 or 32 bytes past a line, 150-152 on one
/// (`hearth bench -p 512 -n 0 -t 1`), and which of the two a run got
/// changed with unrelated allocations (what looked like a cost of the
/// fused row ops).
pub(super) struct Lines<T> {
    lines: Vec<Line>,
    len: usize,
    of: PhantomData<T>,
}

impl<T> Default for Lines<T> {
    fn default() -> Self {
        Lines {
            lines: Vec::new(),
            len: 0,
            of: PhantomData,
        }
    }
}

impl<T: Pod> Lines<T> {
    /// Makes these `n` zero values.
    pub(super) fn zeroed(&mut self, n: usize) {
        self.lines.clear();
        self.lines.resize(
            (n * size_of::<T>()).div_ceil(size_of::<Line>()),
            Line([0; 16]),
        );
        self.len = n;
    }
}

impl<T: Pod> Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl<T: Pod> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

/// Whether this CPU runs `isa`'s kernels.
pub(super) fn available(isa: Isa) -> bool {
    match isa {
        Isa::Scalar => true,
        Isa::Avx2 => {
            is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        }
        Isa::Avx512 => {
            available(Isa::Avx2)
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
        }
        Isa::Neon | Isa::Simd128 => false,
    }
}

/// The fast dot of weight type `ty` under `isa`, `None` where the scalar one
/// stays. Callers must have checked [`available`]`(isa)`.
pub(super) fn vec_dot(isa: Isa, ty: GgmlType) -> Option<DotFn> {
    match isa {
        Isa::Avx2 => avx2::vec_dot(ty).or_else(|| gemm_float::avx2::vec_dot(ty)),
        Isa::Avx512 => avx512::vec_dot(ty)
            .or_else(|| avx2::vec_dot(ty))
            .or_else(|| gemm_float::avx512::vec_dot(ty)),
        _ => None,
    }
}

/// The fast activation quantizer to `ty` under `isa`, `None` where the
/// scalar one stays. Callers must have checked [`available`]`(isa)`.
pub(super) fn quantizer(isa: Isa, ty: GgmlType) -> Option<QuantizeFn> {
    match isa {
        Isa::Avx2 | Isa::Avx512 => avx2::quantizer(ty),
        _ => None,
    }
}

/// The tiled kernel (several rows by several activation rows) of weight
/// type `ty` under `isa`, `None` where the matmul dots pair by pair.
/// AVX-512 runs the 16-token kernels (`gemm16.rs`, `gemm16_legacy.rs`:
/// every format with a tile); `gemm.rs`'s VNNI tiles stay behind them.
/// AVX2 runs the 8-token kernels of `gemm8.rs` and `gemm8_k.rs` (every
/// format with a tile but Q5_1), `gemm.rs`'s tiles for Q5_1. The float formats run
/// `gemm_float.rs` on both.
/// Callers must have checked [`available`]`(isa)`.
pub(super) fn gemm(isa: Isa, ty: GgmlType) -> Option<GemmFn> {
    match isa {
        Isa::Avx2 => gemm8::gemm(ty)
            .or_else(|| gemm8_k::gemm(ty))
            .or_else(|| gemm::avx2::gemm(ty))
            .or_else(|| gemm_float::avx2::gemm(ty)),
        Isa::Avx512 => gemm16::gemm(ty)
            .or_else(|| gemm16_legacy::gemm(ty))
            .or_else(|| gemm::avx512::gemm(ty))
            .or_else(|| gemm_float::avx512::gemm(ty)),
        _ => None,
    }
}

/// How [`gemm()`]'s kernel of `ty` under `isa` wants the weight stored:
/// AVX-512's kernels of Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, Q4_K and Q6_K read groups of
/// 16 rows transposed block by block ([`Layout::Bands`]), the rest plain.
pub(super) fn layout(isa: Isa, ty: GgmlType) -> Layout {
    match isa {
        Isa::Avx512 if gemm16::gemm(ty).is_some() => gemm16::layout(ty),
        Isa::Avx512 => gemm16_legacy::layout(ty),
        _ => Layout::Plain,
    }
}

/// Whether the tile of `ty` under `isa` follows the per-row dot only for
/// finite block scales: `gemm.rs`'s tiles scale each block's eight integer
/// lanes apart, and an exact zero lane times an infinite scale is NaN
/// where the per-row dot, scaling the block's sum, is infinite. The
/// banded kernels scale each pair's exact sum, as the per-row dots do.
pub(super) fn gemm_finite_scales(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Avx2 => {
            gemm8::gemm(ty).is_none()
                && gemm8_k::gemm(ty).is_none()
                && gemm::avx2::gemm(ty).is_some()
        }
        Isa::Avx512 => {
            gemm16::gemm(ty).is_none()
                && gemm16_legacy::gemm(ty).is_none()
                && gemm::avx512::gemm(ty).is_some()
        }
        _ => false,
    }
}

/// Whether a one-token matmul of weight type `ty` under `isa` runs the tile
/// (see [`gemm`]) rather than the per-row dot: always where there is a tile.
///
/// The per-row dot sums in another order than the tiles, and the engine's guarantee that a request batched gives the tokens it gives alone
/// (`tests/engine_cpu.rs`) needs a token's results bit for bit independent
/// of the batch: that holds only while one token runs the batches' tiles.
pub(super) fn gemm_one_token(isa: Isa, ty: GgmlType) -> bool {
    match isa {
        Isa::Avx2 | Isa::Avx512 => gemm(isa, ty).is_some(),
        _ => false,
    }
}
