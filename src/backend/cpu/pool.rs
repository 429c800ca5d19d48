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
//! Graceful on a crowded machine: a region *stalls* where no worker joined
//! it though none was parked (they lost their core), or where the caller
//! kept waiting on one that lost its core in mid-chunk (a wait longer than
//! its own work). Where most recent regions stall, the pool runs the next
//! regions on the caller alone, twice as many each time the stalls go on
//! (up to `MAX_BACKOFF`), then tries the workers again; so 2 threads
//! degrade towards one thread's speed instead of below it: waking a worker
//! that then competes for the same share of the machine as the caller
//! costs more than it brings. A stall now and then (a virtual CPU the host
//! took away for a moment) does not count: running solo for it would cost
//! far more than the stall did. (On wasm, with no clock, only the first
//! signal counts.)
//!
//! Natively the workers are threads of their own; in the threaded wasm
//! build (`+atomics`) they are long-lived jobs on rayon's global pool,
//! whose threads the page made from Web Workers (where blocking on a
//! condvar, `memory.atomic.wait`, is allowed).

use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// How long a waiting worker polls the region counter before it parks:
/// longer than the gaps between the regions of one token (and than a
/// caller's last chunk, which the worker may wait out), far shorter than
/// an idle pause between requests. Parking is not cheap on a virtual
/// machine: the parked worker's vCPU halts, and waking it goes through
/// the host.
#[cfg(not(target_arch = "wasm32"))]
const WORKER_SPIN: Spin = Spin::micros(5_000);
/// wasm has no clock: rounds of 64 polls (a poll is one atomic load, a few
/// ns; there is no `pause` either).
#[cfg(target_arch = "wasm32")]
const WORKER_SPIN: Spin = Spin::rounds(1 << 10);

/// How long the caller polls for the joined workers to leave before it
/// parks: longer than a chunk (a worker still inside has at most one to
/// finish), shorter than a scheduler time slice (a worker that lost its
/// core needs one back, and a caller spinning on it burns its share).
/// On a virtual machine a caller that parks after every region waits on
/// the host to wake its vCPU: with a budget of 1024 polls (some 50 µs)
/// decode at 2 threads ran at half the speed it runs with this one.
#[cfg(not(target_arch = "wasm32"))]
const CALLER_SPIN: Spin = Spin::micros(2_000);
#[cfg(target_arch = "wasm32")]
const CALLER_SPIN: Spin = Spin::rounds(1 << 4);

/// Where stalls go on, the pool runs up to `1 << MAX_BACKOFF` regions (some
/// four decode steps of a small model) on the caller alone.
const MAX_BACKOFF: u32 = 10;
/// Parallel regions without a stall after which the backoff halves.
const CLEAN_DECAY: u32 = 64;
/// The stall rate is a moving average over about `1 << RATE_WINDOW`
/// regions, in units of `1 / RATE_ONE`.
const RATE_WINDOW: u32 = 3;
const RATE_ONE: u32 = 1 << 10;
/// The pool goes solo when the stall rate reaches this: half the recent
/// regions, some six stalls in a row from a clean start. Stalls of one
/// region in twenty (a busy host) stay well below it.
const RATE_SOLO: u32 = RATE_ONE / 2;
/// The rate a solo spell leaves behind: two stalls in a row on the return
/// to the workers start the next, longer spell.
const RATE_AFTER_SOLO: u32 = RATE_ONE * 3 / 8;
/// A caller's wait for workers is a stall past this (and past twice its
/// own work in the region): well over a healthy chunk of decode.
#[cfg(not(target_arch = "wasm32"))]
const STALL_MIN: std::time::Duration = std::time::Duration::from_micros(100);

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
    /// Joins so far, all regions (tells the caller whether any worker
    /// joined its region).
    joins: AtomicUsize,
    /// Parked workers wait here (the mutex guards nothing but the wait).
    lock: Mutex<()>,
    wake: Condvar,
    /// The caller parks here waiting for the last worker to leave.
    left: Condvar,
    /// The caller is parked or about to park on `left`.
    caller_parked: AtomicBool,
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
    /// The stall backoff (only the region holder touches it).
    backoff: Backoff,
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
            joins: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            left: Condvar::new(),
            caller_parked: AtomicBool::new(false),
            sleeping: AtomicUsize::new(0),
            panic: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let mut pool = Self {
            shared,
            region: Mutex::new(()),
            workers: 0,
            backoff: Backoff::default(),
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
            Ok(g) if chunks > 1 && !self.backoff.solo() => g,
            // One chunk, a region already running (a nested call from a
            // chunk, or another thread sharing the pool), or a backoff
            // after stalls: the caller alone.
            _ => return (0..chunks).for_each(f),
        };
        let s = &*self.shared;
        // SAFETY: only the lifetime is erased; this function does not
        // return before every worker that joined the region has left it.
        let run: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        s.next.store(0, Ordering::Relaxed);
        // Before the region opens: no worker of this region counted yet.
        let joins = s.joins.load(Ordering::Relaxed);
        // SAFETY: the previous region is closed and no worker is inside
        // (the last `close_and_wait`), so no one reads `job` now; the store
        // to `state` below publishes the write.
        unsafe { *s.job.get() = Some(Job { run, chunks }) };
        let epoch = (s.state.load(Ordering::Relaxed) >> EPOCH_SHIFT).wrapping_add(1);
        s.state.store(epoch << EPOCH_SHIFT, Ordering::SeqCst);
        let woke = s.sleeping.load(Ordering::SeqCst) > 0;
        if woke {
            // Taking the lock orders this notify after a parking worker's
            // check of `state` (it holds the lock until it waits).
            let _l = s.lock.lock();
            s.wake.notify_all();
        }
        let clock = Clock::start();
        let caller = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| claim(s, f, chunks)));
        let worked = clock.lap();
        close_and_wait(s);
        // `close_and_wait` synchronized with every worker that joined. A
        // worker just woken from parking is not expected in time.
        let alone = !woke && s.joins.load(Ordering::Relaxed) == joins;
        self.backoff.record(alone || clock.stalled(worked));
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

