//! The device-side layout of quantized weights that the GPU backends share
//! (WebGPU, CUDA), and the streaming repacker that writes it.
//!
//! GGUF blocks are 18, 22, 34, 110 or 210 bytes for some formats: their
//! fields are not 4-byte aligned, and WGSL reads storage as `u32`. The packed
//! layout keeps the GGUF bytes but moves what breaks alignment:
//!
//! - **Verbatim** (F32, Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, IQ4_XS): the blocks are
//!   already multiples of 4 bytes with aligned fields; a row is its blocks.
//! - **Halves** (F16, BF16): a row is its 2-byte elements, padded to 4 bytes.
//! - **Split scale** (Q4_0, Q5_0, Q8_0, IQ4_NL, Q3_K, Q6_K): each block minus
//!   its f16 scale `d` is a multiple of 4 bytes (the "body"). A row is
//!   `[body 0 .. body nb-1][d 0 .. d nb-1][pad to 4]`.
//!
//! Rows follow each other at a fixed stride ([`PackedLayout::row_bytes`], a
//! multiple of 4), so any row range is self-contained: a weight larger than
//! the adapter's storage binding limit is split by rows into several buffers
//! ([`PackedLayout::rows_per_part`]), each one laid out exactly like a
//! smaller weight. The repacked bytes of row `r` start at `r * row_bytes`, in
//! the order rows arrive, which is what a streaming upload needs.
//!
//! The shaders in `shaders/quant/*.wgsl` and `shaders/cuda/quant.cuh` read
//! this layout; a change here changes them.

use crate::backend::BackendError;
use crate::quant::GgmlType;

/// How a format's blocks are rearranged in a packed row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arrangement {
    /// Blocks copied as they are.
    Verbatim,
    /// 2-byte elements, the row padded to 4 bytes.
    Halves,
    /// The f16 scale at byte `d_at` of each block moves to a per-row tail array.
    SplitScale {
        /// Byte offset of `d` inside the GGUF block.
        d_at: usize,
    },
}

fn arrangement(ty: GgmlType) -> Option<Arrangement> {
    use GgmlType::*;
    Some(match ty {
        F32 | Q4_1 | Q5_1 | Q2_K | Q4_K | Q5_K | IQ4_XS => Arrangement::Verbatim,
        F16 | BF16 => Arrangement::Halves,
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL => Arrangement::SplitScale { d_at: 0 },
        Q3_K => Arrangement::SplitScale { d_at: 108 },
        Q6_K => Arrangement::SplitScale { d_at: 208 },
        _ => return None,
    })
}

/// Where a `[rows, cols]` weight of type `ty` lives on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackedLayout {
    /// Element type.
    pub ty: GgmlType,
    /// Rows (output features).
    pub rows: u64,
    /// Columns (input features, the dot length).
    pub cols: u64,
    /// Blocks per row (`cols / block_elems`).
    pub blocks_per_row: u64,
    /// Bytes between the starts of consecutive rows; a multiple of 4.
    pub row_bytes: u64,
    /// Total bytes: `rows * row_bytes`.
    pub bytes: u64,
}

impl PackedLayout {
    /// Rows per buffer when no binding may exceed `max_binding` bytes.
    ///
    /// Errors when a single row is larger than the limit.
    pub fn rows_per_part(&self, max_binding: u64) -> Result<u64, BackendError> {
        let per = max_binding / self.row_bytes;
        if per == 0 {
            return Err(BackendError::Shape(format!(
                "one packed row of {} x {} takes {} bytes, more than the adapter's storage binding limit of {max_binding} bytes; this weight cannot run on this adapter",
                self.ty, self.cols, self.row_bytes
            )));
        }
        Ok(per.min(self.rows.max(1)))
    }

    /// The `(first_row, rows)` ranges of the buffers a weight is split into
    /// so that none exceeds `max_binding` bytes.
    pub fn parts(&self, max_binding: u64) -> Result<Vec<(u64, u64)>, BackendError> {
        let per = self.rows_per_part(max_binding)?;
        let mut out = Vec::new();
        let mut first = 0;
        while first < self.rows {
            let rows = per.min(self.rows - first);
            out.push((first, rows));
            first += rows;
        }
        Ok(out)
    }

