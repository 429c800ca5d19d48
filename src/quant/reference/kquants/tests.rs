//! Properties of the k-quant reference on seeded random data (the golden
//! comparison with llama.cpp is `tests/quant_kquants.rs`).
//!
//! Error bounds are ggml's (`tests/test-quantize-fns.cpp`): its metric
//! `sqrt(sum(diff^2)) / n` on its own data, and the same bounds rescaled to a
//! normalized RMSE (`rms(diff) / rms(x)`) for other data: ggml's bound times
//! `sqrt(4096) / 1.42` (its test size, and the RMS of its test signal).

use super::*;
use crate::quant::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use bytemuck::{Pod, Zeroable};

/// SplitMix64: a tiny seeded generator, so failures are reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Standard normal (Box-Muller).
    fn normal(&mut self) -> f32 {
        let u1 = (self.uniform() as f64).max(1e-12);
        let u2 = self.uniform() as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
    fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }
}

const SEEDS: [u64; 4] = [0x5eed_0001, 0x5eed_0002, 42, 20_261_129];
/// ggml's test size.
const N: usize = 4096;

/// A k-quant dot with Q8_K activations.
type DotFn<B> = fn(&[B], &[BlockQ8K]) -> f32;

/// One format under test: its quantizer, dequantizer, dot and ggml's bounds.
struct Format<B> {
    name: &'static str,
    quantize: fn(&[f32], &mut [B]),
    dequantize: fn(&[B], &mut [f32]),
    dot: Option<DotFn<B>>,
    /// `MAX_QUANTIZATION_TOTAL_ERROR*` for this type.
    max_total_error: f32,
    /// `MAX_DOT_PRODUCT_ERROR*` for this type.
    max_dot_error: f32,
}

fn q2() -> Format<BlockQ2K> {
    Format {
        name: "q2_k",
        quantize: quantize_row_q2_k,
        dequantize: dequantize_row_q2_k,
        dot: Some(vec_dot_q2_k_q8_k),
        max_total_error: 0.0075,
        max_dot_error: 0.04,
    }
}
fn q3() -> Format<BlockQ3K> {
    Format {
        name: "q3_k",
        quantize: quantize_row_q3_k,
        dequantize: dequantize_row_q3_k,
        dot: Some(vec_dot_q3_k_q8_k),
        max_total_error: 0.0040,
        max_dot_error: 0.02,
    }
}
fn q4() -> Format<BlockQ4K> {
    Format {
        name: "q4_k",
        quantize: quantize_row_q4_k,
        dequantize: dequantize_row_q4_k,
        dot: Some(vec_dot_q4_k_q8_k),
        max_total_error: 0.002,
        max_dot_error: 0.02,
    }
}
fn q5() -> Format<BlockQ5K> {
    Format {
        name: "q5_k",
        quantize: quantize_row_q5_k,
        dequantize: dequantize_row_q5_k,
        dot: Some(vec_dot_q5_k_q8_k),
        max_total_error: 0.002,
        max_dot_error: 0.02,
    }
}
fn q6() -> Format<BlockQ6K> {
    Format {
        name: "q6_k",
        quantize: quantize_row_q6_k,
        dequantize: dequantize_row_q6_k,
        dot: Some(vec_dot_q6_k_q8_k),
        max_total_error: 0.002,
        max_dot_error: 0.02,
    }
}
fn q8() -> Format<BlockQ8K> {
    Format {
        name: "q8_k",
        quantize: quantize_row_q8_k,
        dequantize: dequantize_row_q8_k,
        dot: None,
        max_total_error: 0.002,
        max_dot_error: 0.02,
    }
}

impl<B: Pod> Format<B> {
    fn quantize(&self, x: &[f32]) -> Vec<B> {
        let mut q = vec![B::zeroed(); x.len() / QK_K];
        (self.quantize)(x, &mut q);
        q
    }
    fn round_trip(&self, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0; x.len()];
        (self.dequantize)(&self.quantize(x), &mut y);
        y
    }
    /// ggml's bound rescaled to `rms(diff) / rms(x)` (see the module docs).
    fn max_nrmse(&self) -> f64 {
        f64::from(self.max_total_error) * (N as f64).sqrt() / 1.42
    }
}

