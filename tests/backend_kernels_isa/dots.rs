//! Per-row dots and activation quantizers of every ISA, and choosing a
//! table by ISA.

use super::*;

#[test]
fn isa_dots_match_the_reference_and_scalar() {
    let scalar = KernelTable::scalar();
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        assert_eq!(table.isa(), isa);
        for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let seed = 5000 + 100 * isa as u64 + i as u64;
            let mut rng = Rng::new(seed);
            let k = table.weight(ty).expect("kernel");
            let ks = scalar.weight(ty).expect("scalar kernel");
            assert_eq!(k.vec_dot_type, ks.vec_dot_type, "{isa} {ty}");
            let be = ty.block_elems();
            for blocks in [1usize, 2, 3, 4, 5, 6, 7, 8, 9, 64, 77] {
                let n = blocks * be.max(32);
                let (w, a) = (row(&mut rng, n), row(&mut rng, n));
                let wq = quantized(ty, &w);
                let aq = quantized(k.vec_dot_type, &a);
                let ours = (k.vec_dot)(&wq, &aq);
                let theirs = (ks.vec_dot)(&wq, &aq);
                let oracle = reference::vec_dot(ty, &wq, &aq).expect("reference dot");
                let mag: f64 = w
                    .iter()
                    .zip(&a)
                    .map(|(x, y)| f64::from((x * y).abs()))
                    .sum();
                let ctx = format!("{isa} {ty} seed {seed} blocks {blocks}");
                assert!(
                    (f64::from(ours) - f64::from(oracle)).abs() <= 1e-5 * mag + 1e-6,
                    "{ctx}: {ours} vs reference {oracle}"
                );
                if bit_identical(ty) {
                    assert_eq!(
                        ours.to_bits(),
                        theirs.to_bits(),
                        "{ctx}: {ours} vs scalar {theirs}"
                    );
                } else {
                    assert!(
                        (f64::from(ours) - f64::from(theirs)).abs() <= 1e-6 * mag + 1e-7,
                        "{ctx}: {ours} vs scalar {theirs}"
                    );
                }
            }
        }
    }
}

#[test]
fn isa_integer_dots_are_exact() {
    // Unit scales make the 32-element dots integer sums: exactly equal.
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::IQ4_NL,
        ] {
            let seed = 77;
            let mut rng = Rng::new(seed);
            let k = table.weight(ty).expect("kernel");
            let mut wq = quantized(ty, &row(&mut rng, 512));
            let mut aq = quantized(GgmlType::Q8_0, &row(&mut rng, 512));
            let one = half::f16::ONE.to_bits().to_le_bytes();
            for b in wq.chunks_exact_mut(ty.block_bytes()) {
                b[..2].copy_from_slice(&one);
            }
            for b in aq.chunks_exact_mut(34) {
                b[..2].copy_from_slice(&one);
            }
            let ours = (k.vec_dot)(&wq, &aq);
            let oracle = reference::vec_dot(ty, &wq, &aq).expect("reference");
            assert_eq!(ours, oracle, "{isa} {ty} seed {seed}");
            assert_eq!(ours.fract(), 0.0, "{isa} {ty}: an integer sum");
        }
    }
}

#[test]
fn extreme_quants_stay_exact() {
    // Largest magnitudes everywhere (weights from +-max rows, activations of
    // +-127): no i16 saturation in any ISA.
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        let scalar = KernelTable::scalar();
        for &ty in &WEIGHT_TYPES {
            let n = 8 * ty.block_elems().max(32);
            let w: Vec<f32> = (0..n)
                .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
                .collect();
            let a: Vec<f32> = (0..n)
                .map(|i| if i % 5 == 0 { 1.0 } else { -1.0 })
                .collect();
            let k = table.weight(ty).expect("kernel");
            let wq = quantized(ty, &w);
            let aq = quantized(k.vec_dot_type, &a);
            let ours = (k.vec_dot)(&wq, &aq);
            let theirs = (scalar.weight(ty).expect("scalar").vec_dot)(&wq, &aq);
            assert!(
                (ours - theirs).abs() <= 1e-6 * n as f32,
                "{isa} {ty}: {ours} vs scalar {theirs}"
            );
        }
    }
}

