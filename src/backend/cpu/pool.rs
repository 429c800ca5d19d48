//! A small persistent worker pool for the many short parallel regions of a
//! decode step (about 240 per token): workers spin a bounded number of
//! times on the region counter, then park on a condvar; the caller takes
//! chunks too.
//!
//! Chunks are claimed from one atomic counter, so a region's chunks go to
//! whichever thread is free (dynamic balance, like rayon's stealing).
//!
//! Robust on a busy machine: a worker *joins* a region (one atomic step on
//! `state`) before it takes a chunk, and the caller *closes* the region
//! once every chunk is claimed. The caller then waits only for the workers
//! that joined, never for one that has not yet run: a worker that lost its
//! core to another process costs the region nothing unless it was
//! descheduled in the middle of a chunk, which chunk sizes of several per
//! thread keep short (the callers size them so).
//!
//! Natively the workers are threads of their own; in the threaded wasm
//! build (`+atomics`) they are long-lived jobs on rayon's global pool,
//! whose threads the page made from Web Workers (where blocking on a
//! condvar, `memory.atomic.wait`, is allowed).

use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// Polls of the region counter before a waiting worker parks. Natively a
/// `pause` takes 10-140 cycles, so this is some tens to hundreds of
/// microseconds: longer than the gaps between the regions of one token,
/// far shorter than a scheduler time slice.
#[cfg(not(target_arch = "wasm32"))]
const SPIN: u32 = 1 << 13;
/// wasm has no `pause`: a poll is one atomic load (a few ns).
#[cfg(target_arch = "wasm32")]
const SPIN: u32 = 1 << 16;

/// Polls while the caller waits for joined workers before it yields its
/// core (a worker that joined and lost its core needs that core back).
const CALLER_SPIN: u32 = 1 << 10;

/// `state` layout: the region number in the high 32 bits, then the closed
/// flag, then the number of workers inside the region.
const EPOCH_SHIFT: u32 = 32;
const CLOSED: u64 = 1 << 31;
const ACTIVE: u64 = CLOSED - 1;

/// The job of one region: `run(i)` for every claimed chunk index `i`.
///
/// The pointer's real lifetime is the region: the caller does not return
/// before every worker that joined has left (`ACTIVE` back at zero).
#[derive(Clone, Copy)]
struct Job {
    run: *const (dyn Fn(usize) + Sync),
    chunks: usize,
}

struct Shared {
    /// Region number, closed flag and workers inside (see `EPOCH_SHIFT`).
    state: AtomicU64,
    /// The current region's job. Written by the caller only while the
    /// previous region is closed and empty, read by workers only after
    /// they joined an open region.
    job: UnsafeCell<Option<Job>>,
    /// Next chunk index to claim.
    next: AtomicUsize,
    /// Parked workers wait here (the mutex guards nothing but the wait).
    lock: Mutex<()>,
    wake: Condvar,
    /// Workers parked or about to park on `wake`.
    sleeping: AtomicUsize,
    /// A panic payload of a worker, re-raised on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    stop: AtomicBool,
}

// SAFETY: every field but `job` is Sync; `job` is written and read under
// the join/close protocol on `state` (see the field), which orders each
// write before the reads of its region and every read before the next
// write; the closure behind the pointer is `Sync`.
unsafe impl Sync for Shared {}
// SAFETY: as above; the raw pointer is only dereferenced inside a region.
unsafe impl Send for Shared {}

/// The pool: `workers` threads plus the caller.
pub(super) struct Pool {
    shared: Arc<Shared>,
    /// One region at a time: a nested or concurrent call runs inline.
    region: Mutex<()>,
    workers: usize,
    #[cfg(not(target_arch = "wasm32"))]
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.workers + 1)
    }
}

