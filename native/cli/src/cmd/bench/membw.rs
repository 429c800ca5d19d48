//! Memory read bandwidth: a SIMD sum streamed over a buffer far larger than
//! the last-level cache, split evenly over the threads, each thread reading
//! one or several parts side by side with software prefetch, as decode's
//! kernels read weight rows ([`PATTERNS`]; the fastest is reported; one
//! plain stream where there is no prefetch instruction to use). Decode
//! reads every weight once per token, so this is the ceiling of its
//! effective GB/s.
//! The buffer comes from the same large-page memory as the CPU backend's
//! weights (`hearth::backend::cpu::hostmem`), so the figure is the one decode
//! can reach (4 KiB pages read about 3x slower in a virtual machine).

use std::hint::black_box;
use std::time::Instant;

use anyhow::{bail, Result};
use hearth::backend::cpu::hostmem::LargePages;
use serde_json::json;

/// Words summed per inner step: 16 independent lanes, so the adds never wait
/// on each other and the loop vectorizes to full-width vector adds.
const LANES: usize = 16;

/// One bandwidth measurement.
#[derive(Debug, Clone)]
pub struct Bandwidth {
    /// Threads reading.
    pub threads: usize,
    /// Bytes read per repetition.
    pub bytes: usize,
    /// GB/s (1e9 bytes) of each repetition.
    pub samples_gbps: Vec<f64>,
    /// How each thread read: the fastest of [`PATTERNS`].
    pub pattern: Pattern,
}

/// How each thread reads its part of the buffer: `streams` parts side by
/// side, a vector from each in turn, each one's lines prefetched `ahead`
/// bytes ahead (none where `ahead` is 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    /// Parts read side by side.
    pub streams: usize,
    /// Bytes each is prefetched ahead.
    pub ahead: usize,
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.streams == 1 { "" } else { "s" };
        match self.ahead {
            0 => write!(f, "{} stream{s}, no prefetch", self.streams),
            ahead => write!(f, "{} stream{s}, {ahead} B ahead", self.streams),
        }
    }
}

/// The reading patterns tried, each as fast as decode's kernels read on
/// some CPU: eight streams 2048 bytes ahead (Intel Ice Lake's four-group
/// passes, where one prefetched stream read ~17 GB/s against ~29), one or
/// two 4096 bytes ahead (AMD Zen 5's one-group passes; one thread read
/// 36-39 GB/s as eight streams, 40-41 as one or two).
#[cfg(target_arch = "x86_64")]
pub const PATTERNS: &[Pattern] = &[
    Pattern {
        streams: 8,
        ahead: 2048,
    },
    Pattern {
        streams: 2,
        ahead: 4096,
    },
    Pattern {
        streams: 1,
        ahead: 4096,
    },
];

/// The one reading pattern where [`sum`] has no prefetching kernel: a
/// plain sum left to the hardware prefetchers.
#[cfg(not(target_arch = "x86_64"))]
pub const PATTERNS: &[Pattern] = &[Pattern {
    streams: 1,
    ahead: 0,
}];

impl Bandwidth {
    /// The best repetition's GB/s.
    pub fn best(&self) -> f64 {
        self.samples_gbps.iter().copied().fold(0.0, f64::max)
    }

    /// The JSON line.
    pub fn json(&self) -> serde_json::Value {
        json!({
            "test": "membw",
            "threads": self.threads,
            "gbps": super::report::mean(&self.samples_gbps),
            "gbps_stddev": super::report::stddev(&self.samples_gbps),
            "gbps_best": self.best(),
            "streams": self.pattern.streams,
            "ahead_bytes": self.pattern.ahead,
            "buffer_bytes": self.bytes,
            "reps": self.samples_gbps.len(),
            "samples_gbps": self.samples_gbps,
        })
    }
}

