//! The CPU matmul's work split and tiles: every shape (one token, a few,
//! many; rows not a multiple of the tiles; a slice of the rows as experts
//! use) at 1 and 2 threads gives the per-pair dots of the same kernel
//! table within f32 rounding, and results do not depend on the thread
//! count (bit for bit).
//!
//! A token alone against the same token in a batch: where the one-token
//! matmul runs the same kernel as batches (the format's tile, or per-pair
//! dots where it has none; `Weight::one_token_runs_tiles`), bit for bit.
//! Where one token dots row by row while batches run tiles (formats whose
//! per-row dot decodes faster), the two sum the same products in another
//! order: the test then asserts the token alone equals the per-row dot bit
//! for bit and the batched result within 1e-5 of `sum |w * a|`.

// Only the seeded generator of the shared test support: the rest of it opens
// model files, which this test (also run as wasm32-wasip1, whose tiles read
// interleaved weights) never does.
#[path = "model_support/rng.rs"]
#[allow(dead_code)]
mod rng;

use hearth::backend::cpu::kernels::{DotFn, KernelTable};
use hearth::backend::cpu::matmul::{matmul, quantize_acts, Weight};
use hearth::backend::cpu::threads::Threads;
use hearth::quant::{reference, GgmlType};
use rng::Rng;

/// The weight types tested.
const TYPES: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::IQ4_XS,
];

/// Where the f16 block scales of the formats whose tiles may convert them
/// for finite values only lie in a block: `d`, and the second scale (`m`
/// / `dmin`) where there is one; and whether every ISA's matmul gives the
/// per-row dot's class of result for them (the others' x86 tiles sum in
/// another order: with an infinite `d`, IQ4_XS's banded kernel gives -inf
/// where its per-row dot, scaling sub-block by sub-block, meets inf * 0).
const SCALES: [(GgmlType, usize, Option<usize>, bool); 8] = [
    (GgmlType::Q4_0, 0, None, true),
    (GgmlType::Q4_1, 0, Some(2), true),
    (GgmlType::Q5_0, 0, None, true),
    (GgmlType::Q8_0, 0, None, true),
    (GgmlType::Q4_K, 0, Some(2), true),
    (GgmlType::Q5_K, 0, Some(2), false),
    (GgmlType::Q6_K, 208, None, false),
    (GgmlType::IQ4_XS, 0, None, false),
];

/// Random rows quantized to `ty`, as raw blocks.
fn quantized(ty: GgmlType, cols: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let wf = rng.normals(cols * rows, 0.5);
    let mut wq = Vec::new();
    reference::quantize(ty, &wf, &mut wq).expect("quantize");
    wq
}

fn weight(table: &KernelTable, ty: GgmlType, cols: usize, rows: usize, rng: &mut Rng) -> Weight {
    weight_of(table, ty, cols, rows, &quantized(ty, cols, rows, rng))
}

/// The weight of raw blocks `wq`.
fn weight_of(table: &KernelTable, ty: GgmlType, cols: usize, rows: usize, wq: &[u8]) -> Weight {
    let words: Vec<u32> = wq
        .chunks(4)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b)
        })
        .collect();
    Weight::new(table, "w", ty, cols, rows, words, wq.len()).expect("weight")
}

/// `w`'s one-thread matmul of `n` fresh random activation rows, and the
/// per-row dots of `dot` on the raw rows `wq` with the same quantized
/// activations: `(matmul, dots)`, both `[n, rows]`.
fn matmul_and_dots(
    table: &KernelTable,
    dot: DotFn,
    w: &Weight,
    wq: &[u8],
    n: usize,
    rng: &mut Rng,
) -> (Vec<f32>, Vec<f32>) {
    let (rows, cols) = (w.rows, w.cols);
    let x = rng.normals(n * cols, 1.0);
    let acts = quantize_acts(table, w, &x).expect("quantize");
    let mut y = vec![0.0f32; n * rows];
    matmul(&Threads::new(1), table, w, 0..rows, &x, &mut y, false).expect("matmul");
    let rb = wq.len() / rows;
    let dots = (0..n)
        .flat_map(|t| (0..rows).map(move |r| (t, r)))
        .map(|(t, r)| dot(&wq[r * rb..(r + 1) * rb], acts.row(t)))
        .collect();
    (y, dots)
}

