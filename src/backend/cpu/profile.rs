//! Per-op-kind timing of the CPU backend, on when `HEARTH_PROFILE=1` (wall
//! time) or `HEARTH_PROFILE=cpu` (the calling thread's CPU time, which a
//! busy machine does not inflate; on Linux, and meaningful at one thread).
//!
//! Every recorded op is timed; at each `submit` (the end of one forward
//! pass) the pass's times go to the decode bucket (one token) or the prefill
//! bucket (more), and when the backend is dropped both buckets are printed
//! to stderr as milliseconds per token per op kind. On wasm32 only under
//! WASI (`wasm32-wasip1`, e.g. the decode_speed example in Node), whose
//! clock `std::time::Instant` reads; off (and free) in browsers, where the
//! core crate has no clock.

use super::options::CpuProfile;
use std::cell::RefCell;

use crate::graph::Op;

/// Op kinds, in the order they are printed.
const KINDS: [&str; 17] = [
    "GetRows",
    "MatMul",
    "Norm|GLU+MatMul",
    "Rope+KvWrite",
    "RmsNorm",
    "Rope",
    "Add",
    "Mul/Scale/Bias",
    "SiluMul",
    "GeluTanhMul",
    "Softmax",
    "KvWrite",
    "PagedAttention",
    "Moe",
    "LogitSoftcap",
    "Argmax/TopK",
    "(step overhead)",
];

/// Index of `op`'s kind in [`KINDS`].
fn kind(op: &Op) -> usize {
    match op {
        Op::GetRows { .. } => 0,
        Op::MatMul { .. } => 1,
        Op::FusedMatMul { .. } => 2,
        Op::RopeKvWrite { .. } => 3,
        Op::RmsNorm { .. } => 4,
        Op::Rope { .. } => 5,
        Op::Add => 6,
        Op::Mul | Op::Scale(_) | Op::BiasAdd => 7,
        Op::SiluMul => 8,
        Op::GeluTanhMul => 9,
        Op::Softmax { .. } => 10,
        Op::KvWrite { .. } => 11,
        Op::PagedAttention { .. } => 12,
        Op::MoeTopK { .. } | Op::MoeExperts { .. } => 13,
        Op::LogitSoftcap(_) => 14,
        Op::Argmax { .. } | Op::TopK { .. } => 15,
    }
}

/// Seconds per kind over some passes, and the tokens they ran.
#[derive(Debug, Default, Clone)]
struct Bucket {
    secs: [f64; KINDS.len()],
    calls: [u64; KINDS.len()],
    passes: u64,
    tokens: u64,
}

/// The profile of one backend.
#[derive(Debug, Default)]
pub(super) struct Profile {
    inner: Option<RefCell<State>>,
    /// CPU time of the calling thread rather than wall time.
    cpu: bool,
}

#[derive(Debug, Default)]
struct State {
    pass: Bucket,
    /// Tokens of the pass now recording (rows of its first embedding lookup).
    pass_tokens: Option<u64>,
    /// When the previous op ended (the gap to the next is step overhead).
    last_end: Option<Clock>,
    decode: Bucket,
    prefill: Bucket,
}

/// Seconds on the profile's clock, from an arbitrary origin.
type Clock = f64;

#[cfg(any(not(target_arch = "wasm32"), target_os = "wasi"))]
fn now(cpu: bool) -> Clock {
    #[cfg(target_os = "linux")]
    if cpu {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call's duration.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc == 0 {
            return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        }
    }
    let _ = cpu;
    thread_local! {
        static ORIGIN: std::time::Instant = std::time::Instant::now();
    }
    ORIGIN.with(|o| o.elapsed().as_secs_f64())
}
#[cfg(all(target_arch = "wasm32", not(target_os = "wasi")))]
fn now(_: bool) -> Clock {
    0.0
}

fn secs_between(a: Clock, b: Clock) -> f64 {
    (b - a).max(0.0)
}

impl Profile {
    /// Profiling as `mode` asks (never on wasm32 outside WASI, which has
    /// no clock).
    pub(super) fn new(mode: CpuProfile) -> Self {
        let clock = cfg!(any(not(target_arch = "wasm32"), target_os = "wasi"));
        let on = clock && mode != CpuProfile::Off;
        Self {
            inner: on.then(|| RefCell::new(State::default())),
            cpu: mode == CpuProfile::CpuClock,
        }
    }

    /// Whether ops are being timed.
    pub(super) fn on(&self) -> bool {
        self.inner.is_some()
    }

    /// Times `f`, which runs `op` over `tokens` rows when it is the pass's
    /// first embedding lookup.
    pub(super) fn time<R>(&self, op: &Op, tokens: Option<u64>, f: impl FnOnce() -> R) -> R {
        let Some(cell) = &self.inner else {
            return f();
        };
        let start = now(self.cpu);
        let r = f();
        let end = now(self.cpu);
        if let Ok(mut s) = cell.try_borrow_mut() {
            let k = kind(op);
            if let Some(last) = s.last_end {
                s.pass.secs[KINDS.len() - 1] += secs_between(last, start);
            }
            s.pass.secs[k] += secs_between(start, end);
            s.pass.calls[k] += 1;
            s.last_end = Some(end);
            if s.pass_tokens.is_none() {
                s.pass_tokens = tokens;
            }
        }
        r
    }

    /// Ends a forward pass.
    pub(super) fn end_pass(&self) {
        let Some(cell) = &self.inner else { return };
        if let Ok(mut s) = cell.try_borrow_mut() {
            let tokens = s.pass_tokens.take().unwrap_or(1);
            let pass = std::mem::take(&mut s.pass);
            s.last_end = None;
            let into = if tokens > 1 {
                &mut s.prefill
            } else {
                &mut s.decode
            };
            for k in 0..KINDS.len() {
                into.secs[k] += pass.secs[k];
                into.calls[k] += pass.calls[k];
            }
            into.passes += 1;
            into.tokens += tokens;
        }
    }

    /// The table printed at drop.
    fn report(&self) -> Option<String> {
        let s = self.inner.as_ref()?.try_borrow().ok()?;
        let mut out = String::new();
        for (name, b) in [("decode", &s.decode), ("prefill", &s.prefill)] {
            if b.tokens == 0 {
                continue;
            }
            let total: f64 = b.secs.iter().sum();
            out += &format!(
                "hearth profile ({}), {name}: {} passes, {} tokens, {:.3} ms/token\n",
                if self.cpu {
                    "calling thread's CPU time"
                } else {
                    "wall time"
                },
                b.passes,
                b.tokens,
                total * 1e3 / b.tokens as f64
            );
            for (k, name) in KINDS.iter().enumerate() {
                if b.secs[k] > 0.0 {
                    out += &format!(
                        "  {name:<16} {:>9.4} ms/token {:>5.1}%  {:>6.1} calls/pass\n",
                        b.secs[k] * 1e3 / b.tokens as f64,
                        100.0 * b.secs[k] / total.max(1e-12),
                        b.calls[k] as f64 / b.passes as f64
                    );
                }
            }
        }
        Some(out)
    }
}

impl Drop for Profile {
    fn drop(&mut self) {
        if let Some(r) = self.report() {
            eprint!("{r}");
        }
    }
}
