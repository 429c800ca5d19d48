//! Unpacking the banded k-quant weights for the 16-token tiles (Q4_K, Q6_K, IQ4_XS in
//! [`Layout::Bands`](crate::backend::cpu::kernels::Layout::Bands)): one
//! block step of a group, 16 rows, decoded at once in zmm registers into
//! [`BandDecoded`], which `tiles16.rs`'s tiles read as they read a
//! [`Decoded`] per row.
//!
//! The bands hold word `k` of the 16 rows side by side, so one load is one
//! word of every row and the one-token kernels' unpacking (`one_token_bands.rs`)
//! gives the 16 rows' unsigned bytes in one register, stored whole. Before,
//! each of the 16 rows was gathered back into a block (53 four-byte copies
//! for Q6_K) and decoded alone: a fifth to a third of the prefill's work.
//!
//! Every value equals [`Format::decode`](super::Format::decode)'s
//! of the gathered block (the tiles' arithmetic does not change, so a
//! token's results stay those of its batch, bit for bit).

use std::arch::x86_64::*;

use super::one_token_bands::{byte_lane, q4k_scales_mins};
#[cfg(test)]
use super::Decoded;
use super::WORDS;
use crate::backend::cpu::kernels::BAND_ROWS;
use crate::quant::blocks::KVALUES_IQ4NL;
#[cfg(test)]
use crate::quant::blocks::{BlockIQ4XS, BlockQ4K, BlockQ6K};

/// One block step of a banded group decoded, row `r` in entry `r` of each
/// array: `q[k]` word `k` of the unsigned bytes, `sc[s]` sub-block `s`'s
/// scale, `coef[p]` the correction's i16 pairs, `d`, `dmin` (the fields of
/// [`Decoded`], 16 rows side by side).
#[repr(C, align(64))]
pub(super) struct BandDecoded {
    pub(super) q: [[u32; BAND_ROWS]; WORDS],
    pub(super) sc: [[i32; BAND_ROWS]; 16],
    pub(super) coef: [[u32; BAND_ROWS]; 8],
    pub(super) d: [f32; BAND_ROWS],
    pub(super) dmin: [f32; BAND_ROWS],
}

impl BandDecoded {
    /// All zeros.
    pub(super) fn new() -> Box<Self> {
        Box::new(BandDecoded {
            q: [[0; BAND_ROWS]; WORDS],
            sc: [[0; BAND_ROWS]; 16],
            coef: [[0; BAND_ROWS]; 8],
            d: [0.0; BAND_ROWS],
            dmin: [0.0; BAND_ROWS],
        })
    }

    /// Row `r`'s entries as a [`Decoded`] (tests compare the two decodes).
    #[cfg(test)]
    pub(super) fn row(&self, r: usize) -> Decoded {
        Decoded {
            q: std::array::from_fn(|k| self.q[k][r]),
            sc: std::array::from_fn(|s| self.sc[s][r]),
            coef: std::array::from_fn(|p| self.coef[p][r]),
            d: self.d[r],
            dmin: self.dmin[r],
        }
    }
}

/// Stores a register of 16 rows' words.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn put<T>(to: &mut [T; BAND_ROWS], v: __m512i) {
    _mm512_storeu_si512(to.as_mut_ptr().cast(), v);
}

/// The 16 f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn halves(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
}

/// Per 32-bit lane, the i16 pair `(lo & 0xFFFF) | (hi << 16)` of two
/// values that fit i16 (what `i16_pair` packs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn pair_lanes(lo: __m512i, hi: __m512i) -> __m512i {
    _mm512_mask_blend_epi16(0xAAAA_AAAA, lo, _mm512_slli_epi32::<16>(hi))
}