    /// Bytes of a buffer holding `rows` rows of this weight.
    pub fn part_bytes(&self, rows: u64) -> u64 {
        rows * self.row_bytes
    }

    /// `u32` words between row starts (what the shaders index with).
    pub fn row_words(&self) -> u64 {
        self.row_bytes / 4
    }
}

/// The device-side layout of a `[rows, cols]` weight of type `ty`.
///
/// `cols` must be a whole number of blocks, and a multiple of 8 for the
/// float types (the kernels decode 8 elements at a time).
pub fn packed_layout(ty: GgmlType, rows: u64, cols: u64) -> Result<PackedLayout, BackendError> {
    packed_layout_for("WebGPU", ty, rows, cols)
}

/// [`packed_layout`] for the backend named `backend` (as its errors name it).
pub fn packed_layout_for(
    backend: &str,
    ty: GgmlType,
    rows: u64,
    cols: u64,
) -> Result<PackedLayout, BackendError> {
    packed_layout_aligned(backend, ty, rows, cols, 4)
}

/// [`packed_layout_for`] with rows starting at multiples of `row_align`
/// bytes (a power of two, at least 4): 16 lets a kernel read the bodies
/// of the formats whose blocks are multiples of 16 bytes (Q4_0, Q8_0,
/// IQ4_NL, Q4_K, Q5_K, Q6_K) with 128-bit loads.
pub fn packed_layout_aligned(
    backend: &str,
    ty: GgmlType,
    rows: u64,
    cols: u64,
    row_align: u64,
) -> Result<PackedLayout, BackendError> {
    let arr = arrangement(ty).ok_or_else(|| BackendError::UnsupportedType {
        tensor: format!("[{rows}, {cols}] weight"),
        ty,
        backend: backend.into(),
    })?;
    let be = ty.block_elems() as u64;
    if cols == 0 || !cols.is_multiple_of(be) || !cols.is_multiple_of(8) {
        return Err(BackendError::Shape(format!(
            "a {ty} row of {cols} values is not a whole number of {}-value blocks (and of 8); the {backend} kernels need whole blocks",
            be.max(8)
        )));
    }
    let nb = cols / be;
    let bb = ty.block_bytes() as u64;
    let row_bytes = match arr {
        Arrangement::Verbatim => nb * bb,
        Arrangement::Halves | Arrangement::SplitScale { .. } => (nb * bb).next_multiple_of(4),
    }
    .next_multiple_of(row_align.max(4));
    let bytes = rows.checked_mul(row_bytes).ok_or_else(|| {
        BackendError::Shape(format!(
            "a [{rows}, {cols}] {ty} weight overflows u64 bytes"
        ))
    })?;
    Ok(PackedLayout {
        ty,
        rows,
        cols,
        blocks_per_row: nb,
        row_bytes,
        bytes,
    })
}

/// Repacks one GGUF row (`src`, whole blocks) into `dst` (`row_bytes` long).
fn pack_row(layout: &PackedLayout, src: &[u8], dst: &mut [u8]) {
    let bb = layout.ty.block_bytes();
    match arrangement(layout.ty) {
        Some(Arrangement::SplitScale { d_at }) => {
            let body = bb - 2;
            let nb = layout.blocks_per_row as usize;
            let (bodies, tail) = dst.split_at_mut(nb * body);
            for (i, block) in src.chunks_exact(bb).enumerate() {
                let out = &mut bodies[i * body..(i + 1) * body];
                out[..d_at].copy_from_slice(&block[..d_at]);
                out[d_at..].copy_from_slice(&block[d_at + 2..]);
                tail[2 * i..2 * i + 2].copy_from_slice(&block[d_at..d_at + 2]);
            }
            tail[2 * nb..].fill(0);
        }
        _ => {
            dst[..src.len()].copy_from_slice(src);
            dst[src.len()..].fill(0);
        }
    }
}

