//! The scalar reference implementation of every format: THE oracle.
//!
//! Plain, obviously correct code. Never optimised, never a production path.
//! Quantizers give the bytes llama.cpp's `llama-quantize` writes (no
//! importance matrix); dequantizers and dots follow ggml's scalar code.
//!
//! - [`float`]: F32, F16, BF16.
//! - [`legacy`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//! - [`iq4`]: IQ4_NL, IQ4_XS.
//! - [`kquants`]: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
//!
//! The functions here dispatch on [`GgmlType`] over raw little-endian block
//! bytes of any alignment. The per-format modules hold ggml-named row
//! functions over block structs (`quantize_row_q4_0`, `dequantize_row_q4_0`,
//! `vec_dot_q4_0_q8_0`, ...).

pub mod float;
pub mod iq4;
pub mod kquants;
pub mod legacy;
#[cfg(test)]
pub(crate) mod testutil;

use crate::quant::blocks::{
    cast_blocks, BlockBF16, BlockF16, BlockF32, BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K,
    BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0,
    BlockQ8_1,
};
use crate::quant::{GgmlType, QuantError};
use bytemuck::Pod;

/// Types with a reference quantizer, dequantizer and (for weight types) dot.
pub const SUPPORTED: [GgmlType; 17] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
];

/// The activation type ggml quantizes the other operand to before a dot with
/// weights of type `ty` (`vec_dot_type` of ggml-cpu.c's `type_traits_cpu`).
///
/// Types without a CPU dot in ggml (Q8_K, the integer types, F64) get F32,
/// the table's zero value.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType::*;
    match ty {
        F16 => F16,
        BF16 => BF16,
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 => Q8_0,
        Q4_1 | Q5_1 | Q8_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S | IQ3_S | IQ2_S
        | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => Q8_K,
        F32 | Q8_K | I8 | I16 | I32 | I64 | F64 => F32,
    }
}

fn unsupported(op: &'static str, ty: GgmlType) -> QuantError {
    let supported = SUPPORTED
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    QuantError::Unsupported { op, ty, supported }
}

fn shape(ty: GgmlType, detail: String) -> QuantError {
    QuantError::Shape { ty, detail }
}

/// `bytes` as whole blocks of `B`, copied (so any alignment works).
fn blocks_of<B: Pod>(ty: GgmlType, bytes: &[u8], what: &str) -> Result<Vec<B>, QuantError> {
    cast_blocks(bytes).ok_or_else(|| {
        shape(
            ty,
            format!(
                "{what}: {} bytes is not a whole number of {}-byte blocks; pass complete rows",
                bytes.len(),
                ty.block_bytes()
            ),
        )
    })
}

fn dequantize_with<B: Pod>(
    ty: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
    row: fn(&[B], &mut [f32]),
) -> Result<(), QuantError> {
    let blocks = blocks_of::<B>(ty, bytes, "dequantize")?;
    let n = blocks.len() * ty.block_elems();
    if out.len() != n {
        return Err(shape(
            ty,
            format!(
                "dequantize: {} bytes hold {n} values but the output has {}",
                bytes.len(),
                out.len()
            ),
        ));
    }
    row(&blocks, out);
    Ok(())
}

