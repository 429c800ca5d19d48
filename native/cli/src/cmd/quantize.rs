//! `hearth quantize`: write a copy of a model with its weights in another
//! format, choosing each tensor's type as llama-quantize does
//! (`hearth::quant::convert`).

use std::fs::File;
use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use hearth::quant::convert::{quantize_model, QuantPlan};
use hearth::quant::recipe::FileType;
use indicatif::{ProgressBar, ProgressStyle};

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
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .ok();
    }
    let (model, sources) = super::open_model(&args.input)?;
    let plan = QuantPlan::new(&model, ftype, args.pure)
        .with_context(|| format!("cannot plan quantizing {}", args.input.display()))?;

    // Write beside the destination and rename at the end: a failed run leaves no half file.
    let tmp = args.output.with_extension("gguf.partial");
    let file = File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
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
    if let Err(err) = written {
        std::fs::remove_file(&tmp).ok();
        return Err(err).context(format!("cannot quantize {}", args.input.display()));
    }
    std::fs::rename(&tmp, &args.output)
        .with_context(|| format!("cannot move the result to {}", args.output.display()))?;
    let size = std::fs::metadata(&args.output)
        .map(|m| m.len())
        .unwrap_or(0);
    eprintln!(
        "wrote {} ({}, {})",
        args.output.display(),
        ftype.name(),
        super::human_bytes(size)
    );
    Ok(())
}
