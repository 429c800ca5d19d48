//! The float formats' tiles and dots against the scalar dots.

use super::*;

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
