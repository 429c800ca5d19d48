//! What the timing examples share.

/// Values uniform in [-0.5, 0.5) from a fixed-seed LCG: the same weights
/// and activations in every run.
pub fn uniform() -> impl FnMut() -> f32 {
    let mut seed = 1u64;
    move || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }
}
