//! Every kernel of every ISA this CPU runs against `quant::reference` (the
//! oracle) and against the scalar kernel, on fresh seeded random rows of
//! 1..8 blocks and long rows; and choosing an ISA through the table.
//!
//! Bounds: the 32-element formats, Q2_K and IQ4_XS are bit-identical to the
//! scalar kernels (exact integer sums per block, scalar float order); the
//! k-quants scale whole blocks where the scalar kernel scales eight lanes,
//! so they agree within `1e-6 * sum |w * a|` (a few f32 ulps of the
//! magnitude). Against the reference both stay within the scalar kernels'
//! own bound, `1e-5 * sum |w * a| + 1e-6`.

// Only the seeded generator of the shared test support: the rest of it opens
// model files, which this test (also built for wasm32 and aarch64) never does.
#[path = "model_support/rng.rs"]
#[allow(dead_code)]
mod rng;

use hearth::backend::cpu::kernels::{
    Isa, KernelTable, Layout, ScaleKinds, WeightKernels, BAND_ROWS,
};
use hearth::quant::reference;
use hearth::quant::{GgmlType, WEIGHT_TYPES};
use rng::Rng;

/// A row of `n` weights of mixed scale (never zeros).
fn row(rng: &mut Rng, n: usize) -> Vec<f32> {
    let scale = [0.01f32, 0.5, 3.0][rng.below(3)];
    rng.normals(n, scale)
}

fn quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    reference::quantize(ty, x, &mut out).expect("reference quantize");
    out
}

/// The ISAs of this CPU other than scalar (printed so a log shows coverage).
fn fast_isas() -> Vec<Isa> {
    let isas: Vec<Isa> = Isa::ALL
        .into_iter()
        .filter(|isa| *isa != Isa::Scalar && isa.available())
        .collect();
    eprintln!("ISAs under test: {isas:?}");
    isas
}

/// Whether the ISA kernels of `ty` must equal the scalar ones bit for bit.
fn bit_identical(ty: GgmlType) -> bool {
    !matches!(
        ty,
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K
    )
}

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

/// Quantized rows `[k, n]` of `ty` from fresh random values, with the f32
/// values kept.
fn quantized_rows(rng: &mut Rng, ty: GgmlType, k: usize, n: usize) -> (Vec<f32>, Vec<u8>) {
    let x: Vec<f32> = (0..k).flat_map(|_| row(rng, n)).collect();
    let q = x.chunks_exact(n).flat_map(|r| quantized(ty, r)).collect();
    (x, q)
}

/// Weight rows `wq` (rows of `rb` bytes of `ty`) in the layout `k`'s tiles
/// read: whole groups of rows rearranged where they want that.
fn laid_out(k: &WeightKernels, ty: GgmlType, wq: &[u8], rb: usize) -> Vec<u8> {
    let mut w = wq.to_vec();
    k.layout.apply(&mut w, rb, ty.block_bytes());
    w
}

#[test]
fn rearranged_rows_read_back_as_the_plain_rows() {
    let mut rng = Rng::new(77);
    let banded = [
        (1, 0, GgmlType::Q4_0),
        (1, 0, GgmlType::Q8_0),
        (1, 0, GgmlType::Q5_0),
        (1, 0, GgmlType::IQ4_NL),
        (2, 0, GgmlType::Q4_1),
        (2, 0, GgmlType::Q4_K),
        (1, 208, GgmlType::Q6_K),
        (2, 0, GgmlType::IQ4_XS),
    ];
    let layouts = [BAND_ROWS, 4]
        .into_iter()
        .flat_map(|rows| banded.map(|(halves, at, ty)| (Layout::Bands { rows, halves, at }, ty)));
    for (layout, ty) in layouts {
        for rows in [1, 3, 4, 5, 8, 11, 16, 17, 35] {
            let (_, wq) = quantized_rows(&mut rng, ty, rows, 2 * ty.block_elems());
            let rb = wq.len() / rows;
            let mut w = wq.clone();
            layout.apply(&mut w, rb, ty.block_bytes());
            let g = layout.group_rows();
            let whole = rows / g * g;
            // The tail past the last whole group is untouched; a group
            // keeps its bytes, rearranged.
            let ctx = format!("{layout:?} {ty} {rows}");
            assert_eq!(w[whole * rb..], wq[whole * rb..], "{ctx}");
            for g0 in (0..whole).step_by(g) {
                let (a, b) = (&w[g0 * rb..(g0 + g) * rb], &wq[g0 * rb..(g0 + g) * rb]);
                assert_ne!(a, b, "{ctx}: group {g0} unchanged");
                let (mut a, mut b) = (a.to_vec(), b.to_vec());
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "{ctx}: group {g0} lost bytes");
            }
            for r in 0..rows {
                let got = layout.plain_row(&w, rows, rb, ty.block_bytes(), r);
                assert_eq!(&*got, &wq[r * rb..(r + 1) * rb], "{ctx} row {r}");
            }
            assert!(layout
                .plain_row(&w, rows, rb, ty.block_bytes(), rows)
                .is_empty());
        }
    }
}

