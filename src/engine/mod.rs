//! The engine: requests in, token events out, over any [`ForwardModel`](crate::model::ForwardModel).
//!
//! The CLI, the server and the browser worker all drive the same loop:
//!
//! ```no_run
//! # async fn demo<M: hearth::model::ForwardModel>(mut engine: hearth::engine::Engine<M>) -> hearth::Result<()> {
//! use hearth::engine::{EngineEvent, GenerateRequest, Prompt};
//! let id = engine.add_request(GenerateRequest::new(Prompt::Text("The capital of France is".into())))?;
//! while engine.has_unfinished() {
//!     for event in engine.step().await? {
//!         match event {
//!             EngineEvent::Token { text, .. } => print!("{text}"),
//!             EngineEvent::Finished { reason, usage, .. } => eprintln!("\n{id}: {reason:?}, {usage:?}"),
//!         }
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Each [`Engine::step`] runs one scheduler step (chunked prefills and
//! one-token decodes of many requests together), ONE forward pass over that
//! whole batch, samples the rows that need it with each request's own
//! [`Sampler`](crate::sample::Sampler), applies stop rules (end-of-generation
//! tokens, `max_tokens`, stop strings) and returns the events. Text in token
//! events is always complete UTF-8; text that might be the start of a stop
//! string is held back until it is known not to be. A request with a
//! [`Constraint`] (a JSON Schema, a grammar, a regex) samples only tokens
//! that keep its output matching, and ends when the match is complete.
//!
//! The step is `async` because GPU readback is asynchronous in browsers;
//! native callers block on it (`pollster::block_on`). Nothing here uses
//! threads, files or blocking waits, and time comes from a [`Clock`] the
//! host provides (the browser build has no system clock in the core).

mod clock;
mod config;
mod constraint;
mod prompt;
mod request;
mod runner;
mod select;
mod stats;
mod step;
mod text;

pub use clock::Clock;
pub use config::EngineConfig;
pub use constraint::Constraint;
pub use request::{EngineEvent, FinishReason, GenerateRequest, Prompt, RequestTimings, Usage};
pub use runner::Engine;
pub use stats::EngineStats;

pub use crate::model::chat::ChatMessage;
pub use crate::sched::RequestId;

use thiserror::Error;

/// Errors of the engine: a request it cannot run, or a model that broke the
/// [`ForwardModel`](crate::model::ForwardModel) contract.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineError {
    /// Unusable engine limits.
    #[error("bad engine configuration: {detail}")]
    BadConfig {
        /// What is wrong.
        detail: String,
    },
    /// The prompt leaves no room in the context for a single new token.
    #[error("prompt is {tokens} tokens but the context is {n_ctx}; shorten it or raise --ctx")]
    PromptTooLong {
        /// Prompt tokens.
        tokens: usize,
        /// Context length (prompt plus output) of one sequence.
        n_ctx: usize,
    },
    /// A prompt that tokenizes to nothing.
    #[error("the prompt is empty (no tokens after tokenization); give some text or token ids")]
    EmptyPrompt,
    /// `max_tokens` of 0.
    #[error("max_tokens is 0; ask for at least one token, or leave it unset to fill the context")]
    ZeroMaxTokens,
    /// A prompt token id outside the vocabulary.
    #[error("prompt token id {token} is outside the vocabulary of {n_vocab} tokens")]
    TokenOutOfVocab {
        /// The id.
        token: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// The model returned the wrong number of logits.
    #[error("the model returned {got} logits for {rows} rows of {n_vocab}; the forward pass broke its contract")]
    LogitsShape {
        /// Floats returned.
        got: usize,
        /// Rows asked for.
        rows: usize,
        /// Row width.
        n_vocab: usize,
    },
    /// An operation that needs an idle engine was called with requests live.
    #[error("{op} needs an idle engine, but {live} requests are still running; finish or cancel them first")]
    Busy {
        /// The operation.
        op: &'static str,
        /// Live requests.
        live: usize,
    },
    /// A request's [`Constraint`] does not compile: a JSON Schema llguidance
    /// cannot use or that nothing satisfies, a grammar or regular
    /// expression with a syntax error, a rule that is never defined.
    #[error(
        "the {kind} constraint does not compile: {detail}; fix it or send the request without it"
    )]
    BadGrammar {
        /// Which kind of constraint ([`Constraint::kind`]).
        kind: &'static str,
        /// llguidance's (or the GBNF converter's) message, with where.
        detail: String,
    },
    /// This engine cannot constrain requests at all (its vocabulary has no
    /// end-of-generation token, or llguidance could not index it).
    #[error("constrained decoding is not available for this model: {detail}; send the request without a constraint")]
    ConstraintUnsupported {
        /// Why.
        detail: String,
    },
    /// A request id the engine does not know (finished, cancelled, or never added).
    #[error("request {id} is not live (finished, cancelled, or never added)")]
    UnknownRequest {
        /// The id.
        id: RequestId,
    },
}
