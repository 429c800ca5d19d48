//! The random numbers of synthetic weights: small, fast and fully specified,
//! so a seed gives the same file on every machine and in every release.
//!
//! - [`Pcg32`] (the sampler's) is PCG-XSH-RR 64/32 (O'Neill 2014): a 64-bit
//!   LCG state with the multiplier 6364136223846793005 and an odd per-stream
//!   increment, output by an xorshift and a data-dependent rotation.
//! - Every row of every tensor has its own stream: the state seed is
//!   SplitMix64 of the user's seed mixed with the FNV-1a hash of the tensor's
//!   name, and the increment is the row index. Rows can therefore be made in
//!   any order, on any number of threads, with identical results, and adding
//!   a tensor does not change the others.
//! - Normal deviates come from the Box-Muller transform, two per pair of
//!   24-bit uniforms: `u1` in (0, 1] (so `ln` is finite) and `u2` in [0, 1),
//!   computed in `f64` and rounded to `f32`.
//!
//! `ln`, `sin` and `cos` are series evaluated here with IEEE `+ - * /` and
//! `sqrt` (which Rust never fuses or reorders) rather than libm's, whose last
//! bits differ between platforms: the same seed gives the same file natively
//! and in wasm, on every OS.

pub use crate::sample::Pcg32;

/// Pairs made per batch: the uniforms are drawn first (the generator is
/// sequential), then the transform runs over plain arrays the compiler
/// vectorizes. The result does not depend on the batch size.
const BATCH: usize = 64;

/// Fills `out` with N(`mean`, `std`^2) deviates from `rng` by Box-Muller:
/// pair `i` gives `out[2i]` (the cosine) and `out[2i + 1]` (the sine); an odd
/// last value takes the cosine of one more pair.
pub fn fill_normal(rng: &mut Pcg32, mean: f32, std: f32, out: &mut [f32]) {
    const SCALE: f64 = 1.0 / (1u32 << 24) as f64;
    let (mut u1, mut u2) = ([0.0f64; BATCH], [0.0f64; BATCH]);
    let (mut r, mut sin, mut cos) = ([0.0f64; BATCH], [0.0f64; BATCH], [0.0f64; BATCH]);
    for chunk in out.chunks_mut(2 * BATCH) {
        let n = chunk.len().div_ceil(2);
        for i in 0..n {
            // u1 in (0, 1], u2 in [0, 1): 24 bits each, exactly representable.
            u1[i] = f64::from((rng.next_u32() >> 8) + 1) * SCALE;
            u2[i] = f64::from(rng.next_u32() >> 8) * SCALE;
        }
        for i in 0..BATCH {
            r[i] = (-2.0 * ln(u1[i])).sqrt();
            (sin[i], cos[i]) = sin_cos_turns(u2[i]);
        }
        for (i, v) in chunk.iter_mut().enumerate() {
            let trig = if i % 2 == 0 { cos[i / 2] } else { sin[i / 2] };
            *v = mean + std * (r[i / 2] * trig) as f32;
        }
    }
}

/// `1 / (2k + 1)`: the coefficients of `atanh(s) / s` in `s^2`.
const LN_SERIES: [f64; 11] = {
    let mut c = [0.0; 11];
    let mut k = 0;
    while k < c.len() {
        c[k] = 1.0 / (2 * k + 1) as f64;
        k += 1;
    }
    c
};

const TRIG_TERMS: usize = 12;

/// `1 / ((2k + 2)(2k + 3))` and `1 / ((2k + 1)(2k + 2))`: the ratios of
/// successive Taylor terms of `sin(a) / a` and `cos(a)`, for Horner's rule.
const SIN_STEP: [f64; TRIG_TERMS] = trig_steps(2);
const COS_STEP: [f64; TRIG_TERMS] = trig_steps(1);

const fn trig_steps(first: usize) -> [f64; TRIG_TERMS] {
    let mut c = [0.0; TRIG_TERMS];
    let mut k = 0;
    while k < TRIG_TERMS {
        let n = 2 * k + first;
        c[k] = 1.0 / (n * (n + 1)) as f64;
        k += 1;
    }
    c
}

