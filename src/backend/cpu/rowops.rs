//! The row ops of prefill on the thread pool, with the fastest kernels the
//! CPU has: GELU- and SiLU-gated products, RMS norm and residual adds.
//!
//! A prompt's activations are `[tokens, width]`: at 512 tokens a gated
//! product covers a million values per layer, so these ops, scalar and on
//! one thread, cost as much as a quarter of prefill. [`RowOps`] picks
//! SIMD kernels for the ISA of the kernel table (scalar ones from
//! [`mod@reference`] elsewhere) and splits large inputs over the threads;
//! below [`PAR_MIN`] values one region costs more than it saves.
//!
//! Every kernel gives the same values on every thread count (each value,
//! or each row, is computed by one thread alone), so a token's results do
//! not depend on its batch. GELU and RMS norm are bit-identical to their
//! scalar forms; SiLU uses ggml's vector exp (as llama.cpp does), within
//! 2 ulp of the scalar one.

use super::kernels::Isa;
use super::threads::Threads;
use crate::graph::reference;

/// Values below which an op stays on the calling thread: a parallel region
/// costs ~7 us at two threads, about what 32K values of a gated product take.
pub const PAR_MIN: usize = 1 << 15;

/// `x = f(x, y)` element-wise (`x` and `y` of one length).
pub type BinaryFn = fn(x: &mut [f32], y: &[f32]);
/// RMS norm of each `w.len()`-wide row of `x` (see [`reference::rms_norm`]).
pub type NormFn = fn(x: &mut [f32], w: &[f32], eps: f32);

/// The row-op kernels of one ISA.
#[derive(Clone, Copy)]
pub struct RowOps {
    isa: Isa,
    gelu_mul: BinaryFn,
    silu_mul: BinaryFn,
    add: BinaryFn,
    rms_norm: NormFn,
}

impl std::fmt::Debug for RowOps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RowOps({})", self.isa)
    }
}

impl RowOps {
    /// The portable kernels of [`mod@reference`].
    pub fn scalar() -> Self {
        Self {
            isa: Isa::Scalar,
            gelu_mul: reference::gelu_mul,
            silu_mul: reference::silu_mul,
            add: reference::add,
            rms_norm: reference::rms_norm,
        }
    }

    /// The kernels for `isa` (the scalar ones where it has none, or where
    /// this CPU lacks it).
    pub fn for_isa(isa: Isa) -> Self {
        #[cfg(target_arch = "x86_64")]
        if matches!(isa, Isa::Avx2 | Isa::Avx512) && isa.available() {
            return super::kernels::x86::rowops::kernels(isa);
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        if isa == Isa::Simd128 {
            return super::kernels::wasm::rowops::kernels();
        }
        let _ = isa;
        Self::scalar()
    }

    /// Kernels of `isa` from their entries (the ISA files' constructor).
    #[cfg(any(
        target_arch = "x86_64",
        all(target_arch = "wasm32", target_feature = "simd128")
    ))]
    pub(super) fn with(
        isa: Isa,
        gelu_mul: BinaryFn,
        silu_mul: BinaryFn,
        add: BinaryFn,
        rms_norm: NormFn,
    ) -> Self {
        Self {
            isa,
            gelu_mul,
            silu_mul,
            add,
            rms_norm,
        }
    }

    /// The ISA the kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The single-threaded kernel of the gated product of `act`, for
    /// callers that split the work themselves. Pieces starting at multiples of 16 values give
    /// the values [`Self::silu_mul`] and [`Self::gelu_mul`] give.
    pub fn gated_kernel(&self, act: crate::graph::Activation) -> BinaryFn {
        match act {
            crate::graph::Activation::Silu => self.silu_mul,
            crate::graph::Activation::GeluTanh => self.gelu_mul,
        }
    }

    /// The single-threaded RMS norm kernel (whole rows, any number).
    pub fn norm_kernel(&self) -> NormFn {
        self.rms_norm
    }

    /// `x = gelu_tanh(x) * y` as ggml's `geglu` (see [`reference::gelu_mul`]).
    pub fn gelu_mul(&self, threads: &Threads, x: &mut [f32], y: &[f32]) {
        par_binary(threads, self.gelu_mul, x, y);
    }

    /// `x = silu(x) * y` (ggml's `swiglu`).
    pub fn silu_mul(&self, threads: &Threads, x: &mut [f32], y: &[f32]) {
        par_binary(threads, self.silu_mul, x, y);
    }

    /// `x += y`.
    pub fn add(&self, threads: &Threads, x: &mut [f32], y: &[f32]) {
        par_binary(threads, self.add, x, y);
    }

    /// RMS norm of each `w.len()`-wide row of `x`, times `w`.
    pub fn rms_norm(&self, threads: &Threads, x: &mut [f32], w: &[f32], eps: f32) {
        let width = w.len();
        if width == 0 {
            return;
        }
        let f = self.rms_norm;
        let rows = x.len() / width;
        if x.len() < PAR_MIN || threads.count() == 1 || rows < 2 {
            return f(x, w, eps);
        }
        let chunk = rows.div_ceil(threads.count() * 4) * width;
        threads.for_chunks(x, chunk, |_, c| f(c, w, eps));
    }
}