/// Reads a `bytes` buffer with `threads` threads in each of [`PATTERNS`],
/// once untimed (pages faulted in, caches warm) and `reps` times timed, and
/// keeps the pattern with the highest mean.
pub fn measure(bytes: usize, threads: usize, reps: usize) -> Result<Bandwidth> {
    let words = bytes / 4 / (LANES * threads) * (LANES * threads);
    if words == 0 {
        bail!("--membw-mib is too small to split over {threads} threads");
    }
    // Distinct nonzero words, so nothing can be assumed about the sum.
    let mut buf = LargePages::default().alloc(words, "the bandwidth test")?;
    for (i, x) in buf.iter_mut().enumerate() {
        *x = (i as u32).wrapping_mul(0x9e37_79b9) | 1;
    }
    let per_thread = words / threads;
    let mut fastest: Option<Bandwidth> = None;
    for &pattern in PATTERNS {
        let mut samples = Vec::with_capacity(reps);
        for rep in 0..=reps {
            let start = Instant::now();
            let total = std::thread::scope(|s| {
                let handles: Vec<_> = buf
                    .chunks(per_thread)
                    .map(|part| s.spawn(move || sum(part, pattern)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().unwrap_or(0))
                    .fold(0u32, u32::wrapping_add)
            });
            let secs = start.elapsed().as_secs_f64().max(1e-9);
            black_box(total);
            if rep > 0 {
                samples.push((words * 4) as f64 / secs / 1e9);
            }
        }
        let mean = super::report::mean;
        if fastest
            .as_ref()
            .is_none_or(|f| mean(&samples) > mean(&f.samples_gbps))
        {
            fastest = Some(Bandwidth {
                threads,
                bytes: words * 4,
                samples_gbps: samples,
                pattern,
            });
        }
    }
    fastest.ok_or_else(|| anyhow::anyhow!("no reading pattern to measure"))
}

/// The wrapping sum of `data` read as `pattern` says, with the widest
/// vector adds this CPU has.
fn sum(data: &[u32], pattern: Pattern) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, checked just above.
            return unsafe { sum_avx512(data, pattern) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { sum_avx2(data, pattern) };
        }
    }
    let _ = pattern;
    sum_lanes(data)
}

/// [`sum_prefetched`] compiled for AVX-512F (512-bit loads and adds).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(data: &[u32], pattern: Pattern) -> u32 {
    sum_prefetched(data, pattern)
}

/// [`sum_prefetched`] compiled for AVX2 (256-bit loads and adds).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(data: &[u32], pattern: Pattern) -> u32 {
    sum_prefetched(data, pattern)
}

/// [`sum_streams`] with `pattern`'s number of streams (1, 2, else 8).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sum_prefetched(data: &[u32], pattern: Pattern) -> u32 {
    match pattern.streams {
        1 => sum_streams::<1>(data, pattern.ahead),
        2 => sum_streams::<2>(data, pattern.ahead),
        _ => sum_streams::<8>(data, pattern.ahead),
    }
}

/// [`sum_lanes`] over `STREAMS` equal parts of `data` read side by side,
/// a vector from each in turn, each part's lines prefetched `ahead` bytes
/// ahead, the way decode's kernels read weight rows (one stream left to
/// the hardware prefetchers read ~4 GB/s on the virtual machines measured).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sum_streams<const STREAMS: usize>(data: &[u32], ahead: usize) -> u32 {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let part = data.len() / STREAMS / LANES * LANES;
    let mut acc = [[0u32; LANES]; STREAMS];
    for at in (0..part).step_by(LANES) {
        for (k, acc) in acc.iter_mut().enumerate() {
            let start = k * part + at;
            // One cache line per step (LANES words).
            let p = data.as_ptr().wrapping_add(start).cast::<i8>();
            // SAFETY: a prefetch only hints the cache and never faults, so
            // an address past the buffer is harmless.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead)) };
            for (a, &x) in acc.iter_mut().zip(&data[start..start + LANES]) {
                *a = a.wrapping_add(x);
            }
        }
    }
    let rest = sum_lanes(&data[STREAMS * part..]);
    acc.iter().flatten().fold(rest, |s, &x| s.wrapping_add(x))
}

/// The wrapping sum of `data` in [`LANES`] independent accumulators: a
/// loop the compiler turns into vector loads and adds.
#[inline(always)]
fn sum_lanes(data: &[u32]) -> u32 {
    let mut acc = [0u32; LANES];
    let mut chunks = data.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a = a.wrapping_add(x);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u32, |s, &x| s.wrapping_add(x));
    acc.iter().fold(tail, |s, &x| s.wrapping_add(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_sum_equals_plain_sum() {
        // Lengths around the lane count, values that wrap.
        for len in [0usize, 1, 15, 16, 17, 100, 1001] {
            let data: Vec<u32> = (0..len as u32)
                .map(|i| i.wrapping_mul(0x9e37_79b9) | 1)
                .collect();
            let plain = data.iter().fold(0u32, |s, &x| s.wrapping_add(x));
            for &pattern in PATTERNS {
                assert_eq!(sum(&data, pattern), plain, "len {len}, {pattern}");
            }
        }
    }

    #[test]
    fn measures_positive_bandwidth() {
        let bw = measure(4 << 20, 2, 2).expect("measure");
        assert_eq!(bw.samples_gbps.len(), 2);
        assert!(bw.samples_gbps.iter().all(|&g| g > 0.0), "{bw:?}");
        assert_eq!(bw.bytes % (16 * 4 * 2), 0);
    }
}
