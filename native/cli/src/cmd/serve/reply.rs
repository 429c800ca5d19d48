//! Turning engine events into OpenAI's reply shapes: whole replies and
//! streamed chunks, for chat and for completions.

use std::sync::Arc;

use hearth::engine::{EngineEvent, FinishReason, Usage};
use hearth::model::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use super::tools::ToolPlan;

/// Which API a reply is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What is common to every object of one reply.
#[derive(Debug, Clone)]
pub struct Header {
    /// `chatcmpl-...` or `cmpl-...`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// Chat or completion.
    pub api: Api,
    /// Choices per prompt (`n`): choice `i` answers prompt `i / n`.
    pub n: usize,
    /// The tools offered (chat): their calls are parsed out of the text.
    pub tools: Option<Arc<ToolPlan>>,
}

impl Header {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.api, chunk) {
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
            (Api::Completion, _) => "text_completion",
        }
    }

    /// A streamed chunk holding `choices`.
    pub fn chunk(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// The last chunk of a stream with `stream_options.include_usage`.
    pub fn usage_chunk(&self, usage: &UsageSum) -> Value {
        let mut c = self.chunk(Vec::new());
        c["usage"] = usage.json();
        c
    }

    /// The whole reply.
    pub fn reply(&self, choices: &[Choice], usage: &UsageSum, tok: &Tokenizer) -> Value {
        let choices: Vec<Value> = choices.iter().map(|c| c.json(self, tok)).collect();
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage.json(),
        })
    }
}

/// One token as reported with log-probabilities.
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    token: u32,
    logprob: f32,
    top: Vec<(u32, f32)>,
}

/// A choice as it accumulates.
#[derive(Debug, Clone, Default)]
pub struct Choice {
    /// Its index in the reply.
    pub index: usize,
    /// Text so far.
    pub text: String,
    /// Characters in `text` (completions' `text_offset` of the next token).
    pub chars: usize,
    /// Tokens with log-probabilities, when asked for.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Why it ended, once it has.
    pub finish: Option<FinishReason>,
    /// What went wrong, for an error finish.
    pub error: Option<String>,
    /// Its counts, once finished.
    pub usage: Usage,
}

impl Choice {
    /// A choice that reports log-probabilities when `logprobs`.
    pub fn new(index: usize, logprobs: bool) -> Self {
        Choice {
            index,
            logprobs: logprobs.then(Vec::new),
            ..Choice::default()
        }
    }

    /// Takes `event`; returns the token's log-probability record when one
    /// is kept (for streaming it at once).
    pub fn apply(&mut self, event: EngineEvent) -> Option<TokenLogprob> {
        match event {
            EngineEvent::Token {
                token,
                text,
                logprob,
                top_logprobs,
                ..
            } => {
                self.text.push_str(&text);
                self.chars += text.chars().count();
                let lp = logprob.map(|logprob| TokenLogprob {
                    token,
                    logprob,
                    top: top_logprobs,
                });
                if let (Some(all), Some(lp)) = (self.logprobs.as_mut(), &lp) {
                    all.push(lp.clone());
                }
                lp
            }
            EngineEvent::Finished {
                reason,
                usage,
                error,
                ..
            } => {
                self.finish = Some(reason);
                self.usage = usage;
                self.error = error;
                None
            }
        }
    }

    /// OpenAI's `finish_reason`.
    pub fn finish_reason(&self) -> Value {
        self.finish.map_or(Value::Null, |r| Value::from(r.as_str()))
    }

    /// The assistant message: the text, or with tools offered, the calls
    /// parsed out of it (ids from `reply_id`) and the text left; and the
    /// finish reason (`tool_calls` when the reply is calls).
    pub fn message(&self, tools: Option<&ToolPlan>, reply_id: &str) -> (Value, Value) {
        let Some(plan) = tools else {
            let msg = json!({"role": "assistant", "content": self.text});
            return (msg, self.finish_reason());
        };
        let id_base = format!(
            "{}_{}",
            reply_id.rsplit('-').next().unwrap_or(reply_id),
            self.index
        );
        let (content, calls) = plan.parse(&self.text, &id_base);
        if calls.is_empty() {
            let msg = json!({"role": "assistant", "content": content});
            return (msg, self.finish_reason());
        }
        let reason = match self.finish {
            Some(FinishReason::Stop | FinishReason::StopString) => Value::from("tool_calls"),
            _ => self.finish_reason(),
        };
        let msg = json!({"role": "assistant", "content": content, "tool_calls": calls});
        (msg, reason)
    }

    fn json(&self, header: &Header, tok: &Tokenizer) -> Value {
        let (api, tools) = (header.api, header.tools.as_deref());
        let logprobs = self
            .logprobs
            .as_ref()
            .map_or(Value::Null, |lps| logprobs_json(api, lps, tok, 0));
        match api {
            Api::Chat => {
                let (message, reason) = self.message(tools, &header.id);
                json!({
                    "index": self.index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": reason,
                })
            }
            Api::Completion => json!({
                "index": self.index,
                "text": self.text,
                "logprobs": logprobs,
                "finish_reason": self.finish_reason(),
            }),
        }
    }
}

/// The `logprobs` object of `tokens`; `offset` is the text length before
/// the first (completions' `text_offset`).
pub fn logprobs_json(api: Api, tokens: &[TokenLogprob], tok: &Tokenizer, offset: usize) -> Value {
    let piece = |id: u32| tok.token_to_piece(id, true);
    let text = |id: u32| String::from_utf8_lossy(&piece(id)).into_owned();
    match api {
        Api::Chat => {
            let content: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let top: Vec<Value> = t
                        .top
                        .iter()
                        .map(|&(id, lp)| json!({"token": text(id), "logprob": lp, "bytes": piece(id)}))
                        .collect();
                    json!({"token": text(t.token), "logprob": t.logprob, "bytes": piece(t.token), "top_logprobs": top})
                })
                .collect();
            json!({"content": content})
        }
        Api::Completion => {
            let mut offsets = Vec::with_capacity(tokens.len());
            let mut at = offset;
            for t in tokens {
                offsets.push(at);
                at += text(t.token).chars().count();
            }
            let top: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let m: Map<String, Value> = t
                        .top
                        .iter()
                        .map(|&(id, lp)| (text(id), Value::from(lp)))
                        .collect();
                    Value::Object(m)
                })
                .collect();
            json!({
                "tokens": tokens.iter().map(|t| text(t.token)).collect::<Vec<_>>(),
                "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                "top_logprobs": top,
                "text_offset": offsets,
            })
        }
    }
}

/// Usage summed over a reply's choices: each prompt counted once.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageSum {
    /// Prompt tokens.
    pub prompt: usize,
    /// Of them, from the prefix cache.
    pub cached: usize,
    /// Generated tokens.
    pub completion: usize,
}

impl UsageSum {
    /// The sum over `choices` (choice `i` answers prompt `i / n`).
    pub fn of(choices: &[Choice], n: usize) -> Self {
        let mut sum = UsageSum::default();
        for c in choices {
            if c.index % n.max(1) == 0 {
                sum.prompt += c.usage.prompt_tokens;
                sum.cached += c.usage.cached_prompt_tokens;
            }
            sum.completion += c.usage.generated_tokens;
        }
        sum
    }

    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}
