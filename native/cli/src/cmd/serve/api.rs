//! The OpenAI request bodies the server reads, and how they become engine
//! requests. Fields the server does not know are ignored, as OpenAI's own
//! clients send many; fields it knows but cannot honour are refused.

use hearth::engine::{ChatMessage, Constraint, GenerateRequest, Prompt};
use hearth::sample::SamplingParams;
use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;

/// Most alternatives `top_logprobs` may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// Most choices `n` may ask for.
pub const MAX_N: u64 = 16;

/// `stop`: one string or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several (at most 4 in OpenAI's API; any number here).
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the request's `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling and stopping fields chat and completions share (`model`
/// is ignored: the server serves one model under any name).
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// Newer name of `max_tokens` (chat).
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature (0: greedy).
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// llama.cpp's top-k (0 or negative: off).
    pub top_k: Option<i64>,
    /// llama.cpp's min-p.
    pub min_p: Option<f64>,
    /// OpenAI's presence penalty.
    pub presence_penalty: Option<f64>,
    /// OpenAI's frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// llama.cpp's / vLLM's repetition penalty.
    #[serde(alias = "repetition_penalty")]
    pub repeat_penalty: Option<f64>,
    /// Seed of the random draw (choice `i` of `n` uses `seed + i`).
    pub seed: Option<i64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Choices per prompt.
    pub n: Option<u64>,
    /// Keep generating after end-of-generation tokens.
    #[serde(default)]
    pub ignore_eos: bool,
    /// `json_object` or `json_schema` output.
    pub response_format: Option<Value>,
    /// A GBNF grammar (llama.cpp's field).
    pub grammar: Option<String>,
    /// A JSON Schema for the output (llama.cpp's field).
    pub json_schema: Option<Value>,
    /// A JSON Schema for the output (vLLM's older field).
    pub guided_json: Option<Value>,
    /// A regular expression the output must match (vLLM's older field).
    pub guided_regex: Option<String>,
    /// A Lark grammar (vLLM's older field).
    pub guided_grammar: Option<String>,
}

impl Common {
    /// The output constraint the request asks for, if any: at most one of
    /// `response_format` (`json_object` / `json_schema`), `grammar` (GBNF),
    /// `json_schema`, `guided_json`, `guided_regex`, `guided_grammar` (Lark).
    pub fn constraint(&self) -> Result<Option<Constraint>, ApiError> {
        let mut found: Vec<(&'static str, Constraint)> = Vec::new();
        if let Some(f) = &self.response_format {
            match f.get("type").and_then(Value::as_str) {
                None | Some("text") => {}
                Some("json_object") => found.push(("response_format", Constraint::JsonObject)),
                Some("json_schema") => {
                    let schema = f
                        .pointer("/json_schema/schema")
                        .or_else(|| f.get("schema"))
                        .cloned()
                        .ok_or_else(|| ApiError::bad_param("response_format", "response_format json_schema needs json_schema.schema"))?;
                    found.push(("response_format", Constraint::JsonSchema(schema)));
                }
                Some(other) => {
                    return Err(ApiError::bad_param(
                        "response_format",
                        format!("response_format type {other:?} is not one of text, json_object, json_schema"),
                    ))
                }
            }
        }
        if let Some(g) = &self.grammar {
            found.push(("grammar", Constraint::Gbnf(g.clone())));
        }
        if let Some(s) = self.json_schema.as_ref().or(self.guided_json.as_ref()) {
            let schema = match s {
                // vLLM takes the schema as a JSON string too.
                Value::String(text) => serde_json::from_str(text).map_err(|e| {
                    ApiError::bad_param("guided_json", format!("the schema is not JSON: {e}"))
                })?,
                v => v.clone(),
            };
            found.push(("json_schema", Constraint::JsonSchema(schema)));
        }
        if let Some(r) = &self.guided_regex {
            found.push(("guided_regex", Constraint::Regex(r.clone())));
        }
        if let Some(g) = &self.guided_grammar {
            found.push(("guided_grammar", Constraint::Lark(g.clone())));
        }
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop().map(|(_, c)| c)),
            _ => {
                let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
                Err(ApiError::bad_request(format!(
                    "give one output constraint, not several ({})",
                    names.join(", ")
                )))
            }
        }
    }
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// Report log-probabilities of the chosen tokens.
    #[serde(default)]
    pub logprobs: bool,
    /// How many alternatives per token (needs `logprobs`).
    pub top_logprobs: Option<u64>,
    /// Functions the model may call.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "function": {"name": ...}}`.
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one reply (default false).
    pub parallel_tool_calls: Option<bool>,
    /// The shared fields.
    #[serde(flatten)]
    pub common: Common,
}

