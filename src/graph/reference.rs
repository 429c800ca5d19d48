//! The scalar reference of the row ops: RMS norm, RoPE, gated activations,
//! softmax, softcap, scale and add, argmax and top-k. Every op works in f32
//! in place on row-major `[rows, width]` data, in the order ggml's CPU
//! backend uses, and defines what every backend's kernel of it computes
//! (the SIMD row kernels follow these bit for bit where their docs say so).
//! The CPU backend runs them where it has no faster kernel. [`moe`] is
//! the reference of mixture-of-experts routing.

pub mod moe;

use half::f16;

use super::{RopeMode, NON_FINITE_ROW};

/// RMS-normalises each `width`-wide row of `x` in place and multiplies by `w`.
///
/// x: `[rows, width]`, w: `[width]`. Squares in f32 summed in f64 as ggml's
/// `ggml_compute_forward_rms_norm_f32`, in a fixed order that SIMD kernels
/// follow bit for bit: eight partial sums (lane `j` takes elements
/// `8i + j`), combined by [`combine8`], then the tail in order.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let width = w.len();
    if width == 0 {
        return;
    }
    for row in x.chunks_exact_mut(width) {
        let mut lanes = [0.0f64; 8];
        let mut blocks = row.chunks_exact(8);
        for b in &mut blocks {
            for (l, &v) in lanes.iter_mut().zip(b) {
                *l += f64::from(v * v);
            }
        }
        let mut sum = combine8(lanes);
        for &v in blocks.remainder() {
            sum += f64::from(v * v);
        }
        let scale = rms_scale(sum, width, eps);
        for (v, &g) in row.iter_mut().zip(w) {
            *v = (*v * scale) * g;
        }
    }
}

/// The eight partial sums of [`rms_norm`] as one: `((0+4) + (1+5)) + ((2+6) + (3+7))`.
#[inline]
pub fn combine8(l: [f64; 8]) -> f64 {
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

/// The factor of [`rms_norm`] for a row of `width` values whose squares sum to `sum`.
#[inline]
pub fn rms_scale(sum: f64, width: usize, eps: f32) -> f32 {
    let mean = (sum / width as f64) as f32;
    1.0 / (mean + eps).sqrt()
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
    let p = RopeParams {
        head_dim,
        n_rot,
        base,
        freq_scale,
        freq_factors: None,
        mode,
    };
    rope_with(x, pos, &p);
}

/// Everything RoPE needs.
#[derive(Debug, Clone, Copy)]
pub struct RopeParams<'a> {
    /// Width of a head.
    pub head_dim: usize,
    /// Rotated dims per head (even, `<= head_dim`).
    pub n_rot: usize,
    /// Frequency base.
    pub base: f32,
    /// Linear scaling of every angle (1 = none).
    pub freq_scale: f32,
    /// Per-pair divisors of the angle (`rope_freqs.weight` of Llama 3.1+), `[n_rot / 2]`.
    pub freq_factors: Option<&'a [f32]>,
    /// Pair layout.
    pub mode: RopeMode,
}

/// RoPE as ggml computes it: theta_i = pos * base^(-2i / n_rot) by repeated
/// f32 multiplication, divided by `freq_factors[i]`, times `freq_scale`.
///
/// x: `[rows, n_heads * head_dim]`, `pos[row]` the row's position.
pub fn rope_with(x: &mut [f32], pos: &[usize], p: &RopeParams<'_>) {
    if !p.rotates() {
        return;
    }
    let mut angles = vec![(0.0, 0.0); pos.len() * (p.n_rot / 2)];
    rope_angles(pos, p, &mut angles);
    rope_apply(x, &angles, p);
}

impl RopeParams<'_> {
    /// Whether these parameters rotate anything ([`rope_with`] leaves the
    /// values as they are otherwise).
    pub fn rotates(&self) -> bool {
        self.head_dim > 0 && self.n_rot >= 2 && self.n_rot <= self.head_dim
    }
}

