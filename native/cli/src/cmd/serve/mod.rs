//! `hearth serve`: an OpenAI-compatible HTTP server over the engine.
//!
//! The model loads on its own thread while the server already answers
//! (`/health` is 503 until it is ready). That thread then runs the engine
//! loop ([`worker`]); HTTP handlers on a tokio runtime turn requests into
//! engine requests, send them over a channel, and turn the events that
//! come back into OpenAI replies or server-sent events ([`routes`]).

mod api;
mod error;
mod metrics;
mod reply;
mod routes;
mod tools;
mod worker;

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result};
use hearth::model::tokenizer::Tokenizer;
use tokio::sync::{mpsc, oneshot};

use super::load::{load_engine, EngineWish, KvArg, ModelArgs};
use api::Limits;
use metrics::Metrics;
use worker::{Command, Worker};

/// Arguments of `hearth serve`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model's name in the API (default: the file name without `.gguf`).
    #[arg(long, alias = "served-model-name")]
    alias: Option<String>,
    /// Requests decoded together (continuous batching); more wait in the queue.
    #[arg(long = "parallel", short = 'n', alias = "np", default_value_t = 16)]
    parallel: usize,
    /// Tokens the K/V cache holds over all requests (0: 4 full contexts).
    #[arg(long, default_value_t = 0)]
    kv_tokens: usize,
    /// Most prompt tokens one step computes beside each four requests that
    /// are decoding (0: the whole step): a long prompt then arrives in
    /// chunks instead of stalling everyone's next token (default: the
    /// platform's, 16; `hearth info --platform`).
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Element type of the K/V cache (default: the platform's, f16 unless
    /// a WebGPU adapter lacks shader-f16).
    #[arg(long, value_enum)]
    kv: Option<KvArg>,
    /// A built-in chat template instead of the model's (chatml, llama3, gemma).
    #[arg(long)]
    chat_template: Option<String>,
    /// Require `Authorization: Bearer KEY` on the API (`/health` and `/metrics` stay open).
    #[arg(long, env = "HEARTH_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Allow browsers from this origin (repeatable; `*` for any).
    #[arg(long = "cors-origin")]
    cors_origins: Vec<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Most tokens one request may ask for.
    #[arg(long, default_value_t = 32768)]
    max_tokens: usize,
    /// Most generation requests in flight (running or queued); more get 429.
    #[arg(long, default_value_t = 256)]
    max_concurrent: usize,
    /// Seconds in-flight requests get to finish after SIGTERM / Ctrl-C
    /// before they are cancelled.
    #[arg(long, default_value_t = 30)]
    shutdown_grace: u64,
}

/// What the handlers know once the model is loaded.
pub struct Ready {
    /// The model's tokenizer (for `/tokenize` and log-probability text).
    pub tokenizer: Tokenizer,
    /// Context length of one request.
    pub n_ctx: usize,
    /// Whether chat requests can be rendered.
    pub has_chat_template: bool,
    /// Tokens the K/V cache holds over all requests.
    pub kv_tokens: usize,
    /// Tokens per K/V block.
    pub block_size: usize,
    /// How tools are offered to this model.
    pub tool_format: tools::ToolFormat,
}

/// Server settings the handlers read.
pub struct Settings {
    /// The model's name in the API.
    pub model_name: String,
    /// Bearer key, when required.
    pub api_key: Option<String>,
    /// Request limits.
    pub limits: Limits,
    /// Most generation requests in flight.
    pub max_concurrent: usize,
    /// Unix seconds at start (`created` of `/v1/models`).
    pub started: u64,
}

/// State shared by every handler.
pub struct Shared {
    /// Settings.
    pub settings: Settings,
    /// The engine thread's inbox.
    pub commands: mpsc::UnboundedSender<Command>,
    /// Set once the model is loaded.
    pub ready: OnceLock<Ready>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Generation requests in flight.
    pub in_flight: AtomicUsize,
    /// Source of default seeds and reply ids.
    pub counter: AtomicU64,
}

/// Runs `hearth serve` until SIGTERM / Ctrl-C.
pub fn run(args: Args) -> Result<()> {
    if args.parallel == 0 {
        anyhow::bail!("--parallel 0 would serve nothing; give 1 or more");
    }
    // Fail before listening when the file cannot be a model; everything
    // else about it is checked while the server already answers /health.
    super::open_model(&args.model.model)?;
    let model_name = args.alias.clone().unwrap_or_else(|| {
        let stem = args
            .model
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned());
        stem.unwrap_or_else(|| "model".to_string())
    });
    let metrics = Arc::new(Metrics::new(&model_name));
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (commands, inbox) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        settings: Settings {
            model_name,
            api_key: args.api_key.clone().filter(|k| !k.is_empty()),
            limits: Limits {
                max_tokens: args.max_tokens.max(1),
            },
            max_concurrent: args.max_concurrent.max(1),
            started,
        },
        commands,
        ready: OnceLock::new(),
        metrics: metrics.clone(),
        in_flight: AtomicUsize::new(0),
        counter: AtomicU64::new(started.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the HTTP runtime")?;
    let (fatal_tx, fatal_rx) = oneshot::channel::<anyhow::Error>();
    spawn_engine(&args, shared.clone(), inbox, fatal_tx)?;
    runtime.block_on(serve(args, shared, fatal_rx))
}

