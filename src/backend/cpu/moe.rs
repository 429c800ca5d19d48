//! The CPU backend's MoE ops: the router ([`Op::MoeTopK`], as
//! [`crate::graph::reference::moe::route`] defines it) and the expert FFNs
//! ([`Op::MoeExperts`]) as a grouped product over the routed ids (ggml's
//! `mul_mat_id`): the tokens routed to an expert share one pass over its
//! rows of the stacked weights.

use super::backend::{nth, CpuBackend, CpuBuffer};
use super::matmul::{matmul, Weight};
use crate::backend::{BackendError, OpIo};
use crate::graph::reference::moe::{route, TokenRoute};
use crate::graph::{Activation, Op};

fn unsupported(op: &Op) -> BackendError {
    BackendError::UnsupportedOp {
        backend: "CPU".into(),
        op: op.describe(),
    }
}

impl CpuBackend {
    pub(super) fn moe_top_k(&self, op: &Op, io: &OpIo<'_, CpuBuffer>) -> Result<(), BackendError> {
        let Op::MoeTopK { n_expert, k } = *op else {
            return Err(unsupported(op));
        };
        let logits = nth(io.inputs, 0, op)?.f32s()?;
        if n_expert == 0 || k == 0 || k > n_expert || logits.len() % n_expert != 0 {
            return Err(BackendError::Shape(format!(
                "{op:?}: {} logits",
                logits.len()
            )));
        }
        let routes = route(&logits, n_expert, k);
        let ids: Vec<u32> = routes
            .iter()
            .flat_map(|r| r.experts.iter().map(|&e| e as u32))
            .collect();
        let weights: Vec<f32> = routes.iter().flat_map(|r| r.weights.clone()).collect();
        nth(io.outputs, 0, op)?.set_f32s(bytemuck::cast_slice(&ids))?;
        nth(io.outputs, 1, op)?.set_f32s(&weights)
    }

    pub(super) fn moe_experts(
        &self,
        op: &Op,
        io: &OpIo<'_, CpuBuffer>,
    ) -> Result<(), BackendError> {
        let Op::MoeExperts {
            n_expert,
            k,
            n_embd,
            n_ff,
            act,
            tys,
            exact,
            ..
        } = *op
        else {
            return Err(unsupported(op));
        };
        let x = nth(io.inputs, 0, op)?.f32s()?;
        let ids = nth(io.inputs, 1, op)?.u32s()?;
        let wts = nth(io.inputs, 2, op)?.f32s()?;
        let tokens = x.len() / n_embd.max(1);
        if k == 0 || x.len() != tokens * n_embd || ids.len() != tokens * k || wts.len() != ids.len()
        {
            return Err(BackendError::Shape(format!(
                "{op:?}: x of {}, ids of {}, weights of {}",
                x.len(),
                ids.len(),
                wts.len()
            )));
        }
        let w =
            |i: usize, cols: usize| nth(io.inputs, 3 + i, op)?.weight(&self.table, tys[i], cols);
        let (gate, up, down) = (w(0, n_embd)?, w(1, n_embd)?, w(2, n_ff)?);
        if gate.rows != n_expert * n_ff || up.rows != gate.rows || down.rows != n_expert * n_embd {
            return Err(BackendError::Shape(format!(
                "{op:?}: expert weights of other shapes"
            )));
        }
        let experts = Experts {
            backend: self,
            gate: &gate,
            up: &up,
            down: &down,
            n_ff,
            n_embd,
            act,
            exact,
        };
        let routes = routes_of(&ids, &wts, k);
        let mut out = vec![0.0f32; x.len()];
        experts.apply(&routes, n_expert, &x, &mut out)?;
        nth(io.outputs, 0, op)?.set_f32s(&out)
    }
}

