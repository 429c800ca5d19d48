//! The row kernels of the fast attention (`attn_fast`): a table of
//! function pointers filled once for the ISA the CPU has (AVX-512, AVX2 with
//! F16C, wasm SIMD128, or portable scalar), each working on a whole tile of keys so one
//! indirect call covers tens of rows.

use super::attention::KvRef;
use super::kernels::{fp16, Isa};

/// Gathers rows into a dense f32 tile: for each `slot` of `slots`,
/// `width` values at `slot * stride + off` of the cache, converted to f32,
/// into `dst[i * width..]`. Callers have bounds-checked every row.
pub type GatherFn = fn(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, dst: &mut [f32]);

/// `out[j] = q · tile[j]` for the `out.len()` rows of width `q.len()` of `tile`.
pub type ScoresFn = fn(q: &[f32], tile: &[f32], out: &mut [f32]);

/// `acc += Σ_j p[j] * tile[j]` over the `p.len()` rows of width `acc.len()` of `tile`.
pub type AccumFn = fn(p: &[f32], tile: &[f32], acc: &mut [f32]);

/// `x = exp(x - m)` element-wise (inputs at most `m`); returns the sum.
pub type ExpSumFn = fn(x: &mut [f32], m: f32) -> f32;

/// `x *= s` element-wise.
pub type ScaleFn = fn(x: &mut [f32], s: f32);

/// Keys per tile of the multi-query kernels ([`MultiKernels`]).
pub const MULTI_TILE: usize = 32;

/// `out[i * MULTI_TILE + j] = q_i · key_j` for the `out.len() / MULTI_TILE`
/// queries `q_i = q[i * hk..]` and the [`MULTI_TILE`] keys of `kt`, stored
/// transposed (`kt[d * MULTI_TILE + j]`: dimension `d` of key `j`, so
/// `hk = kt.len() / MULTI_TILE`).
pub type ScoresNFn = fn(q: &[f32], kt: &[f32], out: &mut [f32]);

/// `acc[i * hv..][..hv] += Σ_{j < n} p[i * MULTI_TILE + j] * v[j * hv..][..hv]`
/// for the `acc.len() / hv` queries `i`, where `n = v.len() / hv`.
pub type AccumNFn = fn(p: &[f32], v: &[f32], hv: usize, acc: &mut [f32]);

/// [`GatherFn`] into the layout of [`ScoresNFn`]: `kt[d * MULTI_TILE + j]`
/// = value `d` of the row of `slots[j]` (at `slot * stride + off` of the
/// cache, as f32), for the `hk = kt.len() / MULTI_TILE` values of each of
/// the (at most [`MULTI_TILE`]) slots, zero for `j >= slots.len()`.
/// Callers have bounds-checked every row.
pub type GatherTFn = fn(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, kt: &mut [f32]);

/// One online-softmax step of several queries over one key tile:
/// for each query `i` with scores `sc[i * MULTI_TILE + lo..][..hi - lo]`
/// and state `ml[2 i..2 i + 2] = (m, l)`, outputs `acc[i * hv..][..hv]`
/// (`hv = acc.len() / queries`): the new maximum `m'`, `acc *= exp(m -
/// m')`, the scores replaced by `exp(score - m')`, `l = l exp(m - m') +
/// sum`, `m = m'`. Scores outside `lo..hi` are left undefined.
pub type SoftmaxNFn = fn(sc: &mut [f32], lo: usize, hi: usize, ml: &mut [f32], acc: &mut [f32]);

/// Asks for the cache lines of the rows of `slots` (`width` values at
/// `slot * stride + off`) ahead of their use; never faults.
pub type PrefetchFn = fn(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, width: usize);

/// Kernels that score and accumulate several queries (the heads of one
/// position that share a K/V head) against one tile of keys per call: each
/// key and value loaded serves every query, and the scores come out as
/// whole vectors with no horizontal sums.
#[derive(Clone, Copy)]
pub struct MultiKernels {
    /// Most queries per call.
    pub max_queries: usize,
    /// Queries · transposed key tile.
    pub scores: ScoresNFn,
    /// The online-softmax step between `scores` and `accum`.
    pub softmax: SoftmaxNFn,
    /// Weighted sums of a value tile for each query.
    pub accum: AccumNFn,
    /// Rows of the cache to a key tile in the layout of `scores`.
    pub gather_t: GatherTFn,
    /// The next tile's rows asked for while this one is computed.
    pub prefetch: PrefetchFn,
}

/// The attention kernels of one ISA.
#[derive(Clone, Copy)]
pub struct AttnKernels {
    /// The ISA they use.
    pub isa: Isa,
    /// Rows of the cache to an f32 tile.
    pub gather: GatherFn,
    /// Query · key tile.
    pub scores: ScoresFn,
    /// Weighted sum of a value tile.
    pub accum: AccumFn,
    /// Shifted exponentials and their sum.
    pub exp_sum: ExpSumFn,
    /// Scaling.
    pub scale: ScaleFn,
    /// Several queries per key tile, where the ISA has them (the one-query
    /// kernels above otherwise).
    pub multi: Option<MultiKernels>,
}

