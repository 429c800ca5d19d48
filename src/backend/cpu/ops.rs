//! Element-wise and row-wise ops of the CPU backend: RMS norm, RoPE, gated
//! activations, softmax, scale and add. Every op works in f32 in place on
//! row-major `[rows, width]` data, in the order ggml's CPU backend uses.

use half::f16;

pub use crate::graph::RopeMode;

/// RMS-normalises each `width`-wide row of `x` in place and multiplies by `w`.
///
/// x: `[rows, width]`, w: `[width]`. Sums in f64 as ggml's `ggml_compute_forward_rms_norm_f32`.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let width = w.len();
    if width == 0 {
        return;
    }
    for row in x.chunks_exact_mut(width) {
        // Squares in f32, summed in f64, as ggml does.
        let sum: f64 = row.iter().map(|&v| f64::from(v * v)).sum();
        let mean = (sum / width as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
}

/// Rotates each `head_dim`-wide head of `x` by its row's position.
///
/// x: `[rows, n_heads * head_dim]`, `pos[row]` the row's position. Only the
/// first `n_rot` dims of a head rotate; theta_i = pos * base^(-2i / n_rot) * scale.
pub fn rope(
    x: &mut [f32],
    pos: &[usize],
    head_dim: usize,
    n_rot: usize,
    base: f32,
    mode: RopeMode,
) {
    rope_scaled(x, pos, head_dim, n_rot, base, 1.0, mode);
}

/// [`rope`] with linear position scaling: every angle times `freq_scale`.
pub fn rope_scaled(
    x: &mut [f32],
    pos: &[usize],
    head_dim: usize,
    n_rot: usize,
    base: f32,
    freq_scale: f32,
    mode: RopeMode,
) {
    if head_dim == 0 || n_rot < 2 {
        return;
    }
    let width = x.len() / pos.len().max(1);
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut cs = vec![(0.0f32, 0.0f32); n_rot / 2];
    for (row, &p) in x.chunks_exact_mut(width).zip(pos) {
        // ggml computes theta by repeated multiplication in f32.
        let mut theta = p as f32;
        for c in cs.iter_mut() {
            let t = if freq_scale == 1.0 {
                theta
            } else {
                theta * freq_scale
            };
            *c = (t.cos(), t.sin());
            theta *= theta_scale;
        }
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(cos, sin)) in cs.iter().enumerate() {
                let (a, b) = match mode {
                    RopeMode::Norm => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + n_rot / 2),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// `gate = silu(gate) * up`, element-wise (ggml's `swiglu`).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// ggml's `ggml_gelu_f32` (tanh approximation).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// `gate = gelu_tanh(gate) * up` as ggml's CPU `geglu`: the GELU input is
/// rounded to fp16 and the result read from an fp16 table (so rounded too).
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            let xh = f16::from_f32(x).to_f32();
            f16::from_f32(gelu_tanh(xh)).to_f32() * u
        };
    }
}

/// `x += y` element-wise.
pub fn add(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Adds `bias` to each `bias.len()`-wide row of `x`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    if bias.is_empty() {
        return;
    }
    for row in x.chunks_exact_mut(bias.len()) {
        add(row, bias);
    }
}

/// `x *= s` element-wise.
pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// `x = cap * tanh(x / cap)` element-wise (logit / attention softcapping).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

/// Softmax of one row in place (max-subtracted, sum in f64 as ggml).
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}
