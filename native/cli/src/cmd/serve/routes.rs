//! The HTTP routes: OpenAI's chat and completions (whole replies and
//! server-sent events), models, tokenize / detokenize, health, metrics;
//! the API key check, body limits and JSON errors for everything refused.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Result;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use hearth::engine::{EngineEvent, FinishReason, GenerateRequest, Prompt};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::api::{self, ChatRequest, CompletionRequest};
use super::error::ApiError;
use super::reply::{logprobs_json, Api, Choice, Header, UsageSum};
use super::tools::{self, ToolPlan};
use super::worker::{ChoiceEvent, Command};
use super::{Ready, Shared};

type AppState = State<Arc<Shared>>;

/// The whole application.
pub fn router(shared: Arc<Shared>, max_body: usize, cors: &[String]) -> Result<Router> {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(shared.clone(), auth));
    let mut app = api
        .route("/health", get(health))
        .route("/model_info", get(model_info))
        .route("/server_info", get(server_info))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(shared);
    if !cors.is_empty() {
        app = app.layer(cors_layer(cors)?);
    }
    Ok(app)
}

fn cors_layer(origins: &[String]) -> Result<CorsLayer> {
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let list = origins
            .iter()
            .map(|o| {
                HeaderValue::from_str(o)
                    .map_err(|_| anyhow::anyhow!("--cors-origin {o:?} is not a valid origin"))
            })
            .collect::<Result<Vec<_>>>()?;
        AllowOrigin::list(list)
    };
    Ok(CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]))
}

/// `Authorization: Bearer KEY` when the server has a key.
async fn auth(State(shared): AppState, req: Request, next: Next) -> Response {
    let Some(key) = shared.settings.api_key.as_deref() else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(g) if same(g.as_bytes(), key.as_bytes()) => next.run(req).await,
        _ => {
            shared.metrics.rejected("unauthorized");
            let msg = "missing or wrong API key; send the header `Authorization: Bearer <key>` with the server's --api-key";
            ApiError::new(StatusCode::UNAUTHORIZED, msg)
                .with_code("invalid_api_key")
                .into_response()
        }
    }
}

/// Compares in time independent of where the inputs differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "no route {} {}; this server has /v1/chat/completions, /v1/completions, /v1/models, /tokenize, /detokenize, /health, /metrics",
            req.method(),
            req.uri().path()
        ),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// The body parsed as `T`, or the error to reply with.
fn parse<T: DeserializeOwned>(
    shared: &Shared,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            shared.metrics.rejected("too_large");
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is over this server's limit (--max-body-bytes)",
            )
        } else {
            ApiError::bad_request(format!("cannot read the request body: {e}"))
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        shared.metrics.rejected("invalid");
        ApiError::from(e)
    })
}

/// The loaded model, or 503 while it loads.
fn ready(shared: &Shared) -> Result<&Ready, ApiError> {
    shared.ready.get().ok_or_else(|| {
        shared.metrics.rejected("loading");
        ApiError::unavailable("the model is still loading; retry when /health answers 200")
    })
}

async fn health(State(shared): AppState) -> Response {
    match shared.ready.get() {
        Some(_) => Json(json!({"status": "ok"})).into_response(),
        None => ApiError::unavailable("the model is still loading").into_response(),
    }
}

async fn metrics(State(shared): AppState) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        shared.metrics.render(),
    )
        .into_response()
}

/// SGLang's `/model_info`, which its router reads when a worker joins.
async fn model_info(State(shared): AppState) -> Json<Value> {
    Json(json!({
        "model_path": shared.settings.model_name,
        "tokenizer_path": null,
        "is_generation": true,
    }))
}