#[test]
fn banded_layout_puts_sixteen_rows_scales_and_words_side_by_side() {
    // The layout the AVX-512 one-token kernels read, written out by hand
    // for Q4_1: per block step, 16 `d`, 16 `m`, then word k of each row.
    let ty = GgmlType::Q4_1;
    let (bb, rows, nb) = (ty.block_bytes(), 16, 2);
    let wq: Vec<u8> = (0..rows * nb * bb)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    let rb = nb * bb;
    let mut w = wq.clone();
    Layout::Bands {
        rows: BAND_ROWS,
        halves: 2,
        at: 0,
    }
    .apply(&mut w, rb, bb);
    for r in 0..rows {
        for b in 0..nb {
            let plain = &wq[r * rb + b * bb..][..bb];
            let step = &w[b * rows * bb..][..rows * bb];
            assert_eq!(
                step[2 * r..2 * r + 2],
                plain[0..2],
                "d of row {r} block {b}"
            );
            assert_eq!(step[32 + 2 * r..34 + 2 * r], plain[2..4], "m of row {r}");
            for k in 0..4 {
                let at = 64 + 64 * k + 4 * r;
                assert_eq!(
                    step[at..at + 4],
                    plain[4 + 4 * k..8 + 4 * k],
                    "word {k} row {r}"
                );
            }
        }
    }
}

#[test]
fn widened_weights_hold_the_same_values() {
    // Where an ISA stores a type re-encoded (wasm: Q5_0 as Q8_0), the
    // encoding round-trips and its dots and rows are bit-identical.
    let mut checked = Vec::new();
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let k = table.weight(ty).expect("kernel");
            let Some(widen) = k.widen else { continue };
            let kw = table.weight(widen.to).expect("kernel of the stored type");
            assert_eq!(kw.vec_dot_type, k.vec_dot_type, "{isa} {ty}");
            let mut rng = Rng::new(13_000 + i as u64);
            let n = 8 * ty.block_elems();
            let (_, wq) = quantized_rows(&mut rng, ty, 1, n);
            let (_, aq) = quantized_rows(&mut rng, k.vec_dot_type, 1, n);
            let mut wide = vec![0u8; n / widen.to.block_elems() * widen.to.block_bytes()];
            (widen.encode)(&wq, &mut wide);
            let mut back = vec![0u8; wq.len()];
            (widen.decode)(&wide, &mut back);
            assert_eq!(back, wq, "{isa} {ty}: the encoding does not round-trip");
            let (a, b) = ((k.vec_dot)(&wq, &aq), (kw.vec_dot)(&wide, &aq));
            assert_eq!(a.to_bits(), b.to_bits(), "{isa} {ty}: {a} vs stored {b}");
            let (mut da, mut db) = (vec![0.0f32; n], vec![0.0f32; n]);
            (k.dequantize_row)(&wq, &mut da);
            (kw.dequantize_row)(&wide, &mut db);
            assert_eq!(da, db, "{isa} {ty}: values differ");
            checked.push(format!("{isa} {ty} as {}", widen.to));
        }
    }
    eprintln!("widened: {checked:?}");
}

