//! `hearth run`: generate a continuation of a prompt, streaming the text.

use std::io::Write;

use anyhow::Result;
use hearth::engine::{
    ChatMessage, Engine, EngineEvent, EngineStats, FinishReason, GenerateRequest, Prompt, Usage,
};
use hearth::model::ForwardModel;
use serde_json::json;

use super::load::{load_engine, EngineWish, KvArg, ModelArgs, SamplingArgs};

/// Arguments of `hearth run`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt.
    #[arg(short, long, required_unless_present = "prompt_tokens")]
    prompt: Option<String>,
    /// The prompt as token ids, comma separated, used exactly as given.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["prompt", "chat"])]
    prompt_tokens: Vec<u32>,
    /// Most tokens to generate (-1: until the context is full).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Element type of the K/V cache (default: the platform's, f16 unless
    /// a WebGPU adapter lacks shader-f16; `hearth info --platform`).
    #[arg(long, value_enum)]
    kv: Option<KvArg>,
    /// Stop when the output contains this text (repeatable); it is not printed.
    #[arg(long)]
    stop: Vec<String>,
    /// Send the prompt as a user message through the model's chat template.
    #[arg(long)]
    chat: bool,
    /// With --chat: a system message first.
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// With --chat: a built-in template instead of the model's (chatml, llama3, gemma).
    #[arg(long, requires = "chat")]
    chat_template: Option<String>,
    /// Keep generating after end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// One JSON object per token (`id`, `text`, `logprob`), then a summary line.
    #[arg(long)]
    json: bool,
}

/// Runs `hearth run`.
pub fn run(args: Args) -> Result<()> {
    if args.n_predict == 0 {
        anyhow::bail!("-n 0 asks for no tokens; give -n N with N >= 1, or -1 to fill the context");
    }
    let wish = EngineWish {
        kv: args.kv.map(Into::into),
        chat_template: args.chat_template.as_deref(),
        need_chat_template: args.chat,
        progress: !args.json,
        ..EngineWish::default()
    };
    let mut loaded = load_engine(&args.model, &wish)?;
    let req = request(&args);
    let seed = req.sampling.seed;
    loaded.engine.add_request(req)?;
    // Once the request is accepted, so that a refusal stays one line.
    if !args.json {
        eprintln!("{}", super::platform::platform_line(&args.model.backend));
        if let Some(line) = &loaded.tune {
            eprintln!("{line}");
        }
    }
    let mut out = std::io::stdout().lock();
    let (reason, usage) = stream(&mut loaded.engine, args.json, &mut out)?;
    let stats = loaded.engine.stats();
    let summary = Summary {
        prompt_tokens: usage.prompt_tokens,
        generated_tokens: usage.generated_tokens,
        reason,
        stats: &stats,
        load_s: loaded.load_s,
        seed,
    };
    if args.json {
        writeln!(out, "{}", summary.json())?;
    } else {
        writeln!(out)?;
        out.flush()?;
        eprintln!("{}", summary.line());
        if let Some(experts) = loaded.engine.model().expert_stats() {
            eprintln!("{experts}");
        }
    }
    Ok(())
}

/// The generation request `args` describe.
fn request(args: &Args) -> GenerateRequest {
    let mut req = GenerateRequest::new(prompt(args));
    req.max_tokens = usize::try_from(args.n_predict).ok().filter(|&n| n > 0);
    req.sampling = args.sampling.params();
    req.stop = args.stop.clone();
    req.logprobs = args.json.then_some(0);
    req.ignore_eos = args.ignore_eos;
    req
}

/// Steps the engine until its one request ends, printing each token's text
/// (or, with `json`, one object per token); returns how it ended.
fn stream<M: ForwardModel>(
    engine: &mut Engine<M>,
    json: bool,
    out: &mut impl Write,
) -> Result<(FinishReason, Usage)> {
    let mut end = None;
    while engine.has_unfinished() {
        for event in pollster::block_on(engine.step())? {
            match event {
                EngineEvent::Token {
                    token,
                    text,
                    logprob,
                    ..
                } if json => {
                    let line = json!({"id": token, "text": text, "logprob": logprob});
                    writeln!(out, "{line}")?;
                }
                EngineEvent::Token { text, .. } => {
                    write!(out, "{text}")?;
                    out.flush()?;
                }
                EngineEvent::Finished {
                    error: Some(error), ..
                } => anyhow::bail!("generation failed: {error}"),
                EngineEvent::Finished { reason, usage, .. } => end = Some((reason, usage)),
            }
        }
    }
    end.ok_or_else(|| anyhow::anyhow!("the request ended without a result"))
}

/// The request's prompt: token ids, a chat turn, or text.
fn prompt(args: &Args) -> Prompt {
    let text = args.prompt.clone().unwrap_or_default();
    if !args.prompt_tokens.is_empty() {
        return Prompt::Tokens(args.prompt_tokens.clone());
    }
    if !args.chat {
        return Prompt::Text(text);
    }
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system.as_str()));
    }
    messages.push(ChatMessage::new("user", text));
    Prompt::Chat(messages)
}

/// The end-of-run numbers.
struct Summary<'a> {
    prompt_tokens: usize,
    generated_tokens: usize,
    reason: FinishReason,
    stats: &'a EngineStats,
    load_s: f64,
    seed: u64,
}

impl Summary<'_> {
    fn json(&self) -> serde_json::Value {
        json!({"summary": {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "finish_reason": self.reason.as_str(),
            "prefill_tps": self.stats.prefill_tps(),
            "decode_tps": self.stats.decode_tps(),
            "load_s": self.load_s,
            "seed": self.seed,
        }})
    }

    fn line(&self) -> String {
        format!(
            "prompt {} tokens, generated {} tokens ({}), prefill {:.1} tok/s, decode {:.1} tok/s, load {:.2} s, seed {}",
            self.prompt_tokens,
            self.generated_tokens,
            self.reason.as_str(),
            self.stats.prefill_tps(),
            self.stats.decode_tps(),
            self.load_s,
            self.seed
        )
    }
}
