//! The worker pool: rayon natively (a pool of the requested size); in the
//! threaded wasm build (`+atomics`) rayon's global pool, which the host fills
//! with Web Workers (wasm-bindgen-rayon's `initThreadPool`) before loading;
//! the calling thread alone where threads are unavailable or one was asked for.

use rayon::prelude::*;

/// Runs data-parallel loops on a fixed number of threads.
#[derive(Debug)]
pub struct Threads {
    pool: Option<rayon::ThreadPool>,
    /// Use rayon's global pool (threaded wasm: workers cannot be spawned
    /// from inside the engine, the host made the pool).
    global: bool,
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
        let shared_wasm = cfg!(all(target_arch = "wasm32", target_feature = "atomics"));
        let pool = if n > 1 && cfg!(not(target_arch = "wasm32")) {
            rayon::ThreadPoolBuilder::new().num_threads(n).build().ok()
        } else {
            None
        };
        Self {
            pool,
            global: n > 1 && shared_wasm,
        }
    }

    /// Threads in use.
    pub fn count(&self) -> usize {
        if self.global {
            return rayon::current_num_threads();
        }
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
            None if self.global => data
                .par_chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
            None => data
                .chunks_mut(chunk)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
        }
    }
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
