//! Unit tests of IQ4_NL and IQ4_XS.

use super::*;
use crate::quant::reference::testutil::{ggml_rmse, ggml_test_data, stress_rows, Rng};
use crate::quant::reference::{dequantize, quantize, vec_dot, vec_dot_type};
use crate::quant::GgmlType;
use bytemuck::Zeroable;
use half::f16;

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = Vec::new();
    quantize(ty, x, &mut q).expect("quantize");
    let mut y = vec![0.0; x.len()];
    dequantize(ty, &q, &mut y).expect("dequantize");
    y
}

#[test]
fn best_index_is_the_nearest_level_ties_up() {
    let seed = 17;
    let mut rng = Rng::new(seed);
    let mut probes: Vec<f32> = (0..20_000).map(|_| (rng.uniform() - 0.5) * 300.0).collect();
    // exact levels and exact midpoints
    for w in KVALUES_IQ4NL.windows(2) {
        probes.extend([f32::from(w[0]), (f32::from(w[0]) + f32::from(w[1])) / 2.0]);
    }
    for x in probes {
        let got = best_index_int8(&KVALUES_IQ4NL, x);
        let dist = |i: usize| (x - f32::from(KVALUES_IQ4NL[i])).abs();
        let best = (0..16)
            .rev()
            .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
            .unwrap_or(0);
        assert_eq!(dist(got), dist(best), "seed {seed}: x = {x}");
        if dist(got) == dist(best) && got != best {
            assert!(got > best, "ties go up: x = {x}");
        }
    }
}

#[test]
fn nearest_int_rounds_half_to_even() {
    for i in -400..400 {
        let x = i as f32 / 8.0;
        assert_eq!(nearest_int(x), x.round_ties_even() as i32, "{x}");
    }
    assert_eq!(nearest_int(2.5), 2);
    assert_eq!(nearest_int(-3.5), -4);
}

#[test]
fn ggml_total_error_bound() {
    let x = ggml_test_data(0.0, 32 * 128);
    for ty in [GgmlType::IQ4_NL, GgmlType::IQ4_XS] {
        let err = ggml_rmse(&x, &round_trip(ty, &x));
        assert!(err > 0.0 && err < 0.002, "{ty}: {err}");
    }
}

