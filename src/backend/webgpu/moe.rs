//! [`Op::MoeExperts`] on WebGPU: the expert FFNs of one MoE layer as
//! products grouped by expert over the routed ids, which stay on the
//! device (ggml's `mul_mat_id`).
//!
//! Five dispatches: the entries (token, slot) are listed by expert
//! (`moe_route.wgsl`, one workgroup); gate and up rows of each used expert
//! are computed for the entries routed to it (`moe_matvec.wgsl`: one pass
//! over an expert's rows serves all of its entries, a few at a time); the
//! gated activation runs over every entry; down likewise; and each token's
//! entries are summed with their router weights (`moe_route.wgsl`, mode 1).
//! An id at or past the layer's experts is left out (an expert computed
//! elsewhere), as on the other backends.

use super::backend::WebGpuBackend;
use super::buffer::GpuBuffer;
use super::ops::{nth, WG_ROW};
use super::quant::{MoeMatvecArgs, WeightPart};
use crate::backend::{BackendError, BufKind, OpIo};
use crate::graph::Op;
use crate::quant::GgmlType;

/// The router's ends: listing entries by expert, and the weighted sum.
pub(super) const MOE_ROUTE: &str = include_str!("../../../shaders/moe_route.wgsl");

/// Workgroup size of the weighted sum (one invocation per output value).
const WG_COMBINE: u32 = 256;

/// A view of the first `bytes` of a kept scratch buffer, so that kernels
/// that size their work by their buffers see the op's own size.
fn view(b: &GpuBuffer, bytes: u64) -> GpuBuffer {
    GpuBuffer {
        raw: b.raw.clone(),
        offset: b.offset,
        len: bytes,
        kind: BufKind::Activations,
    }
}

impl WebGpuBackend {
    /// Whether the experts of `op` run here: every weight of a supported
    /// type, each stacked weight in one binding.
    pub(super) fn supports_moe(&self, op: &Op) -> bool {
        let Op::MoeExperts {
            n_expert,
            n_embd,
            n_ff,
            tys,
            ..
        } = *op
        else {
            return false;
        };
        let shapes = [(n_embd, n_ff), (n_embd, n_ff), (n_ff, n_embd)];
        tys.iter().zip(shapes).all(|(&ty, (cols, rows))| {
            super::weights::supports(ty, cols)
                && self
                    .placement(ty, cols, n_expert * rows)
                    .is_ok_and(|p| p.n_parts() == 1)
        })
    }

    /// Records [`Op::MoeExperts`].
    pub(super) fn moe_experts(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<(), BackendError> {
        let Op::MoeExperts {
            n_expert,
            k,
            n_embd,
            n_ff,
            act,
            tys,
            ..
        } = *op
        else {
            return Err(BackendError::UnsupportedOp {
                backend: "WebGPU".into(),
                op: op.describe(),
            });
        };
        let bad = |what: String| BackendError::Shape(format!("{op:?}: {what}"));
        let (x, ids, wts) = (
            nth(io.inputs, 0, op)?,
            nth(io.inputs, 1, op)?,
            nth(io.inputs, 2, op)?,
        );
        let out = nth(io.outputs, 0, op)?;
        let tokens = x.len / 4 / n_embd.max(1) as u64;
        let entries = tokens * k as u64;
        if k == 0
            || x.len != tokens * n_embd as u64 * 4
            || ids.len / 4 < entries
            || wts.len / 4 < entries
            || out.len < x.len
        {
            return Err(bad(format!(
                "x of {} bytes, ids of {}, weights of {}",
                x.len, ids.len, wts.len
            )));
        }
        if tokens == 0 {
            return Ok(());
        }
        let shapes = [(n_embd, n_ff), (n_embd, n_ff), (n_ff, n_embd)];
        let mut parts: Vec<WeightPart<'_>> = Vec::with_capacity(3);
        for (i, (&ty, (cols, rows))) in tys.iter().zip(shapes).enumerate() {
            let w = nth(io.inputs, 3 + i, op)?;
            let place = self.placement(ty, cols, n_expert * rows)?;
            if place.n_parts() != 1 || place.bytes() != w.len {
                return Err(bad(format!(
                    "weight {i} of {} bytes is not one packed {ty} part of {n_expert} x {rows} rows",
                    w.len
                )));
            }
            parts.push(WeightPart {
                buffer: &w.raw,
                offset: w.offset,
                first_row: 0,
                rows: (n_expert * rows) as u64,
            });
        }
        let ne = n_expert as u64;
        let route = self.scratch((3 * ne + entries) * 4, |b| &mut b.moe_scratch[0])?;
        let g = self.scratch(entries * n_ff as u64 * 4, |b| &mut b.moe_scratch[1])?;
        let u = self.scratch(entries * n_ff as u64 * 4, |b| &mut b.moe_scratch[2])?;
        let d = self.scratch(entries * n_embd as u64 * 4, |b| &mut b.moe_scratch[3])?;
        let (g, u) = (
            view(&g, entries * n_ff as u64 * 4),
            view(&u, entries * n_ff as u64 * 4),
        );
        let unused = self.unused_buffer()?;
        let params =
            |mode_width: u64| vec![entries as u32, n_expert as u32, k as u32, mode_width as u32];
        let list = self
            .key("moe_route", WG_ROW)
            .with_subgroups(false)
            .with_const("MODE", super::shader::ConstValue::U32(0));
        self.dispatch(
            &list,
            MOE_ROUTE,
            params(0),
            &[ids, &route, wts, ids, &unused],
            1,
        );
        let kernels = self.quant.clone();
        let product = |ty: GgmlType, kk: usize, n: usize, per_entry: bool| MoeMatvecArgs {
            ty,
            k: kk as u64,
            n: n as u64,
            n_expert: ne,
            entries,
            k_used: k as u64,
            tokens,
            per_entry,
            x,
            w: parts[0],
            y: &g,
            route: &route,
        };
        kernels.encode_moe_matvec(self, &product(tys[0], n_embd, n_ff, false))?;
        kernels.encode_moe_matvec(
            self,
            &MoeMatvecArgs {
                w: parts[1],
                y: &u,
                ..product(tys[1], n_embd, n_ff, false)
            },
        )?;
        let job = self.gated_job(op, [&g, &u, &g], act)?;
        self.emit_gated(job);
        kernels.encode_moe_matvec(
            self,
            &MoeMatvecArgs {
                x: &g,
                w: parts[2],
                y: &d,
                ..product(tys[2], n_ff, n_embd, true)
            },
        )?;
        let sum = self
            .key("moe_route", WG_COMBINE)
            .with_subgroups(false)
            .with_const("MODE", super::shader::ConstValue::U32(1));
        let values = u32::try_from(tokens * n_embd as u64)
            .map_err(|_| bad("too many output values for one dispatch".into()))?;
        self.dispatch(
            &sum,
            MOE_ROUTE,
            params(n_embd as u64),
            &[ids, &route, wts, &d, out],
            values.div_ceil(WG_COMBINE),
        );
        Ok(())
    }
}
