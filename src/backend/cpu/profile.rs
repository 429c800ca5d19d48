//! Per-op-kind timing of the CPU backend, on when `HEARTH_PROFILE=1`.
//!
//! Every recorded op is timed; at each `submit` (the end of one forward
//! pass) the pass's times go to the decode bucket (one token) or the prefill
//! bucket (more), and when the backend is dropped both buckets are printed
//! to stderr as milliseconds per token per op kind. Off (and free) on wasm32,
//! which has no clock the core crate may use.

use std::cell::RefCell;

use crate::graph::Op;

/// Op kinds, in the order they are printed.
const KINDS: [&str; 14] = [
    "GetRows",
    "MatMul",
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
    "(step overhead)",
];

/// Index of `op`'s kind in [`KINDS`].
fn kind(op: &Op) -> usize {
    match op {
        Op::GetRows { .. } => 0,
        Op::MatMul { .. } => 1,
        Op::RmsNorm { .. } => 2,
        Op::Rope { .. } => 3,
        Op::Add => 4,
        Op::Mul | Op::Scale(_) | Op::BiasAdd => 5,
        Op::SiluMul => 6,
        Op::GeluTanhMul => 7,
        Op::Softmax { .. } => 8,
        Op::KvWrite { .. } => 9,
        Op::PagedAttention { .. } => 10,
        Op::MoeTopK { .. } | Op::MoeExperts { .. } => 11,
        Op::LogitSoftcap(_) => 12,
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

#[cfg(not(target_arch = "wasm32"))]
type Clock = std::time::Instant;
#[cfg(target_arch = "wasm32")]
type Clock = ();

#[cfg(not(target_arch = "wasm32"))]
fn now() -> Clock {
    std::time::Instant::now()
}
#[cfg(target_arch = "wasm32")]
fn now() -> Clock {}

#[cfg(not(target_arch = "wasm32"))]
fn secs_between(a: Clock, b: Clock) -> f64 {
    b.duration_since(a).as_secs_f64()
}
#[cfg(target_arch = "wasm32")]
fn secs_between(_: Clock, _: Clock) -> f64 {
    0.0
}

impl Profile {
    /// On when the environment says `HEARTH_PROFILE=1` (never on wasm32).
    pub(super) fn from_env() -> Self {
        let on = cfg!(not(target_arch = "wasm32"))
            && std::env::var("HEARTH_PROFILE").is_ok_and(|v| v == "1");
        Self {
            inner: on.then(|| RefCell::new(State::default())),
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
        let start = now();
        let r = f();
        let end = now();
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
                "hearth profile, {name}: {} passes, {} tokens, {:.3} ms/token\n",
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
