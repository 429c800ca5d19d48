//! Router skew: a skewed, Zipf-like popularity of the experts of synthetic
//! MoE models ([`SynthOptions::router_skew`](super::SynthOptions::router_skew)).
//!
//! With random routers every expert wins the same share of the tokens, which
//! hides what an expert cache's policy (LRU, LFU, ...) does: trained routers
//! are skewed, and engines report about a tenth of the experts taking most of
//! the routing hits.
//!
//! # Mechanism
//!
//! Layer `L` ranks its experts by a random permutation drawn from the seed
//! and `L` ([`expert_ranks`]), so every layer has its own popular experts.
//! Row `e` of `blk.L.ffn_gate_inp.weight` (expert `e`'s router vector) is
//! drawn as before but with standard deviation `proj * a(rank of e)`:
//!
//! ```text
//! a(r) = p(r)^S,    p(r) = ((1 + r)^-3 + 1e-4) / (1 + 1e-4),    r = 0, 1, ...
//! ```
//!
//! Expert `e`'s logit `w_e . h` then has a spread proportional to `a`, and
//! top-k picks the experts whose logits stand out: the first ranks win
//! whenever their logit is positive, the ranks past ~20 (where `p` reaches
//! its floor, 1e-4) share the slots the first ranks leave, so the tail is
//! thin but never dead. `S` sharpens the same profile; `a` is 1 at rank 0
//! and never above it, so the popular experts keep the usual logit scale.
//!
//! # A bound no router can beat
//!
//! When hidden states are sign-symmetric (`h` and `-h` equally likely, as
//! for zero-mean Gaussian activations), `-h` reverses the order of every
//! router's logits, so an expert is in the top `k` for at most half of the
//! tokens (for `k <= n_expert / 2`). The top 10% of Qwen3-30B-A3B's 128
//! experts (8 used) can therefore take at most 12.8 / 2 / 8 = 80% of the
//! hits, and the most popular of Mixtral's 8 experts (2 used) at most 25%.
//! Scaling the rows brings the head near that bound, and the floor leaves
//! the other experts a thin tail (the slots the head leaves when fewer than
//! `k` of its logits are positive) instead of none. Shares of the top-k hits
//! taken by the most popular experts, routing 50k Gaussian RMS-normed hidden
//! states through layers 0 and 1 of seed 0, for Qwen3-30B-A3B's routing (128
//! experts, 8 used, n_embd 2048) and Mixtral's (8 experts, 2 used, n_embd
//! 4096); `least` is the least popular expert's share (uniform: 0.78% and
//! 12.5%):
//!
//! | skew | 128 / 8: top 10%, 20%, 50% | least | 8 / 2: top 1, 2, 4 | least |
//! |------|----------------------------|-------|--------------------|-------|
//! | 0    | 11%, 22%, 52%              | 0.67% | 12.7%, 25%, 50%    | 12.3% |
//! | 0.5  | 56%, 71%, 84%              | 0.21% | 23.4%, 44%, 71%    | 5.4%  |
//! | 1    | 70%, 89%, 95%              | 0.06% | 25.0%, 48%, 77%    | 3.9%  |
//! | 2    | 75%, 97%, 100%             | 0%    | 25.2%, 50%, 80%    | 3.3%  |
//!
//! Skew 0's top 10% is above 10% only by sampling noise; past skew 1 the
//! tail of the 128-expert shape dies out.

use super::rng;

/// The skew `hearth synth --router-skew` suggests: the head near the bound
/// above (70% of the hits for the top 10% of 128 experts, 8 used), with a
/// thin tail over every expert.
pub const SUGGESTED_ROUTER_SKEW: f32 = 1.0;

/// The floor of the profile `p`: the scale of the tail experts' router rows
/// relative to rank 0's at skew 1.
const FLOOR: f64 = 1e-4;

/// Every expert's popularity rank in `layer` under `seed` (`ranks[e]`, 0 the
/// most popular): a Fisher-Yates shuffle from the generator of the pseudo-tensor
/// `blk.{layer}.ffn_gate_inp.popularity`, so no tensor's values change.
pub fn expert_ranks(seed: u64, layer: u64, n_expert: u64) -> Vec<u64> {
    let mut rng = rng::row_rng(seed, &format!("blk.{layer}.ffn_gate_inp.popularity"), 0);
    let mut order: Vec<u64> = (0..n_expert).collect();
    for i in (1..order.len()).rev() {
        // A uniform j in 0..=i by Lemire's multiply-shift (the bias, i / 2^32, is negligible).
        let j = (u64::from(rng.next_u32()) * (i as u64 + 1)) >> 32;
        order.swap(i, j as usize);
    }
    let mut ranks = vec![0; order.len()];
    for (rank, &expert) in order.iter().enumerate() {
        ranks[expert as usize] = rank as u64;
    }
    ranks
}

/// The factor `a(rank)` on the router row's standard deviation under `skew`
/// (see the module's documentation): 1 at rank 0 or skew 0, decreasing in
/// both. Computed from IEEE arithmetic alone, so every platform writes the
/// same bytes.
pub fn rank_scale(rank: u64, skew: f32) -> f32 {
    if skew == 0.0 {
        return 1.0;
    }
    let x = 1.0 + rank as f64;
    let p = (1.0 / (x * x * x) + FLOOR) / (1.0 + FLOOR);
    rng::pow_unit(p.min(1.0), f64::from(skew)) as f32
}

/// The factor on each row of layer `layer`'s router (`n_expert` rows, row
/// `e` = expert `e`), or nothing at skew 0 (every row keeps the plain scale,
/// bit for bit).
pub fn router_row_scales(seed: u64, layer: u64, n_expert: u64, skew: f32) -> Vec<f32> {
    if skew == 0.0 {
        return Vec::new();
    }
    expert_ranks(seed, layer, n_expert)
        .into_iter()
        .map(|rank| rank_scale(rank, skew))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_a_permutation_per_layer() {
        let r0 = expert_ranks(5, 0, 128);
        let mut sorted = r0.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..128).collect::<Vec<u64>>());
        assert_eq!(r0, expert_ranks(5, 0, 128), "deterministic");
        assert_ne!(r0, expert_ranks(5, 1, 128), "layers differ");
        assert_ne!(r0, expert_ranks(6, 0, 128), "seeds differ");
        assert_eq!(expert_ranks(5, 0, 1), [0]);
    }

    #[test]
    fn the_profile_falls_from_one_to_its_floor() {
        assert_eq!(rank_scale(0, 1.0), 1.0);
        assert_eq!(rank_scale(7, 0.0), 1.0);
        assert!((rank_scale(1, 1.0) - 0.125).abs() < 1e-3);
        let tail = rank_scale(127, 1.0);
        assert!(tail > 1e-4 && tail < 1.1e-4, "{tail}");
        for r in 0..127 {
            assert!(rank_scale(r + 1, 1.0) < rank_scale(r, 1.0), "rank {r}");
            assert!(rank_scale(r + 1, 2.0) <= rank_scale(r + 1, 1.0), "rank {r}");
        }
        assert!(router_row_scales(1, 0, 8, 0.0).is_empty());
        let scales = router_row_scales(1, 0, 8, 1.0);
        assert_eq!(scales.len(), 8);
        assert_eq!(scales.iter().filter(|&&s| s == 1.0).count(), 1);
    }
}