/// Q6_K: the step (16 `d`, then 52 words: 32 of `ql`, 16 of `qh`, 4 of the
/// i8 scales) into `out`, as `Format::decode` (`u = q`, 0..=63, the bias 32
/// taken off through the correction).
///
/// # Safety
/// AVX-512 F/BW; `step` is a whole Q6_K block step of a banded group.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6k(step: *const u8, out: &mut BandDecoded) {
    const R: usize = BAND_ROWS;
    let word = |k: usize| _mm512_loadu_si512(step.add(2 * R + 4 * R * k).cast());
    let (m4, m33) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x33));
    let six = |q: __m512i, bits: __m512i| _mm512_ternarylogic_epi32::<0xE4>(q, bits, m4);
    for h in 0..2 {
        for k in 0..8 {
            let (lo, hi, qh) = (word(16 * h + k), word(16 * h + 8 + k), word(32 + 8 * h + k));
            // As `one_token_bands::one_token_bands_q6k`: the 2-bit fields 0, 2
            // (`a`) and 1, 3 (`b`) of `qh` under each nibble.
            let a = _mm512_and_si512(qh, m33);
            let b = _mm512_and_si512(_mm512_srli_epi16::<2>(qh), m33);
            let u = [
                six(lo, _mm512_slli_epi16::<4>(a)),
                six(hi, _mm512_slli_epi16::<4>(b)),
                six(_mm512_srli_epi16::<4>(lo), a),
                six(_mm512_srli_epi16::<4>(hi), b),
            ];
            // Values 128h + 32c + 4k.. are word 32h + 8c + k.
            for (c, u) in u.iter().enumerate() {
                put(&mut out.q[32 * h + 8 * c + k], *u);
            }
        }
    }
    for w in 0..4 {
        // Scales 4w..4w + 4, a byte each in every row's lane.
        let v = word(48 + w);
        let sx = |j: usize| match j {
            0 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(v)),
            1 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(v)),
            2 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(v)),
            _ => _mm512_srai_epi32::<24>(v),
        };
        let s: [__m512i; 4] = std::array::from_fn(sx);
        for (j, s) in s.iter().enumerate() {
            put(&mut out.sc[4 * w + j], *s);
        }
        put(&mut out.coef[2 * w], pair_lanes(s[0], s[1]));
        put(&mut out.coef[2 * w + 1], pair_lanes(s[2], s[3]));
    }
    out.d = std::mem::transmute::<__m512, [f32; R]>(halves(step));
    out.dmin = [0.0; R];
}

/// Q4_K: the step (16 `d`, 16 `dmin`, then 35 words: the packed scales in
/// 3, the quants in 32) into `out`, as `Format::decode` (`u = q`).
///
/// # Safety
/// AVX-512 F/BW; `step` is a whole Q4_K block step of a banded group.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4k(step: *const u8, out: &mut BandDecoded) {
    const R: usize = BAND_ROWS;
    let word = |k: usize| _mm512_loadu_si512(step.add(4 * R * (1 + k)).cast());
    let m4 = _mm512_set1_epi8(0x0F);
    for j in 0..4 {
        for k in 0..8 {
            // Values 64j + 4k.. (low nibbles of qs[32j + 4k..]) and
            // 64j + 32 + 4k.. (their high nibbles).
            let v = word(3 + 8 * j + k);
            put(&mut out.q[16 * j + k], _mm512_and_si512(v, m4));
            put(
                &mut out.q[16 * j + 8 + k],
                _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
            );
        }
    }
    let (sc, mn) = q4k_scales_mins(word(0), word(1), word(2));
    for half in 0..2 {
        for j in 0..4 {
            put(&mut out.sc[4 * half + j], byte_lane(sc[half], j));
        }
        let m: [__m512i; 4] = std::array::from_fn(|j| byte_lane(mn[half], j));
        put(&mut out.coef[2 * half], pair_lanes(m[0], m[1]));
        put(&mut out.coef[2 * half + 1], pair_lanes(m[2], m[3]));
    }
    out.d = std::mem::transmute::<__m512, [f32; R]>(halves(step));
    out.dmin = std::mem::transmute::<__m512, [f32; R]>(halves(step.add(2 * R)));
}

