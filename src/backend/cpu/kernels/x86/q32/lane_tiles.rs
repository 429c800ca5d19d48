//! The eight-lane tile kernel of the 32-element formats ([`tile`]),
//! instantiated for AVX2 and AVX-512 VNNI by `x86/lane_tiles.rs`.

/// One format's tile kernel `$name::<R, T>`: `w` decodes weight block `bx`
/// to 32 bytes, `wd` its scale; `start` gives the i32 lanes a pair's sum
/// starts from for activation block `by` with quants `aq`; `pair` adds the
/// products of `w` and `x` to lanes `s`; `min` (Q4_1, Q5_1) adds `m * s`.
macro_rules! tile {
    ($features:literal, $name:ident, $W:ty, $A:ty,
     w: |$bx:ident| $wq:expr, wd: $wd:expr,
     a: |$by:ident, $aq:ident| $start:expr,
     pair: |$s:ident, $w:ident, $x:ident| $pair:expr
     $(, min: $wm:expr, $am:expr)?) => {
        #[allow(unused_mut, unused_variables, clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const T: usize>(
            w: *const $W,
            ws: usize,
            a: *const $A,
            as_: usize,
            nb: usize,
            out: *mut f32,
            rs: usize,
            ts: usize,
        ) {
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            let mut mins = [[0.0f32; T]; R];
            for b in 0..nb {
                if T == 1 {
                    prefetch_share(w.add(R * ws).cast(), R * size_of::<$W>(), b);
                }
                let mut wq = [_mm256_setzero_si256(); R];
                let mut wd = [_mm256_setzero_ps(); R];
                let mut wm = [0.0f32; R];
                for r in 0..R {
                    let $bx = &*w.add(r * ws + b);
                    wq[r] = $wq;
                    wd[r] = _mm256_set1_ps($wd);
                    $(wm[r] = $wm;)?
                }
                for t in 0..T {
                    let $by = &*a.add(t * as_ + b);
                    let $aq = load32($by.qs.as_ptr());
                    let start = $start;
                    let ad = _mm256_set1_ps(h2f($by.d));
                    $(
                        let am = $am;
                        for r in 0..R {
                            mins[r][t] += wm[r] * am;
                        }
                    )?
                    for r in 0..R {
                        let ($s, $w, $x) = (start, wq[r], $aq);
                        let lanes = $pair;
                        acc[r][t] = _mm256_fmadd_ps(
                            _mm256_cvtepi32_ps(lanes),
                            _mm256_mul_ps(wd[r], ad),
                            acc[r][t],
                        );
                    }
                }
            }
            for r in 0..R {
                for t in 0..T {
                    *out.add(r * rs + t * ts) = hsum_ps(acc[r][t]) + mins[r][t];
                }
            }
        }
    };
}
pub(in super::super) use tile;