/// The cosine and sine of each rotated pair's angle at each position of
/// `pos`, as [`rope_with`] computes them, into `out` (`n_rot / 2` pairs
/// per position; positions past `out` are left out).
pub fn rope_angles(pos: &[usize], p: &RopeParams<'_>, out: &mut [(f32, f32)]) {
    let half = p.n_rot / 2;
    if half == 0 {
        return;
    }
    let theta_scale = p.base.powf(-2.0 / p.n_rot as f32);
    for (cs, &pos) in out.chunks_exact_mut(half).zip(pos) {
        let mut theta = pos as f32;
        for (i, c) in cs.iter_mut().enumerate() {
            let ff = p
                .freq_factors
                .and_then(|f| f.get(i))
                .copied()
                .unwrap_or(1.0);
            let t = p.freq_scale * (theta / ff);
            *c = (t.cos(), t.sin());
            theta *= theta_scale;
        }
    }
}

/// Rotates each `head_dim`-wide head of `x` by the angles of its row
/// ([`rope_angles`]: `n_rot / 2` per row, rows as many as `angles` holds).
pub fn rope_apply(x: &mut [f32], angles: &[(f32, f32)], p: &RopeParams<'_>) {
    let (head_dim, n_rot) = (p.head_dim, p.n_rot);
    if !p.rotates() {
        return;
    }
    let half = n_rot / 2;
    let width = x.len() / (angles.len() / half).max(1);
    if width == 0 {
        return;
    }
    // Slices zipped, without indices: the compiler vectorizes both layouts.
    let turn = |x0: &mut f32, x1: &mut f32, &(cos, sin): &(f32, f32)| {
        let (a, b) = (*x0, *x1);
        *x0 = a * cos - b * sin;
        *x1 = a * sin + b * cos;
    };
    for (row, cs) in x.chunks_exact_mut(width).zip(angles.chunks_exact(half)) {
        for head in row.chunks_exact_mut(head_dim) {
            let head = &mut head[..n_rot];
            match p.mode {
                RopeMode::Norm => head.chunks_exact_mut(2).zip(cs).for_each(|(pair, c)| {
                    if let [x0, x1] = pair {
                        turn(x0, x1, c);
                    }
                }),
                RopeMode::Neox => {
                    let (lo, hi) = head.split_at_mut(half);
                    lo.iter_mut()
                        .zip(hi)
                        .zip(cs)
                        .for_each(|((x0, x1), c)| turn(x0, x1, c));
                }
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
    let table = gelu_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[usize::from(f16::from_f32(x).to_bits())] * u
        };
    }
}

/// ggml's `ggml_table_gelu_f16` as f32: entry `h` is
/// `f16(gelu_tanh(f32(f16::from_bits(h))))` for all 65536 `h`, built on
/// first use (256 KiB).
pub fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| f16::from_f32(gelu_tanh(f16::from_bits(h).to_f32())).to_f32())
            .collect()
    })
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

/// [`Op::Argmax`](super::Op::Argmax) of one row on the host, the reference of every backend's
/// kernel: the lowest index of the largest value, or [`NON_FINITE_ROW`]
/// when a value is not finite (or the row is empty).
pub fn argmax_row(row: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_finite() {
            return NON_FINITE_ROW;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(NON_FINITE_ROW, |(i, _)| i as u32)
}

/// [`Op::TopK`](super::Op::TopK) of one row on the host, the reference of every backend's
/// kernel: the `k` best `(index, value)` pairs, by value descending then
/// index ascending (a total order: the result never depends on the sort).
/// A row with a non-finite value gives `k` pairs `(NON_FINITE_ROW, NaN)`.
pub fn top_k_row(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    if row.iter().any(|v| !v.is_finite()) {
        return vec![(NON_FINITE_ROW, f32::NAN); k];
    }
    let by_value = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut pairs: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v))
        .collect();
    let k = k.min(pairs.len());
    if k < pairs.len() {
        pairs.select_nth_unstable_by(k, by_value);
        pairs.truncate(k);
    }
    pairs.sort_unstable_by(by_value);
    pairs
}
