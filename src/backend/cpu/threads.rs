//! The worker pool: rayon natively (a pool of the requested size), the
//! calling thread alone where threads are unavailable or one was asked for.

use rayon::prelude::*;

/// Runs data-parallel loops on a fixed number of threads.
#[derive(Debug)]
pub struct Threads {
    pool: Option<rayon::ThreadPool>,
}

impl Threads {
    /// A pool of `n` threads (0 = one per core). One thread, or a target
    /// without threads, runs everything on the caller.
    pub fn new(n: usize) -> Self {
        let n = if n == 0 {
            std::thread::available_parallelism().map_or(1, |p| p.get())
        } else {
            n
        };
        let pool = if n > 1 && cfg!(not(target_arch = "wasm32")) {
            rayon::ThreadPoolBuilder::new().num_threads(n).build().ok()
        } else {
            None
        };
        Self { pool }
    }

    /// Threads in use.
    pub fn count(&self) -> usize {
        self.pool
            .as_ref()
            .map_or(1, rayon::ThreadPool::current_num_threads)
    }

    /// Calls `f(chunk_index, chunk)` for every `chunk`-sized piece of `data`
    /// (the last may be shorter), in parallel when there is a pool.
    pub fn for_chunks<T, F>(&self, data: &mut [T], chunk: usize, f: F)
    where
        T: Send,
        F: Fn(usize, &mut [T]) + Sync + Send,
    {
        let chunk = chunk.max(1);
        match &self.pool {
            Some(pool) => pool.install(|| {
                data.par_chunks_mut(chunk)
                    .enumerate()
                    .for_each(|(i, c)| f(i, c))
            }),
            None => data
                .chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
        }
    }
}
