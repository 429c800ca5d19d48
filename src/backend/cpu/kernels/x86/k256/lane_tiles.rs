//! Tiled dots of Q4_K, Q5_K, Q6_K and IQ4_XS (256-element blocks with 16- or 32-element
//! sub-block scales) against Q8_K activations, in the scheme of `x86/lane_tiles.rs`:
//! `R` weight rows by `T` activation rows per pass, each weight block
//! decoded once per pass and each activation block loaded once per pass.
//!
//! Integer part per pair and block: `maddubs` (u8 weight x i8 activation
//! pairs to i16, exact: weights are at most 63) then `dpwssd` with the
//! sub-block scale (i16 pairs into i32 lanes: `vpdpwssd` with VNNI, `madd`
//! and an add on AVX2), exact. The min / offset term comes from the activation
//! block's 16-element sums (`bsums`). Each block's exact lanes are scaled
//! into f32 lanes, summed at the end of the row: equal to the per-pair dot
//! within f32 rounding.

/// The tile kernel `$name::<R, T>` of Q4_K (no `qh`) or Q5_K (`qh: qh`,
/// the fifth bits): 6-bit sub-block scales and mins, unsigned quants (at
/// most 31: `maddubs` is exact).
macro_rules! q45_tile {
    ($features:literal, $name:ident, $W:ty $(, qh: $qh:ident)?) => {
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const T: usize>(
            w: *const $W,
            ws: usize,
            a: *const BlockQ8K,
            as_: usize,
            nb: usize,
            out: *mut f32,
            rs: usize,
            ts: usize,
        ) {
            let m4 = _mm256_set1_epi8(0x0F);
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for b in 0..nb {
                if T == 1 {
                    prefetch_share(w.add(R * ws).cast(), R * size_of::<$W>(), b);
                }
                let mut sm = [[0u8; 16]; R];
                let mut mins = [_mm256_setzero_si256(); R];
                let mut d = [(0.0f32, 0.0f32); R];
                for r in 0..R {
                    let bx = &*w.add(r * ws + b);
                    sm[r] = k4_scales_mins(&bx.scales);
                    // min j / 2 for bsum j: the mins' bytes doubled, widened.
                    let mb = _mm_loadl_epi64(sm[r].as_ptr().add(8).cast());
                    mins[r] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb));
                    d[r] = (h2f(bx.d), h2f(bx.dmin));
                }
                let mut isum = [[_mm256_setzero_si256(); T]; R];
                for j in 0..4 {
                    let mut lo = [_mm256_setzero_si256(); R];
                    let mut hi = [_mm256_setzero_si256(); R];
                    let mut sl = [_mm256_setzero_si256(); R];
                    let mut sh = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let bx = &*w.add(r * ws + b);
                        let q4 = load32(bx.qs.as_ptr().add(32 * j));
                        lo[r] = _mm256_and_si256(q4, m4);
                        hi[r] = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
                        $(
                            // Q5_K: bit 2j of qh[l] is the fifth bit of
                            // element 64j + l, bit 2j + 1 of 64j + 32 + l.
                            let bits = load32(bx.$qh.as_ptr());
                            let fifth = |m: u8| {
                                let mask = _mm256_set1_epi8(m as i8);
                                let set = _mm256_cmpeq_epi8(_mm256_and_si256(bits, mask), mask);
                                _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                            };
                            lo[r] = _mm256_or_si256(lo[r], fifth(1 << (2 * j)));
                            hi[r] = _mm256_or_si256(hi[r], fifth(1 << (2 * j + 1)));
                        )?
                        sl[r] = _mm256_set1_epi16(i16::from(sm[r][2 * j]));
                        sh[r] = _mm256_set1_epi16(i16::from(sm[r][2 * j + 1]));
                    }
                    for t in 0..T {
                        let by = &*a.add(t * as_ + b);
                        let q8l = load32(by.qs.as_ptr().add(64 * j));
                        let q8h = load32(by.qs.as_ptr().add(64 * j + 32));
                        for r in 0..R {
                            let s = dpwssd(isum[r][t], _mm256_maddubs_epi16(lo[r], q8l), sl[r]);
                            isum[r][t] = dpwssd(s, _mm256_maddubs_epi16(hi[r], q8h), sh[r]);
                        }
                    }
                }
                for t in 0..T {
                    let by = &*a.add(t * as_ + b);
                    let bsums = load32(by.bsums.as_ptr());
                    for r in 0..R {
                        let msum = _mm256_madd_epi16(bsums, mins[r]);
                        let f = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isum[r][t]),
                            _mm256_set1_ps(d[r].0 * by.d),
                            acc[r][t],
                        );
                        acc[r][t] = _mm256_fnmadd_ps(
                            _mm256_cvtepi32_ps(msum),
                            _mm256_set1_ps(d[r].1 * by.d),
                            f,
                        );
                    }
                }
            }
            for r in 0..R {
                for t in 0..T {
                    *out.add(r * rs + t * ts) = hsum_ps(acc[r][t]);
                }
            }
        }

    };
}
pub(in super::super) use q45_tile;

