//! The most int8 multiply-adds per second a wasm SIMD128 kernel can do on
//! this machine: 16-byte weight and activation vectors already in L1,
//! nothing to decode, eight independent accumulators. A decode kernel does
//! at least this work per weight, so its weights per second stay below
//! this figure whatever the format.
//!
//! `cargo run --release --target wasm32-wasip1 --example simd128_dot_ceiling`
//! (Node through `scripts/wasi-run.mjs`) prints G multiply-adds/s of
//! SIMD128's only exact int8 dot (sign-extend to i16, `i32x4.dot_i16x8_s`);
//! a build with `-C target-feature=+simd128,+relaxed-simd` (run under Node
//! 22, `tests/wasm-relaxed`) also times `i32x4.relaxed_dot_i8x16_i7x16_add`.
//! Natively it only says how to run it.

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod ceiling {
    use core::arch::wasm32::*;
    use std::hint::black_box;
    use std::time::Instant;

    /// Independent accumulator chains (enough to hide the dot's latency).
    const CHAINS: usize = 8;

    /// The sum over `reps` passes of `dot(w, a, acc)` over the vectors of
    /// `w` and `a`, on [`CHAINS`] accumulators.
    #[inline(always)]
    fn chains(w: &[v128], a: &[v128], reps: usize, dot: impl Fn(v128, v128, v128) -> v128) -> v128 {
        let mut acc = [i32x4_splat(0); CHAINS];
        for _ in 0..reps {
            for (w, a) in w.chunks_exact(CHAINS).zip(a.chunks_exact(CHAINS)) {
                for k in 0..CHAINS {
                    acc[k] = dot(w[k], a[k], acc[k]);
                }
            }
        }
        acc.into_iter().fold(i32x4_splat(0), |s, x| i32x4_add(s, x))
    }

    /// [`chains`] of 16 int8 pairs per vector with the i16 widening every
    /// SIMD128 kernel uses.
    #[inline(never)]
    fn widened(w: &[v128], a: &[v128], reps: usize) -> v128 {
        chains(w, a, reps, |w, a, acc| {
            let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(w), i16x8_extend_low_i8x16(a));
            let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(w), i16x8_extend_high_i8x16(a));
            i32x4_add(acc, i32x4_add(lo, hi))
        })
    }

    /// [`chains`] of `i32x4.relaxed_dot_i8x16_i7x16_add` (weights 0..=127).
    #[cfg(target_feature = "relaxed-simd")]
    #[inline(never)]
    fn relaxed(w: &[v128], a: &[v128], reps: usize) -> v128 {
        chains(w, a, reps, |w, a, acc| {
            i32x4_relaxed_dot_i8x16_i7x16_add(a, w, acc)
        })
    }

    /// G multiply-adds/s of `f` over `vectors` of each operand, best of five.
    fn rate(f: fn(&[v128], &[v128], usize) -> v128, w: &[v128], a: &[v128]) -> f64 {
        let reps = 4000;
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let t = Instant::now();
            black_box(f(black_box(w), black_box(a), reps));
            best = best.min(t.elapsed().as_secs_f64());
        }
        (w.len() * 16 * reps) as f64 / best / 1e9
    }

    pub fn main() {
        // 16 KiB of each operand: L1-resident.
        let n = 1024;
        let w: Vec<v128> = (0..n).map(|i| u8x16_splat((i * 37 % 128) as u8)).collect();
        let a: Vec<v128> = (0..n).map(|i| i8x16_splat((i * 53 % 255) as i8)).collect();
        println!(
            "widened to i16, i32x4.dot_i16x8_s: {:.1} G multiply-adds/s",
            rate(widened, &w, &a)
        );
        #[cfg(target_feature = "relaxed-simd")]
        println!(
            "i32x4.relaxed_dot_i8x16_i7x16_add: {:.1} G multiply-adds/s",
            rate(relaxed, &w, &a)
        );
    }
}

fn main() {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    ceiling::main();
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    println!(
        "a wasm SIMD128 measurement: cargo run --release --target wasm32-wasip1 --example simd128_dot_ceiling"
    );
}
