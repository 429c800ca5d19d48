//! `#[repr(C)]` block layouts of the ggml quantization formats.
//!
//! Each struct mirrors ggml's `block_*` exactly, byte for byte, and a
//! compile-time assert pins its size to the type table's. Blocks are
//! `bytemuck::Pod` with alignment 1 or 2 (f16 fields), so a byte slice of
//! whole blocks casts to `&[Block]` when aligned, and `read_unaligned` works
//! otherwise (see [`cast_blocks`]).

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};

/// Elements per block of the 32-element formats.
pub const QK4_0: usize = 32;
/// Elements per block of the 32-element formats.
pub const QK8_0: usize = 32;
/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales and mins in Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Q4_0: 32 weights, `w = d * (q - 8)`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles: element i in the low nibble of `qs[i]`, element i+16 in the high nibble.
    pub qs: [u8; QK4_0 / 2],
}

/// Q4_1: 32 weights, `w = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Nibbles, laid out as in Q4_0.
    pub qs: [u8; QK4_0 / 2],
}

/// Q5_0: 32 weights, `w = d * (q - 16)`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits: bit j of the little-endian u32 is element j's high bit.
    pub qh: [u8; 4],
    /// Low nibbles, laid out as in Q4_0.
    pub qs: [u8; QK4_0 / 2],
}

/// Q5_1: 32 weights, `w = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum.
    pub m: f16,
    /// Fifth bits, as in Q5_0.
    pub qh: [u8; 4],
    /// Low nibbles, as in Q4_0.
    pub qs: [u8; QK4_0 / 2],
}

/// Q8_0: 32 weights, `w = d * q`, q in -127..=127.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; QK8_0],
}

/// Q8_1: Q8_0 plus `s = d * sum(qs)`, the activation format for Q4_1 / Q5_1 dots.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`.
    pub s: f16,
    /// Quants.
    pub qs: [i8; QK8_0],
}

/// Q2_K: 256 weights in 16 sub-blocks of 16; 4-bit scales and mins, 2-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Low nibble: sub-block scale; high nibble: sub-block min.
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
}

/// Q3_K: 256 weights in 16 sub-blocks of 16; 6-bit scales, 3-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bit of each quant.
    pub hmask: [u8; QK_K / 8],
    /// Low two bits of each quant.
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

/// Q4_K: 256 weights in 8 sub-blocks of 32; 6-bit scales and mins, 4-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: Q4_K plus a fifth bit per quant.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale for the scales.
    pub d: f16,
    /// Super-block scale for the mins.
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits.
    pub qh: [u8; QK_K / 8],
    /// Low nibbles.
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 256 weights in 16 sub-blocks of 16; 8-bit scales, 6-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low four bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High two bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

/// Q8_K: the activation format of the k-quant dots; f32 scale, sums of 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 quants.
    pub bsums: [i16; QK_K / 16],
}

/// IQ4_NL: 32 weights, `w = d * KVALUES_IQ4NL[q]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4NL {
    /// Scale.
    pub d: f16,
    /// Nibbles indexing [`KVALUES_IQ4NL`], laid out as in Q4_0.
    pub qs: [u8; QK4_0 / 2],
}

/// IQ4_XS: 256 weights in 8 sub-blocks of 32; 6-bit scales, non-linear 4-bit quants.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4XS {
    /// Super-block scale.
    pub d: f16,
    /// High two bits of the eight scales.
    pub scales_h: u16,
    /// Low four bits of the eight scales.
    pub scales_l: [u8; QK_K / 64],
    /// Nibbles indexing [`KVALUES_IQ4NL`].
    pub qs: [u8; QK_K / 2],
}

/// The 16 non-linear levels of IQ4_NL and IQ4_XS (`kvalues_iq4nl`).
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// A single F16 element viewed as a one-element block.
pub type BlockF16 = f16;
/// A single BF16 element viewed as a one-element block.
pub type BlockBF16 = bf16;
/// A single F32 element viewed as a one-element block.
pub type BlockF32 = f32;

const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);
const _: () = assert!(std::mem::size_of::<BlockIQ4NL>() == 18);
const _: () = assert!(std::mem::size_of::<BlockIQ4XS>() == 136);
const _: () = assert!(std::mem::size_of::<BlockF16>() == 2);
const _: () = assert!(std::mem::size_of::<BlockBF16>() == 2);

/// Copies whole blocks out of a byte slice of any alignment.
///
/// Returns `None` when `bytes` is not a whole number of `B` blocks.
pub fn cast_blocks<B: Pod>(bytes: &[u8]) -> Option<Vec<B>> {
    let size = std::mem::size_of::<B>();
    if size == 0 || !bytes.len().is_multiple_of(size) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(size)
            .map(bytemuck::pod_read_unaligned)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;

    #[test]
    fn sizes_match_the_type_table() {
        use std::mem::size_of;
        let pairs = [
            (GgmlType::Q4_0, size_of::<BlockQ4_0>()),
            (GgmlType::Q4_1, size_of::<BlockQ4_1>()),
            (GgmlType::Q5_0, size_of::<BlockQ5_0>()),
            (GgmlType::Q5_1, size_of::<BlockQ5_1>()),
            (GgmlType::Q8_0, size_of::<BlockQ8_0>()),
            (GgmlType::Q8_1, size_of::<BlockQ8_1>()),
            (GgmlType::Q2_K, size_of::<BlockQ2K>()),
            (GgmlType::Q3_K, size_of::<BlockQ3K>()),
            (GgmlType::Q4_K, size_of::<BlockQ4K>()),
            (GgmlType::Q5_K, size_of::<BlockQ5K>()),
            (GgmlType::Q6_K, size_of::<BlockQ6K>()),
            (GgmlType::Q8_K, size_of::<BlockQ8K>()),
            (GgmlType::IQ4_NL, size_of::<BlockIQ4NL>()),
            (GgmlType::IQ4_XS, size_of::<BlockIQ4XS>()),
            (GgmlType::F16, size_of::<BlockF16>()),
            (GgmlType::BF16, size_of::<BlockBF16>()),
            (GgmlType::F32, size_of::<BlockF32>()),
        ];
        for (ty, size) in pairs {
            assert_eq!(ty.block_bytes(), size, "{ty}");
        }
    }

    #[test]
    fn cast_blocks_reads_unaligned() {
        let mut bytes = vec![0u8; 1 + 2 * 18];
        bytes[1] = 0x00;
        bytes[2] = 0x3c; // f16 1.0
        bytes[3] = 0xab;
        let blocks: Vec<BlockQ4_0> = cast_blocks(&bytes[1..]).expect("two blocks");
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].d.to_f32(), 1.0);
        assert_eq!(blocks[0].qs[0], 0xab);
        assert!(cast_blocks::<BlockQ4_0>(&bytes).is_none());
    }
}