#[test]
fn matmul_matches_per_pair_dots_in_every_split() {
    let table = KernelTable::detect();
    eprintln!("ISA {}", table.isa());
    let pools = [Threads::new(1), Threads::new(2)];
    for (i, &ty) in TYPES.iter().enumerate() {
        let seed = 300 + i as u64;
        let mut rng = Rng::new(seed);
        let cols = 2 * ty.block_elems().max(32) + if ty.block_elems() == 32 { 96 } else { 0 };
        let rows = 71;
        let w = weight(&table, ty, cols, rows, &mut rng);
        let k = table.weight(ty).expect("kernel");
        for n in [1usize, 2, 3, 5, 8, 9, 67] {
            let x = rng.normals(n * cols, 1.0);
            let acts = quantize_acts(&table, &w, &x).expect("quantize");
            for range in [0..rows, 5..66] {
                let m = range.len();
                // One token runs the batches' kernel: tiles for both, or dots for both.
                let same_kernel = k.gemm.is_none() || w.one_token_runs_tiles();
                let mut results = Vec::new();
                for pool in &pools {
                    let mut y = vec![f32::NAN; n * m];
                    matmul(pool, &table, &w, range.clone(), &x, &mut y, false).expect("matmul");
                    for t in 0..n {
                        for r in 0..m {
                            let got = y[t * m + r];
                            let want = (k.vec_dot)(&w.row(range.start + r), acts.row(t));
                            let mag: f32 =
                                x[t * cols..(t + 1) * cols].iter().map(|v| v.abs()).sum();
                            assert!(
                                (got - want).abs() <= 1e-5 * mag * 4.0 + 1e-5,
                                "{ty} seed {seed} n {n} rows {range:?} t {t} r {r}: {got} vs {want}"
                            );
                        }
                    }
                    for t in [0, n - 1] {
                        let mut y1 = vec![0.0; m];
                        let x1 = &x[t * cols..(t + 1) * cols];
                        matmul(pool, &table, &w, range.clone(), x1, &mut y1, false)
                            .expect("matmul");
                        if same_kernel {
                            // Each token alone gives the same bits.
                            assert_eq!(
                                &y1[..],
                                &y[t * m..(t + 1) * m],
                                "{ty} seed {seed} n {n} t {t}: batched differs from alone"
                            );
                            continue;
                        }
                        let mut wrow = vec![0.0f32; cols];
                        for r in 0..m {
                            let want = (k.vec_dot)(&w.row(range.start + r), acts.row(t));
                            assert_eq!(
                                y1[r].to_bits(),
                                want.to_bits(),
                                "{ty} seed {seed} t {t} r {r}: alone differs from the dot"
                            );
                            w.dequantize_row(range.start + r, &mut wrow);
                            let mag: f32 = wrow.iter().zip(x1).map(|(a, b)| (a * b).abs()).sum();
                            let batched = y[t * m + r];
                            assert!(
                                (y1[r] - batched).abs() <= 1e-5 * mag,
                                "{ty} seed {seed} n {n} t {t} r {r}: alone {} vs batched \
                                 {batched} (sum |w*a| {mag})",
                                y1[r]
                            );
                        }
                    }
                    results.push(y);
                }
                assert_eq!(
                    results[0], results[1],
                    "{ty} seed {seed} n {n}: 1 vs 2 threads"
                );
            }
        }
    }
}

