//! What one scheduling step decided, as plain data for the engine.

use super::request::RequestId;
use crate::kv::{BlockId, Slot};

/// Why a request is in this step's batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScheduleKind {
    /// Admitted for the first time.
    New,
    /// Admitted again after a preemption: recomputes prompt and output so far.
    Resumed,
    /// Was running already (a decode or the next prefill chunk).
    Running,
}

/// One request's share of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledRequest {
    /// The request.
    pub id: RequestId,
    /// Why it runs.
    pub kind: ScheduleKind,
    /// Position of the first token computed now (tokens before it are cached).
    pub start: usize,
    /// Input token ids, positions `start .. start + tokens.len()`.
    pub tokens: Vec<u32>,
    /// Where each input token's K/V goes (same length as `tokens`).
    pub slots: Vec<Slot>,
    /// The whole block table, for attention over positions `0 .. start + tokens.len()`.
    pub block_table: Vec<BlockId>,
    /// Whether the last input token is the sequence's last known token, so
    /// its logits row must be sampled (false for a prefill chunk that is not
    /// the last).
    pub samples: bool,
}

impl ScheduledRequest {
    /// Tokens computed for this request in this step.
    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Positions of the input tokens: `start .. start + num_tokens()`.
    pub fn positions(&self) -> std::ops::Range<usize> {
        self.start..self.start + self.tokens.len()
    }

    /// Tokens attention sees after this step's writes: `start + num_tokens()`.
    pub fn context_len(&self) -> usize {
        self.start + self.tokens.len()
    }
}

/// The step's batch: requests in batch order (decodes, then prefill chunks of
/// running requests, then admitted ones), within the token budget and the
/// sequence limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// Step number (0, 1, ...).
    pub step: u64,
    /// What runs.
    pub requests: Vec<ScheduledRequest>,
    /// Requests preempted in this step (blocks freed, back at the head of
    /// the waiting queue); the engine drops any per-step state it keeps for them.
    pub preempted: Vec<RequestId>,
    /// Sum of `num_tokens()` over `requests`.
    pub num_batched_tokens: usize,
}

impl SchedulerOutput {
    /// `{request: tokens}` of this step.
    pub fn num_tokens_by_request(&self) -> Vec<(RequestId, usize)> {
        self.requests
            .iter()
            .map(|r| (r.id, r.num_tokens()))
            .collect()
    }

    /// Whether nothing runs.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// The requests whose logits are sampled this step, in batch order.
    pub fn sampling_requests(&self) -> impl Iterator<Item = &ScheduledRequest> {
        self.requests.iter().filter(|r| r.samples)
    }
}
