//! `hearth logits`: the logits of every position of a token sequence, for
//! comparing with other engines.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use super::load::{load_engine, EngineWish, KvArg, ModelArgs};

/// Arguments of `hearth logits`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Token ids, comma separated, run exactly as given (no BOS added).
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// Where to write the logits: little-endian f32, `[n_tokens][n_vocab]`.
    #[arg(long)]
    out: PathBuf,
    /// Element type of the K/V cache (f32 matches llama.cpp's reference dumps).
    #[arg(long, value_enum, default_value = "f32")]
    kv: KvArg,
    /// CPU only: multiply the weights with the f32 activations (each row
    /// expanded to f32) instead of int8-quantized ones: slow, the reference
    /// that quantized paths are compared with.
    #[arg(long)]
    exact: bool,
}

/// Runs `hearth logits`.
pub fn run(args: Args) -> Result<()> {
    if args.exact && args.model.backend != "cpu" {
        bail!("--exact is the CPU backend's exact-f32 mode: drop it, or run with --backend cpu");
    }
    let wish = EngineWish {
        kv: Some(args.kv.into()),
        default_ctx: Some(args.tokens.len()),
        exact_f32: args.exact,
        ..EngineWish::default()
    };
    let mut loaded = load_engine(&args.model, &wish)?;
    let logits = pollster::block_on(loaded.engine.all_logits(&args.tokens))?;
    // Once the tokens are accepted, so that a refusal stays one line.
    if let Some(line) = &loaded.tune {
        eprintln!("{line}");
    }
    let n_vocab = logits.len() / args.tokens.len().max(1);
    let mut bytes = Vec::with_capacity(logits.len() * 4);
    for v in &logits {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let mut file = std::fs::File::create(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    file.write_all(&bytes)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!(
        "wrote {} x {} logits to {}",
        args.tokens.len(),
        n_vocab,
        args.out.display()
    );
    Ok(())
}