/// ggml's `generate_data`: `0.1 + amplitude * cos(i + offset)`.
fn ggml_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

/// ggml's `array_rmse`: `sqrt(sum(diff^2)) / n`.
fn ggml_rmse(a: &[f32], b: &[f32]) -> f64 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    sum.sqrt() / a.len() as f64
}

fn nrmse(x: &[f32], y: &[f32]) -> f64 {
    let d: f64 = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2))
        .sum();
    let s: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
    (d / s).sqrt()
}

fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}

/// Seeded rows of `N` values with the shapes that stress the quantizers.
fn random_rows(seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let mut r = Rng(seed);
    let normal: Vec<f32> = (0..N).map(|_| r.normal()).collect();
    let uniform: Vec<f32> = (0..N).map(|_| 4.0 * r.uniform() - 2.0).collect();
    let mut outliers = normal.clone();
    for _ in 0..N / 64 {
        let i = (r.next_u64() % N as u64) as usize;
        outliers[i] *= 20.0;
    }
    let negative: Vec<f32> = (0..N).map(|_| -0.05 - r.uniform()).collect();
    let positive: Vec<f32> = (0..N).map(|_| 3.0 + r.normal().abs()).collect();
    let tiny: Vec<f32> = (0..N).map(|_| 1e-3 * r.normal()).collect();
    // Blocks of very different magnitudes in one row.
    let mixed: Vec<f32> = (0..N)
        .map(|i| r.normal() * 10f32.powi((i / QK_K) as i32 % 5 - 2))
        .collect();
    vec![
        ("normal", normal),
        ("uniform", uniform),
        ("outliers", outliers),
        ("all-negative", negative),
        ("all-positive", positive),
        ("tiny", tiny),
        ("mixed-magnitude", mixed),
    ]
}

/// ggml's bound on ggml's data; on the seeded rows, the rescaled bound per
/// row (1.5x for rows with 20x outliers, which ggml's smooth test signal does
/// not have) and 2x per block, so one broken block cannot hide in a row.
fn check_round_trip<B: Pod>(f: &Format<B>) {
    let x = ggml_data(0.0, N);
    let err = ggml_rmse(&x, &f.round_trip(&x));
    assert!(
        err < f64::from(f.max_total_error),
        "{}: ggml total error {err} >= {}",
        f.name,
        f.max_total_error
    );
    for seed in SEEDS {
        for (kind, x) in random_rows(seed) {
            let y = f.round_trip(&x);
            assert!(
                y.iter().all(|v| v.is_finite()),
                "{} {kind} seed {seed:#x}: non-finite output",
                f.name
            );
            let row_bound = f.max_nrmse() * if kind == "outliers" { 1.5 } else { 1.0 };
            let e = nrmse(&x, &y);
            assert!(
                e < row_bound,
                "{} {kind} seed {seed:#x}: normalized rmse {e:.4} >= {row_bound:.4}",
                f.name
            );
            for (b, (xb, yb)) in x.chunks(QK_K).zip(y.chunks(QK_K)).enumerate() {
                let e = nrmse(xb, yb);
                let bound = 2.0 * f.max_nrmse();
                assert!(
                    e < bound,
                    "{} {kind} seed {seed:#x} block {b}: normalized rmse {e:.4} >= {bound:.4}",
                    f.name
                );
            }
        }
    }
}

/// Q8_K rounds to nearest: every element is within half a step of its input.
#[test]
fn q8_k_error_is_at_most_half_a_step() {
    for seed in SEEDS {
        for (kind, x) in random_rows(seed) {
            let q = q8().quantize(&x);
            let y = q8().round_trip(&x);
            for (i, (&a, &b)) in x.iter().zip(&y).enumerate() {
                let step = q[i / QK_K].d.abs();
                // Half a step, plus the rounding of `iscale * x` and of `d * q`.
                let bound = 0.5 * step + 1e-6 * a.abs().max(step * 127.0);
                assert!(
                    (a - b).abs() <= bound,
                    "{kind} seed {seed:#x} [{i}]: {a} -> {b}, step {step}"
                );
            }
        }
    }
}