/// The tile kernel `tile_iq4_xs::<R, T>`: per 32-element sub-block, the
/// signed levels' magnitudes times the activations carrying the levels'
/// signs (`maddubs`, exact: |level| <= 127, |q8| <= 127, pairs within i16),
/// then `dpwssd` with the sub-block's signed 6-bit scale (exact in i32).
macro_rules! iq4_xs_tile {
    ($features:literal) => {
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn tile_iq4_xs<const R: usize, const T: usize>(
            w: *const BlockIQ4XS,
            ws: usize,
            a: *const BlockQ8K,
            as_: usize,
            nb: usize,
            out: *mut f32,
            rs: usize,
            ts: usize,
        ) {
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for b in 0..nb {
                if T == 1 {
                    prefetch_share(w.add(R * ws).cast(), R * size_of::<BlockIQ4XS>(), b);
                }
                let mut sc = [[0i16; 8]; R];
                let mut d = [0.0f32; R];
                for r in 0..R {
                    let bx = &*w.add(r * ws + b);
                    for (ib, s) in sc[r].iter_mut().enumerate() {
                        let low = (bx.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
                        let high = ((bx.scales_h >> (2 * ib)) & 3) as u8;
                        *s = i16::from(low | (high << 4)) - 32;
                    }
                    d[r] = h2f(bx.d);
                }
                let mut isum = [[_mm256_setzero_si256(); T]; R];
                for ib in 0..8 {
                    let mut lv = [_mm256_setzero_si256(); R];
                    let mut mag = [_mm256_setzero_si256(); R];
                    let mut s16 = [_mm256_setzero_si256(); R];
                    for r in 0..R {
                        let bx = &*w.add(r * ws + b);
                        let qs = &*bx.qs.as_ptr().add(16 * ib).cast::<[u8; 16]>();
                        lv[r] = iq4_levels(qs);
                        mag[r] = _mm256_sign_epi8(lv[r], lv[r]);
                        s16[r] = _mm256_set1_epi16(sc[r][ib]);
                    }
                    for t in 0..T {
                        let by = &*a.add(t * as_ + b);
                        let q8 = load32(by.qs.as_ptr().add(32 * ib));
                        for r in 0..R {
                            let p = _mm256_maddubs_epi16(mag[r], _mm256_sign_epi8(q8, lv[r]));
                            isum[r][t] = dpwssd(isum[r][t], p, s16[r]);
                        }
                    }
                }
                for t in 0..T {
                    let by = &*a.add(t * as_ + b);
                    for r in 0..R {
                        acc[r][t] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(isum[r][t]),
                            _mm256_set1_ps(d[r] * by.d),
                            acc[r][t],
                        );
                    }
                }
            }
            for r in 0..R {
                for t in 0..T {
                    *out.add(r * rs + t * ts) = hsum_ps(acc[r][t]);
                }
            }
        }
    };
}
pub(in super::super) use iq4_xs_tile;