/// Natural log of `x` in (0, 1], to ~1e-15, from IEEE arithmetic alone (so
/// every platform, wasm included, gets the same bits; libm `ln` may differ).
pub fn ln(x: f64) -> f64 {
    let bits = x.to_bits();
    // x = m * 2^e with m in [1, 2); x is normal (at least 2^-24).
    let e = ((bits >> 52) & 0x7ff) as f64 - 1023.0;
    let m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    // Selects rather than a branch, so batches vectorize.
    let big = m > std::f64::consts::SQRT_2;
    let (m, e) = (if big { m * 0.5 } else { m }, if big { e + 1.0 } else { e });
    // ln m = 2 atanh(s), |s| <= 0.172: the odd series to s^21 is exact to ~1e-17.
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let sum = LN_SERIES.iter().rev().fold(0.0, |acc, &c| acc * s2 + c);
    e * std::f64::consts::LN_2 + 2.0 * s * sum
}

/// `1 / k!` for k = 0..=17: `exp(f)` for |f| <= ln 2 / 2 to ~1e-17 by Horner's rule.
const EXP_SERIES: [f64; 18] = {
    let mut c = [1.0; 18];
    let mut k = 1;
    while k < c.len() {
        c[k] = c[k - 1] / k as f64;
        k += 1;
    }
    c
};

/// `e^x` for `x <= 0`, to ~1e-15, from IEEE arithmetic alone (see [`ln`]).
/// Below `-700` (under 1e-304, zero in `f32`) it is 0; NaN stays NaN.
pub fn exp_neg(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x < -700.0 {
        return 0.0;
    }
    // ln 2 in two parts (fdlibm's): the high part has 32 significant bits,
    // so `k * LN2_HI` is exact for |k| < 2^21 and f keeps its low bits.
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    let x = x.min(0.0);
    // x = k ln 2 + f, |f| <= ln 2 / 2 (plus rounding), k in [-1010, 0].
    let k = (x / std::f64::consts::LN_2).round();
    let f = (x - k * LN2_HI) - k * LN2_LO;
    let sum = EXP_SERIES.iter().rev().fold(0.0, |acc, &c| acc * f + c);
    // 2^k is a normal f64 for k >= -1022: its bits are the biased exponent.
    let two_k = f64::from_bits(((k as i64 + 1023) as u64) << 52);
    sum * two_k
}

/// `base^exponent` for `base` in (0, 1] and `exponent >= 0`, as
/// `exp(exponent ln base)` from IEEE arithmetic alone (see [`ln`]).
pub fn pow_unit(base: f64, exponent: f64) -> f64 {
    exp_neg(exponent * ln(base))
}

/// `(sin, cos)` of `turns` full turns (`2π turns`), `turns` in [0, 1), to
/// ~1e-15, from IEEE arithmetic alone (see [`ln`]).
fn sin_cos_turns(turns: f64) -> (f64, f64) {
    let quarters = turns * 4.0;
    let q = quarters.floor();
    let a = (quarters - q) * std::f64::consts::FRAC_PI_2; // [0, π/2)
    let a2 = a * a;
    // Taylor series to a^23 / a^22: the next terms are below 1e-16 on [0, π/2).
    let (mut sin, mut cos) = (0.0, 0.0);
    for k in (0..TRIG_TERMS).rev() {
        sin = 1.0 - sin * a2 * SIN_STEP[k];
        cos = 1.0 - cos * a2 * COS_STEP[k];
    }
    let (s, c) = (a * sin, cos);
    // Quadrant q turns (s, c) by q right angles: (c, -s), (-s, -c), (-c, s).
    let q = q as u32;
    let (s, c) = if q & 1 == 1 { (c, -s) } else { (s, c) };
    if q & 2 == 2 {
        (-s, -c)
    } else {
        (s, c)
    }
}

