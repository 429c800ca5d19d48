//! Every CPU kernel against `quant::reference` (the oracle) on fresh seeded
//! random data: dots equal the reference's within f32 rounding (exactly where
//! the sums are integers), dequantized rows equal the reference's, the
//! activation quantizers agree with the reference's, and quantized dots stay
//! within ggml's `test-quantize-fns` error bounds of the f32 dot.

mod model_support;

use hearth::backend::cpu::kernels::KernelTable;
use hearth::quant::reference;
use hearth::quant::GgmlType;
use hearth::quant::WEIGHT_TYPES;
use model_support::rng::Rng;

const N: usize = 512;

/// A row of `n` weights of mixed scale (never zeros).
fn row(rng: &mut Rng, n: usize) -> Vec<f32> {
    let scale = [0.01f32, 0.5, 3.0][rng.below(3)];
    rng.normals(n, scale)
}

/// Bytes of `x` quantized by the reference, in 4-byte aligned storage.
fn quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    reference::quantize(ty, x, &mut out).expect("reference quantize");
    out
}

/// ggml's `MAX_QUANTIZATION_TOTAL_ERROR`-style bound on |dot_q - dot_f32| / n.
fn dot_bound(ty: GgmlType) -> f64 {
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K => 0.04,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1e-3,
        _ => 0.02,
    }
}

#[test]
fn dots_match_the_reference() {
    let table = KernelTable::scalar();
    for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
        let seed = 1000 + i as u64;
        let mut rng = Rng::new(seed);
        let k = table.weight(ty).expect("kernel");
        let act_ty = k.vec_dot_type;
        assert_eq!(act_ty, reference::vec_dot_type(ty), "{ty}");
        let quantize = table.quantizer(act_ty).expect("quantizer");
        for trial in 0..8 {
            let (w, a) = (row(&mut rng, N), row(&mut rng, N));
            let wq = quantized(ty, &w);
            let aq_ref = quantized(act_ty, &a);
            let mut aq = vec![0u8; aq_ref.len()];
            quantize(&a, &mut aq);
            let ours = (k.vec_dot)(&wq, &aq_ref);
            let oracle = reference::vec_dot(ty, &wq, &aq_ref).expect("reference dot");
            let mag: f64 = w
                .iter()
                .zip(&a)
                .map(|(x, y)| f64::from((x * y).abs()))
                .sum();
            assert!(
                (f64::from(ours) - f64::from(oracle)).abs() <= 1e-5 * mag + 1e-6,
                "{ty} seed {seed} trial {trial}: {ours} vs reference {oracle}"
            );
            let exact: f64 = w
                .iter()
                .zip(&a)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            let with_ours = (k.vec_dot)(&wq, &aq);
            let err = (f64::from(with_ours) - exact).abs() / N as f64;
            assert!(
                err <= dot_bound(ty) * mag / N as f64 + 1e-4,
                "{ty} seed {seed}: dot error {err}"
            );
        }
    }
}

#[test]
fn integer_dots_are_exact() {
    // With unit scales the legacy dots are integer sums: exactly equal.
    let table = KernelTable::scalar();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
    ] {
        let seed = 77;
        let mut rng = Rng::new(seed);
        let k = table.weight(ty).expect("kernel");
        let mut wq = quantized(ty, &row(&mut rng, N));
        let mut aq = quantized(GgmlType::Q8_0, &row(&mut rng, N));
        let one = half::f16::ONE.to_bits().to_le_bytes();
        for b in wq.chunks_exact_mut(ty.block_bytes()) {
            b[..2].copy_from_slice(&one);
        }
        for b in aq.chunks_exact_mut(34) {
            b[..2].copy_from_slice(&one);
        }
        let ours = (k.vec_dot)(&wq, &aq);
        let oracle = reference::vec_dot(ty, &wq, &aq).expect("reference");
        assert_eq!(ours, oracle, "{ty} seed {seed}");
        assert_eq!(ours.fract(), 0.0, "{ty}: an integer sum");
    }
}

#[test]
fn dequantize_matches_the_reference() {
    let table = KernelTable::scalar();
    for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
        let seed = 2000 + i as u64;
        let mut rng = Rng::new(seed);
        let x = row(&mut rng, N);
        let q = quantized(ty, &x);
        let (mut ours, mut oracle) = (vec![0.0f32; N], vec![0.0f32; N]);
        (table.weight(ty).expect("kernel").dequantize_row)(&q, &mut ours);
        reference::dequantize(ty, &q, &mut oracle).expect("reference");
        for (j, (a, b)) in ours.iter().zip(&oracle).enumerate() {
            assert!(
                (a - b).abs() <= 1e-6 * b.abs(),
                "{ty} seed {seed} [{j}]: {a} vs {b}"
            );
        }
    }
}

#[test]
fn activation_quantizers_match_the_reference() {
    let table = KernelTable::scalar();
    for (i, ty) in [
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q8_K,
        GgmlType::F16,
        GgmlType::BF16,
    ]
    .into_iter()
    .enumerate()
    {
        let seed = 3000 + i as u64;
        let mut rng = Rng::new(seed);
        let x = row(&mut rng, N);
        let oracle = quantized(ty, &x);
        let mut ours = vec![0u8; oracle.len()];
        (table.quantizer(ty).expect("quantizer"))(&x, &mut ours);
        // ggml's x86 Q8_0/Q8_1 quantizer scales by 127/amax and rounds ties
        // to even where the reference uses 1/d and rounds half away: the odd
        // int8 can differ by one. Everything else is byte-identical.
        let differing = ours.iter().zip(&oracle).filter(|(a, b)| a != b).count();
        let allowed = if matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1) {
            oracle.len() / 50
        } else {
            0
        };
        assert!(
            differing <= allowed,
            "{ty} seed {seed}: {differing} bytes differ"
        );
        let (mut a, mut b) = (vec![0.0f32; N], vec![0.0f32; N]);
        reference::dequantize(ty, &ours, &mut a).expect("ours");
        reference::dequantize(ty, &oracle, &mut b).expect("oracle");
        let max = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(
            a.iter().zip(&b).all(|(p, q)| (p - q).abs() <= max / 100.0),
            "{ty} seed {seed}"
        );
    }
}