/// Loads the model on its own thread, then runs the engine loop there. A
/// failed load goes to `fatal` (the server then exits with it).
fn spawn_engine(
    args: &Args,
    shared: Arc<Shared>,
    inbox: mpsc::UnboundedReceiver<Command>,
    fatal: oneshot::Sender<anyhow::Error>,
) -> Result<()> {
    let model = args.model.clone();
    let (kv, chat_template, parallel, kv_tokens, prefill_chunk) = (
        args.kv,
        args.chat_template.clone(),
        args.parallel,
        args.kv_tokens,
        args.prefill_chunk,
    );
    std::thread::Builder::new()
        .name("engine".to_string())
        .spawn(move || {
            let prefill_chunk = prefill_chunk.unwrap_or_else(|| {
                crate::cmd::platform::defaults_for(&model.backend)
                    .prefill_chunk
                    .value
            });
            let wish = EngineWish {
                kv: kv.map(Into::into),
                chat_template: chat_template.as_deref(),
                max_num_seqs: parallel,
                kv_tokens,
                kv_contexts: 4,
                prefill_tokens_per_4_decodes: prefill_chunk,
                ..EngineWish::default()
            };
            let loaded = match load_engine(&model, &wish) {
                Ok(l) => l,
                Err(e) => {
                    let _ = fatal.send(e);
                    return;
                }
            };
            if let Some(line) = &loaded.tune {
                eprintln!("{line}");
            }
            let engine = loaded.engine;
            let cfg = engine.config().clone();
            shared.metrics.set_loaded(cfg.block_size, cfg.num_blocks() - 1);
            let ready = Ready {
                tokenizer: engine.tokenizer().clone(),
                n_ctx: cfg.n_ctx,
                has_chat_template: engine.chat_template().is_some(),
                kv_tokens: (cfg.num_blocks() - 1) * cfg.block_size,
                block_size: cfg.block_size,
                tool_format: tools::ToolFormat::of(engine.chat_template()),
            };
            let _ = shared.ready.set(ready);
            eprintln!(
                "serve: {} loaded in {:.1}s ({}, context {}, {} requests at once, K/V for {} tokens)",
                shared.settings.model_name,
                loaded.load_s,
                engine.model().device_name(),
                cfg.n_ctx,
                cfg.max_num_seqs,
                (cfg.num_blocks() - 1) * cfg.block_size,
            );
            Worker::new(engine, shared.metrics.clone()).run(inbox);
        })
        .context("cannot start the engine thread")?;
    Ok(())
}

/// Binds, serves until a signal (or a failed load), then drains.
async fn serve(
    args: Args,
    shared: Arc<Shared>,
    fatal: oneshot::Receiver<anyhow::Error>,
) -> Result<()> {
    // tokio resolves names and tries each address in turn.
    let (host, port) = (args.host.as_str(), args.port);
    let listener = tokio::net::TcpListener::bind((host, port)).await.with_context(|| {
        format!("cannot listen on {host}:{port}; is another server on that port (pick another with --port), or is --host not an address of this machine?")
    })?;
    let local = listener
        .local_addr()
        .context("cannot read the bound address")?;
    eprintln!(
        "serve: listening on http://{local} (model {})",
        shared.settings.model_name
    );
    let app = routes::router(shared.clone(), args.max_body_bytes, &args.cors_origins)?;
    let (failed_tx, mut failed_rx) = oneshot::channel::<anyhow::Error>();
    let grace = Duration::from_secs(args.shutdown_grace);
    let commands = shared.commands.clone();
    let shutdown = async move {
        tokio::select! {
            () = signal() => {
                eprintln!("serve: shutting down; in-flight requests get {}s to finish", grace.as_secs());
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    let _ = commands.send(Command::CancelAll);
                });
            }
            Ok(e) = fatal => {
                let _ = failed_tx.send(e);
            }
        }
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .context("the HTTP server failed")?;
    match failed_rx.try_recv() {
        Ok(e) => Err(e),
        Err(_) => Ok(()),
    }
}

/// SIGTERM or Ctrl-C.
async fn signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await,
            };
        tokio::select! {
            () = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await;
}
