//! Matrix multiplication with a quantized or float weight.
//!
//! ggml's CPU scheme: the activations are quantized ONCE per matmul to the
//! weight type's `vec_dot_type` (Q8_0, Q8_1, Q8_K, fp16, bf16), then every
//! output element is one `vec_dot` of a weight row with an activation row.
//! Weights stay in their GGUF blocks (never a dequantized copy). The exact-f32
//! mode instead expands one weight row at a time into scratch and dots it with
//! the f32 activations (for tests).

use super::kernels::{KernelTable, WeightKernels};
use super::threads::Threads;
use crate::backend::BackendError;
use crate::quant::GgmlType;

/// A weight matrix in its GGUF encoding: `rows` rows of `cols` elements
/// (ggml `ne[0] = cols`). 3-D expert tensors are `n_expert * rows_per_expert` rows.
#[derive(Debug)]
pub struct Weight {
    /// Tensor name, for errors.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Elements per row (`ne[0]`).
    pub cols: usize,
    /// Number of rows (product of `ne[1..]`).
    pub rows: usize,
    /// Bytes per row.
    pub row_bytes: usize,
    /// The raw blocks, 4-byte aligned storage (`data_len` bytes used).
    data: Vec<u32>,
    data_len: usize,
    kernels: WeightKernels,
}

impl Weight {
    /// Wraps raw tensor bytes. Fails when the CPU backend has no kernel for
    /// `ty` or the byte count does not match the shape.
    pub fn new(
        table: &KernelTable,
        name: &str,
        ty: GgmlType,
        cols: usize,
        rows: usize,
        data: Vec<u32>,
        data_len: usize,
    ) -> Result<Self, BackendError> {
        let kernels = table
            .weight(ty)
            .ok_or_else(|| BackendError::UnsupportedType {
                tensor: name.to_string(),
                ty,
            })?;
        let be = ty.block_elems();
        if !cols.is_multiple_of(be) {
            return Err(BackendError::Shape(format!(
                "tensor '{name}': rows of {cols} elements are not whole {ty} blocks of {be}"
            )));
        }
        let row_bytes = cols / be * ty.block_bytes();
        if row_bytes * rows != data_len || data.len() * 4 < data_len {
            return Err(BackendError::Shape(format!(
                "tensor '{name}': {data_len} bytes do not hold {rows} rows of {cols} {ty}"
            )));
        }
        Ok(Self {
            name: name.to_string(),
            ty,
            cols,
            rows,
            row_bytes,
            data,
            data_len,
            kernels,
        })
    }

    /// All bytes of the weight.
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.data)[..self.data_len]
    }

    /// The raw bytes of row `r` (`r < rows`).
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Expands row `r` to f32 into `out` (`out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        (self.kernels.dequantize_row)(self.row(r), out);
    }
}

/// Activations quantized for one weight type: `n` rows of `row_bytes`.
#[derive(Debug)]
pub struct QuantizedActs {
    data: Vec<u32>,
    row_bytes: usize,
}

impl QuantizedActs {
    fn row(&self, t: usize) -> &[u8] {
        &bytemuck::cast_slice(&self.data)[t * self.row_bytes..(t + 1) * self.row_bytes]
    }
}

/// Quantizes `x` (`[n, cols]`) to the `vec_dot_type` of `w`.
pub fn quantize_acts(
    table: &KernelTable,
    w: &Weight,
    x: &[f32],
) -> Result<QuantizedActs, BackendError> {
    let at = w.kernels.vec_dot_type;
    let quantize = table
        .quantizer(at)
        .ok_or_else(|| BackendError::UnsupportedType {
            tensor: format!("activations of {}", w.name),
            ty: at,
        })?;
    let row_bytes = w.cols / at.block_elems() * at.block_bytes();
    let n = x.len() / w.cols.max(1);
    let mut data = vec![0u32; (row_bytes * n).div_ceil(4)];
    {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut data);
        for (xr, out) in x
            .chunks_exact(w.cols)
            .zip(bytes.chunks_exact_mut(row_bytes))
        {
            quantize(xr, out);
        }
    }
    Ok(QuantizedActs { data, row_bytes })
}

/// Rows of the output computed per parallel task.
const ROWS_PER_TASK: usize = 16;

/// `y = x · W[rows]ᵀ` for the weight rows `rows` (all rows of a matrix, or
/// one expert's slice of a 3-D tensor).
///
/// x: `[n, w.cols]`, y: `[n, rows.len()]`. `exact` selects the exact-f32 mode.
pub fn matmul(
    threads: &Threads,
    table: &KernelTable,
    w: &Weight,
    rows: std::ops::Range<usize>,
    x: &[f32],
    y: &mut [f32],
    exact: bool,
) -> Result<(), BackendError> {
    let n = x.len() / w.cols.max(1);
    let m = rows.len();
    if x.len() != n * w.cols || y.len() != n * m || rows.end > w.rows {
        return Err(BackendError::Shape(format!(
            "matmul with '{}' ([{}, {}]): x has {} values, y {}, rows {rows:?}",
            w.name,
            w.rows,
            w.cols,
            x.len(),
            y.len()
        )));
    }
    if n == 0 || m == 0 {
        return Ok(());
    }
    // yt: [rows, n], computed in parallel over rows, then transposed.
    let mut yt = vec![0.0f32; m * n];
    let chunk = ROWS_PER_TASK * n;
    if exact {
        threads.for_chunks(&mut yt, chunk, |ci, out| {
            let mut scratch = vec![0.0f32; w.cols];
            for (k, orow) in out.chunks_exact_mut(n).enumerate() {
                w.dequantize_row(rows.start + ci * ROWS_PER_TASK + k, &mut scratch);
                for (t, o) in orow.iter_mut().enumerate() {
                    let xr = &x[t * w.cols..(t + 1) * w.cols];
                    *o = super::kernels::float::vec_dot_f32(&scratch, xr);
                }
            }
        });
    } else {
        let acts = quantize_acts(table, w, x)?;
        let dot = w.kernels.vec_dot;
        threads.for_chunks(&mut yt, chunk, |ci, out| {
            // Tokens outer: the task's few weight rows stay in L1 while each
            // activation row is read once per task.
            let first = rows.start + ci * ROWS_PER_TASK;
            let n_rows = out.len() / n;
            for t in 0..n {
                let a = acts.row(t);
                for k in 0..n_rows {
                    out[k * n + t] = dot(w.row(first + k), a);
                }
            }
        });
    }
    for (r, col) in yt.chunks_exact(n).enumerate() {
        for (t, &v) in col.iter().enumerate() {
            y[t * m + r] = v;
        }
    }
    Ok(())
}