/// When the pool runs regions on the caller alone after stalls. Fields are
/// atomics only to keep `Pool` `Sync`: the region holder alone uses them.
#[derive(Default)]
struct Backoff {
    /// Regions still to run on the caller alone.
    solo: AtomicU32,
    /// The last spell's exponent (`1 << shift` solo regions).
    shift: AtomicU32,
    /// Parallel regions since the last spell or decay.
    clean: AtomicU32,
    /// Moving average of stalls per parallel region (`RATE_ONE` = all).
    rate: AtomicU32,
}

impl Backoff {
    /// Whether this region runs on the caller alone (counts it down).
    fn solo(&self) -> bool {
        let left = self.solo.load(Ordering::Relaxed);
        if left > 0 {
            self.solo.store(left - 1, Ordering::Relaxed);
        }
        left > 0
    }

    /// Accounts for a parallel region that did or did not stall.
    fn record(&self, stalled: bool) {
        let rate = self.rate.load(Ordering::Relaxed);
        let rate = rate - (rate >> RATE_WINDOW) + if stalled { RATE_ONE >> RATE_WINDOW } else { 0 };
        let shift = self.shift.load(Ordering::Relaxed);
        if rate >= RATE_SOLO {
            let shift = (shift + 1).min(MAX_BACKOFF);
            self.shift.store(shift, Ordering::Relaxed);
            self.solo.store(1 << shift, Ordering::Relaxed);
            self.clean.store(0, Ordering::Relaxed);
            self.rate.store(RATE_AFTER_SOLO, Ordering::Relaxed);
            return;
        }
        self.rate.store(rate, Ordering::Relaxed);
        if !stalled && shift > 0 {
            let clean = self.clean.load(Ordering::Relaxed) + 1;
            if clean >= CLEAN_DECAY {
                self.shift.store(shift - 1, Ordering::Relaxed);
                self.clean.store(0, Ordering::Relaxed);
            } else {
                self.clean.store(clean, Ordering::Relaxed);
            }
        }
    }
}

/// Times the caller's share of a region and its wait for the workers.
#[cfg(not(target_arch = "wasm32"))]
struct Clock(std::time::Instant);

#[cfg(not(target_arch = "wasm32"))]
impl Clock {
    fn start() -> Self {
        Self(std::time::Instant::now())
    }

    /// Time since the start (the caller's own work).
    fn lap(&self) -> std::time::Duration {
        self.0.elapsed()
    }

    /// Whether the wait after `worked` was a stall: longer than twice the
    /// caller's own work and than `STALL_MIN`.
    fn stalled(&self, worked: std::time::Duration) -> bool {
        let waited = self.0.elapsed().saturating_sub(worked);
        waited > STALL_MIN && waited > 2 * worked
    }
}

/// A spin budget before parking: wall time natively, rounds of 64 polls on
/// wasm (no clock there).
#[derive(Clone, Copy)]
struct Spin {
    #[cfg(not(target_arch = "wasm32"))]
    budget: std::time::Duration,
    #[cfg(target_arch = "wasm32")]
    budget: u32,
}

impl Spin {
    #[cfg(not(target_arch = "wasm32"))]
    const fn micros(us: u64) -> Self {
        Self {
            budget: std::time::Duration::from_micros(us),
        }
    }

    #[cfg(target_arch = "wasm32")]
    const fn rounds(rounds: u32) -> Self {
        Self { budget: rounds }
    }

    /// Polls `done` in rounds of 64 until it gives a value or the budget
    /// runs out (`None`).
    fn until<T>(self, mut done: impl FnMut() -> Option<T>) -> Option<T> {
        #[cfg(not(target_arch = "wasm32"))]
        let start = std::time::Instant::now();
        #[cfg(target_arch = "wasm32")]
        let mut rounds = 0u32;
        loop {
            for _ in 0..64 {
                if let Some(v) = done() {
                    return Some(v);
                }
                std::hint::spin_loop();
            }
            #[cfg(not(target_arch = "wasm32"))]
            if start.elapsed() > self.budget {
                return None;
            }
            #[cfg(target_arch = "wasm32")]
            {
                rounds += 1;
                if rounds > self.budget {
                    return None;
                }
            }
        }
    }
}