impl Pool {
    /// A pool of `threads` (the caller and up to `threads - 1` workers);
    /// `None` when not one worker could be started.
    pub(super) fn new(threads: usize) -> Option<Self> {
        let shared = Arc::new(Shared {
            state: AtomicU64::new(CLOSED),
            job: UnsafeCell::new(None),
            next: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            sleeping: AtomicUsize::new(0),
            panic: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let mut pool = Self {
            shared,
            region: Mutex::new(()),
            workers: 0,
            #[cfg(not(target_arch = "wasm32"))]
            handles: Vec::new(),
        };
        for i in 1..threads {
            if !pool.start_worker(i) {
                break;
            }
            pool.workers += 1;
        }
        (pool.workers > 0).then_some(pool)
    }

    /// Starts worker `i` on a thread of its own.
    #[cfg(not(target_arch = "wasm32"))]
    fn start_worker(&mut self, i: usize) -> bool {
        let s = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("hearth-cpu-{i}"))
            .spawn(move || worker(&s));
        match spawned {
            Ok(h) => {
                self.handles.push(h);
                true
            }
            Err(_) => false,
        }
    }

    /// Starts worker `i` as a long-lived job on rayon's global pool (Web
    /// Workers). At most all but one of rayon's threads are taken, across
    /// every pool alive, so rayon's own parallel loops (weight conversion
    /// at load) always have a thread left.
    #[cfg(target_arch = "wasm32")]
    fn start_worker(&mut self, _i: usize) -> bool {
        static HOSTED: AtomicUsize = AtomicUsize::new(0);
        let limit = rayon::current_num_threads().saturating_sub(1);
        let taken = HOSTED.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
            (h < limit).then_some(h + 1)
        });
        if taken.is_err() {
            return false;
        }
        let s = Arc::clone(&self.shared);
        rayon::spawn(move || {
            worker(&s);
            HOSTED.fetch_sub(1, Ordering::AcqRel);
        });
        true
    }

    /// Threads, the caller included.
    pub(super) fn count(&self) -> usize {
        self.workers + 1
    }

    /// Runs `f(i)` for every `i < chunks`, on all threads; returns when all
    /// ran. A panic in any chunk is re-raised here once the region is over.
    pub(super) fn run(&self, chunks: usize, f: &(dyn Fn(usize) + Sync)) {
        let guard = match self.region.try_lock() {
            Ok(g) if chunks > 1 => g,
            // One chunk, or a region already running (a nested call from a
            // chunk, or another thread sharing the pool): the caller alone.
            _ => return (0..chunks).for_each(f),
        };
        let s = &*self.shared;
        // SAFETY: only the lifetime is erased; this function does not
        // return before every worker that joined the region has left it.
        let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        s.next.store(0, Ordering::Relaxed);
        // SAFETY: the previous region is closed and no worker is inside
        // (the last `close_and_wait`), so no one reads `job` now; the store
        // to `state` below publishes the write.
        unsafe { *s.job.get() = Some(Job { run, chunks }) };
        let epoch = (s.state.load(Ordering::Relaxed) >> EPOCH_SHIFT).wrapping_add(1);
        s.state.store(epoch << EPOCH_SHIFT, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this notify after a parking worker's
            // check of `state` (it holds the lock until it waits).
            let _l = s.lock.lock();
            s.wake.notify_all();
        }
        let caller = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f, chunks)));
        close_and_wait(s);
        drop(guard);
        if let Err(p) = caller {
            std::panic::resume_unwind(p);
        }
        let worker_panic = s.panic.lock().ok().and_then(|mut p| p.take());
        if let Some(p) = worker_panic {
            std::panic::resume_unwind(p);
        }
    }
}

/// Closes the current region to late workers and waits for those inside.
fn close_and_wait(s: &Shared) {
    let mut state = s.state.fetch_or(CLOSED, Ordering::AcqRel);
    let mut polls = 0u32;
    while state & ACTIVE != 0 {
        polls = polls.saturating_add(1);
        if polls < CALLER_SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        state = s.state.load(Ordering::Acquire);
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

/// Waits until the region number differs from `seen` (spinning, then
/// parked); returns the state seen, or `None` when the pool stops.
fn wait_for_region(s: &Shared, seen: u64) -> Option<u64> {
    for _ in 0..SPIN {
        let state = s.state.load(Ordering::Acquire);
        if state >> EPOCH_SHIFT != seen {
            return Some(state);
        }
        std::hint::spin_loop();
    }
    let mut lock = s.lock.lock().ok()?;
    s.sleeping.fetch_add(1, Ordering::SeqCst);
    let state = loop {
        let state = s.state.load(Ordering::SeqCst);
        if state >> EPOCH_SHIFT != seen || s.stop.load(Ordering::SeqCst) {
            break state;
        }
        lock = match s.wake.wait(lock) {
            Ok(l) => l,
            Err(_) => break state,
        };
    };
    s.sleeping.fetch_sub(1, Ordering::SeqCst);
    (!s.stop.load(Ordering::SeqCst)).then_some(state)
}

/// Joins the open region of `state`, if it is still open; `Err` carries
/// the region number to wait past.
fn join(s: &Shared, mut state: u64) -> Result<u64, u64> {
    loop {
        if state & CLOSED != 0 {
            return Err(state >> EPOCH_SHIFT);
        }
        match s
            .state
            .compare_exchange_weak(state, state + 1, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => return Ok(state >> EPOCH_SHIFT),
            Err(now) => state = now,
        }
    }
}

/// A worker: for each new region, joins it if still open, takes chunks
/// until none are left, leaves.
fn worker(s: &Shared) {
    let mut seen = 0u64;
    while let Some(state) = wait_for_region(s, seen) {
        match join(s, state) {
            Err(epoch) => seen = epoch,
            Ok(epoch) => {
                seen = epoch;
                // SAFETY: this worker is inside an open region, so the
                // caller wrote `job` before opening it and will not write
                // it again before this worker leaves (the `fetch_sub`).
                let job = unsafe { *s.job.get() };
                if let Some(j) = job {
                    // SAFETY: the caller keeps the closure alive until
                    // every worker inside the region has left.
                    let f = unsafe { &*j.run };
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        claim(s, f, j.chunks)
                    }));
                    if let Err(p) = r {
                        if let Ok(mut slot) = s.panic.lock() {
                            slot.get_or_insert(p);
                        }
                    }
                }
                s.state.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Ok(_l) = self.shared.lock.lock() {
            self.shared.wake.notify_all();
        }
        #[cfg(not(target_arch = "wasm32"))]
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}
