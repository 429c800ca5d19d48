//! `hearth chat`: an interactive conversation on stdin/stdout.
//!
//! Each turn sends the whole conversation through the chat template; the
//! earlier turns' K/V comes from the prefix cache, so only the new text is
//! computed.

use std::io::{BufRead, IsTerminal, Write};

use anyhow::Result;
use hearth::engine::{ChatMessage, Engine, EngineEvent, GenerateRequest, Prompt};
use hearth::model::ForwardModel;

use super::load::{load_engine, EngineWish, KvArg, ModelArgs, SamplingArgs};

/// Arguments of `hearth chat`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// A built-in template instead of the model's (chatml, llama3, gemma).
    #[arg(long)]
    chat_template: Option<String>,
    /// A system message opening the conversation.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply (-1: until the context is full).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 1024,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Element type of the K/V cache (default: the platform's, f16 unless
    /// a WebGPU adapter lacks shader-f16; `hearth info --platform`).
    #[arg(long, value_enum)]
    kv: Option<KvArg>,
}

/// Runs `hearth chat`: one line of stdin is one user turn; `/exit` or end
/// of input quits.
pub fn run(args: Args) -> Result<()> {
    let wish = EngineWish {
        kv: args.kv.map(Into::into),
        chat_template: args.chat_template.as_deref(),
        need_chat_template: true,
        ..EngineWish::default()
    };
    let mut loaded = load_engine(&args.model, &wish)?;
    if let Some(line) = &loaded.tune {
        eprintln!("{line}");
    }
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "chatting with {}; /exit or Ctrl-D to quit",
            args.model.model.display()
        );
    }
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system.as_str()));
    }
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next().transpose()? else {
            break;
        };
        let line = line.trim_end_matches('\r');
        if line.trim() == "/exit" {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        messages.push(ChatMessage::new("user", line));
        let reply = reply(&mut loaded.engine, &messages, &args)?;
        messages.push(ChatMessage::new("assistant", reply));
    }
    Ok(())
}

/// Streams the assistant's reply to `messages`; returns its text.
fn reply<M: ForwardModel>(
    engine: &mut Engine<M>,
    messages: &[ChatMessage],
    args: &Args,
) -> Result<String> {
    let mut req = GenerateRequest::new(Prompt::Chat(messages.to_vec()));
    req.sampling = args.sampling.params();
    req.max_tokens = usize::try_from(args.n_predict).ok().filter(|&n| n > 0);
    engine.add_request(req)?;
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    let mut usage = None;
    while engine.has_unfinished() {
        for event in pollster::block_on(engine.step())? {
            match event {
                EngineEvent::Token { text: piece, .. } => {
                    write!(out, "{piece}")?;
                    out.flush()?;
                    text.push_str(&piece);
                }
                EngineEvent::Finished {
                    error: Some(error), ..
                } => anyhow::bail!("generation failed: {error}"),
                EngineEvent::Finished {
                    usage: u, timings, ..
                } => usage = Some((u, timings)),
            }
        }
    }
    writeln!(out)?;
    if let Some((u, t)) = usage {
        let tps = if t.decode_s > 0.0 {
            u.generated_tokens.saturating_sub(1) as f64 / t.decode_s
        } else {
            0.0
        };
        eprintln!(
            "[{} prompt tokens ({} cached), {} generated, {:.1} tok/s]",
            u.prompt_tokens, u.cached_prompt_tokens, u.generated_tokens, tps
        );
    }
    Ok(text)
}