#[test]
fn round_trip_within_ggml_bounds() {
    check_round_trip(&q2());
    check_round_trip(&q3());
    check_round_trip(&q4());
    check_round_trip(&q5());
    check_round_trip(&q6());
    check_round_trip(&q8());
}

/// `vec_dot(quantize(w), quantize_q8_k(a))` against the exact dot of the
/// inputs (ggml's bound) and against the dot of the dequantized operands
/// (only float rounding may differ).
fn check_dot<B: Pod>(f: &Format<B>) {
    let Some(dot) = f.dot else { return };
    let mut cases = vec![(0u64, ggml_data(0.0, N), ggml_data(1.0, N))];
    for seed in SEEDS {
        let mut r = Rng(seed ^ 0xd07);
        let w = (0..N).map(|_| 4.0 * r.uniform() - 2.0).collect();
        let a = (0..N).map(|_| 4.0 * r.uniform() - 2.0).collect();
        cases.push((seed, w, a));
    }
    for (seed, w, a) in cases {
        let wq = f.quantize(&w);
        let aq = q8().quantize(&a);
        let got = dot(&wq, &aq);
        let err = (f64::from(got) - dot_f64(&w, &a)).abs() / N as f64;
        assert!(
            err < f64::from(f.max_dot_error),
            "{} seed {seed:#x}: dot error {err} >= {}",
            f.name,
            f.max_dot_error
        );

        let (mut wd, mut ad) = (vec![0.0; N], vec![0.0; N]);
        (f.dequantize)(&wq, &mut wd);
        dequantize_row_q8_k(&aq, &mut ad);
        let exact = dot_f64(&wd, &ad);
        let scale: f64 = wd
            .iter()
            .zip(&ad)
            .map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs())
            .sum();
        let diff = (f64::from(got) - exact).abs();
        assert!(
            diff <= 1e-5 * scale,
            "{} seed {seed:#x}: dot {got} vs dequantized {exact} (scale {scale})",
            f.name
        );
    }
}

#[test]
fn dots_within_ggml_bounds() {
    check_dot(&q2());
    check_dot(&q3());
    check_dot(&q4());
    check_dot(&q5());
    check_dot(&q6());
}

/// A Q8_K block of random quants in `-8..=8` with consistent `bsums` and `d = 0.5`.
fn small_q8k(r: &mut Rng) -> BlockQ8K {
    let mut b = BlockQ8K::zeroed();
    b.d = 0.5;
    for q in b.qs.iter_mut() {
        *q = (r.next_u64() % 17) as i8 - 8;
    }
    for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = g.iter().map(|&q| i16::from(q)).sum();
    }
    b
}

/// Random bytes for every field of a block, then power-of-two scales, so every
/// product and partial sum is an exactly representable `f32`.
fn random_block<B: Pod>(r: &mut Rng, set_scales: impl Fn(&mut B)) -> B {
    let mut b = B::zeroed();
    for byte in bytemuck::bytes_of_mut(&mut b) {
        *byte = r.byte();
    }
    set_scales(&mut b);
    b
}

/// With power-of-two scales and small quants the dot is an exact integer
/// multiple of a power of two: it must equal the dot of the dequantized rows
/// exactly, whatever the quant bits and sub-block scales are.
fn check_exact_dot<B: Pod>(f: &Format<B>, set_scales: impl Fn(&mut B) + Copy) {
    let Some(dot) = f.dot else { return };
    for seed in SEEDS {
        let mut r = Rng(seed ^ 0xe4ac7);
        let nb = 8;
        let w: Vec<B> = (0..nb).map(|_| random_block(&mut r, set_scales)).collect();
        let a: Vec<BlockQ8K> = (0..nb).map(|_| small_q8k(&mut r)).collect();
        let (mut wd, mut ad) = (vec![0.0; nb * QK_K], vec![0.0; nb * QK_K]);
        (f.dequantize)(&w, &mut wd);
        dequantize_row_q8_k(&a, &mut ad);
        let want = dot_f64(&wd, &ad);
        let got = dot(&w, &a);
        assert_eq!(
            f64::from(got),
            want,
            "{} seed {seed:#x}: integer dot",
            f.name
        );
        assert!(
            want.abs() > 1.0,
            "{} seed {seed:#x}: degenerate test data",
            f.name
        );
    }
}

