//! Unit tests of the 32-element formats (through the dispatching API, so the
//! dispatch is covered too).

use super::*;
use crate::quant::reference::testutil::{ggml_rmse, ggml_test_data, stress_rows, Rng};
use crate::quant::reference::{dequantize, quantize, vec_dot, vec_dot_type};
use crate::quant::GgmlType;
use half::f16;

const TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
];

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = Vec::new();
    quantize(ty, x, &mut q).expect("quantize");
    assert_eq!(q.len(), x.len() / ty.block_elems() * ty.block_bytes());
    let mut y = vec![0.0; x.len()];
    dequantize(ty, &q, &mut y).expect("dequantize");
    y
}

/// Largest error allowed in a block, from the format's step: symmetric formats
/// map `amax` to the end of the range (one step of error on the clamped side),
/// asymmetric ones have half a step of `(max - min) / levels`; plus the f16
/// rounding of the scale (2^-11 relative, over at most 127 steps) and of the min.
fn block_bound(ty: GgmlType, xb: &[f32]) -> f32 {
    let amax = xb.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let (min, max) = xb
        .iter()
        .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let f16_slack = amax * 2f32.powi(-10);
    let step = match ty {
        GgmlType::Q4_0 => amax / 8.0,
        GgmlType::Q5_0 => amax / 16.0,
        GgmlType::Q4_1 => (max - min) / 15.0 / 2.0,
        GgmlType::Q5_1 => (max - min) / 31.0 / 2.0,
        _ => amax / 127.0 / 2.0,
    };
    step * 1.001 + f16_slack
}

#[test]
fn round_trip_within_the_format_step() {
    let seed = 42;
    let mut rng = Rng::new(seed);
    for (r, x) in stress_rows(&mut rng, 512).iter().enumerate() {
        for ty in TYPES {
            let y = round_trip(ty, x);
            for (b, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let bound = block_bound(ty, xb);
                for (j, (&a, &c)) in xb.iter().zip(yb).enumerate() {
                    assert!(
                        (a - c).abs() <= bound,
                        "seed {seed} {ty} row {r} block {b} elem {j}: {a} -> {c}, bound {bound}"
                    );
                }
            }
        }
    }
}

#[test]
fn ggml_total_error_bound() {
    // test-quantize-fns.cpp: MAX_QUANTIZATION_TOTAL_ERROR on its cosine data.
    let x = ggml_test_data(0.0, 32 * 128);
    for ty in TYPES {
        let err = ggml_rmse(&x, &round_trip(ty, &x));
        assert!(err < 0.002, "{ty}: {err}");
        assert!(err > 0.0, "{ty} is lossy");
    }
}

#[test]
fn constant_and_all_negative_blocks() {
    // A constant block: Q4_0 / Q5_0 hit it exactly (d = max / -8 or -16 is exact
    // in f16 here), Q4_1 / Q5_1 give d = 0 and reproduce it from the min; Q8
    // scales are `max / 127`, exact only to f16 precision.
    let x = vec![0.375f32; 32];
    for ty in TYPES {
        let y = round_trip(ty, &x);
        if matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1) {
            assert!(
                y.iter()
                    .all(|&v| (v - 0.375).abs() <= 0.375 * 2f32.powi(-11)),
                "{ty}: {y:?}"
            );
        } else {
            assert_eq!(y, x, "{ty}");
        }
    }
    // All negative: the extreme maps to q = 0 for Q4_0 (d > 0 since max < 0).
    let x: Vec<f32> = (0..32).map(|j| -1.0 - j as f32 / 8.0).collect();
    let mut q = vec![BlockQ4_0 {
        d: f16::ZERO,
        qs: [0; 16],
    }];
    quantize_row_q4_0(&x, &mut q);
    assert!(q[0].d.to_f32() > 0.0);
    assert_eq!(q[0].qs[15] >> 4, 0, "the most negative value is quant 0");
}

