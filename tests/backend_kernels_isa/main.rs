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
//!
//! The tests are grouped by kind of kernel: per-row dots and activation
//! quantizers (`dots.rs`), weight layouts (`layout.rs`), tiles
//! (`tiles.rs`) and the float formats (`float.rs`); the helpers they share
//! are here.

// Only the seeded generator of the shared test support: the rest of it opens
// model files, which this test (also built for wasm32 and aarch64) never does.
#[path = "../model_support/rng.rs"]
#[allow(dead_code)]
mod rng;

use hearth::backend::cpu::kernels::{
    Isa, KernelTable, Layout, ScaleKinds, WeightKernels, BAND_ROWS,
};
use hearth::quant::reference;
use hearth::quant::{GgmlType, WEIGHT_TYPES};
use rng::Rng;

mod dots;
mod float;
mod layout;
mod tiles;

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