/// SGLang's `/server_info`: the settings a router may read.
async fn server_info(State(shared): AppState) -> Json<Value> {
    let r = shared.ready.get();
    Json(json!({
        "model_path": shared.settings.model_name,
        "served_model_name": shared.settings.model_name,
        "context_length": r.map(|r| r.n_ctx),
        "max_total_num_tokens": r.map(|r| r.kv_tokens),
        "page_size": r.map(|r| r.block_size),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn models(State(shared): AppState) -> Json<Value> {
    let s = &shared.settings;
    let n_ctx = shared.ready.get().map(|r| r.n_ctx);
    Json(json!({"object": "list", "data": [{
        "id": s.model_name,
        "object": "model",
        "created": s.started,
        "owned_by": "hearth",
        "max_model_len": n_ctx,
    }]}))
}

/// `/tokenize` takes llama-server's and vLLM's fields.
#[derive(Deserialize)]
struct TokenizeRequest {
    #[serde(alias = "prompt")]
    content: String,
    #[serde(default = "yes", alias = "add_special_tokens")]
    add_special: bool,
    #[serde(default)]
    parse_special: bool,
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

async fn tokenize(
    State(shared): AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let req: TokenizeRequest = parse(&shared, body)?;
    let r = ready(&shared)?;
    let ids = r
        .tokenizer
        .encode(&req.content, req.add_special, req.parse_special)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let tokens: Vec<Value> = if req.with_pieces {
        ids.iter()
            .map(|&id| json!({"id": id, "piece": String::from_utf8_lossy(&r.tokenizer.token_to_piece(id, true))}))
            .collect()
    } else {
        ids.iter().map(|&id| Value::from(id)).collect()
    };
    Ok(Json(
        json!({"tokens": tokens, "count": ids.len(), "max_model_len": r.n_ctx}),
    ))
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

async fn detokenize(
    State(shared): AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let req: DetokenizeRequest = parse(&shared, body)?;
    let r = ready(&shared)?;
    let n_vocab = r.tokenizer.vocab_size();
    if let Some(&bad) = req.tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(ApiError::bad_param(
            "tokens",
            format!("token id {bad} is outside the vocabulary of {n_vocab}"),
        ));
    }
    let text = r.tokenizer.decode(&req.tokens, false, true);
    Ok(Json(json!({"content": text, "prompt": text})))
}

/// A place among the generation requests in flight, given back on drop.
struct Slot(Arc<Shared>);

impl Slot {
    fn take(shared: &Arc<Shared>) -> Result<Self, ApiError> {
        let max = shared.settings.max_concurrent;
        let prev = shared.in_flight.fetch_add(1, Ordering::SeqCst);
        if prev >= max {
            shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            shared.metrics.rejected("busy");
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the server has {max} requests in flight (--max-concurrent); retry shortly"
                ),
            ));
        }
        Ok(Slot(shared.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A started generation: its events and its slot.
struct Started {
    events: mpsc::UnboundedReceiver<ChoiceEvent>,
    _slot: Slot,
}

/// Hands `reqs` to the engine thread.
async fn start(shared: &Arc<Shared>, reqs: Vec<GenerateRequest>) -> Result<Started, ApiError> {
    let slot = Slot::take(shared)?;
    let (events_tx, events) = mpsc::unbounded_channel();
    let (accepted, answer) = oneshot::channel();
    let gone = || {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine has stopped; restart the server",
        )
    };
    shared
        .commands
        .send(Command::Generate {
            reqs,
            accepted,
            events: events_tx,
        })
        .map_err(|_| gone())?;
    answer.await.map_err(|_| gone())??;
    Ok(Started {
        events,
        _slot: slot,
    })
}

fn next_seed(shared: &Shared) -> u64 {
    let c = shared.counter.fetch_add(1, Ordering::Relaxed);
    // splitmix64: distinct seeds from a counter.
    let mut z = c.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn chat(
    State(shared): AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(&shared, body)?;
    let r = ready(&shared)?;
    if !r.has_chat_template {
        return Err(ApiError::bad_request(
            "this model has no chat template; start the server with --chat-template chatml|llama3|gemma, or use /v1/completions",
        ));
    }
    let tools = tools::plan(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        r.tool_format,
    )?;
    let asked = req.common.constraint()?;
    if tools.is_some() && asked.is_some() {
        return Err(ApiError::bad_request(
            "give tools or an output constraint (response_format, grammar), not both",
        ));
    }
    let logprobs = api::chat_logprobs(&req)?;
    let messages = req.chat_messages()?;
    let (prompt, constraint) = match &tools {
        Some(plan) => (plan.prompt(messages), plan.constraint()),
        None => (Prompt::Chat(messages), asked),
    };
    let seed = next_seed(&shared);
    let limits = &shared.settings.limits;
    let reqs = api::generate_requests(&req.common, prompt, logprobs, constraint, limits, seed)?;
    let n = reqs.len();
    let reply = Reply {
        api: Api::Chat,
        n,
        logprobs: logprobs.is_some(),
        tools: tools.map(Arc::new),
    };
    respond(shared, reply, reqs, &req.common).await
}

async fn completions(
    State(shared): AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(&shared, body)?;
    ready(&shared)?;
    req.check_supported()?;
    let constraint = req.common.constraint()?;
    let logprobs = api::completion_logprobs(&req)?;
    let seed = next_seed(&shared);
    let limits = &shared.settings.limits;
    let mut reqs = Vec::new();
    let mut n = 1;
    for prompt in req.prompts()? {
        let group = api::generate_requests(
            &req.common,
            prompt,
            logprobs,
            constraint.clone(),
            limits,
            seed,
        )?;
        n = group.len();
        reqs.extend(group);
    }
    let reply = Reply {
        api: Api::Completion,
        n,
        logprobs: logprobs.is_some(),
        tools: None,
    };
    respond(shared, reply, reqs, &req.common).await
}

/// How a reply is shaped.
struct Reply {
    api: Api,
    /// Choices per prompt.
    n: usize,
    logprobs: bool,
    /// The tools offered, whose calls are parsed out of the text.
    tools: Option<Arc<ToolPlan>>,
}

/// Starts the requests and answers with the whole reply or a stream.
async fn respond(
    shared: Arc<Shared>,
    reply: Reply,
    reqs: Vec<GenerateRequest>,
    common: &api::Common,
) -> Result<Response, ApiError> {
    let count = reqs.len();
    let started = start(&shared, reqs).await?;
    let prefix = if reply.api == Api::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let header = Header {
        id: format!("{prefix}-{:016x}", next_seed(&shared)),
        created: now_unix(),
        model: shared.settings.model_name.clone(),
        api: reply.api,
        n: reply.n,
        tools: reply.tools,
    };
    let choices = (0..count).map(|i| Choice::new(i, reply.logprobs)).collect();
    if common.stream {
        let usage = common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage);
        let stream = sse_stream(shared, header, started, choices, usage);
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    whole_reply(shared, header, started, choices).await
}

async fn whole_reply(
    shared: Arc<Shared>,
    header: Header,
    mut started: Started,
    mut choices: Vec<Choice>,
) -> Result<Response, ApiError> {
    let tok = &ready(&shared)?.tokenizer;
    let mut open = choices.len();
    while open > 0 {
        let Some(ChoiceEvent { index, event }) = started.events.recv().await else {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the engine stopped mid-request; retry",
            ));
        };
        let Some(choice) = choices.get_mut(index) else {
            continue;
        };
        if matches!(event, EngineEvent::Finished { .. }) {
            open -= 1;
        }
        choice.apply(event);
    }
    if let Some(c) = choices
        .iter()
        .find(|c| c.finish == Some(FinishReason::Error))
    {
        let msg = c
            .error
            .clone()
            .unwrap_or_else(|| "generation failed".to_string());
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg));
    }
    let usage = UsageSum::of(&choices, header.n);
    Ok(Json(header.reply(&choices, &usage, tok)).into_response())
}

/// The state of a reply being streamed.
struct Streaming {
    shared: Arc<Shared>,
    header: Header,
    started: Started,
    choices: Vec<Choice>,
    role_sent: Vec<bool>,
    open: usize,
    include_usage: bool,
    queue: VecDeque<Event>,
    done: bool,
}

impl Streaming {
    fn data(&mut self, v: &Value) {
        self.queue.push_back(Event::default().data(v.to_string()));
    }

    fn on_event(&mut self, ChoiceEvent { index, event }: ChoiceEvent) {
        let Some(r) = self.shared.ready.get() else {
            return;
        };
        let tok = &r.tokenizer;
        let api = self.header.api;
        let Some(choice) = self.choices.get_mut(index) else {
            return;
        };
        match event {
            EngineEvent::Token { ref text, .. } => {
                let text = text.clone();
                let offset = choice.chars;
                let lp = choice.apply(event);
                let lp_json = lp.map_or(Value::Null, |lp| logprobs_json(api, &[lp], tok, offset));
                let mut chunks = Vec::new();
                if api == Api::Chat && !self.role_sent[index] {
                    self.role_sent[index] = true;
                    chunks.push(json!({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}));
                }
                // With tools offered the text is held until the end, where
                // it becomes calls or content.
                let held = self.header.tools.is_some();
                if !held && (!text.is_empty() || !lp_json.is_null()) {
                    chunks.push(match api {
                        Api::Chat => json!({"index": index, "delta": {"content": text}, "logprobs": lp_json, "finish_reason": null}),
                        Api::Completion => json!({"index": index, "text": text, "logprobs": lp_json, "finish_reason": null}),
                    });
                }
                for c in chunks {
                    let chunk = self.header.chunk(vec![c]);
                    self.data(&chunk);
                }
            }
            EngineEvent::Finished { .. } => {
                choice.apply(event);
                self.open = self.open.saturating_sub(1);
                if choice.finish == Some(FinishReason::Error) {
                    let msg = choice
                        .error
                        .clone()
                        .unwrap_or_else(|| "generation failed".to_string());
                    let err = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg).body();
                    self.data(&err);
                    return;
                }
                let mut reason = choice.finish_reason();
                if let Some(plan) = self.header.tools.as_deref() {
                    let (message, r) = choice.message(Some(plan), &self.header.id);
                    reason = r;
                    let mut delta = json!({});
                    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
                        let calls: Vec<Value> = calls
                            .iter()
                            .enumerate()
                            .map(|(i, c)| {
                                let mut c = c.clone();
                                c["index"] = json!(i);
                                c
                            })
                            .collect();
                        delta["tool_calls"] = json!(calls);
                    }
                    if let Some(content) = message.get("content").filter(|c| !c.is_null()) {
                        delta["content"] = content.clone();
                    }
                    let c = json!({"index": index, "delta": delta, "logprobs": null, "finish_reason": null});
                    let chunk = self.header.chunk(vec![c]);
                    self.data(&chunk);
                }
                let last = match api {
                    Api::Chat => {
                        json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason})
                    }
                    Api::Completion => {
                        json!({"index": index, "text": "", "logprobs": null, "finish_reason": reason})
                    }
                };
                let chunk = self.header.chunk(vec![last]);
                self.data(&chunk);
            }
        }
    }

    fn end(&mut self) {
        if self.include_usage {
            let usage = UsageSum::of(&self.choices, self.header.n);
            let chunk = self.header.usage_chunk(&usage);
            self.data(&chunk);
        }
        self.queue.push_back(Event::default().data("[DONE]"));
        self.done = true;
    }
}

/// Server-sent events of a reply; dropping the stream (the client went
/// away) drops the events receiver, which cancels the requests.
fn sse_stream(
    shared: Arc<Shared>,
    header: Header,
    started: Started,
    choices: Vec<Choice>,
    include_usage: bool,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let open = choices.len();
    let state = Streaming {
        shared,
        header,
        started,
        role_sent: vec![false; open],
        choices,
        open,
        include_usage,
        queue: VecDeque::new(),
        done: false,
    };
    stream::unfold(state, |mut st| async move {
        loop {
            if let Some(ev) = st.queue.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.done {
                return None;
            }
            if st.open == 0 {
                st.end();
                continue;
            }
            match st.started.events.recv().await {
                Some(ev) => st.on_event(ev),
                None => {
                    let err = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the engine stopped mid-request; retry",
                    )
                    .body();
                    st.data(&err);
                    st.open = 0;
                }
            }
        }
    })
}
