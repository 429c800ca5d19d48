//! `hearth tokenize`: text to token ids, as llama.cpp's `llama_tokenize` does.

use std::path::PathBuf;

use anyhow::{Context, Result};
use hearth::model::tokenizer::Tokenizer;

/// Arguments of `hearth tokenize`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model whose tokenizer to use.
    #[arg(short, long)]
    model: PathBuf,
    /// Turn special-token text (`<|im_start|>`, `<bos>`) into their ids.
    #[arg(long)]
    parse_special: bool,
    /// Do not add BOS/EOS even where the model's metadata asks for them.
    #[arg(long)]
    no_bos: bool,
    /// Print one JSON array of ids on one line.
    #[arg(long)]
    json: bool,
    /// Read the text from this file instead of the command line.
    #[arg(long, conflicts_with = "text")]
    file: Option<PathBuf>,
    /// The text to tokenize.
    #[arg(required_unless_present = "file")]
    text: Option<String>,
}

/// Runs `hearth tokenize`.
pub fn run(args: Args) -> Result<()> {
    let text = match (&args.file, args.text) {
        (Some(path), _) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read text from {}", path.display()))?,
        (None, Some(text)) => text,
        (None, None) => anyhow::bail!("give the text to tokenize, or --file PATH"),
    };
    let (file, _source) = super::open_model(&args.model)?;
    let tokenizer = Tokenizer::from_metadata(file.metadata())
        .with_context(|| format!("cannot build the tokenizer of {}", args.model.display()))?;
    let ids = tokenizer.encode(&text, !args.no_bos, args.parse_special)?;
    if args.json {
        println!("{}", serde_json::to_string(&ids)?);
        return Ok(());
    }
    for id in &ids {
        let piece = tokenizer.token_to_piece(*id, true);
        println!("{id:>8} -> {:?}", String::from_utf8_lossy(&piece));
    }
    println!("{} tokens", ids.len());
    Ok(())
}