/// Normalized squared error of each 256-element stretch: 4-bit non-linear
/// levels give at most ~0.65% on these rows (outliers included: the blocks
/// they sit in are dominated by them); the bound is about twice that.
#[test]
fn round_trip_normalized_error() {
    let seed = 23;
    let mut rng = Rng::new(seed);
    for (r, x) in stress_rows(&mut rng, 1024).iter().enumerate() {
        for ty in [GgmlType::IQ4_NL, GgmlType::IQ4_XS] {
            let y = round_trip(ty, x);
            for (c, (xc, yc)) in x.chunks(256).zip(y.chunks(256)).enumerate() {
                let err: f64 = xc
                    .iter()
                    .zip(yc)
                    .map(|(&a, &b)| f64::from(a - b).powi(2))
                    .sum();
                let norm: f64 = xc.iter().map(|&a| f64::from(a).powi(2)).sum();
                let bound = 0.012;
                assert!(
                    err / norm < bound,
                    "seed {seed} {ty} row {r} chunk {c}: nmse {}",
                    err / norm
                );
                // Every block's largest value survives to within one level gap (24 of 127).
                for xb in xc.chunks(32).zip(yc.chunks(32)) {
                    let amax = xb.0.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    for (&a, &b) in xb.0.iter().zip(xb.1) {
                        if ty == GgmlType::IQ4_NL || r != 4 {
                            assert!(
                                (a - b).abs() <= amax * 0.2,
                                "seed {seed} {ty} row {r}: {a} -> {b}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn all_zero_super_block_keeps_ggml_negative_zero_scale() {
    let x = vec![0.0f32; QK_K];
    let mut q = vec![BlockIQ4XS {
        d: f16::ONE,
        scales_h: 0,
        scales_l: [0; 4],
        qs: [0; 128],
    }];
    quantize_row_iq4_xs(&x, &mut q);
    assert_eq!(q[0].d.to_bits(), 0x8000);
    assert_eq!(q[0].scales_h, 0xAAAA, "scale 0 is stored as 32");
    assert_eq!(q[0].scales_l, [0; 4]);
    assert!(
        q[0].qs.iter().all(|&b| b == 0x88),
        "level 8 (value 1) is nearest to 0"
    );
}

#[test]
fn dots_match_the_dequantized_dot() {
    let seed = 29;
    let mut rng = Rng::new(seed);
    let n = 1024;
    for scale in [0.02f32, 1.0, 30.0] {
        let w: Vec<f32> = (0..n).map(|_| rng.normal() * scale).collect();
        let a: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let mut ad = vec![0.0f32; n];

        let (mut wq, mut aq) = (Vec::new(), Vec::new());
        quantize(GgmlType::IQ4_NL, &w, &mut wq).expect("weights");
        quantize(vec_dot_type(GgmlType::IQ4_NL), &a, &mut aq).expect("acts");
        dequantize(GgmlType::Q8_0, &aq, &mut ad).expect("acts");
        check_dot(GgmlType::IQ4_NL, &wq, &aq, &ad, &w, &a, scale, seed);

        let mut wq = Vec::new();
        quantize(GgmlType::IQ4_XS, &w, &mut wq).expect("weights");
        let mut a8 = vec![BlockQ8K::zeroed(); a.len() / QK_K];
        crate::quant::reference::kquants::quantize_row_q8_k(&a, &mut a8);
        for (o, (q, b)) in ad
            .iter_mut()
            .zip(a8.iter().flat_map(|b| b.qs.iter().map(move |q| (q, b.d))))
        {
            *o = f32::from(*q) * b;
        }
        check_dot(
            GgmlType::IQ4_XS,
            &wq,
            bytemuck::cast_slice(&a8),
            &ad,
            &w,
            &a,
            scale,
            seed,
        );
    }
}

#[allow(clippy::too_many_arguments)]
fn check_dot(
    ty: GgmlType,
    wq: &[u8],
    aq: &[u8],
    ad: &[f32],
    w: &[f32],
    a: &[f32],
    scale: f32,
    seed: u64,
) {
    let got = f64::from(vec_dot(ty, wq, aq).expect("dot"));
    let mut wd = vec![0.0f32; w.len()];
    dequantize(ty, wq, &mut wd).expect("dequantize");
    let exact: f64 = wd
        .iter()
        .zip(ad)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let mag: f64 = wd
        .iter()
        .zip(ad)
        .map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs())
        .sum();
    assert!(
        (got - exact).abs() <= 1e-5 * mag,
        "seed {seed} {ty} scale {scale}: {got} vs {exact}"
    );
    let f: f64 = w
        .iter()
        .zip(a)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    assert!(
        ((got - f) / f64::from(scale)).abs() / w.len() as f64 <= 0.02,
        "seed {seed} {ty}"
    );
}

/// With unit scales every partial sum is an integer below 2^24: exact.
#[test]
fn dots_are_exact_on_integer_blocks() {
    let seed = 31;
    let mut rng = Rng::new(seed);
    let mut bytes = |n: usize| -> Vec<u8> { (0..n).map(|_| rng.below(256) as u8).collect() };
    let nl: Vec<BlockIQ4NL> = (0..8)
        .map(|_| BlockIQ4NL {
            d: f16::ONE,
            qs: bytemuck::pod_read_unaligned(&bytes(16)),
        })
        .collect();
    let a8: Vec<BlockQ8_0> = (0..8)
        .map(|_| BlockQ8_0 {
            d: f16::ONE,
            qs: bytemuck::pod_read_unaligned(&bytes(32)),
        })
        .collect();
    // xs scales: d = 1 and sub-block scales l - 32 for random l
    let xs: Vec<BlockIQ4XS> = (0..2)
        .map(|_| BlockIQ4XS {
            d: f16::ONE,
            scales_h: u16::from_le_bytes([bytes(1)[0], bytes(1)[0]]),
            scales_l: bytemuck::pod_read_unaligned(&bytes(4)),
            qs: bytemuck::pod_read_unaligned(&bytes(128)),
        })
        .collect();
    let ak: Vec<BlockQ8K> = (0..2)
        // Activations in -3..=3 keep every partial sum below 2^24 whatever the quants.
        .map(|_| BlockQ8K {
            d: 1.0,
            qs: std::array::from_fn(|_| (rng.below(7) as i32 - 3) as i8),
            bsums: [0; 16],
        })
        .collect();

    let int_dot = |w: &[f32], a: &[i64]| -> f32 {
        w.iter().zip(a).map(|(&x, &y)| x as i64 * y).sum::<i64>() as f32
    };
    let mut wd = vec![0.0; 256];
    dequantize_row_iq4_nl(&nl, &mut wd);
    let acts: Vec<i64> = a8.iter().flat_map(|b| b.qs.map(i64::from)).collect();
    assert_eq!(
        vec_dot_iq4_nl_q8_0(&nl, &a8),
        int_dot(&wd, &acts),
        "seed {seed}"
    );

    let mut wd = vec![0.0; 512];
    dequantize_row_iq4_xs(&xs, &mut wd);
    let acts: Vec<i64> = ak.iter().flat_map(|b| b.qs.map(i64::from)).collect();
    assert_eq!(
        vec_dot_iq4_xs_q8_k(&xs, &ak),
        int_dot(&wd, &acts),
        "seed {seed}"
    );
    assert!(
        wd.iter().any(|&v| v.abs() > 127.0 * 16.0),
        "scales far from 1 are exercised"
    );
}