#[test]
fn q4_0_known_block() {
    // x_j = j - 16: max = -16, d = 2, q = trunc(x / 2 + 8.5), clamped to 15.
    let x: Vec<f32> = (0..32).map(|j| j as f32 - 16.0).collect();
    let mut q = vec![BlockQ4_0 {
        d: f16::ZERO,
        qs: [0; 16],
    }];
    quantize_row_q4_0(&x, &mut q);
    assert_eq!(q[0].d.to_bits(), 0x4000);
    let expect: Vec<u8> = (0..32)
        .map(|j| ((x[j] / 2.0 + 8.5) as u8).min(15))
        .collect();
    for j in 0..16 {
        assert_eq!(q[0].qs[j], expect[j] | expect[j + 16] << 4, "byte {j}");
    }
    assert_eq!(q[0].qs[0], 0x80);
}

#[test]
fn q5_high_bits_and_q8_1_sum() {
    let seed = 5;
    let mut rng = Rng::new(seed);
    let x: Vec<f32> = (0..64).map(|_| rng.normal()).collect();
    let mut q5 = vec![
        BlockQ5_0 {
            d: f16::ZERO,
            qh: [0; 4],
            qs: [0; 16]
        };
        2
    ];
    quantize_row_q5_0(&x, &mut q5);
    for (b, blk) in q5.iter().enumerate() {
        let id = 1.0 / (signed_absmax(&x[b * 32..b * 32 + 32]).0 / -16.0);
        for j in 0..32 {
            let want = ((x[b * 32 + j] * id + 16.5) as i32).min(31);
            assert_eq!(
                q5_value(&blk.qs, blk.qh, j),
                want,
                "seed {seed} block {b} elem {j}"
            );
        }
    }
    let mut q81 = vec![
        BlockQ8_1 {
            d: f16::ZERO,
            s: f16::ZERO,
            qs: [0; 32]
        };
        2
    ];
    quantize_row_q8_1(&x, &mut q81);
    for blk in &q81 {
        let sum: i32 = blk.qs.iter().map(|&v| i32::from(v)).sum();
        let want = sum as f32 * blk.d.to_f32();
        assert!(
            (blk.s.to_f32() - want).abs() <= want.abs() * 2e-3 + 1e-6,
            "seed {seed}"
        );
    }
}

fn dequantized(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f64> {
    let mut y = vec![0.0f32; n];
    dequantize(ty, bytes, &mut y).expect("dequantize");
    y.into_iter().map(f64::from).collect()
}

#[test]
fn dots_match_the_dequantized_dot() {
    let seed = 9;
    let mut rng = Rng::new(seed);
    let n = 1024;
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        for scale in [0.01f32, 1.0, 50.0] {
            let w: Vec<f32> = (0..n).map(|_| rng.normal() * scale + 0.1 * scale).collect();
            let a: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            let (mut wq, mut aq) = (Vec::new(), Vec::new());
            quantize(ty, &w, &mut wq).expect("weights");
            quantize(vec_dot_type(ty), &a, &mut aq).expect("activations");
            let got = f64::from(vec_dot(ty, &wq, &aq).expect("dot"));
            let (wd, ad) = (
                dequantized(ty, &wq, n),
                dequantized(vec_dot_type(ty), &aq, n),
            );
            let exact: f64 = wd.iter().zip(&ad).map(|(x, y)| x * y).sum();
            let mag: f64 = wd.iter().zip(&ad).map(|(x, y)| (x * y).abs()).sum();
            // *_1 dots use the stored f16 `s = fp16(d * sum q)`, not `fp16(d) * sum q`:
            // a 2^-11 relative difference on each block's min term.
            // Per block that is |m| * |s - d * sum q| <= max|w| * 2^-10 * 32 * max|a|.
            let mins: f64 = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                let amax = |v: &[f64]| v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                wd.chunks(32)
                    .zip(ad.chunks(32))
                    .map(|(x, y)| amax(x) * 32.0 * amax(y) / 1024.0)
                    .sum()
            } else {
                0.0
            };
            assert!(
                (got - exact).abs() <= 1e-5 * mag + mins,
                "seed {seed} {ty} scale {scale}: {got} vs {exact}"
            );
            // And close to the f32 dot of the unquantized data (ggml's dot error bound).
            let f: f64 = w
                .iter()
                .zip(&a)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            assert!(
                ((got - f) / f64::from(scale)).abs() / n as f64 <= 0.02,
                "seed {seed} {ty}"
            );
        }
    }
}