/// Decodes one packed row back into GGUF blocks (the inverse of the repack).
fn unpack_row(layout: &PackedLayout, src: &[u8], dst: &mut [u8]) {
    let bb = layout.ty.block_bytes();
    match arrangement(layout.ty) {
        Some(Arrangement::SplitScale { d_at }) => {
            let body = bb - 2;
            let nb = layout.blocks_per_row as usize;
            let (bodies, tail) = src.split_at(nb * body);
            for (i, block) in dst.chunks_exact_mut(bb).enumerate() {
                let from = &bodies[i * body..(i + 1) * body];
                block[..d_at].copy_from_slice(&from[..d_at]);
                block[d_at..d_at + 2].copy_from_slice(&tail[2 * i..2 * i + 2]);
                block[d_at + 2..].copy_from_slice(&from[d_at..]);
            }
        }
        _ => dst.copy_from_slice(&src[..dst.len()]),
    }
}

/// Streaming repack of one weight tensor: GGUF rows in, packed rows out.
///
/// Feed whole rows in order as the reader yields them; each call appends the
/// packed bytes of exactly those rows, which belong at device offset
/// [`Repacker::packed_offset`] (taken before the call) of the weight's
/// layout. Host memory is the caller's chunk, never the tensor.
#[derive(Debug)]
pub struct Repacker {
    layout: PackedLayout,
    src_row_bytes: usize,
    rows_done: u64,
}

impl Repacker {
    /// A repacker for a `[rows, cols]` weight of type `ty`.
    pub fn new(ty: GgmlType, rows: u64, cols: u64) -> Result<Self, BackendError> {
        Self::for_layout(packed_layout(ty, rows, cols)?)
    }

    /// A repacker writing `layout` (from [`packed_layout_for`]).
    pub fn for_layout(layout: PackedLayout) -> Result<Self, BackendError> {
        let ty = layout.ty;
        let src_row_bytes = (layout.blocks_per_row as usize) * ty.block_bytes();
        Ok(Self {
            layout,
            src_row_bytes,
            rows_done: 0,
        })
    }

    /// The layout being written.
    pub fn layout(&self) -> &PackedLayout {
        &self.layout
    }

    /// GGUF bytes of one row.
    pub fn gguf_row_bytes(&self) -> usize {
        self.src_row_bytes
    }

    /// Rows repacked so far.
    pub fn rows_done(&self) -> u64 {
        self.rows_done
    }

    /// Byte offset in the packed layout where the next row's bytes go.
    pub fn packed_offset(&self) -> u64 {
        self.rows_done * self.layout.row_bytes
    }

    /// Repacks `gguf` (whole GGUF rows, any alignment) and appends the packed
    /// bytes to `out`. Errors on a partial row or more rows than the tensor has.
    pub fn push_rows(&mut self, gguf: &[u8], out: &mut Vec<u8>) -> Result<(), BackendError> {
        if !gguf.len().is_multiple_of(self.src_row_bytes) {
            return Err(BackendError::Shape(format!(
                "repack of a {} weight: {} bytes is not a whole number of {}-byte rows; feed whole rows",
                self.layout.ty,
                gguf.len(),
                self.src_row_bytes
            )));
        }
        let n = (gguf.len() / self.src_row_bytes) as u64;
        if self.rows_done + n > self.layout.rows {
            return Err(BackendError::Shape(format!(
                "repack of a {} weight of {} rows was fed {} rows",
                self.layout.ty,
                self.layout.rows,
                self.rows_done + n
            )));
        }
        let rb = self.layout.row_bytes as usize;
        let start = out.len();
        out.resize(start + n as usize * rb, 0);
        for (src, dst) in gguf
            .chunks_exact(self.src_row_bytes)
            .zip(out[start..].chunks_exact_mut(rb))
        {
            pack_row(&self.layout, src, dst);
        }
        self.rows_done += n;
        Ok(())
    }