#[test]
fn isa_gemm_tiles_match_the_per_row_dots() {
    // Ragged shapes: rows and tokens not multiples of the tiles (4 x 4,
    // 4 x 2), strided outputs with untouched gaps.
    let scalar = KernelTable::scalar();
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let k = table.weight(ty).expect("kernel");
            let Some(gemm) = k.gemm else { continue };
            let seed = 9000 + 100 * isa as u64 + i as u64;
            let mut rng = Rng::new(seed);
            let be = ty.block_elems().max(32);
            let ks = scalar.weight(ty).expect("scalar kernel");
            for (rows, toks, blocks) in [
                (1, 1, 1),
                (4, 1, 3),
                (5, 1, 8),
                (3, 2, 2),
                (4, 4, 5),
                (9, 7, 3),
                (13, 5, 9),
                (8, 9, 1),
                (6, 16, 18),
                (17, 70, 2),
                // Two groups of 16 rows over two chunks of eight blocks
                // and a ragged third, by two groups of 16 tokens and a
                // ragged third.
                (35, 37, 19),
                // One token through passes of four, two and one bands of
                // eight rows, and a ragged end.
                (59, 1, 4),
                // One token through a pass of four groups of 16 rows, then
                // one, and a ragged end.
                (83, 1, 2),
            ] {
                let n = blocks * be;
                let (w, wq) = quantized_rows(&mut rng, ty, rows, n);
                let (a, aq) = quantized_rows(&mut rng, k.vec_dot_type, toks, n);
                let (rb, ab) = (wq.len() / rows, aq.len() / toks);
                for (row_stride, tok_stride) in [(1, rows + 3), (toks + 1, 1)] {
                    let len = (rows - 1) * row_stride + (toks - 1) * tok_stride + 1;
                    let mut out = vec![f32::NAN; len + 2];
                    let o = hearth::backend::cpu::kernels::Out {
                        out: &mut out[..len],
                        row_stride,
                        tok_stride,
                    };
                    gemm(&laid_out(&k, ty, &wq, rb), rb, &aq, ab, o);
                    let ctx = format!("{isa} {ty} seed {seed} {rows}x{toks}x{blocks}");
                    let mut written = 0;
                    for r in 0..rows {
                        for t in 0..toks {
                            let got = out[r * row_stride + t * tok_stride];
                            let wrow = &wq[r * rb..(r + 1) * rb];
                            let arow = &aq[t * ab..(t + 1) * ab];
                            let want = (ks.vec_dot)(wrow, arow);
                            let mag: f64 = w[r * n..(r + 1) * n]
                                .iter()
                                .zip(&a[t * n..(t + 1) * n])
                                .map(|(x, y)| f64::from((x * y).abs()))
                                .sum();
                            assert!(
                                (f64::from(got) - f64::from(want)).abs() <= 1e-5 * mag + 1e-6,
                                "{ctx} r {r} t {t}: {got} vs per-row dot {want}"
                            );
                            written += 1;
                        }
                    }
                    let untouched = out.iter().filter(|v| v.is_nan()).count();
                    assert_eq!(untouched, out.len() - written, "{ctx}: gaps were written");
                }
            }
        }
    }
}

