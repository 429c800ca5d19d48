//! A small persistent worker pool (opt-in: `HEARTH_POOL=spin`) for the
//! many short parallel regions of a decode step (about 240 per token):
//! workers spin briefly on an epoch
//! counter, then park on a condvar; the caller takes chunks too and spins
//! until the workers are done. Native targets only (it spawns threads).
//!
//! Chunks are claimed from one atomic counter, so a region's chunks go to
//! whichever thread is free (dynamic balance, like rayon's stealing).

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Spins on the epoch before a worker parks (`pause` takes up to ~140
/// cycles: some tens of microseconds, about the gap between two ops).
const SPIN: u32 = 1_000;

/// The job of one region: `run(i)` for every claimed chunk index `i`.
///
/// The pointer's real lifetime is the region: the caller does not return
/// before every worker has finished with it (`Shared::done`).
#[derive(Clone, Copy)]
struct Job {
    run: *const (dyn Fn(usize) + Sync),
    chunks: usize,
}

// SAFETY: the closure behind `run` is `Sync`, and it outlives every use
// (the caller waits for all workers before the region ends).
unsafe impl Send for Job {}

struct Shared {
    /// Bumped by the caller for each region; workers wait for a change.
    epoch: AtomicUsize,
    /// The current job, written under the lock before the epoch moves.
    job: Mutex<Option<Job>>,
    wake: Condvar,
    /// Workers parked on `wake`.
    sleeping: AtomicUsize,
    /// Next chunk index to claim.
    next: AtomicUsize,
    /// Workers finished with the current region.
    done: AtomicUsize,
    /// A panic payload of a worker, re-raised on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    stop: std::sync::atomic::AtomicBool,
}

/// The pool: `workers` threads plus the caller.
pub(super) struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.workers.len() + 1)
    }
}

impl Pool {
    /// A pool of `threads` (the caller and `threads - 1` workers); `None`
    /// when a worker cannot be spawned.
    pub(super) fn new(threads: usize) -> Option<Self> {
        let shared = Arc::new(Shared {
            epoch: AtomicUsize::new(0),
            job: Mutex::new(None),
            wake: Condvar::new(),
            sleeping: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            stop: std::sync::atomic::AtomicBool::new(false),
        });
        let mut workers = Vec::new();
        for i in 1..threads {
            let s = Arc::clone(&shared);
            let h = std::thread::Builder::new()
                .name(format!("hearth-cpu-{i}"))
                .spawn(move || worker(&s))
                .ok()?;
            workers.push(h);
        }
        Some(Self { shared, workers })
    }

    /// Threads, the caller included.
    pub(super) fn count(&self) -> usize {
        self.workers.len() + 1
    }

    /// Runs `f(i)` for every `i < chunks`, on all threads; returns when all ran.
    pub(super) fn run(&self, chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        let s = &*self.shared;
        if chunks <= 1 || self.workers.is_empty() {
            (0..chunks).for_each(f);
            return;
        }
        // SAFETY: only the lifetime is erased; this function does not return
        // before every worker has counted itself done with this job.
        let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        s.next.store(0, Ordering::Relaxed);
        s.done.store(0, Ordering::Relaxed);
        if let Ok(mut job) = s.job.lock() {
            *job = Some(Job { run, chunks });
            s.epoch.fetch_add(1, Ordering::Release);
            if s.sleeping.load(Ordering::Relaxed) > 0 {
                s.wake.notify_all();
            }
        }
        let caller = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f, chunks)));
        let mut spins = 0u32;
        while s.done.load(Ordering::Acquire) < self.workers.len() {
            spins = spins.saturating_add(1);
            if spins < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Ok(mut job) = s.job.lock() {
            *job = None;
        }
        if let Err(p) = caller {
            std::panic::resume_unwind(p);
        }
        let worker_panic = s.panic.lock().ok().and_then(|mut p| p.take());
        if let Some(p) = worker_panic {
            std::panic::resume_unwind(p);
        }
    }
}

/// Claims and runs chunks until none are left.
fn claim(s: &Shared, f: &(dyn Fn(usize) + Sync), chunks: usize) {
    loop {
        let i = s.next.fetch_add(1, Ordering::Relaxed);
        if i >= chunks {
            return;
        }
        f(i);
    }
}

/// A worker: waits for each new epoch, runs its share, counts itself done.
fn worker(s: &Shared) {
    let mut seen = 0usize;
    loop {
        let mut spins = 0u32;
        while s.epoch.load(Ordering::Acquire) == seen && spins < SPIN {
            spins += 1;
            std::hint::spin_loop();
        }
        let Ok(mut job) = s.job.lock() else { return };
        while s.epoch.load(Ordering::Acquire) == seen && !s.stop.load(Ordering::Relaxed) {
            s.sleeping.fetch_add(1, Ordering::Relaxed);
            job = match s.wake.wait(job) {
                Ok(j) => j,
                Err(_) => return,
            };
            s.sleeping.fetch_sub(1, Ordering::Relaxed);
        }
        if s.stop.load(Ordering::Relaxed) {
            return;
        }
        seen = s.epoch.load(Ordering::Acquire);
        let current = *job;
        drop(job);
        if let Some(j) = current {
            // SAFETY: the caller keeps the closure alive until `done` counts
            // this worker (see `Pool::run`).
            let f = unsafe { &*j.run };
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f, j.chunks)));
            if let Err(p) = r {
                if let Ok(mut slot) = s.panic.lock() {
                    slot.get_or_insert(p);
                }
            }
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Ok(_job) = self.shared.job.lock() {
            self.shared.epoch.fetch_add(1, Ordering::Release);
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}
