//! Continuous batching: requests in, per-step batches out as plain data, so
//! the policy is tested without a model.
//!
//! The engine's loop: [`Scheduler::add_request`] as requests arrive; each
//! step [`Scheduler::schedule`] → run the model over
//! [`SchedulerOutput::requests`] (writing K/V through their slots, attending
//! through their block tables) → sample the rows of requests with `samples`
//! → [`Scheduler::update_from_output`] → forward the [`SchedEvent`]s.

mod output;
mod request;
mod scheduler;
mod update;

pub use output::{ScheduleKind, ScheduledRequest, SchedulerOutput};
pub use request::{FinishReason, Request, RequestId, SchedEvent};
pub use scheduler::{Scheduler, SchedulerConfig};
pub use update::SchedulerStats;

use thiserror::Error;

/// Errors of the scheduler: a caller broke the protocol or sent a request
/// that cannot run.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchedError {
    /// Unusable limits.
    #[error("bad scheduler configuration: {detail}")]
    BadConfig {
        /// What is wrong.
        detail: String,
    },
    /// A request id that is already live.
    #[error("request {id} is already queued or running: ids must be unique among live requests")]
    DuplicateId {
        /// The id.
        id: RequestId,
    },
    /// An empty prompt or `max_tokens == 0`.
    #[error("request {id} has an empty prompt or max_tokens = 0: give at least one prompt token and max_tokens >= 1")]
    EmptyRequest {
        /// The id.
        id: RequestId,
    },
    /// A request that could never fit the KV pool.
    #[error("request {id} needs up to {tokens} KV tokens ({blocks} blocks) but the pool has {usable} blocks: lower max_tokens or enlarge the KV cache")]
    TooLong {
        /// The id.
        id: RequestId,
        /// Prompt plus output tokens that need K/V.
        tokens: usize,
        /// Blocks for them.
        blocks: usize,
        /// Blocks in the pool.
        usable: usize,
    },
    /// A request id that is not live.
    #[error("request {id} is not queued or running (finished, cancelled, or never added)")]
    UnknownRequest {
        /// The id.
        id: RequestId,
    },
    /// `schedule` called twice without `update_from_output`.
    #[error("a step is in flight: call update_from_output with its sampled tokens before scheduling again")]
    StepInFlight,
    /// `update_from_output` with no step scheduled.
    #[error("no step in flight: call schedule first")]
    NoStepInFlight,
    /// Sampled tokens that do not match the step's sampling requests.
    #[error("sampled tokens do not match the step: {detail}")]
    BadSamples {
        /// What is wrong.
        detail: String,
    },
    /// The KV bookkeeping refused an operation.
    #[error(transparent)]
    Kv(#[from] crate::kv::KvError),
    /// A broken internal invariant (a bug in this module).
    #[error("scheduler invariant broken: {detail}; please report this")]
    Internal {
        /// What was found.
        detail: String,
    },
}
