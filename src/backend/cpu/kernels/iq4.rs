//! Scalar kernels of the non-linear 4-bit formats IQ4_NL (dot with Q8_0)
//! and IQ4_XS (dot with Q8_K).

use super::fp16;
use crate::quant::blocks::{BlockIQ4NL, BlockIQ4XS, BlockQ8K, BlockQ8_0, KVALUES_IQ4NL, QK_K};

/// Level of nibble `q`.
#[inline]
fn kv(q: u8) -> i32 {
    i32::from(KVALUES_IQ4NL[usize::from(q & 0xF)])
}

/// Integer dot of 16 packed nibbles (elements `j`, `j + 16`) with 32 int8.
#[inline]
fn idot_nibbles(qs: &[u8], q8: &[i8]) -> i32 {
    // Wrapping ops: the sums stay far below 2^31 and vectorize unchecked.
    let mut sumi = 0i32;
    for j in 0..16 {
        sumi = sumi
            .wrapping_add(kv(qs[j]).wrapping_mul(i32::from(q8[j])))
            .wrapping_add(kv(qs[j] >> 4).wrapping_mul(i32::from(q8[j + 16])));
    }
    sumi
}

/// The six-bit scale of sub-block `ib` (0..8) of an IQ4_XS block, minus 32.
#[inline]
pub(super) fn xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    let high = ((b.scales_h >> (2 * ib)) & 3) as u8;
    i32::from(low | (high << 4)) - 32
}

/// Dot of an IQ4_NL row with a Q8_0 row of the same length.
pub fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let sumi = idot_nibbles(&bx.qs, &by.qs);
        sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32;
    }
    sumf
}

/// Dot of an IQ4_XS row with a Q8_K row of the same length.
pub fn vec_dot_iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let d4d8 = fp16(bx.d) * by.d;
        for ib in 0..QK_K / 32 {
            let sumi = idot_nibbles(&bx.qs[16 * ib..16 * ib + 16], &by.qs[32 * ib..32 * ib + 32]);
            sumf += d4d8 * xs_scale(bx, ib) as f32 * sumi as f32;
        }
    }
    sumf
}

/// Expands IQ4_NL blocks to f32. Preconditions: `y.len() == x.len() * 32`.
pub fn dequantize_row_iq4_nl(x: &[BlockIQ4NL], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(32)) {
        let d = fp16(b.d);
        for j in 0..16 {
            y[j] = d * kv(b.qs[j]) as f32;
            y[j + 16] = d * kv(b.qs[j] >> 4) as f32;
        }
    }
}

/// Expands IQ4_XS blocks to f32. Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_iq4_xs(x: &[BlockIQ4XS], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16(b.d);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let dl = d * xs_scale(b, ib) as f32;
            let qs = &b.qs[16 * ib..16 * ib + 16];
            for j in 0..16 {
                y[j] = dl * kv(qs[j]) as f32;
                y[j + 16] = dl * kv(qs[j] >> 4) as f32;
            }
        }
    }
}
