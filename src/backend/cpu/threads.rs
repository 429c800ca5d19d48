//! The worker pool: the purpose-built pool of `pool` by default (spin a
//! bounded time, then park; the caller never waits for a worker that has
//! not started on a region), or a rayon pool of the requested size with
//! `HEARTH_POOL=rayon`; the calling thread alone where threads are
//! unavailable or one was asked for.
//!
//! In the threaded wasm build (`+atomics`) the engine cannot spawn threads:
//! the pool's workers are long-lived jobs on rayon's global pool, which the
//! host fills with Web Workers through wasm-bindgen-rayon's `initThreadPool`
//! before loading; rayon's global pool runs the regions itself where no
//! worker could be hosted.
//!
//! Measured on a 2-core machine (SmolLM2-135M Q4_1, decode): rayon's
//! wake-ups cost more than a second thread gains (2 threads slower than
//! one), the purpose-built pool gives 1.8x. `cargo test --release --test
//! cpu_threads -- --ignored --nocapture` measures the cost of one region
//! on each.

use super::options::PoolKind;
use rayon::prelude::*;

#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
use super::pool::Pool;

/// Which threads run the regions.
#[derive(Debug)]
enum Inner {
    /// The calling thread alone.
    One,
    /// A rayon pool of the requested size.
    #[cfg(not(target_arch = "wasm32"))]
    Rayon(rayon::ThreadPool),
    /// rayon's global pool (threaded wasm, when no pool worker could be
    /// hosted on it).
    #[cfg(target_arch = "wasm32")]
    Global,
    /// The purpose-built pool.
    #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
    Own(Pool),
}

/// Runs data-parallel loops on a fixed number of threads.
#[derive(Debug)]
pub struct Threads {
    inner: Inner,
}

/// `&mut [T]`'s base pointer, shareable: chunks handed out are disjoint.
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
struct Base<T>(*mut T);

// SAFETY: each chunk index is claimed by exactly one thread (the pool's
// atomic counter), so the `&mut` chunks made from the base never overlap;
// `T: Send` lets them move to another thread.
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
unsafe impl<T: Send> Sync for Base<T> {}

/// `n`, or one per core for 0.
fn resolve(n: usize) -> usize {
    if n == 0 {
        std::thread::available_parallelism().map_or(1, |p| p.get())
    } else {
        n
    }
}

impl Threads {
    /// A pool of `n` threads (0 = one per core) on the purpose-built pool.
    /// One thread, or a target without threads, runs everything on the
    /// caller.
    pub fn new(n: usize) -> Self {
        Self::with_pool(n, PoolKind::Own)
    }

    /// A pool of `n` threads (0 = one per core) of `kind`.
    pub fn with_pool(n: usize, kind: PoolKind) -> Self {
        match kind {
            PoolKind::Own => Self::spinning(n),
            PoolKind::Rayon => Self::rayon(n),
        }
    }

    /// A pool of `n` threads (0 = one per core) on the purpose-built pool
    /// (where threads exist; otherwise the caller alone).
    pub fn spinning(n: usize) -> Self {
        let n = resolve(n);
        let inner = if n <= 1 { Inner::One } else { own_pool(n) };
        Self { inner }
    }

    /// A pool of `n` threads (0 = one per core) on rayon: a pool of its own
    /// natively, rayon's global pool in the threaded wasm build.
    pub fn rayon(n: usize) -> Self {
        let n = resolve(n);
        let inner = if n <= 1 { Inner::One } else { rayon_pool(n) };
        Self { inner }
    }

    /// Threads in use.
    pub fn count(&self) -> usize {
        match &self.inner {
            Inner::One => 1,
            #[cfg(not(target_arch = "wasm32"))]
            Inner::Rayon(p) => p.current_num_threads(),
            #[cfg(target_arch = "wasm32")]
            Inner::Global => rayon::current_num_threads(),
            #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
            Inner::Own(p) => p.count(),
        }
    }

    /// Calls `f(chunk_index, chunk)` for every `chunk`-sized piece of `data`
    /// (the last may be shorter), in parallel when there is a pool.
    pub fn for_chunks<T, F>(&self, data: &mut [T], chunk: usize, f: F)
    where
        T: Send,
        F: Fn(usize, &mut [T]) + Sync + Send,
    {
        let chunk = chunk.max(1);
        match &self.inner {
            #[cfg(not(target_arch = "wasm32"))]
            Inner::Rayon(pool) => pool.install(|| {
                data.par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(i, c)| f(i, c))
            }),
            #[cfg(target_arch = "wasm32")]
            Inner::Global => data
                .par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
            Inner::One => data
                .chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
            #[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
            Inner::Own(pool) => {
                let len = data.len();
                let base = Base(data.as_mut_ptr());
                let base = &base;
                pool.run(len.div_ceil(chunk), &|i| {
                    let start = i * chunk;
                    let n = chunk.min(len - start);
                    // SAFETY: `start + n <= len`, and chunk `i` is handed
                    // to one thread only (see `Base`); `data` is borrowed
                    // mutably for the whole call.
                    let c = unsafe { std::slice::from_raw_parts_mut(base.0.add(start), n) };
                    f(i, c);
                });
            }
        }
    }
}

/// A rayon pool of `n` threads (natively), or the caller alone when it
/// cannot be built.
#[cfg(not(target_arch = "wasm32"))]
fn rayon_pool(n: usize) -> Inner {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .ok()
        .map_or(Inner::One, Inner::Rayon)
}

/// rayon's global pool where the host made one (threaded wasm).
#[cfg(target_arch = "wasm32")]
fn rayon_pool(_: usize) -> Inner {
    if cfg!(target_feature = "atomics") {
        Inner::Global
    } else {
        Inner::One
    }
}

/// The purpose-built pool of `n` threads; rayon's where it cannot start.
#[cfg(any(not(target_arch = "wasm32"), target_feature = "atomics"))]
fn own_pool(n: usize) -> Inner {
    Pool::new(n).map_or_else(|| rayon_pool(n), Inner::Own)
}

/// No threads to build a pool from (single-thread wasm).
#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
fn own_pool(_: usize) -> Inner {
    Inner::One
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_run_on_every_thread_and_cover_the_data() {
        let threads = Threads::new(2);
        assert_eq!(threads.count(), 2);
        let ids = std::sync::Mutex::new(std::collections::HashSet::new());
        let mut data = vec![0usize; 64];
        threads.for_chunks(&mut data, 4, |i, c| {
            // Sleeping tasks overlap even on a busy machine.
            std::thread::sleep(std::time::Duration::from_millis(2));
            if let Ok(mut set) = ids.lock() {
                set.insert(std::thread::current().id());
            }
            c.iter_mut().for_each(|v| *v = i);
        });
        assert_eq!(ids.lock().map(|s| s.len()).unwrap_or(0), 2);
        assert!(data.iter().enumerate().all(|(j, &v)| v == j / 4));
        let one = Threads::new(1);
        assert_eq!(one.count(), 1);
    }
}
