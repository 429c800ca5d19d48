//! `hearth synth`: write a model with random weights in a real model's shape
//! and tensor types, which Hearth and llama.cpp both load. For benchmarks:
//! decode speed is bytes over bandwidth, so only the shapes and types matter.
//!
//! The plan and the values come from `hearth::model::synth`; this command
//! makes the rows on every core and streams them to the file, a bounded
//! chunk at a time, so an 8B model is written without holding it.

use std::fs::File;
use std::io::BufWriter;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use hearth::gguf::GgufWriter;
use hearth::model::synth::{Scales, SynthArch, SynthModel, SynthOptions, SynthShape};
use hearth::quant::recipe::FileType;
use indicatif::ProgressBar;
use rayon::prelude::*;

/// Values made per chunk of a tensor: 8 Mi values (32 MiB as f32) bound the
/// memory whatever the model's size.
const CHUNK_VALUES: u64 = 8 << 20;

/// Arguments of `hearth synth`.
#[derive(clap::Args)]
pub struct Args {
    /// Where to write the model (.gguf).
    output: PathBuf,
    /// Architecture: llama, qwen2, qwen3, gemma3 or qwen3moe (implied by --shape).
    #[arg(long)]
    arch: Option<String>,
    /// A real model's shape: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, smollm2-135m,
    /// smollm2-360m, qwen2.5-0.5b, qwen2.5-1.5b, qwen3-0.6b, qwen3-1.7b, qwen3-4b,
    /// qwen3-8b, gemma3-270m, gemma3-1b, qwen3-30b-a3b. The options below override it.
    #[arg(long)]
    shape: Option<String>,
    /// Width of the residual stream.
    #[arg(long)]
    hidden: Option<u64>,
    /// Transformer blocks.
    #[arg(long)]
    layers: Option<u64>,
    /// Query heads.
    #[arg(long)]
    heads: Option<u64>,
    /// Key/value heads (default: --heads).
    #[arg(long)]
    kv_heads: Option<u64>,
    /// Per-head width (default: --hidden / --heads).
    #[arg(long)]
    head_dim: Option<u64>,
    /// Feed-forward width.
    #[arg(long)]
    ffn: Option<u64>,
    /// Vocabulary size.
    #[arg(long)]
    vocab: Option<u64>,
    /// Experts per layer (qwen3moe).
    #[arg(long)]
    experts: Option<u64>,
    /// Experts used per token (qwen3moe).
    #[arg(long)]
    experts_used: Option<u64>,
    /// Feed-forward width of one expert (qwen3moe).
    #[arg(long)]
    expert_ffn: Option<u64>,
    /// Tie the output projection to the token embeddings (true or false).
    #[arg(long, value_name = "BOOL")]
    tied: Option<bool>,
    /// RoPE frequency base.
    #[arg(long)]
    rope_base: Option<f32>,
    /// Context length written to the metadata.
    #[arg(long)]
    ctx: Option<u64>,
    /// File type, as llama-quantize names them: Q4_K_M, Q4_0, Q8_0, Q6_K, IQ4_XS, F16, ...
    #[arg(long = "type", default_value = "Q4_K_M")]
    file_type: String,
    /// Give every weight the file type's tensor type (llama-quantize --pure).
    #[arg(long)]
    pure: bool,
    /// Seed of the random weights: the same seed writes the same file.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Standard deviation of the projection weights.
    #[arg(long, default_value_t = Scales::default().proj)]
    std: f32,
    /// Standard deviation of the token embeddings (and untied output).
    #[arg(long, default_value_t = Scales::default().embd)]
    embd_std: f32,
    /// Skew of the experts' popularity (MoE shapes). 0 gives every expert the same share of
    /// tokens; above 0 each layer has its own few popular experts and a thin tail, like trained
    /// routers (only the router weights change). 1 is the suggested value: the top 10% of
    /// qwen3-30b-a3b's experts then take about 70% of the routing hits. The file records it as
    /// hearth.synth.router_skew.
    #[arg(long, value_name = "S", default_value_t = 0.0)]
    router_skew: f32,
    /// Worker threads (default: all cores).
    #[arg(short, long)]
    threads: Option<usize>,
}