/// `f(x, y)` over the threads in chunks of whole cache lines.
fn par_binary(threads: &Threads, f: BinaryFn, x: &mut [f32], y: &[f32]) {
    let n = x.len().min(y.len());
    let x = &mut x[..n];
    if n < PAR_MIN || threads.count() == 1 {
        return f(x, &y[..n]);
    }
    let chunk = n.div_ceil(threads.count() * 4).next_multiple_of(16);
    threads.for_chunks(x, chunk, |i, c| {
        let at = i * chunk;
        f(c, &y[at..at + c.len()]);
    });
}

/// [`reference::argmax_row`] in two vectorizable passes: the largest
/// value and whether any value is non-finite (sixteen independent lanes),
/// then the first index holding that value. Same results: `>` keeps the
/// lowest index of a tie, and `-0.0 == 0.0` makes the second pass find the
/// first of either zero where the reference keeps the first.
pub fn argmax_row(row: &[f32]) -> u32 {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        // LLVM does not vectorize the loop below for wasm (`f32::max`
        // is not `f32x4.max`): 3 ns a value, scalar.
        super::kernels::wasm::rowops::argmax_row(row)
    }
    #[cfg(not(all(target_arch = "wasm32", target_feature = "simd128")))]
    argmax_scalar(row)
}