/// No clock on wasm32 (`Instant::now` panics there): never a stall.
#[cfg(target_arch = "wasm32")]
struct Clock;

#[cfg(target_arch = "wasm32")]
impl Clock {
    fn start() -> Self {
        Self
    }

    fn lap(&self) {}

    fn stalled(&self, _worked: ()) -> bool {
        false
    }
}

/// Closes the current region to late workers and waits for those inside:
/// spinning briefly, then parked until the last one leaves.
fn close_and_wait(s: &Shared) {
    let state = s.state.fetch_or(CLOSED, Ordering::AcqRel);
    if state & ACTIVE == 0 {
        return;
    }
    let left = CALLER_SPIN.until(|| (s.state.load(Ordering::Acquire) & ACTIVE == 0).then_some(()));
    if left.is_none() {
        park_caller(s);
    }
}

/// Parks the caller until no worker is inside the region.
fn park_caller(s: &Shared) {
    let Ok(mut lock) = s.lock.lock() else {
        // A poisoned lock (a panic while holding it, which nothing here
        // does): spin instead.
        while s.state.load(Ordering::Acquire) & ACTIVE != 0 {
            std::thread::yield_now();
        }
        return;
    };
    s.caller_parked.store(true, Ordering::SeqCst);
    while s.state.load(Ordering::SeqCst) & ACTIVE != 0 {
        lock = match s.left.wait(lock) {
            Ok(l) => l,
            Err(_) => break,
        };
    }
    s.caller_parked.store(false, Ordering::SeqCst);
}

/// A worker leaves the region; the last one out wakes a parked caller.
fn leave(s: &Shared) {
    let before = s.state.fetch_sub(1, Ordering::SeqCst);
    if before & ACTIVE == 1 && s.caller_parked.load(Ordering::SeqCst) {
        // Taking the lock orders this notify after the caller's check of
        // `state` (it holds the lock until it waits).
        let _l = s.lock.lock();
        s.left.notify_all();
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
    let moved = |state: u64| state >> EPOCH_SHIFT != seen;
    if let Some(state) =
        WORKER_SPIN.until(|| Some(s.state.load(Ordering::Acquire)).filter(|&st| moved(st)))
    {
        return Some(state);
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
            Ok(_) => {
                s.joins.fetch_add(1, Ordering::Relaxed);
                return Ok(state >> EPOCH_SHIFT);
            }
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
                leave(s);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a pattern of regions (true = stalled) and gives the share run
    /// solo (a solo region takes the place of a parallel one).
    fn solo_share(pattern: impl Iterator<Item = bool>) -> f64 {
        let b = Backoff::default();
        let (mut solo, mut total) = (0u32, 0u32);
        for stalled in pattern {
            total += 1;
            if b.solo() {
                solo += 1;
            } else {
                b.record(stalled);
            }
        }
        f64::from(solo) / f64::from(total)
    }

    #[test]
    fn stalls_now_and_then_never_send_the_pool_solo() {
        // One region in twenty stalls, some in pairs: a busy host.
        let share = solo_share((0..20_000).map(|i| i % 20 == 0 || i % 97 == 1));
        assert_eq!(share, 0.0);
    }

    #[test]
    fn a_run_of_stalls_sends_the_pool_solo_for_longer_each_time() {
        let b = Backoff::default();
        let mut first = None;
        for i in 0..6 {
            assert!(!b.solo());
            b.record(true);
            if b.solo.load(Ordering::Relaxed) > 0 {
                first = Some(i);
                break;
            }
        }
        assert_eq!(first, Some(5), "six stalls in a row go solo");
        let spell = b.solo.load(Ordering::Relaxed);
        while b.solo() {}
        // Two more stalls on the way back: a longer spell.
        b.record(true);
        assert_eq!(b.solo.load(Ordering::Relaxed), 0);
        b.record(true);
        assert_eq!(b.solo.load(Ordering::Relaxed), 2 * spell);
    }

    #[test]
    fn a_crowded_machine_runs_mostly_solo_and_a_quiet_one_recovers() {
        // Every parallel region stalls: most regions run on the caller.
        assert!(solo_share(std::iter::repeat_n(true, 20_000)) > 0.9);
        // Then the machine quiets down: the backoff decays back to none.
        let b = Backoff::default();
        for _ in 0..5_000 {
            if !b.solo() {
                b.record(true);
            }
        }
        for _ in 0..50_000 {
            if !b.solo() {
                b.record(false);
            }
        }
        assert_eq!(b.shift.load(Ordering::Relaxed), 0);
        assert!(!b.solo());
    }
}