#[test]
fn weights_with_subnormal_scales_give_the_per_pair_dots() {
    // Some f16 block scales subnormal: where the tiles have a variant for
    // normal scales only (`gemm_normal_scales`, SIMD128), the weight must
    // not take it, and results equal the per-row dots bit for bit (those
    // tiles are bit-identical to them); a weight without subnormal scales
    // takes it and gives the same results.
    let table = KernelTable::detect();
    let (cols, rows) = (512, 40);
    let mut tested = Vec::new();
    for (i, &(ty, d, second, _)) in SCALES.iter().enumerate() {
        let k = table.weight(ty).expect("kernel");
        if k.gemm_normal_scales.is_none() {
            continue;
        }
        let seed = 800 + i as u64;
        let mut rng = Rng::new(seed);
        let plain = quantized(ty, cols, rows, &mut rng);
        let mut tiny = plain.clone();
        let bb = ty.block_bytes();
        for (b, block) in tiny.chunks_exact_mut(bb).enumerate() {
            let at = if b % 2 == 0 { d } else { second.unwrap_or(d) };
            let h = (1 + rng.below(0x3FF) as u16) | [0, 0x8000][rng.below(2)];
            block[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
        for (what, wq) in [("normal scales", &plain), ("subnormal scales", &tiny)] {
            let w = weight_of(&table, ty, cols, rows, wq);
            for n in [1usize, 3] {
                let (y, dots) = matmul_and_dots(&table, k.vec_dot, &w, wq, n, &mut rng);
                for (i, (got, want)) in y.iter().zip(&dots).enumerate() {
                    let (t, r) = (i / rows, i % rows);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty} {what} seed {seed} n {n} t {t} r {r}: {got} vs the per-row dot {want}"
                    );
                }
            }
        }
        tested.push(ty);
    }
    if tested.is_empty() {
        eprintln!(
            "no tiles for normal scales only on {}: nothing to test",
            table.isa()
        );
    }
}

#[test]
fn weights_with_non_finite_scales_give_the_per_pair_dots() {
    // A block scale of +inf or NaN: tiles that convert scales for finite
    // values only (`gemm_finite_scales`, the SIMD128 ones) must not see the
    // weight, and every result keeps the per-row dot's class (NaN, +-inf)
    // and value.
    let table = KernelTable::detect();
    let (cols, rows) = (512, 12);
    for (i, &(ty, d, second, every_isa)) in SCALES.iter().enumerate() {
        let k = table.weight(ty).expect("kernel");
        if !every_isa && !k.gemm_finite_scales {
            continue;
        }
        let seed = 700 + i as u64;
        let mut rng = Rng::new(seed);
        let mut wq = quantized(ty, cols, rows, &mut rng);
        let (rb, bb) = (wq.len() / rows, ty.block_bytes());
        // Row 2, block 0: d = +inf. Row 5, block 1: its second scale (m /
        // dmin) or, with none, d = NaN.
        wq[2 * rb + d..2 * rb + d + 2].copy_from_slice(&0x7C00u16.to_le_bytes());
        let at = 5 * rb + bb + second.unwrap_or(d);
        wq[at..at + 2].copy_from_slice(&0x7E00u16.to_le_bytes());
        let w = weight_of(&table, ty, cols, rows, &wq);
        if k.gemm_finite_scales {
            assert!(
                !w.one_token_runs_tiles(),
                "{ty}: non-finite scales reach the tiles"
            );
        }
        for n in [1usize, 3] {
            let (y, dots) = matmul_and_dots(&table, k.vec_dot, &w, &wq, n, &mut rng);
            for t in 0..n {
                for r in [2, 5] {
                    let (got, want) = (y[t * rows + r], dots[t * rows + r]);
                    assert!(!want.is_finite(), "{ty} r {r}: the dot is finite ({want})");
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "{ty} seed {seed} n {n} t {t} r {r}: {got} vs the per-row dot {want}"
                    );
                }
            }
        }
    }
}