/// IQ4_XS: the step (16 `d`, 16 `scales_h`, then 33 words: `scales_l`, the
/// quants in 32) into `out`, as `Format::decode` (`u = level + 128`).
///
/// # Safety
/// AVX-512 F/BW; `step` is a whole IQ4_XS block step of a banded group.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn iq4xs(step: *const u8, out: &mut BandDecoded) {
    const R: usize = BAND_ROWS;
    let word = |k: usize| _mm512_loadu_si512(step.add(4 * R * (1 + k)).cast());
    let m4 = _mm512_set1_epi8(0x0F);
    let levels = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    let table = _mm512_broadcast_i32x4(_mm_xor_si128(levels, _mm_set1_epi8(i8::MIN)));
    for ib in 0..8 {
        for k in 0..4 {
            // Values 32ib + 4k.. (low nibbles) and 32ib + 16 + 4k.. (high).
            let v = word(1 + 4 * ib + k);
            let lo = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4));
            let hi = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
            put(&mut out.q[8 * ib + k], lo);
            put(&mut out.q[8 * ib + 4 + k], hi);
        }
    }
    // The scale of sub-block ib: nibble ib of `scales_l`, bits 2ib..2ib + 2
    // of `scales_h` above it, less 32.
    let low_bits = word(0);
    let high_bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(step.add(2 * R).cast()));
    let count = |n: usize| _mm_cvtsi32_si128(n as i32);
    let sc: [__m512i; 8] = std::array::from_fn(|ib| {
        let low = _mm512_and_si512(
            _mm512_srl_epi32(low_bits, count(4 * ib)),
            _mm512_set1_epi32(0xF),
        );
        let high = _mm512_and_si512(
            _mm512_srl_epi32(high_bits, count(2 * ib)),
            _mm512_set1_epi32(3),
        );
        _mm512_sub_epi32(
            _mm512_or_si512(low, _mm512_slli_epi32::<4>(high)),
            _mm512_set1_epi32(32),
        )
    });
    for (ib, s) in sc.iter().enumerate() {
        put(&mut out.sc[ib], *s);
    }
    for p in 0..4 {
        put(&mut out.coef[p], pair_lanes(sc[2 * p], sc[2 * p + 1]));
    }
    out.d = std::mem::transmute::<__m512, [f32; R]>(halves(step));
    out.dmin = [0.0; R];
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::x86::k256::Format;
    use crate::backend::cpu::kernels::x86::{available, layout};
    use crate::backend::cpu::kernels::Isa;
    use crate::quant::reference::testutil::Rng;
    use crate::quant::GgmlType;

    /// Seeded random bytes.
    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut rng = Rng::new(seed);
        (0..n).map(|_| rng.next_u32() as u8).collect()
    }

    /// 16 rows of 3 random blocks of `W` (finite f16 scales at `halves`
    /// offsets), banded as the kernels store them; each step decoded at
    /// once equals each row's block decoded alone.
    fn check<W: Format>(
        ty: GgmlType,
        f16_at: &[usize],
        decode_band: unsafe fn(*const u8, &mut BandDecoded),
    ) {
        let (bb, nb) = (size_of::<W>(), 3);
        for seed in [3u64, 11, 2024] {
            let mut w = bytes(seed, BAND_ROWS * nb * bb);
            for block in w.chunks_exact_mut(bb) {
                for &at in f16_at {
                    // Finite: exponent below all ones.
                    block[at + 1] &= 0xBB;
                }
            }
            let plain = w.clone();
            layout(Isa::Avx512, ty).apply(&mut w, nb * bb, bb);
            assert_ne!(w, plain, "{ty}: not banded");
            let mut dec = BandDecoded::new();
            for b in 0..nb {
                // SAFETY: AVX-512 VNNI is available (checked by the
                // caller); step `b` is a whole block step of the group.
                unsafe { decode_band(w.as_ptr().add(b * BAND_ROWS * bb), &mut dec) };
                for r in 0..BAND_ROWS {
                    let block: W = bytemuck::pod_read_unaligned(&plain[(r * nb + b) * bb..][..bb]);
                    let mut want = Decoded::zeroed();
                    // SAFETY: AVX2, FMA, F16C come with AVX-512 here.
                    unsafe { block.decode(&mut want) };
                    let got = dec.row(r);
                    let ctx = format!("{ty} seed {seed} block {b} row {r}");
                    assert_eq!(got.q, want.q, "{ctx}: quants");
                    let sub = WORDS / W::SUB;
                    assert_eq!(got.sc[..sub], want.sc[..sub], "{ctx}: scales");
                    let pairs = W::PAIR_WORDS;
                    assert_eq!(got.coef[..pairs], want.coef[..pairs], "{ctx}: coefficients");
                    assert_eq!(got.d.to_bits(), want.d.to_bits(), "{ctx}: d");
                    if W::MIN {
                        assert_eq!(got.dmin.to_bits(), want.dmin.to_bits(), "{ctx}: dmin");
                    }
                }
            }
        }
    }

    #[test]
    fn band_steps_decode_as_their_rows_blocks() {
        if !available(Isa::Avx512) {
            eprintln!("skipped: this CPU lacks AVX-512 VNNI");
            return;
        }
        check::<BlockQ4K>(GgmlType::Q4_K, &[0, 2], q4k);
        check::<BlockQ6K>(GgmlType::Q6_K, &[208], q6k);
        check::<BlockIQ4XS>(GgmlType::IQ4_XS, &[0], iq4xs);
    }
}
