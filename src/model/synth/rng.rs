//! The random numbers of synthetic weights: small, fast and fully specified,
//! so a seed gives the same file on every machine and in every release.
//!
//! - [`Pcg32`] is PCG-XSH-RR 64/32 (O'Neill 2014): a 64-bit LCG state with
//!   the multiplier 6364136223846793005 and an odd per-stream increment,
//!   output by an xorshift and a data-dependent rotation.
//! - Every row of every tensor has its own stream: the state seed is
//!   SplitMix64 of the user's seed mixed with the FNV-1a hash of the tensor's
//!   name, and the increment is the row index. Rows can therefore be made in
//!   any order, on any number of threads, with identical results, and adding
//!   a tensor does not change the others.
//! - Normal deviates come from the Box-Muller transform in `f32`, two per pair
//!   of 24-bit uniforms: `u1` in (0, 1] (so `ln` is finite) and `u2` in [0, 1).
//!
//! `ln`, `sqrt`, `sin` and `cos` are the platform's `f32` functions; `sqrt`
//! is exact everywhere, and the others agree between the usual libms to the
//! last bit for all but rare inputs, so files made on other platforms may
//! (rarely) differ in a low bit of a weight.

/// PCG-XSH-RR with 64-bit state and 32-bit output.
#[derive(Debug, Clone)]
pub struct Pcg32 {
    state: u64,
    inc: u64,
}

const PCG_MULT: u64 = 6_364_136_223_846_793_005;

impl Pcg32 {
    /// The generator for `seed` on stream `stream` (PCG's `pcg32_srandom_r`).
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Pcg32 {
            state: 0,
            inc: (stream << 1) | 1,
        };
        rng.next_u32();
        rng.state = rng.state.wrapping_add(seed);
        rng.next_u32();
        rng
    }

    /// The next 32 uniformly distributed bits.
    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        let rot = (old >> 59) as u32;
        xorshifted.rotate_right(rot)
    }

    /// Fills `out` with N(`mean`, `std`^2) deviates by Box-Muller.
    pub fn fill_normal(&mut self, mean: f32, std: f32, out: &mut [f32]) {
        let mut pairs = out.chunks_exact_mut(2);
        for pair in &mut pairs {
            let (a, b) = self.normal_pair();
            pair[0] = mean + std * a;
            pair[1] = mean + std * b;
        }
        if let [last] = pairs.into_remainder() {
            *last = mean + std * self.normal_pair().0;
        }
    }

    /// Two independent standard normal deviates.
    fn normal_pair(&mut self) -> (f32, f32) {
        const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
        // u1 in (0, 1], u2 in [0, 1): 24 bits each, exactly representable.
        let u1 = ((self.next_u32() >> 8) + 1) as f32 * SCALE;
        let u2 = (self.next_u32() >> 8) as f32 * SCALE;
        let r = (-2.0 * u1.ln()).sqrt();
        let (s, c) = (std::f32::consts::TAU * u2).sin_cos();
        (r * c, r * s)
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
            rng.fill_normal(0.5, 0.02, &mut v);
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
