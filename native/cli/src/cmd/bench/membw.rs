//! Memory read bandwidth: a SIMD sum streamed over a buffer far larger than
//! the last-level cache, split evenly over the threads, each thread reading
//! eight parts side by side with software prefetch, as decode's kernels
//! read a band of weight rows. Decode reads every weight once per token,
//! so this is the ceiling of its effective GB/s.
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
}

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
            "buffer_bytes": self.bytes,
            "reps": self.samples_gbps.len(),
            "samples_gbps": self.samples_gbps,
        })
    }
}

/// Reads a `bytes` buffer with `threads` threads once untimed (pages faulted
/// in, caches warm) and `reps` times timed.
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
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        let start = Instant::now();
        let total = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(per_thread)
                .map(|part| s.spawn(move || sum(part)))
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
    Ok(Bandwidth {
        threads,
        bytes: words * 4,
        samples_gbps: samples,
    })
}

/// The wrapping sum of `data`, with the widest vector adds this CPU has.
fn sum(data: &[u32]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F, checked just above.
            return unsafe { sum_avx512(data) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return unsafe { sum_avx2(data) };
        }
    }
    sum_lanes(data)
}

/// [`sum_lanes`] compiled for AVX-512F (512-bit loads and adds).
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(data: &[u32]) -> u32 {
    sum_prefetched(data)
}

/// [`sum_lanes`] compiled for AVX2 (256-bit loads and adds).
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(data: &[u32]) -> u32 {
    sum_prefetched(data)
}

/// Streams each thread reads side by side, and how far ahead of each one
/// its cache lines are prefetched (bytes).
#[cfg(target_arch = "x86_64")]
const STREAMS: usize = 8;
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 2048;

/// [`sum_lanes`] over [`STREAMS`] equal parts of `data` read side by side,
/// a vector from each in turn, each part's lines prefetched [`AHEAD`]
/// bytes ahead, the way decode's kernels read a band of weight rows. On
/// the virtual machines measured, one stream left to the hardware
/// prefetchers read at ~4 GB/s and one prefetched stream at ~17, while
/// the decode kernels reached ~29: this is the access pattern whose
/// ceiling they work against.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn sum_prefetched(data: &[u32]) -> u32 {
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
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD)) };
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
            assert_eq!(sum(&data), plain, "len {len}");
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
