//! Seeded random data for the reference unit tests (no dependency on `rand`).

/// SplitMix64: tiny, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed` (print the seed on failure).
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = (self.uniform() as f64).max(1e-12);
        let u2 = self.uniform() as f64;
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }

    /// Uniform integer in `0..n`.
    pub fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % u64::from(n)) as u32
    }
}

/// Rows of test weights of `n` elements that stress quantizers: Gaussian rows
/// at scales from 1e-3 to 1e2, rows with a few large outliers, rows whose
/// blocks are all negative or all positive, and a row with one constant block.
/// Never zeros.
pub fn stress_rows(rng: &mut Rng, n: usize) -> Vec<Vec<f32>> {
    let mut rows = Vec::new();
    for scale in [1e-3f32, 0.05, 1.0, 100.0] {
        rows.push((0..n).map(|_| rng.normal() * scale).collect());
    }
    let mut outliers: Vec<f32> = (0..n).map(|_| rng.normal() * 0.1).collect();
    for _ in 0..(n / 64).max(1) {
        let i = rng.below(n as u32) as usize;
        outliers[i] = if rng.uniform() < 0.5 { -8.0 } else { 12.0 };
    }
    rows.push(outliers);
    rows.push((0..n).map(|_| -(rng.normal().abs() + 0.01) * 0.3).collect());
    rows.push((0..n).map(|_| rng.normal().abs() * 2.0 + 0.5).collect());
    let mut constant: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    for v in constant.iter_mut().take(32) {
        *v = 0.75;
    }
    rows.push(constant);
    rows
}

/// ggml's `generate_data` (test-quantize-fns.cpp): `0.1 + 2 cos(i + offset)`.
pub fn ggml_test_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

/// ggml's `array_rmse`, as it defines it: `sqrt(sum of squared differences) / n`.
pub fn ggml_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    (sum.sqrt() / a.len() as f64) as f32
}