/// One chat message.
#[derive(Debug, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// A string, an array of content parts, or null (an assistant turn
    /// that only calls tools).
    #[serde(default)]
    pub content: Value,
    /// Calls an earlier assistant turn made.
    pub tool_calls: Option<Value>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
}

/// `prompt` of `POST /v1/completions`: text, token ids, or a batch of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum CompletionPrompt {
    /// One text prompt.
    Text(String),
    /// One prompt as token ids.
    Tokens(Vec<u32>),
    /// Several text prompts.
    Texts(Vec<String>),
    /// Several prompts as token ids.
    TokenBatches(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt(s).
    pub prompt: CompletionPrompt,
    /// Log-probabilities: the chosen token's and this many alternatives.
    pub logprobs: Option<u64>,
    /// Echo the prompt (not supported: refused).
    #[serde(default)]
    pub echo: bool,
    /// Text appended after the completion (not supported: refused).
    pub suffix: Option<String>,
    /// Best-of sampling (only 1 or `n`: refused otherwise).
    pub best_of: Option<u64>,
    /// The shared fields.
    #[serde(flatten)]
    pub common: Common,
}

impl CompletionRequest {
    /// The prompts, in order.
    pub fn prompts(&self) -> Result<Vec<Prompt>, ApiError> {
        let prompts = match &self.prompt {
            CompletionPrompt::Text(t) => vec![Prompt::Text(t.clone())],
            CompletionPrompt::Tokens(t) => vec![Prompt::Tokens(t.clone())],
            CompletionPrompt::Texts(ts) => ts.iter().cloned().map(Prompt::Text).collect(),
            CompletionPrompt::TokenBatches(ts) => ts.iter().cloned().map(Prompt::Tokens).collect(),
        };
        if prompts.is_empty() {
            return Err(ApiError::bad_param(
                "prompt",
                "prompt is an empty list; give at least one prompt",
            ));
        }
        Ok(prompts)
    }

    /// Refuses the fields the server cannot honour.
    pub fn check_supported(&self) -> Result<(), ApiError> {
        if self.echo {
            return Err(ApiError::bad_param(
                "echo",
                "echo is not supported; send the prompt without it and prepend it yourself",
            ));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::bad_param(
                "suffix",
                "suffix (fill-in-the-middle) is not supported",
            ));
        }
        let n = self.common.n.unwrap_or(1);
        if self.best_of.is_some_and(|b| b != n) {
            return Err(ApiError::bad_param(
                "best_of",
                "best_of is not supported; leave it unset or equal to n",
            ));
        }
        Ok(())
    }
}

impl ChatRequest {
    /// The conversation as the chat template takes it: text parts joined,
    /// other parts refused.
    pub fn chat_messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_param(
                "messages",
                "messages is empty; send at least one message",
            ));
        }
        self.messages
            .iter()
            .map(|m| {
                let mut msg = ChatMessage::new(m.role.clone(), message_text(&m.content)?);
                msg.tool_calls = m.tool_calls.clone().filter(|c| !c.is_null());
                msg.tool_call_id = m.tool_call_id.clone();
                Ok(msg)
            })
            .collect()
    }
}

/// The text of a message's `content`: a string, null, or text parts.
fn message_text(content: &Value) -> Result<String, ApiError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad_param(
                            "messages",
                            format!("content part of type {} is not supported; this server takes text parts only", kind.unwrap_or("(none)")),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::bad_param(
            "messages",
            "message content must be a string, an array of text parts, or null",
        )),
    }
}

/// Limits the server applies to every request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most tokens one request may ask for (`max_tokens`).
    pub max_tokens: usize,
}