/// [`argmax_row`]'s portable form.
pub fn argmax_scalar(row: &[f32]) -> u32 {
    const LANES: usize = 16;
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut bad = [0u32; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for ((m, b), &v) in max.iter_mut().zip(&mut bad).zip(c) {
            *m = m.max(v);
            *b |= u32::from(v.to_bits() & 0x7f80_0000 == 0x7f80_0000);
        }
    }
    let mut m = max.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut any_bad = bad.iter().any(|&b| b != 0);
    for &v in tail {
        m = m.max(v);
        any_bad |= !v.is_finite();
    }
    if any_bad || row.is_empty() {
        return crate::graph::NON_FINITE_ROW;
    }
    row.iter()
        .position(|&v| v == m)
        .map_or(crate::graph::NON_FINITE_ROW, |i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded uniform values in `[-scale, scale)` (splitmix64).
    fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn all_isas() -> Vec<RowOps> {
        Isa::ALL
            .into_iter()
            .filter(|i| i.available())
            .map(RowOps::for_isa)
            .collect()
    }

    #[test]
    fn gelu_and_norm_are_bit_identical_to_scalar_on_any_thread_count() {
        let threads = Threads::new(2);
        for seed in [1u64, 7, 2024] {
            // Odd lengths reach the kernels' scalar tails; 12 spans the
            // GELU cut-offs at +-10.
            let n = PAR_MIN + 37 + seed as usize % 13;
            let (x, y) = (values(seed, n, 12.0), values(seed + 1, n, 2.0));
            let mut want = x.clone();
            reference::gelu_mul(&mut want, &y);
            let width = 577;
            let rows = n / width;
            let w = values(seed + 2, width, 1.5);
            let mut want_n = x[..rows * width].to_vec();
            reference::rms_norm(&mut want_n, &w, 1e-6);
            for k in all_isas() {
                for t in [&Threads::new(1), &threads] {
                    let mut got = x.clone();
                    k.gelu_mul(t, &mut got, &y);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{k:?} gelu seed {seed}");
                    let mut got = x[..rows * width].to_vec();
                    k.rms_norm(t, &mut got, &w, 1e-6);
                    assert_eq!(got, want_n, "{k:?} rms_norm seed {seed}");
                }
            }
        }
    }

    #[test]
    fn fast_argmax_matches_the_reference() {
        // Lengths around the lanes (16 portable, 4 in SIMD128), ties,
        // signed zeros, and one non-finite value at a random place (lane
        // body or tail).
        let mut s = 0xA2A2u64;
        let mut below = |n: usize| {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (s >> 33) as usize % n
        };
        for case in 0..400 {
            let n = [0, 1, 3, 5, 15, 16, 17, 31, 1000, 262_144][case % 10];
            let mut row = values(case as u64, n, 3.0);
            if n > 0 && case % 3 == 0 {
                let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                row[below(n)] = m;
            }
            if n > 1 && case % 7 == 0 {
                row.iter_mut().for_each(|v| *v = -v.abs());
                row[below(n)] = 0.0;
                row[below(n)] = -0.0;
            }
            if n > 0 && case % 5 == 0 {
                row[below(n)] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][case % 3];
            }
            let want = reference::argmax_row(&row);
            assert_eq!(argmax_row(&row), want, "case {case}, {n} values");
            assert_eq!(argmax_scalar(&row), want, "case {case}, {n} values");
        }
    }

    #[test]
    fn silu_and_add_match_scalar() {
        let threads = Threads::new(2);
        for seed in [3u64, 99] {
            let n = PAR_MIN * 2 + 5;
            let (x, y) = (values(seed, n, 40.0), values(seed + 1, n, 2.0));
            let mut want = x.clone();
            reference::silu_mul(&mut want, &y);
            let mut want_add = x.clone();
            reference::add(&mut want_add, &y);
            for k in all_isas() {
                let mut got = x.clone();
                k.silu_mul(&threads, &mut got, &y);
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    let tol = 4.0 * f32::EPSILON * w.abs() + 1e-30;
                    assert!(
                        (g - w).abs() <= tol,
                        "{k:?} silu seed {seed} at {i}: x {} -> {g}, want {w}",
                        x[i]
                    );
                }
                let mut got = x.clone();
                k.add(&threads, &mut got, &y);
                assert_eq!(got, want_add, "{k:?} add seed {seed}");
            }
        }
    }
}

/// Speed of the row ops against the scalar forms, interleaved in one run:
/// `cargo test --release --lib rowops::speed -- --ignored --nocapture`.
#[cfg(test)]
mod speed {
    use super::*;

    fn time(f: &mut dyn FnMut()) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = std::time::Instant::now();
            f();
            best = best.min(t.elapsed().as_secs_f64());
        }
        best * 1e3
    }

    #[test]
    #[ignore = "timing, prints a table"]
    fn row_ops_against_scalar() {
        // Gemma-3-270M prefill: 512 tokens, feed-forward 2048 wide, rows of 640.
        let n = 512 * 2048;
        let x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 / 125.0 - 4.0)
            .collect();
        let y: Vec<f32> = (0..n)
            .map(|i| ((i * 104_729) % 997) as f32 / 500.0 - 1.0)
            .collect();
        let w: Vec<f32> = (0..640).map(|i| 0.5 + i as f32 / 640.0).collect();
        let one = Threads::new(1);
        let two = Threads::new(2);
        let best = RowOps::for_isa(Isa::best());
        let scalar = RowOps::scalar();
        for (name, op) in [
            ("gelu_mul", 0),
            ("silu_mul", 1),
            ("add", 2),
            ("rms_norm", 3),
        ] {
            let mut row = format!("{name:>9}");
            for (k, t) in [(&scalar, &one), (&best, &one), (&best, &two)] {
                let mut buf = x.clone();
                let ms = time(&mut || {
                    buf.copy_from_slice(&x);
                    match op {
                        0 => k.gelu_mul(t, &mut buf, &y),
                        1 => k.silu_mul(t, &mut buf, &y),
                        2 => k.add(t, &mut buf, &y),
                        _ => k.rms_norm(t, &mut buf[..512 * 640], &w, 1e-6),
                    }
                });
                row += &format!("  {:?} x{}: {ms:8.3} ms", k.isa(), t.count());
            }
            println!("{row}");
        }
    }
}