/// SplitMix64's output function: a bijective mix of 64 bits.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The generator for row `row` of the tensor named `tensor` under `seed`.
pub fn row_rng(seed: u64, tensor: &str, row: u64) -> Pcg32 {
    Pcg32::new(splitmix64(seed ^ splitmix64(fnv1a(tensor.as_bytes()))), row)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Synthetic files' bytes depend on this sequence: it must never change.
    #[test]
    fn pcg32_matches_the_reference_sequence() {
        // pcg32-demo from the PCG C library: pcg32_srandom_r(&rng, 42u, 54u).
        let mut rng = Pcg32::new(42, 54);
        let got: Vec<u32> = (0..6).map(|_| rng.next_u32()).collect();
        assert_eq!(
            got,
            [0xa15c02b7, 0x7b47f409, 0xba1d3330, 0x83d2f293, 0xbfa4784b, 0xcbed606e]
        );
    }

    /// Pinned bits: a change here changes every synthetic file.
    #[test]
    fn normals_are_pinned() {
        let mut v = [0.0f32; 5];
        fill_normal(&mut row_rng(1, "token_embd.weight", 3), 0.0, 1.0, &mut v);
        assert_eq!(
            v.map(f32::to_bits),
            [3198603708, 3170212489, 3207551104, 1043783284, 1048823722],
            "{v:?}"
        );
    }

    #[test]
    fn series_match_libm() {
        for i in 1..=4096u32 {
            let x = f64::from(i) / 4096.0;
            assert!((ln(x) - x.ln()).abs() < 1e-14, "ln {x}");
            let tiny = f64::from(i) * 2f64.powi(-24);
            assert!((ln(tiny) - tiny.ln()).abs() < 1e-13, "ln {tiny}");
            let t = f64::from(i - 1) / 4096.0;
            let (s, c) = sin_cos_turns(t);
            let (ws, wc) = (std::f64::consts::TAU * t).sin_cos();
            assert!(
                (s - ws).abs() < 1e-14 && (c - wc).abs() < 1e-14,
                "sin_cos {t}"
            );
        }
    }

    #[test]
    fn exp_and_pow_match_libm() {
        for i in 0..20_000u32 {
            let x = -f64::from(i) * 0.035; // 0 down to just above -700
            let want = x.exp();
            let got = exp_neg(x);
            assert!(
                (got - want).abs() <= 1e-14 * want,
                "exp {x}: {got} vs {want}"
            );
        }
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(-800.0), 0.0);
        assert!(exp_neg(f64::NAN).is_nan());
        for (base, exponent) in [
            (0.5, 3.0),
            (1e-4, 0.5),
            (0.9, 17.25),
            (1.0, 2.0),
            (0.3, 0.0),
        ] {
            let want = f64::powf(base, exponent);
            let got = pow_unit(base, exponent);
            assert!(
                (got - want).abs() <= 1e-14 * want,
                "{base}^{exponent}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn known_hashes() {
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        // SplitMix64 seeded with 0: its first output.
        assert_eq!(splitmix64(0), 0xe220a8397b1dcdaf);
    }

    #[test]
    fn normals_have_the_asked_moments() {
        for seed in [1u64, 2, 3] {
            let mut rng = row_rng(seed, "blk.0.attn_q.weight", 7);
            let mut v = vec![0.0f32; 100_001];
            fill_normal(&mut rng, 0.5, 0.02, &mut v);
            let n = v.len() as f64;
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
            let var = v
                .iter()
                .map(|&x| (f64::from(x) - mean).powi(2))
                .sum::<f64>()
                / n;
            assert!((mean - 0.5).abs() < 0.0005, "seed {seed}: mean {mean}");
            assert!(
                (var.sqrt() - 0.02).abs() < 0.0005,
                "seed {seed}: std {}",
                var.sqrt()
            );
            // Tails exist but stay plausible for 1e5 samples.
            let max_z = v
                .iter()
                .map(|&x| ((x - 0.5) / 0.02).abs())
                .fold(0.0, f32::max);
            assert!(max_z > 3.0 && max_z < 7.0, "seed {seed}: max |z| {max_z}");
        }
    }

    #[test]
    fn rows_and_tensors_get_distinct_streams() {
        let first = |seed, name: &str, row| row_rng(seed, name, row).next_u32();
        let base = first(1, "a.weight", 0);
        assert_ne!(base, first(1, "a.weight", 1));
        assert_ne!(base, first(1, "b.weight", 0));
        assert_ne!(base, first(2, "a.weight", 0));
        assert_eq!(base, first(1, "a.weight", 0));
    }
}