#[test]
fn dots_are_exact_on_integer_data() {
    let d = f16::from_f32(0.25);
    let dmin = f16::from_f32(0.125);
    check_exact_dot(&q2(), |b: &mut BlockQ2K| (b.d, b.dmin) = (d, dmin));
    check_exact_dot(&q3(), |b: &mut BlockQ3K| b.d = d);
    check_exact_dot(&q4(), |b: &mut BlockQ4K| (b.d, b.dmin) = (d, dmin));
    check_exact_dot(&q5(), |b: &mut BlockQ5K| (b.d, b.dmin) = (d, dmin));
    check_exact_dot(&q6(), |b: &mut BlockQ6K| b.d = d);
}

#[test]
fn q8_k_scale_comes_from_the_signed_max() {
    for seed in SEEDS {
        let mut r = Rng(seed);
        let x: Vec<f32> = (0..N).map(|_| r.normal()).collect();
        let q = q8().quantize(&x);
        for (b, xb) in q.iter().zip(x.chunks(QK_K)) {
            let (_, max) = signed_absmax(xb);
            let imax = xb.iter().position(|&v| v == max).unwrap_or(0);
            assert_eq!(
                b.qs[imax], -127,
                "seed {seed:#x}: the largest element maps to -127"
            );
            assert_eq!(b.d, 1.0 / (-127.0 / max), "seed {seed:#x}: d");
            assert!(
                b.qs.iter().all(|&v| v >= -127),
                "seed {seed:#x}: -128 never appears"
            );
            for (s, g) in b.bsums.iter().zip(b.qs.chunks(16)) {
                assert_eq!(
                    i32::from(*s),
                    g.iter().map(|&v| i32::from(v)).sum::<i32>(),
                    "seed {seed:#x}: bsums"
                );
            }
        }
    }
}

#[test]
fn zero_and_constant_blocks() {
    let zeros = vec![0.0f32; QK_K];
    let constant = vec![0.7f32; QK_K];
    let neg_constant = vec![-0.3f32; QK_K];
    fn check<B: Pod>(f: &Format<B>, x: &[f32], bound: f64) {
        let y = f.round_trip(x);
        let worst = x
            .iter()
            .zip(&y)
            .map(|(&a, &b)| f64::from((a - b).abs()))
            .fold(0.0, f64::max);
        assert!(
            worst <= bound,
            "{}: max error {worst} on {:?}..",
            f.name,
            &x[..2]
        );
    }
    for x in [&zeros, &constant, &neg_constant] {
        // Constant blocks: every quantizer represents them to within a few f16 ulps.
        let bound = 2e-3 * f64::from(x[0].abs());
        check(&q2(), x, bound);
        check(&q3(), x, bound);
        check(&q4(), x, bound);
        check(&q5(), x, bound);
        check(&q6(), x, bound);
        check(&q8(), x, bound);
    }
}

#[test]
fn far_below_f16_range_gives_finite_small_values() {
    let mut r = Rng(7);
    let x: Vec<f32> = (0..QK_K).map(|_| 1e-9 * r.normal()).collect();
    fn check<B: Pod>(f: &Format<B>, x: &[f32]) {
        let y = f.round_trip(x);
        assert!(
            y.iter().all(|v| v.is_finite() && v.abs() < 1e-7),
            "{}: {:?}",
            f.name,
            &y[..4]
        );
    }
    check(&q2(), &x);
    check(&q3(), &x);
    check(&q4(), &x);
    check(&q5(), &x);
    check(&q6(), &x);
    check(&q8(), &x);
}