/// Runs `hearth synth`.
pub fn run(args: Args) -> Result<()> {
    let Some(ftype) = FileType::from_name(&args.file_type) else {
        bail!(
            "unknown --type {:?}; choose one of {}",
            args.file_type,
            FileType::names().join(", ")
        );
    };
    let (shape, label) = shape_of(&args)?;
    let options = SynthOptions {
        ftype,
        pure: args.pure,
        seed: args.seed,
        scales: Scales {
            proj: args.std,
            embd: args.embd_std,
            ..Scales::default()
        },
        router_skew: args.router_skew,
    };
    let model = SynthModel::new(shape, &label, &options)?;
    let skew = if args.router_skew > 0.0 {
        format!(", router skew {}", args.router_skew)
    } else {
        String::new()
    };
    super::output::set_threads(args.threads);
    let start = Instant::now();
    let size = super::output::write_atomically(&args.output, |tmp| write_model(tmp, &model))?;
    eprintln!(
        "wrote {} (synthetic {label}, {}, {} parameters, {}{skew}) in {:.1} s",
        args.output.display(),
        ftype.name(),
        count(model.n_params()),
        super::human_bytes(size),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `1_235_814_400` -> `1.24 B`.
fn count(n: u64) -> String {
    match n {
        0..=999_999 => format!("{:.1} K", n as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} M", n as f64 / 1e6),
        _ => format!("{:.2} B", n as f64 / 1e9),
    }
}

/// The shape the arguments ask for, and its label for `general.name`.
fn shape_of(args: &Args) -> Result<(SynthShape, String)> {
    let arch = match &args.arch {
        Some(name) => Some(SynthArch::from_name(name).with_context(|| {
            format!(
                "unknown --arch {name:?}; choose one of {}",
                SynthArch::names().join(", ")
            )
        })?),
        None => None,
    };
    let (mut shape, label) = match &args.shape {
        Some(name) => named_shape(name, arch)?,
        None => custom_shape(args, arch)?,
    };
    let set = |field: &mut u64, value: Option<u64>| {
        if let Some(v) = value {
            *field = v;
        }
    };
    set(&mut shape.hidden, args.hidden);
    set(&mut shape.layers, args.layers);
    set(&mut shape.heads, args.heads);
    set(&mut shape.kv_heads, args.kv_heads);
    set(&mut shape.head_dim, args.head_dim);
    set(&mut shape.ffn, args.ffn);
    set(&mut shape.vocab, args.vocab);
    set(&mut shape.experts, args.experts);
    set(&mut shape.experts_used, args.experts_used);
    set(&mut shape.expert_ffn, args.expert_ffn);
    set(&mut shape.context, args.ctx);
    shape.tied = args.tied.unwrap_or(shape.tied);
    shape.rope_base = args.rope_base.unwrap_or(shape.rope_base);
    Ok((shape, label))
}

fn named_shape(name: &str, arch: Option<SynthArch>) -> Result<(SynthShape, String)> {
    let Some(shape) = SynthShape::named(name) else {
        bail!(
            "unknown --shape {name:?}; choose one of {}, or give --arch and --hidden --layers --heads --ffn --vocab",
            SynthShape::names().join(", ")
        );
    };
    if let Some(arch) = arch.filter(|&a| a != shape.arch) {
        bail!(
            "--shape {name} is a {} model, not {}; drop --arch or pick another shape",
            shape.arch.name(),
            arch.name()
        );
    }
    Ok((shape, name.to_ascii_lowercase()))
}

/// A shape from `--arch` and the dimensions; `shape_of` applies them after.
fn custom_shape(args: &Args, arch: Option<SynthArch>) -> Result<(SynthShape, String)> {
    let Some(arch) = arch else {
        bail!("pass --shape NAME, or --arch with --hidden --layers --heads --ffn --vocab");
    };
    let required = [
        ("--hidden", args.hidden),
        ("--layers", args.layers),
        ("--heads", args.heads),
        ("--ffn", args.ffn),
        ("--vocab", args.vocab),
    ];
    let missing: Vec<&str> = required
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(n, _)| *n)
        .collect();
    if !missing.is_empty() {
        bail!(
            "a custom shape needs {} (or pass --shape NAME)",
            missing.join(" ")
        );
    }
    let [hidden, layers, heads, ffn, vocab] = required.map(|(_, v)| v.unwrap_or(0));
    let head_dim = match args.head_dim {
        Some(d) => d,
        None if heads > 0 && hidden % heads == 0 => hidden / heads,
        None => bail!("--hidden {hidden} does not split into {heads} heads; pass --head-dim"),
    };
    let kv_heads = args.kv_heads.unwrap_or(heads);
    let dims = [hidden, layers, heads, kv_heads, head_dim, ffn, vocab];
    let label = format!("{} h{hidden} l{layers}", arch.name());
    Ok((SynthShape::custom(arch, dims), label))
}

fn write_model(path: &Path, model: &SynthModel) -> Result<()> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let out = BufWriter::with_capacity(8 << 20, file);
    let mut writer = GgufWriter::new(out, &model.metadata, &model.specs())?;
    let bar = super::output::byte_progress(model.data_bytes());
    for (index, tensor) in model.tensors.iter().enumerate() {
        bar.set_message(tensor.name.clone());
        let rows_per_chunk = (CHUNK_VALUES / tensor.row_len()).max(1);
        let n_rows = tensor.n_rows();
        let mut start = 0;
        while start < n_rows {
            let end = (start + rows_per_chunk).min(n_rows);
            write_chunk(model, index, start..end, &mut writer, &bar)
                .with_context(|| format!("writing {}", tensor.name))?;
            start = end;
        }
    }
    writer.finish()?;
    bar.finish_and_clear();
    Ok(())
}

/// Makes `rows` of tensor `index` in parallel (in groups, a few per
/// thread) and writes them in order.
fn write_chunk<W: std::io::Write>(
    model: &SynthModel,
    index: usize,
    rows: Range<u64>,
    writer: &mut GgufWriter<W>,
    bar: &ProgressBar,
) -> Result<()> {
    let n = rows.end - rows.start;
    let per_group = n.div_ceil(4 * rayon::current_num_threads() as u64).max(1);
    let groups: Vec<Range<u64>> = (0..n.div_ceil(per_group))
        .map(|g| {
            let s = rows.start + g * per_group;
            s..(s + per_group).min(rows.end)
        })
        .collect();
    let parts: Vec<Vec<u8>> = groups
        .into_par_iter()
        .map(|range| -> Result<Vec<u8>> {
            let mut bytes = Vec::new();
            model.encode_rows(index, range, &mut bytes)?;
            Ok(bytes)
        })
        .collect::<Result<_>>()?;
    for part in parts {
        writer.write_data(&part)?;
        bar.inc(part.len() as u64);
    }
    Ok(())
}