/// The engine requests of one prompt: `n` of them, seeds `seed + i`.
/// `logprobs`: `Some(k)` reports the chosen token and `k` alternatives.
pub fn generate_requests(
    common: &Common,
    prompt: Prompt,
    logprobs: Option<usize>,
    constraint: Option<Constraint>,
    limits: &Limits,
    default_seed: u64,
) -> Result<Vec<GenerateRequest>, ApiError> {
    let n = common.n.unwrap_or(1);
    if n == 0 || n > MAX_N {
        return Err(ApiError::bad_param(
            "n",
            format!("n must be between 1 and {MAX_N}, got {n}"),
        ));
    }
    let max_tokens = match common.max_completion_tokens.or(common.max_tokens) {
        None => None,
        Some(0) => {
            return Err(ApiError::bad_param(
                "max_tokens",
                "max_tokens is 0; ask for at least one token",
            ))
        }
        Some(m) if m > limits.max_tokens as u64 => {
            return Err(ApiError::bad_param(
                "max_tokens",
                format!(
                    "max_tokens {m} is over this server's limit of {}; ask for fewer",
                    limits.max_tokens
                ),
            ))
        }
        Some(m) => Some(m as usize),
    };
    let sampling = sampling_params(common, default_seed)?;
    let stop = match &common.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    }
    .into_iter()
    .filter(|s| !s.is_empty())
    .collect::<Vec<_>>();
    let mut reqs = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut req = GenerateRequest::new(prompt.clone());
        req.max_tokens = Some(max_tokens.unwrap_or(limits.max_tokens));
        req.sampling = SamplingParams {
            seed: sampling.seed.wrapping_add(i),
            ..sampling.clone()
        };
        req.stop = stop.clone();
        req.logprobs = logprobs;
        req.ignore_eos = common.ignore_eos;
        req.constraint = constraint.clone();
        reqs.push(req);
    }
    Ok(reqs)
}

/// The sampler's settings: llama-server's defaults for what is not given.
fn sampling_params(c: &Common, default_seed: u64) -> Result<SamplingParams, ApiError> {
    let mut p = SamplingParams {
        seed: c.seed.map_or(default_seed, |s| s as u64),
        ..SamplingParams::default()
    };
    let finite =
        |name: &'static str, v: Option<f64>, lo: f64, hi: f64| -> Result<Option<f32>, ApiError> {
            match v {
                None => Ok(None),
                Some(x) if x.is_finite() && (lo..=hi).contains(&x) => Ok(Some(x as f32)),
                Some(x) => Err(ApiError::bad_param(
                    name,
                    format!("{name} must be between {lo} and {hi}, got {x}"),
                )),
            }
        };
    if let Some(t) = finite("temperature", c.temperature, 0.0, 2.0)? {
        p.temperature = t;
    }
    if let Some(t) = finite("top_p", c.top_p, 0.0, 1.0)? {
        // 0 would keep nothing; like llama.cpp, it keeps the most likely token.
        p.top_p = t.max(f32::MIN_POSITIVE);
    }
    if let Some(t) = finite("min_p", c.min_p, 0.0, 1.0)? {
        p.min_p = t;
    }
    if let Some(t) = finite("presence_penalty", c.presence_penalty, -2.0, 2.0)? {
        p.presence_penalty = t;
    }
    if let Some(t) = finite("frequency_penalty", c.frequency_penalty, -2.0, 2.0)? {
        p.frequency_penalty = t;
    }
    if let Some(t) = finite("repeat_penalty", c.repeat_penalty, 0.0, 10.0)? {
        if t <= 0.0 {
            return Err(ApiError::bad_param(
                "repeat_penalty",
                "repeat_penalty must be above 0 (1 is off)",
            ));
        }
        p.repeat_penalty = t;
    }
    if let Some(k) = c.top_k {
        p.top_k = usize::try_from(k).unwrap_or(0);
    }
    Ok(p)
}

/// The `top_logprobs` count of a chat request: `None` without `logprobs`.
pub fn chat_logprobs(req: &ChatRequest) -> Result<Option<usize>, ApiError> {
    match (req.logprobs, req.top_logprobs) {
        (false, Some(k)) if k > 0 => Err(ApiError::bad_param(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        (false, _) => Ok(None),
        (true, k) => top_logprobs_count("top_logprobs", k.unwrap_or(0)).map(Some),
    }
}

/// The `logprobs` count of a completion request.
pub fn completion_logprobs(req: &CompletionRequest) -> Result<Option<usize>, ApiError> {
    req.logprobs
        .map(|k| top_logprobs_count("logprobs", k))
        .transpose()
}

fn top_logprobs_count(param: &'static str, k: u64) -> Result<usize, ApiError> {
    if k > MAX_TOP_LOGPROBS {
        return Err(ApiError::bad_param(
            param,
            format!("{param} must be at most {MAX_TOP_LOGPROBS}, got {k}"),
        ));
    }
    Ok(k as usize)
}