impl std::fmt::Debug for AttnKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AttnKernels({})", self.isa)
    }
}

impl AttnKernels {
    /// The portable kernels (every target).
    pub fn scalar() -> Self {
        Self {
            isa: Isa::Scalar,
            gather: gather_scalar,
            scores: scores_scalar,
            accum: accum_scalar,
            exp_sum: exp_sum_scalar,
            scale: scale_scalar,
            multi: None,
        }
    }

    /// The kernels of `isa`, `None` when this CPU lacks it.
    pub fn for_isa(isa: Isa) -> Option<Self> {
        if !isa.available() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            super::kernels::x86::attention::kernels(isa).or_else(|| Some(Self::scalar()))
        }
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        {
            super::kernels::wasm::attention::kernels(isa).or_else(|| Some(Self::scalar()))
        }
        #[cfg(not(any(
            target_arch = "x86_64",
            all(target_arch = "wasm32", target_feature = "simd128")
        )))]
        {
            Some(Self::scalar())
        }
    }

    /// The kernels of the fastest ISA this CPU has.
    pub fn best() -> Self {
        Self::for_isa(Isa::best()).unwrap_or_else(Self::scalar)
    }
}

/// Lowest exponent argument of the vector [`ExpSumFn`]s: below it exp
/// underflows (the result is then about 1.6e-38, which no softmax weight
/// can tell from 0).
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
pub(super) const EXP_MIN: f32 = -87.0;

/// Scalar [`GatherFn`]; f32 rows are plain copies, and the f32 copy is shared
/// by every ISA.
pub(super) fn gather_scalar(
    src: KvRef<'_>,
    slots: &[usize],
    stride: usize,
    off: usize,
    dst: &mut [f32],
) {
    let width = dst.len() / slots.len().max(1);
    for (d, &s) in dst.chunks_exact_mut(width.max(1)).zip(slots) {
        let at = s * stride + off;
        match src {
            KvRef::F16(v) => {
                for (o, &h) in d.iter_mut().zip(&v[at..at + width]) {
                    *o = fp16(h);
                }
            }
            KvRef::F32(v) => d.copy_from_slice(&v[at..at + width]),
        }
    }
}

/// The queries and keys of an [`AccumNFn`] call, `None` where there is
/// nothing to do or the scores are too short (the SIMD kernels' check).
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
pub(super) fn accum_n_shape(
    p: &[f32],
    v: &[f32],
    hv: usize,
    acc: &[f32],
) -> Option<(usize, usize)> {
    if hv == 0 {
        return None;
    }
    let (nq, n) = (acc.len() / hv, (v.len() / hv).min(MULTI_TILE));
    (nq > 0 && p.len() >= (nq - 1) * MULTI_TILE + n).then_some((nq, n))
}

/// [`AccumNFn`] one value at a time over `n` keys (the SIMD kernels' value
/// widths that are not whole vectors).
#[cfg(any(
    target_arch = "x86_64",
    all(target_arch = "wasm32", target_feature = "simd128")
))]
pub(super) fn accum_n_scalar(p: &[f32], v: &[f32], hv: usize, n: usize, acc: &mut [f32]) {
    for (i, a) in acc.chunks_exact_mut(hv).enumerate() {
        for (j, vj) in v.chunks_exact(hv).take(n).enumerate() {
            let pj = p[i * MULTI_TILE + j];
            for (x, &y) in a.iter_mut().zip(vj) {
                *x += pj * y;
            }
        }
    }
}

/// f16 values to f32, one by one (the SIMD kernels' tails).
#[cfg(target_arch = "x86_64")]
pub(super) fn f16_to_f32_scalar(src: &[half::f16], dst: &mut [f32]) {
    for (o, &h) in dst.iter_mut().zip(src) {
        *o = fp16(h);
    }
}

fn scores_scalar(q: &[f32], tile: &[f32], out: &mut [f32]) {
    let w = q.len().max(1);
    for (o, k) in out.iter_mut().zip(tile.chunks_exact(w)) {
        *o = super::kernels::float::vec_dot_f32(k, q);
    }
}

fn accum_scalar(p: &[f32], tile: &[f32], acc: &mut [f32]) {
    let w = acc.len().max(1);
    for (&pj, v) in p.iter().zip(tile.chunks_exact(w)) {
        for (a, &x) in acc.iter_mut().zip(v) {
            *a += pj * x;
        }
    }
}

fn exp_sum_scalar(x: &mut [f32], m: f32) -> f32 {
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    sum
}

fn scale_scalar(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}