/// ggml's behaviour on NaN and infinities is garbage, but the reference must
/// not panic (overflow checks are on in test builds).
#[test]
fn non_finite_inputs_do_not_panic() {
    let mut r = Rng(11);
    let mut x: Vec<f32> = (0..4 * QK_K).map(|_| r.normal()).collect();
    x[3] = f32::NAN;
    x[QK_K + 5] = f32::INFINITY;
    x[2 * QK_K + 7] = f32::NEG_INFINITY;
    x[3 * QK_K + 9] = f32::MAX;
    let _ = q2().round_trip(&x);
    let _ = q3().round_trip(&x);
    let _ = q4().round_trip(&x);
    let _ = q5().round_trip(&x);
    let _ = q6().round_trip(&x);
    let _ = q8().round_trip(&x);
    let a = q8().quantize(&x);
    let _ = vec_dot_q2_k_q8_k(&q2().quantize(&x), &a);
    let _ = vec_dot_q3_k_q8_k(&q3().quantize(&x), &a);
    let _ = vec_dot_q4_k_q8_k(&q4().quantize(&x), &a);
    let _ = vec_dot_q5_k_q8_k(&q5().quantize(&x), &a);
    let _ = vec_dot_q6_k_q8_k(&q6().quantize(&x), &a);
}

/// Dots accept any bit pattern (blocks read from a file) without overflow.
#[test]
fn dots_on_random_bits_do_not_panic() {
    let mut r = Rng(12);
    let nb = 16;
    let a: Vec<BlockQ8K> = (0..nb)
        .map(|_| random_block(&mut r, |b: &mut BlockQ8K| b.d = 1.0))
        .collect();
    let one = f16::from_f32(1.0);
    let w2: Vec<BlockQ2K> = (0..nb)
        .map(|_| random_block(&mut r, |b: &mut BlockQ2K| (b.d, b.dmin) = (one, one)))
        .collect();
    let w3: Vec<BlockQ3K> = (0..nb)
        .map(|_| random_block(&mut r, |b: &mut BlockQ3K| b.d = one))
        .collect();
    let w4: Vec<BlockQ4K> = (0..nb)
        .map(|_| random_block(&mut r, |b: &mut BlockQ4K| (b.d, b.dmin) = (one, one)))
        .collect();
    let w5: Vec<BlockQ5K> = (0..nb)
        .map(|_| random_block(&mut r, |b: &mut BlockQ5K| (b.d, b.dmin) = (one, one)))
        .collect();
    let w6: Vec<BlockQ6K> = (0..nb)
        .map(|_| random_block(&mut r, |b: &mut BlockQ6K| b.d = one))
        .collect();
    for v in [
        vec_dot_q2_k_q8_k(&w2, &a),
        vec_dot_q3_k_q8_k(&w3, &a),
        vec_dot_q4_k_q8_k(&w4, &a),
        vec_dot_q5_k_q8_k(&w5, &a),
        vec_dot_q6_k_q8_k(&w6, &a),
    ] {
        assert!(v.is_finite());
    }
}

#[test]
fn nearest_int_rounds_half_to_even() {
    let cases = [
        (0.5, 0),
        (1.5, 2),
        (2.5, 2),
        (-0.5, 0),
        (-1.5, -2),
        (3.49, 3),
        (-3.51, -4),
        (4_194_303.0, 4_194_303),
    ];
    for (x, want) in cases {
        assert_eq!(nearest_int(x), want, "nearest_int({x})");
    }
    let mut r = Rng(99);
    for _ in 0..100_000 {
        let x = (r.uniform() - 0.5) * 2.0 * 4_194_303.0 * r.uniform().powi(8);
        assert_eq!(
            nearest_int(x),
            x.round_ties_even() as i32,
            "nearest_int({x})"
        );
    }
}

#[test]
fn rows_quantize_block_by_block() {
    let mut r = Rng(3);
    let x: Vec<f32> = (0..3 * QK_K).map(|_| r.normal()).collect();
    let whole = q4().quantize(&x);
    for (i, xb) in x.chunks(QK_K).enumerate() {
        let one = q4().quantize(xb);
        assert_eq!(
            bytemuck::bytes_of(&one[0]),
            bytemuck::bytes_of(&whole[i]),
            "block {i}"
        );
    }
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "blocks need")]
fn mismatched_lengths_are_caught_in_debug_builds() {
    let x = vec![1.0f32; QK_K + 1];
    let mut y = vec![BlockQ4K::zeroed(); 1];
    quantize_row_q4_k(&x, &mut y);
}
