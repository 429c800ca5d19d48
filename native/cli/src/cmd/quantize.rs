//! `hearth quantize`: write a copy of a model with its weights in another
//! format, choosing each tensor's type as llama-quantize does
//! (`hearth::model::quantize`).

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use hearth::model::quantize::{quantize_model, QuantPlan};
use hearth::quant::recipe::FileType;

use super::output::{byte_progress, set_threads, write_atomically};

/// Arguments of `hearth quantize`.
#[derive(clap::Args)]
pub struct Args {
    /// The model to read (F32, F16, BF16 or already quantized).
    input: PathBuf,
    /// Where to write the quantized model.
    output: PathBuf,
    /// File type: F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L,
    /// Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS (Q4_K means Q4_K_M).
    file_type: String,
    /// Give every weight the file type's tensor type (llama-quantize --pure).
    #[arg(long)]
    pure: bool,
    /// Worker threads (default: all cores).
    #[arg(short, long)]
    threads: Option<usize>,
}

/// Runs `hearth quantize`.
pub fn run(args: Args) -> Result<()> {
    let Some(ftype) = FileType::from_name(&args.file_type) else {
        bail!(
            "unknown file type {:?}; choose one of {}",
            args.file_type,
            FileType::names().join(", ")
        );
    };
    if args.input == args.output {
        bail!("the output must be another file than the input");
    }
    set_threads(args.threads);
    let (model, sources) = super::open_model(&args.input)?;
    let plan = QuantPlan::new(&model, ftype, args.pure)
        .with_context(|| format!("cannot plan quantizing {}", args.input.display()))?;
    let size = write_atomically(&args.output, |tmp| {
        let file = File::create(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let bar = byte_progress(0);
        let written = pollster::block_on(quantize_model(
            &model,
            &sources,
            &plan,
            BufWriter::new(file),
            &mut |done, total, name| {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(name.to_string());
            },
        ));
        bar.finish_and_clear();
        written
            .map(drop)
            .with_context(|| format!("cannot quantize {}", args.input.display()))
    })?;
    eprintln!(
        "wrote {} ({}, {})",
        args.output.display(),
        ftype.name(),
        super::human_bytes(size)
    );
    Ok(())
}
