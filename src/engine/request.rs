//! What callers send the engine and what it sends back.

use super::constraint::Constraint;
use crate::model::chat::ChatMessage;
use crate::sample::SamplingParams;
use crate::sched::RequestId;

/// The prompt of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Plain text, tokenized as `llama_tokenize(text, add_special = true,
    /// parse_special = false)`: BOS where the model adds one, and
    /// special-token text taken literally.
    Text(String),
    /// Token ids, used exactly as given (no BOS added).
    Tokens(Vec<u32>),
    /// A conversation, rendered with the engine's chat template (opening the
    /// assistant's turn) and tokenized with special tokens parsed, as
    /// llama.cpp does (a BOS the template prints itself is not doubled).
    Chat(Vec<ChatMessage>),
    /// A conversation and the functions the model may call (OpenAI's
    /// `tools`), given to the template as `tools`; otherwise as
    /// [`Prompt::Chat`]. Templates that do not read `tools` ignore them
    /// (see [`ChatTemplate::supports_tools`](crate::model::chat::ChatTemplate::supports_tools)).
    ChatWithTools {
        /// The conversation.
        messages: Vec<ChatMessage>,
        /// The functions, `[{"type": "function", "function": {...}}]`.
        tools: Vec<serde_json::Value>,
    },
}

/// A generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt: Prompt,
    /// Most tokens to generate; `None` fills the context. Clamped to the
    /// room the context leaves after the prompt.
    pub max_tokens: Option<usize>,
    /// How to sample (`SamplingParams::greedy()` for argmax).
    pub sampling: SamplingParams,
    /// Strings that end generation; the output is cut before the match.
    pub stop: Vec<String>,
    /// `Some(n)`: report each token's log-probability and the `n` most likely
    /// alternatives (overrides `sampling.top_logprobs`); `None`: none.
    pub logprobs: Option<usize>,
    /// Keep generating past end-of-generation tokens (benchmarks). A
    /// constrained request still ends when its grammar is complete.
    pub ignore_eos: bool,
    /// What the output must match (JSON, a grammar, a regex); `None`:
    /// anything. Compiled by [`Engine::add_request`](super::Engine::add_request),
    /// which refuses one that does not compile
    /// ([`EngineError::BadGrammar`](super::EngineError::BadGrammar)).
    pub constraint: Option<Constraint>,
}

impl GenerateRequest {
    /// A request for `prompt` with default sampling, no stop strings, no
    /// log-probabilities, no constraint, and no token limit but the context.
    pub fn new(prompt: Prompt) -> Self {
        GenerateRequest {
            prompt,
            max_tokens: None,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            logprobs: None,
            ignore_eos: false,
            constraint: None,
        }
    }
}

/// Why a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// An end-of-generation token (EOS, EOT, ...) was sampled, or the
    /// request's constraint is complete (nothing more can follow).
    Stop,
    /// `max_tokens` tokens were generated, or the context is full.
    Length,
    /// [`Engine::cancel`](super::Engine::cancel) was called.
    Cancelled,
    /// A stop string matched; the text was cut before it.
    StopString,
    /// Its logits could not be sampled (non-finite values from the model,
    /// a constraint that cannot go on); the `Finished` event's `error` says
    /// why. Other requests go on.
    Error,
}

impl FinishReason {
    /// The OpenAI name: `stop` (end token or stop string), `length`,
    /// `cancelled`, `error`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::StopString => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the prefix cache at admission.
    pub cached_prompt_tokens: usize,
    /// Tokens generated (an end-of-generation token included).
    pub generated_tokens: usize,
}

/// Wall-clock phases of a finished request, in seconds (0 without a clock).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RequestTimings {
    /// From `add_request` to its first scheduled step.
    pub queue_s: f64,
    /// From its first scheduled step to its first token (prefill).
    pub prefill_s: f64,
    /// From its first token to its end (decode).
    pub decode_s: f64,
}

/// What a step reports.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// A new token.
    Token {
        /// The request.
        request: RequestId,
        /// The token id.
        token: u32,
        /// Text released with this token: complete UTF-8, possibly empty
        /// (a character still incomplete, text held back as a possible stop
        /// string start, or a control token), possibly more than this token's
        /// piece (held text released).
        text: String,
        /// Natural-log probability of the token, when asked for.
        logprob: Option<f32>,
        /// The most likely alternatives `(id, logprob)`, when asked for.
        top_logprobs: Vec<(u32, f32)>,
    },
    /// The request ended (its K/V blocks are already free); no more events
    /// come for it.
    Finished {
        /// The request.
        request: RequestId,
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// Timings.
        timings: RequestTimings,
        /// What went wrong, for [`FinishReason::Error`].
        error: Option<String>,
    },
}