/// The k-quant tile kernels `tile_q4_k`, `tile_q5_k`, `tile_q6_k` and
/// `tile_iq4_xs` (`::<R, T>`) for `$features`, over the `dpwssd` in scope.
macro_rules! kquant_tiles {
    ($features:literal) => {
        q45_tile!($features, tile_q4_k, BlockQ4K);
        q45_tile!($features, tile_q5_k, BlockQ5K, qh: qh);
        iq4_xs_tile!($features);

        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn tile_q6_k<const R: usize, const T: usize>(
            w: *const BlockQ6K,
            ws: usize,
            a: *const BlockQ8K,
            as_: usize,
            nb: usize,
            out: *mut f32,
            rs: usize,
            ts: usize,
        ) {
            let m4 = _mm256_set1_epi8(0x0F);
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            for b in 0..nb {
                if T == 1 {
                    prefetch_share(w.add(R * ws).cast(), R * size_of::<BlockQ6K>(), b);
                }
                let mut sc16 = [_mm256_setzero_si256(); R];
                let mut d = [0.0f32; R];
                for r in 0..R {
                    let bx = &*w.add(r * ws + b);
                    sc16[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128(bx.scales.as_ptr().cast()));
                    d[r] = h2f(bx.d);
                }
                let mut isum = [[_mm256_setzero_si256(); T]; R];
                for h in 0..2 {
                    for c in 0..4 {
                        // Chunk c of half h: 32 values 0..64 (low 4 bits from
                        // ql, high 2 from qh), scales g and g + 1 per 16.
                        let mut q = [_mm256_setzero_si256(); R];
                        let mut sc = [_mm256_setzero_si256(); R];
                        let g = 8 * h + 2 * c;
                        for r in 0..R {
                            let bx = &*w.add(r * ws + b);
                            let ql = load32(bx.ql.as_ptr().add(64 * h + 32 * (c % 2)));
                            let ql = if c < 2 {
                                _mm256_and_si256(ql, m4)
                            } else {
                                _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4)
                            };
                            let qh = load32(bx.qh.as_ptr().add(32 * h));
                            let qh = match c {
                                0 => _mm256_slli_epi16::<4>(qh),
                                1 => _mm256_slli_epi16::<2>(qh),
                                2 => qh,
                                _ => _mm256_srli_epi16::<2>(qh),
                            };
                            let qh = _mm256_and_si256(qh, _mm256_set1_epi8(0x30));
                            q[r] = _mm256_or_si256(ql, qh);
                            sc[r] = _mm256_set_m128i(
                                _mm_set1_epi16(i16::from(bx.scales[g + 1])),
                                _mm_set1_epi16(i16::from(bx.scales[g])),
                            );
                        }
                        for t in 0..T {
                            let by = &*a.add(t * as_ + b);
                            let q8 = load32(by.qs.as_ptr().add(128 * h + 32 * c));
                            for r in 0..R {
                                let p = _mm256_maddubs_epi16(q[r], q8);
                                isum[r][t] = dpwssd(isum[r][t], p, sc[r]);
                            }
                        }
                    }
                }
                for t in 0..T {
                    let by = &*a.add(t * as_ + b);
                    let bsums = load32(by.bsums.as_ptr());
                    for r in 0..R {
                        // The stored values are q + 32: subtract 32 * sum(scale * bsum).
                        let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, sc16[r]));
                        let lanes = _mm256_sub_epi32(isum[r][t], off);
                        acc[r][t] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(lanes),
                            _mm256_set1_ps(d[r] * by.d),
                            acc[r][t],
                        );
                    }
                }
            }
            for r in 0..R {
                for t in 0..T {
                    *out.add(r * rs + t * ts) = hsum_ps(acc[r][t]);
                }
            }
        }
    };
}
pub(in super::super) use kquant_tiles;