#[test]
fn isa_gemm_results_do_not_depend_on_the_batch() {
    // A token's results alone (one activation row) equal its results in a
    // batch bit for bit: batched requests give the tokens they give alone.
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let k = table.weight(ty).expect("kernel");
            let Some(gemm) = k.gemm else { continue };
            let seed = 9500 + 100 * isa as u64 + i as u64;
            let mut rng = Rng::new(seed);
            let be = ty.block_elems().max(32);
            // 91 rows: the one-token kernels' passes of four, four, two and
            // one bands of eight rows and three rows past the last band, or
            // of four and one groups of 16 rows and 11 past the last; 11
            // blocks: more than one of the prefill tiles' chunks.
            let (rows, toks, n) = (91, 37, 11 * be);
            let (_, wq) = quantized_rows(&mut rng, ty, rows, n);
            let (_, aq) = quantized_rows(&mut rng, k.vec_dot_type, toks, n);
            let (rb, ab) = (wq.len() / rows, aq.len() / toks);
            let mut all = vec![0.0f32; rows * toks];
            let o = hearth::backend::cpu::kernels::Out {
                out: &mut all,
                row_stride: 1,
                tok_stride: rows,
            };
            gemm(&laid_out(&k, ty, &wq, rb), rb, &aq, ab, o);
            for t in [0, 5, 16, 36] {
                let mut one = vec![0.0f32; rows];
                let o = hearth::backend::cpu::kernels::Out {
                    out: &mut one,
                    row_stride: 1,
                    tok_stride: rows,
                };
                gemm(
                    &laid_out(&k, ty, &wq, rb),
                    rb,
                    &aq[t * ab..(t + 1) * ab],
                    ab,
                    o,
                );
                for r in 0..rows {
                    assert_eq!(
                        one[r].to_bits(),
                        all[t * rows + r].to_bits(),
                        "{isa} {ty} seed {seed} r {r} t {t}: {} alone, {} in the batch",
                        one[r],
                        all[t * rows + r]
                    );
                }
            }
        }
    }
}

#[test]
fn isa_gemm_integer_tiles_are_exact() {
    // Unit scales: every result is an integer sum, so tiles equal the
    // reference exactly, whatever the float order.
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::IQ4_NL,
        ] {
            let k = table.weight(ty).expect("kernel");
            let Some(gemm) = k.gemm else {
                // Only the x86 ISAs have tiles; elsewhere the matmul dots pair by pair.
                if cfg!(target_arch = "x86_64") {
                    panic!("{isa} {ty}: no tiled kernel");
                }
                continue;
            };
            let seed = 78;
            let mut rng = Rng::new(seed);
            let (rows, toks, n) = (6, 5, 512);
            let (_, mut wq) = quantized_rows(&mut rng, ty, rows, n);
            let (_, mut aq) = quantized_rows(&mut rng, GgmlType::Q8_0, toks, n);
            let one = half::f16::ONE.to_bits().to_le_bytes();
            for b in wq.chunks_exact_mut(ty.block_bytes()) {
                b[..2].copy_from_slice(&one);
            }
            for b in aq.chunks_exact_mut(34) {
                b[..2].copy_from_slice(&one);
            }
            let (rb, ab) = (wq.len() / rows, aq.len() / toks);
            let mut out = vec![0.0f32; rows * toks];
            let o = hearth::backend::cpu::kernels::Out {
                out: &mut out,
                row_stride: 1,
                tok_stride: rows,
            };
            gemm(&laid_out(&k, ty, &wq, rb), rb, &aq, ab, o);
            for r in 0..rows {
                for t in 0..toks {
                    let want = reference::vec_dot(
                        ty,
                        &wq[r * rb..(r + 1) * rb],
                        &aq[t * ab..(t + 1) * ab],
                    )
                    .expect("reference");
                    assert_eq!(
                        out[r + t * rows],
                        want,
                        "{isa} {ty} seed {seed} r {r} t {t}"
                    );
                }
            }
        }
    }
}

