//! Requests as the scheduler sees them, and the events it emits about them.

use crate::sample::SamplingParams;

/// Identifies a request; unique among live requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "req-{}", self.0)
    }
}

/// A generation request: tokens in, up to `max_tokens` tokens out.
///
/// Stop rules: a sampled token in `stop_token_ids` (the model's EOS ids and
/// any others) ends the request here; stop *strings* need text, so the
/// engine checks them in the callback of
/// [`Scheduler::update_from_output_with`](super::Scheduler::update_from_output_with)
/// and keeps the text position itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Unique among live requests.
    pub id: RequestId,
    /// The prompt, tokenized (non-empty).
    pub prompt_tokens: Vec<u32>,
    /// Most tokens to generate (>= 1); the engine clamps it to the context.
    pub max_tokens: usize,
    /// Tokens that end the request when sampled (EOS ids first). The stop
    /// token itself is reported as the last output token.
    pub stop_token_ids: Vec<u32>,
    /// How to sample; the scheduler only carries it for the engine.
    pub sampling: SamplingParams,
}

impl Request {
    /// A request with default sampling and no stop tokens.
    pub fn new(id: RequestId, prompt_tokens: Vec<u32>, max_tokens: usize) -> Self {
        Request {
            id,
            prompt_tokens,
            max_tokens,
            stop_token_ids: Vec::new(),
            sampling: SamplingParams::default(),
        }
    }
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// A token of `stop_token_ids` was sampled (it is the last output token).
    StopToken(u32),
    /// The engine's stop-string check matched.
    StopString,
    /// `max_tokens` tokens were generated.
    Length,
    /// [`Scheduler::cancel`](super::Scheduler::cancel) was called.
    Cancelled,
}

/// What happened to a request in one update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchedEvent {
    /// A new output token.
    Token {
        /// The request.
        id: RequestId,
        /// The token.
        token: u32,
        /// Its index among the request's output tokens (0 = first).
        index: usize,
    },
    /// The request ended; its blocks are already released.
    Finished {
        /// The request.
        id: RequestId,
        /// Why.
        reason: FinishReason,
        /// Every output token, in order.
        output_tokens: Vec<u32>,
    },
}

/// Where a live request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Waiting,
    Running,
}

/// The scheduler's record of a live request.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) req: Request,
    /// Prompt then output tokens: a preempted request recomputes all of them.
    pub(crate) tokens: Vec<u32>,
    /// Leading `tokens` whose K/V is in the cache.
    pub(crate) num_computed: usize,
    pub(crate) status: Status,
    /// Times this request was preempted.
    pub(crate) num_preemptions: u32,
    /// Distinguishes this request from an older one with the same id.
    pub(crate) serial: u64,
}

impl Entry {
    pub(crate) fn output(&self) -> &[u32] {
        &self.tokens[self.req.prompt_tokens.len()..]
    }
}
