//! Mixture of experts: the router and the seam behind which expert FFNs run.
//!
//! [`route`] turns router logits into each token's top-k experts and weights
//! (softmax over all experts, top-k, renormalised, as llama.cpp does for
//! Mixtral and Qwen3-MoE). [`group_by_expert`] inverts that into per-expert
//! token lists, so each expert's weights are read once per step.
//! [`ExpertFfn`] is the ONE seam through which expert computation goes: the
//! CPU model implements it over weights in memory; an expert cache (device
//! slots, host compute, prefetch) can take it over without the model changing.

use crate::graph::reference::softmax as softmax_in_place;

/// One token's chosen experts.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRoute {
    /// Expert ids, best first.
    pub experts: Vec<usize>,
    /// Their weights (sum 1).
    pub weights: Vec<f32>,
}

/// Routes every token: logits `[tokens, n_expert]` to its top-`k` experts.
///
/// Ties go to the lower expert id. Weights are the softmax probabilities of
/// the chosen experts divided by their sum.
pub fn route(logits: &[f32], n_expert: usize, k: usize) -> Vec<TokenRoute> {
    if n_expert == 0 {
        return Vec::new();
    }
    logits
        .chunks_exact(n_expert)
        .map(|row| {
            let mut p = row.to_vec();
            softmax_in_place(&mut p);
            let mut order: Vec<usize> = (0..n_expert).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            order.truncate(k.min(n_expert));
            let sum: f32 = order.iter().map(|&e| p[e]).sum();
            let weights = order.iter().map(|&e| p[e] / sum).collect();
            TokenRoute {
                experts: order,
                weights,
            }
        })
        .collect()
}

/// The tokens routed to one expert.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExpertBatch {
    /// Token rows (indices into the step's rows).
    pub rows: Vec<usize>,
    /// The routing weight of each row.
    pub weights: Vec<f32>,
}

/// Groups routed tokens by expert: entry `e` lists the rows that use expert `e`.
pub fn group_by_expert(routes: &[TokenRoute], n_expert: usize) -> Vec<ExpertBatch> {
    let mut groups = vec![ExpertBatch::default(); n_expert];
    for (row, r) in routes.iter().enumerate() {
        for (&e, &w) in r.experts.iter().zip(&r.weights) {
            if let Some(g) = groups.get_mut(e) {
                g.rows.push(row);
                g.weights.push(w);
            }
        }
    }
    groups
}

/// Runs expert FFNs: the seam an expert cache implements.
pub trait ExpertFfn {
    /// Computes expert `expert` of layer `layer` on `x` (`[rows, n_embd]`)
    /// into `out` (`[rows, n_embd]`, overwritten).
    fn run_expert(
        &self,
        layer: usize,
        expert: usize,
        x: &[f32],
        out: &mut [f32],
    ) -> crate::Result<()>;
}

/// The MoE FFN of one layer for all rows: routes, groups, runs each used
/// expert once on its rows, and sums the weighted outputs into `out`
/// (`[rows, n_embd]`, overwritten).
pub fn moe_forward(
    experts: &dyn ExpertFfn,
    layer: usize,
    router_logits: &[f32],
    n_expert: usize,
    k: usize,
    x: &[f32],
    out: &mut [f32],
) -> crate::Result<()> {
    let routes = route(router_logits, n_expert, k);
    moe_apply(experts, layer, &routes, n_expert, x, out)
}

/// The MoE FFN of one layer for rows already routed (`routes[r]`: row r's
/// experts): groups, runs each used expert once on its rows, and sums the
/// weighted outputs into `out` (`[rows, n_embd]`, overwritten).
pub fn moe_apply(
    experts: &dyn ExpertFfn,
    layer: usize,
    routes: &[TokenRoute],
    n_expert: usize,
    x: &[f32],
    out: &mut [f32],
) -> crate::Result<()> {
    let width = x.len() / routes.len().max(1);
    out.fill(0.0);
    for (e, g) in group_by_expert(routes, n_expert).iter().enumerate() {
        if g.rows.is_empty() {
            continue;
        }
        let mut xe = Vec::with_capacity(g.rows.len() * width);
        for &r in &g.rows {
            xe.extend_from_slice(&x[r * width..(r + 1) * width]);
        }
        let mut ye = vec![0.0f32; xe.len()];
        experts.run_expert(layer, e, &xe, &mut ye)?;
        for (i, (&r, &w)) in g.rows.iter().zip(&g.weights).enumerate() {
            for (o, &v) in out[r * width..(r + 1) * width]
                .iter_mut()
                .zip(&ye[i * width..])
            {
                *o += w * v;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_top_k_renormalised() {
        let logits = [0.0, 2.0, 1.0, 2.0, 5.0, 0.0, 0.0, 0.0];
        let r = route(&logits, 4, 2);
        assert_eq!(r[0].experts, vec![1, 3]);
        assert!((r[0].weights[0] - 0.5).abs() < 1e-6);
        assert_eq!(r[1].experts[0], 0);
        assert!((r[1].weights.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let g = group_by_expert(&r, 4);
        assert_eq!(g[1].rows, vec![0, 1]);
        assert_eq!(g[3].rows, vec![0]);
        assert!(g[2].rows.is_empty());
        assert_eq!(g[0].rows, vec![1]);
    }
}
