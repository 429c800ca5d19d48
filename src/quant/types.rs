//! The table of ggml tensor types: id, name, block elements, block bytes.
//!
//! This is the one place that knows the sizes of every ggml type. Ids are the
//! values stored in GGUF tensor infos (`enum ggml_type`); removed ids (4, 5,
//! 31-33, 36-38) are absent and read as unknown.

use std::fmt;

/// A ggml tensor element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(missing_docs)] // the variants are ggml's type names
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

/// The weight types Hearth runs: every backend has kernels for these, and
/// the reference ([`crate::quant::reference`]) defines each of them.
pub const WEIGHT_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// One row of the type table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeInfo {
    /// The type.
    pub ty: GgmlType,
    /// The id stored in GGUF files.
    pub id: u32,
    /// ggml's name (`q4_K`, `f16`, ...).
    pub name: &'static str,
    /// Elements per block (1 for plain scalar types).
    pub block_elems: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// True when [`crate::quant::reference`] can dequantize this type.
    pub has_reference: bool,
}

const fn row(
    ty: GgmlType,
    id: u32,
    name: &'static str,
    block_elems: usize,
    block_bytes: usize,
    has_reference: bool,
) -> TypeInfo {
    TypeInfo {
        ty,
        id,
        name,
        block_elems,
        block_bytes,
        has_reference,
    }
}

/// Every ggml type, in id order.
pub const TYPES: &[TypeInfo] = &[
    row(GgmlType::F32, 0, "f32", 1, 4, true),
    row(GgmlType::F16, 1, "f16", 1, 2, true),
    row(GgmlType::Q4_0, 2, "q4_0", 32, 18, true),
    row(GgmlType::Q4_1, 3, "q4_1", 32, 20, true),
    row(GgmlType::Q5_0, 6, "q5_0", 32, 22, true),
    row(GgmlType::Q5_1, 7, "q5_1", 32, 24, true),
    row(GgmlType::Q8_0, 8, "q8_0", 32, 34, true),
    row(GgmlType::Q8_1, 9, "q8_1", 32, 36, true),
    row(GgmlType::Q2_K, 10, "q2_K", 256, 84, true),
    row(GgmlType::Q3_K, 11, "q3_K", 256, 110, true),
    row(GgmlType::Q4_K, 12, "q4_K", 256, 144, true),
    row(GgmlType::Q5_K, 13, "q5_K", 256, 176, true),
    row(GgmlType::Q6_K, 14, "q6_K", 256, 210, true),
    row(GgmlType::Q8_K, 15, "q8_K", 256, 292, true),
    row(GgmlType::IQ2_XXS, 16, "iq2_xxs", 256, 66, false),
    row(GgmlType::IQ2_XS, 17, "iq2_xs", 256, 74, false),
    row(GgmlType::IQ3_XXS, 18, "iq3_xxs", 256, 98, false),
    row(GgmlType::IQ1_S, 19, "iq1_s", 256, 50, false),
    row(GgmlType::IQ4_NL, 20, "iq4_nl", 32, 18, true),
    row(GgmlType::IQ3_S, 21, "iq3_s", 256, 110, false),
    row(GgmlType::IQ2_S, 22, "iq2_s", 256, 82, false),
    row(GgmlType::IQ4_XS, 23, "iq4_xs", 256, 136, true),
    row(GgmlType::I8, 24, "i8", 1, 1, false),
    row(GgmlType::I16, 25, "i16", 1, 2, false),
    row(GgmlType::I32, 26, "i32", 1, 4, false),
    row(GgmlType::I64, 27, "i64", 1, 8, false),
    row(GgmlType::F64, 28, "f64", 1, 8, false),
    row(GgmlType::IQ1_M, 29, "iq1_m", 256, 56, false),
    row(GgmlType::BF16, 30, "bf16", 1, 2, true),
    row(GgmlType::TQ1_0, 34, "tq1_0", 256, 54, false),
    row(GgmlType::TQ2_0, 35, "tq2_0", 256, 66, false),
    row(GgmlType::MXFP4, 39, "mxfp4", 32, 17, false),
];

impl GgmlType {
    /// The type with GGUF id `id`, or `None` for unknown and removed ids.
    pub fn from_id(id: u32) -> Option<Self> {
        TYPES.iter().find(|t| t.id == id).map(|t| t.ty)
    }

    /// The type named `name`, case-insensitive (`q4_k`, `Q4_K`, `f16`).
    pub fn from_name(name: &str) -> Option<Self> {
        TYPES
            .iter()
            .find(|t| t.name.eq_ignore_ascii_case(name))
            .map(|t| t.ty)
    }

    /// This type's row of [`TYPES`].
    pub fn info(self) -> &'static TypeInfo {
        // TYPES lists every variant exactly once (checked by a test).
        TYPES.iter().find(|t| t.ty == self).unwrap_or(&TYPES[0])
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self.info().id
    }

    /// ggml's name.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        self.info().block_elems
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.info().block_bytes
    }

    /// The lower-case name of a weight type ([`WEIGHT_TYPES`]), as kernel
    /// and shader names spell it (`q4_k`, `iq4_xs`, `bf16`); `None` for
    /// the other types.
    pub fn weight_label(self) -> Option<&'static str> {
        use GgmlType::*;
        Some(match self {
            F32 => "f32",
            F16 => "f16",
            BF16 => "bf16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q2_K => "q2_k",
            Q3_K => "q3_k",
            Q4_K => "q4_k",
            Q5_K => "q5_k",
            Q6_K => "q6_k",
            IQ4_NL => "iq4_nl",
            IQ4_XS => "iq4_xs",
            _ => return None,
        })
    }

    /// True for block-quantized types (block of more than one element).
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes taken by `n_elems` elements, or `None` when `n_elems` is not a
    /// whole number of blocks or the size overflows.
    pub fn bytes_for(self, n_elems: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !n_elems.is_multiple_of(be) {
            return None;
        }
        (n_elems / be).checked_mul(self.block_bytes() as u64)
    }

    /// Bits per weight, for display.
    pub fn bits_per_weight(self) -> f64 {
        self.block_bytes() as f64 * 8.0 / self.block_elems() as f64
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Upper case as llama.cpp prints types in file names and logs (Q4_K, F16).
        f.write_str(&self.name().to_ascii_uppercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_labels_are_the_lower_case_names_of_the_weight_types() {
        for ty in WEIGHT_TYPES {
            assert_eq!(
                ty.weight_label(),
                Some(ty.to_string().to_lowercase().as_str()),
                "{ty}"
            );
        }
        assert_eq!(GgmlType::Q8_K.weight_label(), None);
    }

    #[test]
    fn table_is_consistent() {
        for (i, t) in TYPES.iter().enumerate() {
            assert_eq!(GgmlType::from_id(t.id), Some(t.ty));
            assert_eq!(t.ty.info(), t);
            assert_eq!(GgmlType::from_name(t.name), Some(t.ty));
            assert_eq!(GgmlType::from_name(&t.name.to_uppercase()), Some(t.ty));
            for u in &TYPES[i + 1..] {
                assert!(t.id < u.id, "ids in order and unique");
                assert_ne!(t.ty, u.ty);
            }
        }
        for removed in [4, 5, 31, 32, 33, 36, 37, 38, 40, 1000] {
            assert_eq!(GgmlType::from_id(removed), None);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F16.bytes_for(3), Some(6));
        assert_eq!(GgmlType::Q8_0.bytes_for(u64::MAX - 31), None);
        assert_eq!(GgmlType::Q4_0.bits_per_weight(), 4.5);
    }
}