/// The routes of [`Op::MoeTopK`]'s outputs (`ids`, `wts`: `[tokens, k]`).
fn routes_of(ids: &[u32], wts: &[f32], k: usize) -> Vec<TokenRoute> {
    ids.chunks_exact(k)
        .zip(wts.chunks_exact(k))
        .map(|(e, w)| TokenRoute {
            experts: e.iter().map(|&e| e as usize).collect(),
            weights: w.to_vec(),
        })
        .collect()
}

/// One layer's expert FFNs over their stacked weights.
struct Experts<'a> {
    backend: &'a CpuBackend,
    gate: &'a Weight,
    up: &'a Weight,
    down: &'a Weight,
    n_ff: usize,
    n_embd: usize,
    act: Activation,
    exact: bool,
}

impl Experts<'_> {
    /// The MoE FFN of all rows already routed (`routes[r]`: row r's
    /// experts): each used expert runs once on the rows routed to it, in
    /// expert order; then each row sums its experts' weighted outputs in
    /// its route's order (as ggml and the GPU backends do), so the sum does
    /// not depend on where the experts sit among the stacked weights (the
    /// expert cache's device slots). Ids past `n_expert` are left out
    /// (experts computed elsewhere). `out` is `[rows, n_embd]`, overwritten.
    fn apply(
        &self,
        routes: &[TokenRoute],
        n_expert: usize,
        x: &[f32],
        out: &mut [f32],
    ) -> Result<(), BackendError> {
        let width = self.n_embd;
        let k = routes.first().map_or(0, |r| r.experts.len());
        // The (row, position in its route) pairs of each expert.
        let mut groups: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_expert];
        for (r, route) in routes.iter().enumerate() {
            for (j, &e) in route.experts.iter().enumerate() {
                if let Some(g) = groups.get_mut(e) {
                    g.push((r, j));
                }
            }
        }
        let mut parts = vec![0.0f32; routes.len() * k * width];
        for (e, g) in groups.iter().enumerate() {
            if g.is_empty() {
                continue;
            }
            let mut xe = Vec::with_capacity(g.len() * width);
            for &(r, _) in g {
                xe.extend_from_slice(&x[r * width..(r + 1) * width]);
            }
            let mut ye = vec![0.0f32; xe.len()];
            self.run_expert(e, &xe, &mut ye)?;
            for (i, &(r, j)) in g.iter().enumerate() {
                let at = (r * k + j) * width;
                parts[at..at + width].copy_from_slice(&ye[i * width..(i + 1) * width]);
            }
        }
        for (r, route) in routes.iter().enumerate() {
            let o = &mut out[r * width..(r + 1) * width];
            o.fill(0.0);
            for (j, (&e, &w)) in route.experts.iter().zip(&route.weights).enumerate() {
                if e >= n_expert {
                    continue;
                }
                let at = (r * k + j) * width;
                for (o, &v) in o.iter_mut().zip(&parts[at..at + width]) {
                    *o += w * v;
                }
            }
        }
        Ok(())
    }

    /// Expert `e`'s FFN on `x` (`[rows, n_embd]`) into `out` (overwritten).
    fn run_expert(&self, e: usize, x: &[f32], out: &mut [f32]) -> Result<(), BackendError> {
        let (b, ff, d) = (self.backend, self.n_ff, self.n_embd);
        let n = x.len() / d.max(1);
        let (mut g, mut u) = (vec![0.0; n * ff], vec![0.0; n * ff]);
        let mm = |w: &Weight, rows: std::ops::Range<usize>, x: &[f32], y: &mut [f32]| {
            matmul(&b.threads, &b.table, w, rows, x, y, self.exact)
        };
        mm(self.gate, e * ff..(e + 1) * ff, x, &mut g)?;
        mm(self.up, e * ff..(e + 1) * ff, x, &mut u)?;
        let rows = b.rows();
        match self.act {
            Activation::Silu => rows.silu_mul(&b.threads, &mut g, &u),
            Activation::GeluTanh => rows.gelu_mul(&b.threads, &mut g, &u),
        }
        mm(self.down, e * d..(e + 1) * d, &g, out)
    }
}
