//! Throughput counters of an engine.

use crate::sched::SchedulerStats;

/// Tokens computed and the time spent, since the engine started.
///
/// A step's forward time is split between prefill and decode in proportion
/// to their tokens (a step usually holds only one kind with one request).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineStats {
    /// Steps that ran a forward pass.
    pub steps: u64,
    /// Prompt (and recomputed) tokens run through the model.
    pub prefill_tokens: u64,
    /// Seconds spent on them.
    pub prefill_s: f64,
    /// Generated tokens fed back one at a time.
    pub decode_tokens: u64,
    /// Seconds spent on them.
    pub decode_s: f64,
    /// Tokens sampled.
    pub sampled_tokens: u64,
    /// The scheduler's queues, pool and prefix cache.
    pub sched: SchedulerStats,
}

impl EngineStats {
    /// Prefill tokens per second (0 when nothing was timed).
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prefill_tokens, self.prefill_s)
    }

    /// Decode tokens per second (0 when nothing was timed).
    pub fn decode_tps(&self) -> f64 {
        rate(self.decode_tokens, self.decode_s)
    }
}

fn rate(tokens: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        tokens as f64 / seconds
    } else {
        0.0
    }
}

/// The engine's running totals (the scheduler part is read on demand).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Counters {
    pub(crate) steps: u64,
    pub(crate) prefill_tokens: u64,
    pub(crate) prefill_s: f64,
    pub(crate) decode_tokens: u64,
    pub(crate) decode_s: f64,
    pub(crate) sampled_tokens: u64,
}

impl Counters {
    /// Adds a step of `prefill` and `decode` tokens that took `seconds`.
    pub(crate) fn add_step(&mut self, prefill: usize, decode: usize, seconds: f64) {
        let total = (prefill + decode).max(1) as f64;
        self.steps += 1;
        self.prefill_tokens += prefill as u64;
        self.decode_tokens += decode as u64;
        self.prefill_s += seconds * prefill as f64 / total;
        self.decode_s += seconds * decode as f64 / total;
    }

    pub(crate) fn snapshot(&self, sched: SchedulerStats) -> EngineStats {
        EngineStats {
            steps: self.steps,
            prefill_tokens: self.prefill_tokens,
            prefill_s: self.prefill_s,
            decode_tokens: self.decode_tokens,
            decode_s: self.decode_s,
            sampled_tokens: self.sampled_tokens,
            sched,
        }
    }
}