#[test]
fn one_token_tiles_equal_the_per_row_dots_bit_for_bit() {
    // Where a one-token matmul runs the tiles, a token's results must not
    // depend on its batch, nor differ from the table's own per-row dot: the
    // SIMD128 tiles keep the per-row float order lane by lane. On x86 the
    // tiles run for one token only where the format's tile decodes faster,
    // and may sum in another order, so only wasm32 is held to this.
    if !cfg!(target_arch = "wasm32") {
        return;
    }
    let scalar = KernelTable::scalar();
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let k = table.weight(ty).expect("kernel");
            // (Q5_0 is stored as Q8_0 there and runs its tile.)
            let tiled = [
                GgmlType::Q4_0,
                GgmlType::Q4_1,
                GgmlType::Q8_0,
                GgmlType::Q4_K,
                GgmlType::Q5_K,
                GgmlType::Q6_K,
                GgmlType::IQ4_XS,
            ];
            if isa == Isa::Simd128 && tiled.contains(&ty) {
                assert!(k.gemm.is_some(), "{isa} {ty}: no tiled kernel");
            }
            let Some(gemm) = k.gemm else { continue };
            assert!(k.gemm_one_token, "{isa} {ty}: tiles not used for one token");
            let ks = scalar.weight(ty).expect("scalar kernel");
            let seed = 12_000 + 100 * isa as u64 + i as u64;
            let mut rng = Rng::new(seed);
            let be = ty.block_elems().max(32);
            // 36, 100 and 132 rows: the one-token SIMD128 bands run eight
            // parts of 9, 25 and 33 bands, unequal by one.
            for (rows, toks, blocks) in [
                (1, 1, 1),
                (7, 3, 2),
                (4, 1, 18),
                (9, 2, 20),
                (36, 1, 2),
                (100, 1, 3),
                (132, 1, 1),
            ] {
                let n = blocks * be;
                let (_, wq) = quantized_rows(&mut rng, ty, rows, n);
                let (_, aq) = quantized_rows(&mut rng, k.vec_dot_type, toks, n);
                let (rb, ab) = (wq.len() / rows, aq.len() / toks);
                let mut out = vec![0.0f32; rows * toks];
                let o = hearth::backend::cpu::kernels::Out {
                    out: &mut out,
                    row_stride: toks,
                    tok_stride: 1,
                };
                gemm(&laid_out(&k, ty, &wq, rb), rb, &aq, ab, o);
                for r in 0..rows {
                    for t in 0..toks {
                        let (wrow, arow) = (&wq[r * rb..(r + 1) * rb], &aq[t * ab..(t + 1) * ab]);
                        let got = out[r * toks + t];
                        let ctx =
                            format!("{isa} {ty} seed {seed} {rows}x{toks}x{blocks} r {r} t {t}");
                        let own = (k.vec_dot)(wrow, arow);
                        assert_eq!(
                            got.to_bits(),
                            own.to_bits(),
                            "{ctx}: {got} vs own dot {own}"
                        );
                        if bit_identical(ty) {
                            let want = (ks.vec_dot)(wrow, arow);
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{ctx}: {got} vs scalar {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Where a block of `ty` holds its f16 scales (`d`, then `m` / `dmin`),
/// for the formats that have them.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

#[test]
fn scale_kinds_tell_subnormal_and_non_finite_scales() {
    let ty = GgmlType::Q4_1;
    let mut rng = Rng::new(31);
    let wq = quantized(ty, &rng.normals(4 * 32, 0.5));
    let with = |at: usize, h: u16| {
        let mut w = wq.clone();
        w[at..at + 2].copy_from_slice(&h.to_le_bytes());
        ScaleKinds::of(ty, &w)
    };
    let kinds = |non_finite, subnormal| ScaleKinds {
        non_finite,
        subnormal,
    };
    assert_eq!(ScaleKinds::of(ty, &wq), kinds(false, false));
    // Block 2's `m`: the smallest and largest subnormals, both signs.
    for h in [0x0001, 0x03FF, 0x8001, 0x83FF] {
        assert_eq!(with(2 * 20 + 2, h), kinds(false, true), "{h:#06x}");
    }
    // Zeros and the smallest normal are neither.
    for h in [0x0000, 0x8000, 0x0400] {
        assert_eq!(with(20, h), kinds(false, false), "{h:#06x}");
    }
    assert_eq!(with(3 * 20, 0x7C00), kinds(true, false));
    assert_eq!(with(0, 0xFE00), kinds(true, false));
    // Types without f16 block scales.
    assert_eq!(
        ScaleKinds::of(GgmlType::F16, &[0, 0x7C]),
        kinds(false, false)
    );
}

#[test]
fn isa_gemm_tiles_take_subnormal_block_scales() {
    // Half of the block scales replaced by f16 subnormals (random
    // mantissas and signs, some zeros): `gemm` still gives the per-row
    // dot's results bit for bit; `gemm_normal_scales`, where an ISA has
    // one, gives them on weights without subnormal scales (a third of
    // whose blocks have a zero scale).
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for (i, &ty) in WEIGHT_TYPES.iter().enumerate() {
            let k = table.weight(ty).expect("kernel");
            let (Some(gemm), offsets) = (k.gemm, scale_offsets(ty)) else {
                continue;
            };
            if offsets.is_empty() {
                continue;
            }
            let seed = 15_000 + 100 * isa as u64 + i as u64;
            let mut rng = Rng::new(seed);
            let be = ty.block_elems().max(32);
            for (rows, toks, blocks) in [(4, 1, 3), (36, 1, 2), (9, 3, 4), (5, 2, 1), (33, 20, 10)]
            {
                let n = blocks * be;
                let mut wq: Vec<u8> = (0..rows)
                    .flat_map(|_| quantized(ty, &rng.normals(n, 0.5)))
                    .collect();
                // Zero scales of both signs, which are not subnormal.
                for block in wq.chunks_exact_mut(ty.block_bytes()).step_by(3) {
                    let at = offsets[rng.below(offsets.len())];
                    let h = [0u16, 0x8000][rng.below(2)];
                    block[at..at + 2].copy_from_slice(&h.to_le_bytes());
                }
                let (a, aq) = quantized_rows(&mut rng, k.vec_dot_type, toks, n);
                let (rb, ab) = (wq.len() / rows, aq.len() / toks);
                let mut tiny = wq.clone();
                for (b, block) in tiny.chunks_exact_mut(ty.block_bytes()).enumerate() {
                    for &at in offsets {
                        if (b + at) % 2 == 0 {
                            let h = (rng.below(0x400) as u16) | [0, 0x8000][rng.below(2)];
                            block[at..at + 2].copy_from_slice(&h.to_le_bytes());
                        }
                    }
                }
                let ctx = format!("{isa} {ty} seed {seed} {rows}x{toks}x{blocks}");
                assert!(
                    !ScaleKinds::of(ty, &wq).subnormal,
                    "{ctx}: subnormal scales"
                );
                assert!(
                    ScaleKinds::of(ty, &tiny).subnormal,
                    "{ctx}: no subnormal scale"
                );
                let mut cases = vec![("gemm, subnormal scales", gemm, &tiny)];
                cases.push(("gemm, normal scales", gemm, &wq));
                if let Some(normal) = k.gemm_normal_scales {
                    cases.push(("gemm_normal_scales", normal, &wq));
                }
                for (what, f, w) in cases {
                    let mut out = vec![0.0f32; rows * toks];
                    let o = hearth::backend::cpu::kernels::Out {
                        out: &mut out,
                        row_stride: toks,
                        tok_stride: 1,
                    };
                    f(&laid_out(&k, ty, w, rb), rb, &aq, ab, o);
                    for r in 0..rows {
                        for t in 0..toks {
                            let want = (k.vec_dot)(&w[r * rb..(r + 1) * rb], &aq[t * ab..][..ab]);
                            let got = out[r * toks + t];
                            if isa == Isa::Simd128 || k.gemm_normal_scales.is_some() {
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{ctx} {what} r {r} t {t}: {got} vs the per-row dot {want}"
                                );
                            } else {
                                // x86's tiles sum in another order: within
                                // f32 rounding of the magnitude.
                                let mut wrow = vec![0.0f32; n];
                                (k.dequantize_row)(&w[r * rb..(r + 1) * rb], &mut wrow);
                                let mag: f64 = wrow
                                    .iter()
                                    .zip(&a[t * n..(t + 1) * n])
                                    .map(|(x, y)| f64::from((x * y).abs()))
                                    .sum();
                                assert!(
                                    (f64::from(got) - f64::from(want)).abs() <= 1e-5 * mag + 1e-30,
                                    "{ctx} {what} r {r} t {t}: {got} vs the per-row dot {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Raw values of float type `ty` (F32, F16, BF16) from `x`, with the
/// values at positions `7 * j % n` for `j < special` (the same positions
/// in every row, so edges meet edges in a product) replaced by edges of the
/// formats: zeros of both signs, f16 subnormals, bf16 magnitudes whose
/// products leave f32's normal range (1e-21, 1e21), and infinities. With
/// `tiny`, the whole row is scaled by 1e-21 first: BF16 products and sums
/// then lie among f32's subnormals, where rounding each product differs
/// from fusing it.
fn float_row(rng: &mut Rng, ty: GgmlType, x: &[f32], special: usize, tiny: bool) -> Vec<u8> {
    let edges = [
        0.0f32,
        -0.0,
        3.0e-6,
        -5.96e-8,
        1.0e-21,
        -1.0e21,
        f32::INFINITY,
    ];
    let n = x.len();
    let mut x: Vec<f32> = x
        .iter()
        .map(|v| if tiny { v * 1e-21 } else { *v })
        .collect();
    for j in 0..special {
        x[7 * j % n] = edges[rng.below(edges.len())];
    }
    match ty {
        GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

#[test]
fn float_tiles_and_dots_equal_the_scalar_dots_bit_for_bit() {
    // The float formats keep the scalar kernels' eight lanes and rounding
    // on every ISA: dots and tiles give the scalar results exactly, on
    // lengths that are not multiples of the lanes and on edge values.
    let scalar = KernelTable::scalar();
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for isa in fast_isas() {
        let table = KernelTable::with_isa(isa).expect("available ISA");
        for (i, ty) in [GgmlType::F32, GgmlType::F16, GgmlType::BF16]
            .into_iter()
            .enumerate()
        {
            let (k, ks) = (
                table.weight(ty).expect("kernel"),
                scalar.weight(ty).expect("scalar kernel"),
            );
            if cfg!(target_arch = "x86_64") {
                assert!(k.gemm.is_some(), "{isa} {ty}: no tile");
            }
            let seed = 14_000 + 100 * isa as u64 + i as u64;
            let mut rng = Rng::new(seed);
            for (rows, toks, n, special, tiny) in [
                (1, 1, 1, 0, false),
                (5, 3, 7, 0, false),
                (4, 1, 8, 1, false),
                (9, 7, 61, 3, false),
                (6, 2, 256, 8, false),
                (13, 5, 1000, 2, false),
                (5, 4, 64, 0, true),
                (3, 3, 77, 4, true),
            ] {
                let w: Vec<u8> = (0..rows)
                    .flat_map(|_| {
                        let x = row(&mut rng, n);
                        float_row(&mut rng, ty, &x, special, tiny)
                    })
                    .collect();
                let a: Vec<u8> = (0..toks)
                    .flat_map(|_| {
                        let x = row(&mut rng, n);
                        float_row(&mut rng, ty, &x, special, tiny)
                    })
                    .collect();
                let (rb, ab) = (w.len() / rows, a.len() / toks);
                let mut out = vec![f32::NAN; rows * toks];
                if let Some(gemm) = k.gemm {
                    let o = hearth::backend::cpu::kernels::Out {
                        out: &mut out,
                        row_stride: toks,
                        tok_stride: 1,
                    };
                    gemm(&w, rb, &a, ab, o);
                }
                for r in 0..rows {
                    for t in 0..toks {
                        let (wr, ar) = (&w[r * rb..(r + 1) * rb], &a[t * ab..(t + 1) * ab]);
                        let want = (ks.vec_dot)(wr, ar);
                        let dot = (k.vec_dot)(wr, ar);
                        let ctx = format!("{isa} {ty} seed {seed} {rows}x{toks}x{n} r {r} t {t}");
                        assert!(same(dot, want), "{ctx}: dot {dot} vs scalar {want}");
                        if k.gemm.is_some() {
                            let got = out[r * toks + t];
                            assert!(same(got, want), "{ctx}: tile {got} vs scalar {want}");
                        }
                    }
                }
            }
        }
    }
}
