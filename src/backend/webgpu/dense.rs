//! F32 and F16 weights: matrix products and row lookups (the float types
//! need no repacking; quantized types are the `quant` module's).

use super::backend::WebGpuBackend;
use super::buffer::GpuBuffer;
use super::ops::nth;
use super::shader::{ConstValue, PipelineKey};
use super::KernelSource;
use crate::backend::{BackendError, OpIo};
use crate::graph::Op;
use crate::quant::GgmlType;

const GET_ROWS: &str = include_str!("../../../shaders/dense_get_rows.wgsl");
const LINEAR: &str = include_str!("../../../shaders/dense_linear.wgsl");

/// Tokens one workgroup of the linear kernel computes together.
const TB: u32 = 4;
/// Workgroup size of the linear kernel.
const WG_LINEAR: u32 = 64;
/// Workgroup size of the lookup kernel.
const WG_ROWS: u32 = 256;

/// The kernel files of this module with constants, for validation.
pub fn kernel_sources() -> Vec<KernelSource> {
    vec![
        (
            "dense_get_rows",
            GET_ROWS,
            vec![("F16_TABLE", ConstValue::Bool(true))],
        ),
        (
            "dense_linear",
            LINEAR,
            vec![
                ("F16_WEIGHT", ConstValue::Bool(true)),
                ("ROUND_X", ConstValue::Bool(true)),
                ("TB", ConstValue::U32(TB)),
            ],
        ),
    ]
}

impl WebGpuBackend {
    /// Records a [`Op::MatMul`] or [`Op::GetRows`] over F32 / F16 weights.
    pub(super) fn record_dense(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
    ) -> Result<(), BackendError> {
        match *op {
            Op::MatMul { ty, k, n, exact } => self.linear(op, io, ty, k, n, exact),
            Op::GetRows { ty, width } => self.get_rows(op, io, ty, width),
            _ => Err(BackendError::UnsupportedOp {
                backend: "WebGPU".into(),
                op: op.describe(),
            }),
        }
    }

    fn linear(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
        ty: GgmlType,
        k: usize,
        n: usize,
        exact: bool,
    ) -> Result<(), BackendError> {
        let (x, w, y) = (
            nth(io.inputs, 0, op)?,
            nth(io.inputs, 1, op)?,
            nth(io.outputs, 0, op)?,
        );
        let f16 = ty == GgmlType::F16;
        let elem = if f16 { 2 } else { 4 };
        let tokens = x.len / 4 / k.max(1) as u64;
        if k == 0
            || x.len != tokens * k as u64 * 4
            || w.len != (n * k * elem) as u64
            || y.len != tokens * n as u64 * 4
        {
            return Err(BackendError::Shape(format!(
                "{op:?}: x of {} bytes, W of {}, y of {}",
                x.len, w.len, y.len
            )));
        }
        let key = PipelineKey::new("dense_linear", WG_LINEAR, &self.ctx.caps)
            .with_ty(if f16 { "f16" } else { "f32" })
            .with_const("F16_WEIGHT", ConstValue::Bool(f16))
            .with_const("ROUND_X", ConstValue::Bool(f16 && !exact))
            .with_const("TB", ConstValue::U32(TB));
        let pipeline = self.pipeline(&key, &[LINEAR]);
        let groups = n as u32 * (tokens as u32).div_ceil(TB);
        let d = super::backend::Dispatch {
            pipeline,
            params: vec![tokens as u32, k as u32, n as u32, 0],
            binds: [x, w, y]
                .iter()
                .map(|b| super::backend::Bind::whole(b))
                .collect(),
            groups: self.grid(groups),
        };
        self.enqueue(d);
        Ok(())
    }

    fn get_rows(
        &mut self,
        op: &Op,
        io: &OpIo<'_, GpuBuffer>,
        ty: GgmlType,
        width: usize,
    ) -> Result<(), BackendError> {
        let (table, ids, out) = (
            nth(io.inputs, 0, op)?,
            nth(io.inputs, 1, op)?,
            nth(io.outputs, 0, op)?,
        );
        let f16 = ty == GgmlType::F16;
        let elem = if f16 { 2 } else { 4 };
        let rows = ids.len / 4;
        let table_rows = table.len / (width * elem).max(1) as u64;
        if width == 0 || out.len != rows * width as u64 * 4 {
            return Err(BackendError::Shape(format!(
                "{op:?}: {rows} ids into an output of {} bytes",
                out.len
            )));
        }
        let key = PipelineKey::new("dense_get_rows", WG_ROWS, &self.ctx.caps)
            .with_ty(if f16 { "f16" } else { "f32" })
            .with_subgroups(false)
            .with_const("F16_TABLE", ConstValue::Bool(f16));
        let pipeline = self.pipeline(&key, &[GET_ROWS]);
        let total = (rows * width as u64) as u32;
        let d = super::backend::Dispatch {
            pipeline,
            params: vec![rows as u32, width as u32, table_rows as u32, 0],
            binds: [table, ids, out]
                .iter()
                .map(|b| super::backend::Bind::whole(b))
                .collect(),
            groups: self.grid(total.div_ceil(WG_ROWS)),
        };
        self.enqueue(d);
        Ok(())
    }
}
