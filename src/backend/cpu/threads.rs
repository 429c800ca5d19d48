//! The worker pool: rayon (a pool of the requested size; in the threaded
//! wasm build, `+atomics`, rayon's global pool, which the host fills with Web
//! Workers through wasm-bindgen-rayon's `initThreadPool` before loading), or natively the
//! small purpose-built pool of `pool` (spin, then park) when
//! `HEARTH_POOL=spin` asks for it; the calling thread alone where threads
//! are unavailable or one was asked for.
//!
//! rayon stays the default: measured on a 2-core machine shared with other
//! work, one rayon region costs about 7 us at 2 threads, and the spinning
//! pool more (23-63 us), because spinning workers lose their core to the
//! neighbours exactly when a region needs them. On a quiet machine the
//! spinning pool's regions are the cheaper; `cargo test --release --test
//! cpu_threads -- --ignored --nocapture` measures both (`HEARTH_POOL=spin`).

use rayon::prelude::*;

#[cfg(not(target_arch = "wasm32"))]
use super::pool::Pool;

/// Which threads run the regions.
#[derive(Debug)]
enum Inner {
    /// The calling thread alone.
    One,
    /// A rayon pool of the requested size.
    Rayon(rayon::ThreadPool),
    /// rayon's global pool (threaded wasm: the engine cannot spawn workers,
    /// the host made the pool).
    Global,
    /// The purpose-built pool.
    #[cfg(not(target_arch = "wasm32"))]
    Own(Pool),
}

/// Runs data-parallel loops on a fixed number of threads.
#[derive(Debug)]
pub struct Threads {
    inner: Inner,
}

/// `&mut [T]`'s base pointer, shareable: chunks handed out are disjoint.
#[cfg(not(target_arch = "wasm32"))]
struct Base<T>(*mut T);

// SAFETY: each chunk index is claimed by exactly one thread (the pool's
// atomic counter), so the `&mut` chunks made from the base never overlap;
// `T: Send` lets them move to another thread.
#[cfg(not(target_arch = "wasm32"))]
unsafe impl<T: Send> Sync for Base<T> {}

impl Threads {
    /// A pool of `n` threads (0 = one per core). One thread, or a target
    /// without threads, runs everything on the caller.
    pub fn new(n: usize) -> Self {
        let n = if n == 0 {
            std::thread::available_parallelism().map_or(1, |p| p.get())
        } else {
            n
        };
        let rayon_pool = || {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .ok()
                .map_or(Inner::One, Inner::Rayon)
        };
        let shared_wasm = cfg!(all(target_arch = "wasm32", target_feature = "atomics"));
        let inner = if n <= 1 {
            Inner::One
        } else if shared_wasm {
            Inner::Global
        } else if std::env::var("HEARTH_POOL").is_ok_and(|v| v == "spin") {
            own_pool(n).unwrap_or_else(rayon_pool)
        } else {
            rayon_pool()
        };
        Self { inner }
    }

    /// A pool of `n` threads on the purpose-built spinning pool (where
    /// threads exist; otherwise as [`Threads::new`]).
    pub fn spinning(n: usize) -> Self {
        let inner = match own_pool(n.max(1)) {
            Some(p) if n > 1 => p,
            _ => Self::new(n).inner,
        };
        Self { inner }
    }

    /// Threads in use.
    pub fn count(&self) -> usize {
        match &self.inner {
            Inner::One => 1,
            Inner::Rayon(p) => p.current_num_threads(),
            Inner::Global => rayon::current_num_threads(),
            #[cfg(not(target_arch = "wasm32"))]
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
            Inner::Rayon(pool) => pool.install(|| {
                data.par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(i, c)| f(i, c))
            }),
            Inner::Global => data
                .par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
            Inner::One => data
                .chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
            #[cfg(not(target_arch = "wasm32"))]
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

/// The purpose-built pool of `n` threads.
#[cfg(not(target_arch = "wasm32"))]
fn own_pool(n: usize) -> Option<Inner> {
    Pool::new(n).map(Inner::Own)
}

/// No threads to build a pool from.
#[cfg(target_arch = "wasm32")]
fn own_pool(_: usize) -> Option<Inner> {
    None
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