#[test]
fn tables_of_every_isa_can_be_chosen() {
    for isa in Isa::ALL {
        assert_eq!(Isa::parse(isa.name()), Some(isa));
        match KernelTable::with_isa(isa) {
            Some(t) => {
                assert!(isa.available(), "{isa}");
                assert_eq!(t.isa(), isa);
                let (r, warning) = KernelTable::for_request(Some(isa.name()));
                assert_eq!((r.isa(), warning), (isa, None));
            }
            None => {
                assert!(!isa.available(), "{isa}");
                let (r, warning) = KernelTable::for_request(Some(isa.name()));
                assert_eq!(r.isa(), Isa::best());
                assert!(warning.expect("a warning").contains("lacks"));
            }
        }
    }
    assert!(KernelTable::with_isa(Isa::Scalar).is_some());
    assert_eq!(Isa::parse(" AVX2 "), Some(Isa::Avx2));
    let (t, warning) = KernelTable::for_request(Some(""));
    assert_eq!((t.isa(), warning), (Isa::best(), None));
    let (t, warning) = KernelTable::for_request(Some("sse9"));
    assert_eq!(t.isa(), Isa::best());
    assert!(warning.expect("a warning").contains("not one of"));
    assert_eq!(KernelTable::for_request(None).0.isa(), Isa::best());
}

#[test]
fn isa_activation_quantizers_equal_the_scalar_ones() {
    // Same scale, same ties-to-even rounding: byte-identical blocks.
    let scalar = KernelTable::scalar();
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
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
            let seed = 7000 + 100 * isa as u64 + i as u64;
            let mut rng = Rng::new(seed);
            let be = ty.block_elems();
            for blocks in [1usize, 2, 3, 5, 8, 40] {
                let n = blocks * be.max(32);
                let mut x = row(&mut rng, n);
                // Exact ties and a zero block exercise rounding and amax = 0.
                x[1] = 0.5 * x[0].abs().max(1e-3);
                if blocks > 2 {
                    x[32..64].fill(0.0);
                }
                let bytes = n / be * ty.block_bytes();
                let (mut ours, mut theirs) = (vec![0u8; bytes], vec![0u8; bytes]);
                (table.quantizer(ty).expect("quantizer"))(&x, &mut ours);
                (scalar.quantizer(ty).expect("quantizer"))(&x, &mut theirs);
                assert!(ours == theirs, "{isa} {ty} seed {seed} blocks {blocks}");
                let oracle = quantized(ty, &x);
                let differing = ours.iter().zip(&oracle).filter(|(a, b)| a != b).count();
                assert!(
                    differing <= oracle.len() / 50,
                    "{isa} {ty} seed {seed}: {differing} bytes differ from the reference"
                );
            }
        }
    }
}

#[test]
fn isa_q8_k_quantizer_equals_the_scalar_one_on_ties_and_zero_blocks() {
    // The sign of the scale comes from the FIRST element of largest
    // magnitude: +a before -a and -a before +a give opposite scales.
    let scalar = KernelTable::scalar();
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        let seed = 7900 + isa as u64;
        let mut rng = Rng::new(seed);
        let mut x = row(&mut rng, 4 * 256);
        let big = 1.0 + x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        (x[37], x[200]) = (big, -big);
        (x[256 + 3], x[256 + 255]) = (-big, big);
        x[512..768].fill(0.0);
        x[768 + 9] = f32::NAN;
        let bytes = 4 * GgmlType::Q8_K.block_bytes();
        let (mut ours, mut theirs) = (vec![0u8; bytes], vec![0u8; bytes]);
        (table.quantizer(GgmlType::Q8_K).expect("quantizer"))(&x, &mut ours);
        (scalar.quantizer(GgmlType::Q8_K).expect("quantizer"))(&x, &mut theirs);
        let b = GgmlType::Q8_K.block_bytes();
        for k in 0..3 {
            assert!(
                ours[k * b..(k + 1) * b] == theirs[k * b..(k + 1) * b],
                "{isa} seed {seed} block {k}"
            );
        }
        let oracle = quantized(GgmlType::Q8_K, &x[..768]);
        assert!(
            ours[..3 * b] == oracle[..],
            "{isa} seed {seed}: differs from the reference"
        );
        // A NaN is skipped by the max in both: the scale agrees.
        assert_eq!(
            ours[3 * b..3 * b + 4],
            theirs[3 * b..3 * b + 4],
            "{isa} seed {seed}"
        );
    }
}