/// Dequantizes `bytes` (whole blocks of `ty`, any alignment) into `out`.
///
/// `out.len()` must be exactly the number of elements the blocks hold.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    use GgmlType::*;
    match ty {
        F32 => dequantize_with::<BlockF32>(ty, bytes, out, float::dequantize_row_f32),
        F16 => dequantize_with::<BlockF16>(ty, bytes, out, float::dequantize_row_f16),
        BF16 => dequantize_with::<BlockBF16>(ty, bytes, out, float::dequantize_row_bf16),
        Q4_0 => dequantize_with::<BlockQ4_0>(ty, bytes, out, legacy::dequantize_row_q4_0),
        Q4_1 => dequantize_with::<BlockQ4_1>(ty, bytes, out, legacy::dequantize_row_q4_1),
        Q5_0 => dequantize_with::<BlockQ5_0>(ty, bytes, out, legacy::dequantize_row_q5_0),
        Q5_1 => dequantize_with::<BlockQ5_1>(ty, bytes, out, legacy::dequantize_row_q5_1),
        Q8_0 => dequantize_with::<BlockQ8_0>(ty, bytes, out, legacy::dequantize_row_q8_0),
        Q8_1 => dequantize_with::<BlockQ8_1>(ty, bytes, out, legacy::dequantize_row_q8_1),
        IQ4_NL => dequantize_with::<BlockIQ4NL>(ty, bytes, out, iq4::dequantize_row_iq4_nl),
        IQ4_XS => dequantize_with::<BlockIQ4XS>(ty, bytes, out, iq4::dequantize_row_iq4_xs),
        Q2_K => dequantize_with::<BlockQ2K>(ty, bytes, out, kquants::dequantize_row_q2_k),
        Q3_K => dequantize_with::<BlockQ3K>(ty, bytes, out, kquants::dequantize_row_q3_k),
        Q4_K => dequantize_with::<BlockQ4K>(ty, bytes, out, kquants::dequantize_row_q4_k),
        Q5_K => dequantize_with::<BlockQ5K>(ty, bytes, out, kquants::dequantize_row_q5_k),
        Q6_K => dequantize_with::<BlockQ6K>(ty, bytes, out, kquants::dequantize_row_q6_k),
        Q8_K => dequantize_with::<BlockQ8K>(ty, bytes, out, kquants::dequantize_row_q8_k),
        _ => Err(unsupported("dequantize", ty)),
    }
}

fn quantize_with<B: Pod>(
    ty: GgmlType,
    src: &[f32],
    out: &mut Vec<u8>,
    row: fn(&[f32], &mut [B]),
) -> Result<(), QuantError> {
    let be = ty.block_elems();
    if !src.len().is_multiple_of(be) {
        return Err(shape(
            ty,
            format!(
                "quantize: {} values is not a multiple of the block size {be}",
                src.len()
            ),
        ));
    }
    let mut blocks = vec![B::zeroed(); src.len() / be];
    row(src, &mut blocks);
    out.extend_from_slice(bytemuck::cast_slice(&blocks));
    Ok(())
}

/// Quantizes `src` to `ty` and appends the blocks' bytes to `out`.
///
/// `src.len()` must be a multiple of `ty`'s block size. Gives the bytes
/// `llama-quantize` writes for a row (no importance matrix).
pub fn quantize(ty: GgmlType, src: &[f32], out: &mut Vec<u8>) -> Result<(), QuantError> {
    use GgmlType::*;
    match ty {
        F32 => quantize_with::<BlockF32>(ty, src, out, float::quantize_row_f32),
        F16 => quantize_with::<BlockF16>(ty, src, out, float::quantize_row_f16),
        BF16 => quantize_with::<BlockBF16>(ty, src, out, float::quantize_row_bf16),
        Q4_0 => quantize_with::<BlockQ4_0>(ty, src, out, legacy::quantize_row_q4_0),
        Q4_1 => quantize_with::<BlockQ4_1>(ty, src, out, legacy::quantize_row_q4_1),
        Q5_0 => quantize_with::<BlockQ5_0>(ty, src, out, legacy::quantize_row_q5_0),
        Q5_1 => quantize_with::<BlockQ5_1>(ty, src, out, legacy::quantize_row_q5_1),
        Q8_0 => quantize_with::<BlockQ8_0>(ty, src, out, legacy::quantize_row_q8_0),
        Q8_1 => quantize_with::<BlockQ8_1>(ty, src, out, legacy::quantize_row_q8_1),
        IQ4_NL => quantize_with::<BlockIQ4NL>(ty, src, out, iq4::quantize_row_iq4_nl),
        IQ4_XS => quantize_with::<BlockIQ4XS>(ty, src, out, iq4::quantize_row_iq4_xs),
        Q2_K => quantize_with::<BlockQ2K>(ty, src, out, kquants::quantize_row_q2_k),
        Q3_K => quantize_with::<BlockQ3K>(ty, src, out, kquants::quantize_row_q3_k),
        Q4_K => quantize_with::<BlockQ4K>(ty, src, out, kquants::quantize_row_q4_k),
        Q5_K => quantize_with::<BlockQ5K>(ty, src, out, kquants::quantize_row_q5_k),
        Q6_K => quantize_with::<BlockQ6K>(ty, src, out, kquants::quantize_row_q6_k),
        Q8_K => quantize_with::<BlockQ8K>(ty, src, out, kquants::quantize_row_q8_k),
        _ => Err(unsupported("quantize", ty)),
    }
}