#[test]
fn ggml_dot_error_bound() {
    let (x, a) = (ggml_test_data(0.0, 32 * 128), ggml_test_data(1.0, 32 * 128));
    let f: f64 = x
        .iter()
        .zip(&a)
        .map(|(&p, &q)| f64::from(p) * f64::from(q))
        .sum();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        let (mut wq, mut aq) = (Vec::new(), Vec::new());
        quantize(ty, &x, &mut wq).expect("weights");
        quantize(vec_dot_type(ty), &a, &mut aq).expect("activations");
        let got = f64::from(vec_dot(ty, &wq, &aq).expect("dot"));
        assert!(
            (got - f).abs() / x.len() as f64 <= 0.02,
            "{ty}: {got} vs {f}"
        );
    }
}

/// Blocks with d = 1 (and m = 0): every step is an integer below 2^24, so the
/// dot is exact and equals the integer dot product of the quants.
#[test]
fn dots_are_exact_on_integer_blocks() {
    let seed = 13;
    let mut rng = Rng::new(seed);
    let one = f16::ONE;
    let nb = 8;
    let a8: Vec<BlockQ8_0> = (0..nb)
        .map(|_| BlockQ8_0 {
            d: one,
            qs: std::array::from_fn(|_| (rng.below(255) as i32 - 127) as i8),
        })
        .collect();
    let a81: Vec<BlockQ8_1> = a8
        .iter()
        .map(|b| BlockQ8_1 {
            d: one,
            s: f16::from_f32(b.qs.iter().map(|&v| f32::from(v)).sum()),
            qs: b.qs,
        })
        .collect();
    let mut bytes = || -> [u8; 16] { std::array::from_fn(|_| rng.below(256) as u8) };
    let q40: Vec<BlockQ4_0> = (0..nb)
        .map(|_| BlockQ4_0 {
            d: one,
            qs: bytes(),
        })
        .collect();
    let q41: Vec<BlockQ4_1> = (0..nb)
        .map(|_| BlockQ4_1 {
            d: one,
            m: f16::ZERO,
            qs: bytes(),
        })
        .collect();
    let q50: Vec<BlockQ5_0> = (0..nb)
        .map(|b| BlockQ5_0 {
            d: one,
            qh: (0x9E37_79B9u32 ^ (b as u32 * 0x1234_5678)).to_le_bytes(),
            qs: bytes(),
        })
        .collect();
    let q51: Vec<BlockQ5_1> = q50
        .iter()
        .map(|b| BlockQ5_1 {
            d: one,
            m: f16::ZERO,
            qh: b.qh,
            qs: b.qs,
        })
        .collect();
    let w8: Vec<BlockQ8_0> = (0..nb)
        .map(|_| BlockQ8_0 {
            d: one,
            qs: std::array::from_fn(|_| (rng.below(256) as i32 - 128) as i8),
        })
        .collect();

    let acts: Vec<i64> = a8.iter().flat_map(|b| b.qs.map(i64::from)).collect();
    let idot = |w: Vec<f32>| -> f32 {
        let s: i64 = w.iter().zip(&acts).map(|(&x, &y)| x as i64 * y).sum();
        s as f32
    };
    let deq = |f: &dyn Fn(&mut [f32])| {
        let mut y = vec![0.0; nb * 32];
        f(&mut y);
        y
    };
    assert_eq!(
        vec_dot_q4_0_q8_0(&q40, &a8),
        idot(deq(&|y| dequantize_row_q4_0(&q40, y))),
        "seed {seed}"
    );
    assert_eq!(
        vec_dot_q4_1_q8_1(&q41, &a81),
        idot(deq(&|y| dequantize_row_q4_1(&q41, y))),
        "seed {seed}"
    );
    assert_eq!(
        vec_dot_q5_0_q8_0(&q50, &a8),
        idot(deq(&|y| dequantize_row_q5_0(&q50, y))),
        "seed {seed}"
    );
    assert_eq!(
        vec_dot_q5_1_q8_1(&q51, &a81),
        idot(deq(&|y| dequantize_row_q5_1(&q51, y))),
        "seed {seed}"
    );
    assert_eq!(
        vec_dot_q8_0_q8_0(&w8, &a8),
        idot(deq(&|y| dequantize_row_q8_0(&w8, y))),
        "seed {seed}"
    );
    // Not vacuous: the quants span the whole range.
    let q5 = deq(&|y| dequantize_row_q5_0(&q50, y));
    assert!(q5.contains(&-16.0) && q5.contains(&15.0));
}