    /// Checks that every row was fed.
    pub fn finish(self) -> Result<PackedLayout, BackendError> {
        if self.rows_done != self.layout.rows {
            return Err(BackendError::Shape(format!(
                "repack of a {} weight ended after {} of {} rows; the reader stopped early",
                self.layout.ty, self.rows_done, self.layout.rows
            )));
        }
        Ok(self.layout)
    }
}

/// Decodes packed rows (whole `row_bytes` rows of `layout`) back into GGUF
/// block bytes: for debugging and tests, and for reading weights back.
pub fn unpack_rows(layout: &PackedLayout, packed: &[u8]) -> Result<Vec<u8>, BackendError> {
    let rb = layout.row_bytes as usize;
    if rb == 0 || !packed.len().is_multiple_of(rb) {
        return Err(BackendError::Shape(format!(
            "unpack: {} bytes is not a whole number of {rb}-byte packed rows",
            packed.len()
        )));
    }
    let src_rb = layout.blocks_per_row as usize * layout.ty.block_bytes();
    let mut out = vec![0u8; packed.len() / rb * src_rb];
    for (src, dst) in packed.chunks_exact(rb).zip(out.chunks_exact_mut(src_rb)) {
        unpack_row(layout, src, dst);
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quant::reference;
    use crate::quant::WEIGHT_TYPES;

    /// Deterministic pseudo-random values (splitmix64), never all zero.
    pub(crate) fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = s;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_layout_is_aligned_and_rows_are_self_contained() {
        for ty in WEIGHT_TYPES {
            let l = packed_layout(ty, 7, 512).expect("layout");
            assert_eq!(l.row_bytes % 4, 0, "{ty}");
            assert_eq!(l.bytes, 7 * l.row_bytes, "{ty}");
            assert!(l.row_bytes as usize >= 512 / ty.block_elems() * ty.block_bytes());
            let parts = l.parts(3 * l.row_bytes + 1).expect("parts");
            assert_eq!(parts, vec![(0, 3), (3, 3), (6, 1)], "{ty}");
        }
        assert!(packed_layout(GgmlType::Q4_K, 2, 128).is_err());
        assert!(packed_layout(GgmlType::Q8_K, 2, 256).is_err());
        let l = packed_layout(GgmlType::Q6_K, 2, 256).expect("layout");
        assert!(l.rows_per_part(100).is_err());
    }

    #[test]
    fn repack_round_trips_to_the_gguf_blocks() {
        for (i, ty) in WEIGHT_TYPES.into_iter().enumerate() {
            let seed = 0x5EED_0000 + i as u64;
            let (rows, cols) = (5u64, 512u64);
            let x = values(seed, (rows * cols) as usize);
            let mut gguf = Vec::new();
            reference::quantize(ty, &x, &mut gguf).expect("quantize");
            let mut rp = Repacker::new(ty, rows, cols).expect("repacker");
            let rb = rp.gguf_row_bytes();
            let mut packed = Vec::new();
            // Uneven chunks of whole rows, as a reader would give them.
            for chunk in [&gguf[..rb], &gguf[rb..3 * rb], &gguf[3 * rb..]] {
                assert_eq!(rp.packed_offset(), packed.len() as u64);
                rp.push_rows(chunk, &mut packed).expect("push");
            }
            let layout = rp.finish().expect("finish");
            assert_eq!(packed.len() as u64, layout.bytes, "{ty} seed {seed:#x}");
            let back = unpack_rows(&layout, &packed).expect("unpack");
            assert!(back == gguf, "{ty}: round trip differs (seed {seed:#x})");
        }
    }

    #[test]
    fn repacker_rejects_partial_and_extra_rows() {
        let mut rp = Repacker::new(GgmlType::Q4_0, 2, 64).expect("repacker");
        let mut out = Vec::new();
        assert!(rp.push_rows(&[1u8; 35], &mut out).is_err());
        rp.push_rows(&[1u8; 36 * 2], &mut out).expect("two rows");
        assert!(rp.push_rows(&[1u8; 36], &mut out).is_err());
        let rp = Repacker::new(GgmlType::Q4_0, 2, 64).expect("repacker");
        assert!(rp.finish().is_err());
    }
}
