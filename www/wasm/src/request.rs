//! Requests and events as the JSON the package's worker exchanges with the
//! facade. The worker has already validated and defaulted the OpenAI-shaped
//! body; this is the engine's request, field for field.

use hearth::engine::{ChatMessage, EngineEvent, FinishReason, GenerateRequest, Prompt};
use hearth::model::tokenizer::Tokenizer;
use hearth::sample::SamplingParams;
use serde::Deserialize;
use serde_json::{json, Value};

/// The prompt: text, token ids, or chat messages.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptJson {
    /// Plain text (BOS added where the model wants one).
    Text(String),
    /// Token ids, exactly.
    Tokens(Vec<u32>),
    /// Messages rendered with the chat template.
    Chat(Vec<ChatMessage>),
}

/// One generation request.
#[derive(Debug, Deserialize)]
pub struct RequestJson {
    prompt: PromptJson,
    max_tokens: Option<usize>,
    temperature: f32,
    top_p: f32,
    top_k: usize,
    min_p: f32,
    repeat_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    seed: u64,
    #[serde(default)]
    stop: Vec<String>,
    logprobs: Option<usize>,
    #[serde(default)]
    ignore_eos: bool,
}

impl RequestJson {
    /// The engine's request.
    pub fn into_request(self) -> GenerateRequest {
        let prompt = match self.prompt {
            PromptJson::Text(t) => Prompt::Text(t),
            PromptJson::Tokens(t) => Prompt::Tokens(t),
            PromptJson::Chat(m) => Prompt::Chat(m),
        };
        let mut req = GenerateRequest::new(prompt);
        req.max_tokens = self.max_tokens;
        req.sampling = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        };
        req.stop = self.stop;
        req.logprobs = self.logprobs;
        req.ignore_eos = self.ignore_eos;
        req
    }
}

/// The package's name of a finish reason (`abort` for a cancel).
fn reason_name(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Cancelled => "abort",
        other => other.as_str(),
    }
}

/// A token's text for log-probability reports (lossy UTF-8) and its bytes.
fn piece(tok: &Tokenizer, id: u32) -> Value {
    let bytes = tok.token_to_piece(id, true);
    json!({"token": String::from_utf8_lossy(&bytes), "bytes": bytes})
}

/// One engine event as JSON: `{"type":"token",...}` or `{"type":"finished",...}`.
pub fn event_json(event: &EngineEvent, tok: &Tokenizer) -> Value {
    match event {
        EngineEvent::Token {
            request,
            token,
            text,
            logprob,
            top_logprobs,
        } => {
            let top: Vec<Value> = top_logprobs
                .iter()
                .map(|&(id, lp)| {
                    let mut p = piece(tok, id);
                    p["logprob"] = json!(lp);
                    p
                })
                .collect();
            let mut lp = Value::Null;
            if let Some(l) = logprob {
                lp = piece(tok, *token);
                lp["logprob"] = json!(l);
                lp["top_logprobs"] = Value::Array(top);
            }
            json!({"type": "token", "request": request.0, "token": token, "text": text, "logprob": lp})
        }
        EngineEvent::Finished {
            request,
            reason,
            usage,
            timings,
            error,
        } => json!({
            "type": "finished",
            "request": request.0,
            "reason": reason_name(*reason),
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_prompt_tokens,
            "completion_tokens": usage.generated_tokens,
            "queue_s": timings.queue_s,
            "prefill_s": timings.prefill_s,
            "decode_s": timings.decode_s,
            "error": error,
        }),
    }
}
