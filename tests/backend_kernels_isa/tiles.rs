//! The tiles of every ISA against the per-row dots: results, batch
//! independence, exact integer sums, one-token passes, and block scales
//! that are subnormal or not finite.

use super::*;

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