fn dot_with<W: Pod, A: Pod>(
    ty: GgmlType,
    weights: &[u8],
    acts: &[u8],
    dot: fn(&[W], &[A]) -> f32,
) -> Result<f32, QuantError> {
    let w = blocks_of::<W>(ty, weights, "vec_dot weights")?;
    let at = vec_dot_type(ty);
    let a = blocks_of::<A>(at, acts, "vec_dot activations")?;
    let (nw, na) = (w.len() * ty.block_elems(), a.len() * at.block_elems());
    if nw != na {
        return Err(shape(ty, format!("vec_dot: {nw} weights but {na} activations (of type {at}); pass rows of equal length")));
    }
    Ok(dot(&w, &a))
}

/// Dot product of a row of weights of type `ty` with a row of activations of
/// type [`vec_dot_type`]`(ty)` holding the same number of elements.
pub fn vec_dot(ty: GgmlType, weights: &[u8], acts: &[u8]) -> Result<f32, QuantError> {
    use GgmlType::*;
    match ty {
        F32 => dot_with::<BlockF32, BlockF32>(ty, weights, acts, float::vec_dot_f32),
        F16 => dot_with::<BlockF16, BlockF16>(ty, weights, acts, float::vec_dot_f16),
        BF16 => dot_with::<BlockBF16, BlockBF16>(ty, weights, acts, float::vec_dot_bf16),
        Q4_0 => dot_with::<BlockQ4_0, BlockQ8_0>(ty, weights, acts, legacy::vec_dot_q4_0_q8_0),
        Q4_1 => dot_with::<BlockQ4_1, BlockQ8_1>(ty, weights, acts, legacy::vec_dot_q4_1_q8_1),
        Q5_0 => dot_with::<BlockQ5_0, BlockQ8_0>(ty, weights, acts, legacy::vec_dot_q5_0_q8_0),
        Q5_1 => dot_with::<BlockQ5_1, BlockQ8_1>(ty, weights, acts, legacy::vec_dot_q5_1_q8_1),
        Q8_0 => dot_with::<BlockQ8_0, BlockQ8_0>(ty, weights, acts, legacy::vec_dot_q8_0_q8_0),
        IQ4_NL => dot_with::<BlockIQ4NL, BlockQ8_0>(ty, weights, acts, iq4::vec_dot_iq4_nl_q8_0),
        IQ4_XS => dot_with::<BlockIQ4XS, BlockQ8K>(ty, weights, acts, iq4::vec_dot_iq4_xs_q8_k),
        Q2_K => dot_with::<BlockQ2K, BlockQ8K>(ty, weights, acts, kquants::vec_dot_q2_k_q8_k),
        Q3_K => dot_with::<BlockQ3K, BlockQ8K>(ty, weights, acts, kquants::vec_dot_q3_k_q8_k),
        Q4_K => dot_with::<BlockQ4K, BlockQ8K>(ty, weights, acts, kquants::vec_dot_q4_k_q8_k),
        Q5_K => dot_with::<BlockQ5K, BlockQ8K>(ty, weights, acts, kquants::vec_dot_q5_k_q8_k),
        Q6_K => dot_with::<BlockQ6K, BlockQ8K>(ty, weights, acts, kquants::vec_dot_q6_k_q8_k),
        _ => Err(unsupported("vec_dot", ty)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_dot_types_follow_ggml() {
        use GgmlType::*;
        let table = [
            (F32, F32),
            (F16, F16),
            (BF16, BF16),
            (Q4_0, Q8_0),
            (Q4_1, Q8_1),
            (Q5_0, Q8_0),
            (Q5_1, Q8_1),
            (Q8_0, Q8_0),
            (IQ4_NL, Q8_0),
            (IQ4_XS, Q8_K),
            (Q2_K, Q8_K),
            (Q3_K, Q8_K),
            (Q4_K, Q8_K),
            (Q5_K, Q8_K),
            (Q6_K, Q8_K),
        ];
        for (w, a) in table {
            assert_eq!(vec_dot_type(w), a, "{w}");
        }
    }

    #[test]
    fn shapes_are_checked() {
        let mut out = vec![0.0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out),
            Err(QuantError::Shape { .. })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0u8; 36], &mut out),
            Err(QuantError::Shape { .. })
        ));
        let mut bytes = Vec::new();
        assert!(matches!(
            quantize(GgmlType::Q8_0, &[1.0; 31], &mut bytes),
            Err(QuantError::Shape { .. })
        ));
        assert!(bytes.is_empty());
        assert!(matches!(
            vec_dot(GgmlType::Q8_0, &[0u8; 34], &[0u8; 68]),
            Err(QuantError::Shape { .. })
        ));
        let err = quantize(GgmlType::IQ2_XS, &[1.0; 256], &mut bytes).expect_err("no reference");
        assert!(err.to_string().contains("IQ4_XS"), "{err}");
    }

    #[test]
    fn dispatch_agrees_with_the_type_table() {
        use crate::quant::TYPES;
        for info in TYPES {
            let ty = info.ty;
            let bytes = vec![0x31u8; 2 * ty.block_bytes()];
            let mut out = vec![0.0f32; 2 * ty.block_elems()];
            let result = dequantize(ty, &bytes, &mut out);
            match result {
                Ok(()) => {
                    assert!(info.has_reference && SUPPORTED.contains(&ty), "{ty}");
                    assert!(
                        out.iter().all(|v| v.is_finite()) && out.iter().any(|&v| v != 0.0),
                        "{ty}"
                    );
                }
                Err(QuantError::Unsupported { .. }) => assert!(!info.has_reference, "{ty}"),
                Err(e) => panic!("{ty}: {e}"),
            }
        }
    }

    #[test]
    fn float_types_dispatch() {
        let x: Vec<f32> = (0..40).map(|i| (i as f32 * 0.61).cos() * 3.0).collect();
        let a: Vec<f32> = (0..40).map(|i| (i as f32 * 0.23).sin()).collect();
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let (mut xq, mut aq) = (Vec::new(), Vec::new());
            quantize(ty, &x, &mut xq).expect("weights");
            quantize(vec_dot_type(ty), &a, &mut aq).expect("acts");
            assert_eq!(xq.len(), 40 * ty.block_bytes());
            let (mut xd, mut ad) = (vec![0.0; 40], vec![0.0; 40]);
            dequantize(ty, &xq, &mut xd).expect("weights");
            dequantize(ty, &aq, &mut ad).expect("acts");
            if ty == GgmlType::F32 {
                assert_eq!(xd, x);
            }
            let exact: f64 = xd
                .iter()
                .zip(&ad)
                .map(|(&p, &q)| f64::from(p) * f64::from(q))
                .sum();
            // Products of f16 / bf16 values are exact in f32; f32 products round.
            let got = vec_dot(ty, &xq, &aq).expect("dot");
            assert!(
                (f64::from(got) - exact).abs() <= exact.abs() * 1e-6,
                "{ty}: {got} vs {exact}"
            );
        }
    }

    #[test]
    fn quantize_appends_and_reads_unaligned() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut bytes = vec![0xAB];
        quantize(GgmlType::Q4_1, &x, &mut bytes).expect("quantize");
        assert_eq!(bytes.len(), 1 + 40);
        assert_eq!(bytes[0], 0xAB);
        let (mut a, mut b) = (vec![0.0; 64], vec![0.0; 64]);
        dequantize(GgmlType::Q4_1, &bytes[1..], &mut a).expect("unaligned");
        let copy: Vec<u8> = bytes[1..].to_vec();
        dequantize(GgmlType::Q4_1, &copy, &mut b).expect("fresh allocation");
        assert_eq!(a, b);
        assert!(a.iter().zip(&x).all(|(p, q)| (p - q).abs() < 0.1));
    }
}
