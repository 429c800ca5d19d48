//! `hearth quantize`: write a copy of a model with its weights in another
//! format, choosing each tensor's type as llama-quantize does.
//!
//! The quantizers are `hearth::quant::reference`'s, which give the bytes
//! llama.cpp's own (no importance matrix) give: a model quantized here and one
//! quantized by llama-quantize from the same source are the same file.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use hearth::gguf::{GgufModel, GgufWriter, MmapSource, TensorInfo, TensorSpec, Value};
use hearth::model::ModelConfig;
use hearth::quant::recipe::{self, FileType, ModelShape, TensorRef};
use hearth::quant::{reference, GgmlType};
use rayon::prelude::*;

/// ggml's `GGML_QNT_VERSION`, written to `general.quantization_version`.
const QUANTIZATION_VERSION: u32 = 2;

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

/// One output tensor: where its data comes from and what it becomes.
struct Job<'a> {
    src: &'a TensorInfo,
    to: GgmlType,
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
    super::output::set_threads(args.threads);
    let (model, sources) = super::open_model(&args.input)?;
    let jobs = plan_jobs(&model, ftype, args.pure)?;
    let mut metadata = model.metadata().clone();
    // As gguf_set_val does: a key that is set again moves to the end.
    for (key, value) in [
        ("general.quantization_version", QUANTIZATION_VERSION),
        ("general.file_type", ftype.id()),
    ] {
        metadata.remove(key);
        metadata.set(key, Value::U32(value));
    }
    for key in ["split.no", "split.count", "split.tensors.count"] {
        metadata.remove(key);
    }
    let specs: Vec<TensorSpec> = jobs
        .iter()
        .map(|j| TensorSpec {
            name: j.src.name.clone(),
            shape: j.src.shape.clone(),
            ty: j.to,
        })
        .collect();

    let size = super::output::write_atomically(&args.output, |tmp| {
        write_model(tmp, &metadata, &specs, &jobs, &sources)
    })?;
    eprintln!(
        "wrote {} ({}, {})",
        args.output.display(),
        ftype.name(),
        super::human_bytes(size)
    );
    Ok(())
}

/// The output tensors in llama-quantize's order, each with its new type.
fn plan_jobs(model: &GgufModel, ftype: FileType, pure: bool) -> Result<Vec<Job<'_>>> {
    let cfg = ModelConfig::from_metadata(model.metadata())
        .context("cannot read the model's shapes, which the quantization recipe needs")?;
    let shape = ModelShape {
        n_layer: cfg.n_layer,
        n_expert: cfg.n_expert,
        n_gqa: cfg.n_head / cfg.n_head_kv.max(1),
    };
    let names: Vec<&str> = model.tensors.iter().map(|t| t.name.as_str()).collect();
    let order = recipe::quantize_order(&names);
    let refs: Vec<TensorRef<'_>> = order
        .iter()
        .map(|&i| {
            let t = &model.tensors[i];
            TensorRef {
                name: &t.name,
                shape: &t.shape,
                ty: t.ty,
            }
        })
        .collect();
    let types = recipe::plan(ftype, pure, shape, &refs);
    let mut jobs = Vec::with_capacity(order.len());
    for (&i, to) in order.iter().zip(types) {
        let src = &model.tensors[i];
        if src.ty != to && !reference::SUPPORTED.contains(&src.ty) {
            bail!(
                "tensor {} is {}, which hearth cannot read; convert it to F16 or F32 first",
                src.name,
                src.ty
            );
        }
        jobs.push(Job { src, to });
    }
    Ok(jobs)
}

fn write_model(
    path: &Path,
    metadata: &hearth::gguf::Metadata,
    specs: &[TensorSpec],
    jobs: &[Job<'_>],
    sources: &[MmapSource],
) -> Result<()> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut writer = GgufWriter::new(BufWriter::new(file), metadata, specs)?;
    let total: u64 = jobs.iter().map(|j| j.src.size).sum();
    let bar = super::output::byte_progress(total);
    for job in jobs {
        bar.set_message(job.src.name.clone());
        let data = tensor_bytes(job.src, sources)?;
        if job.src.ty == job.to {
            writer.write_data(data)?;
        } else {
            let converted = convert(job.src, data, job.to)?;
            writer.write_data(&converted)?;
        }
        bar.inc(job.src.size);
    }
    writer.finish()?;
    bar.finish_and_clear();
    Ok(())
}

fn tensor_bytes<'a>(t: &TensorInfo, sources: &'a [MmapSource]) -> Result<&'a [u8]> {
    use hearth::gguf::ByteSource;
    let bytes = sources
        .get(t.split)
        .and_then(|s| s.as_slice())
        .context("the model's file is not memory-mapped")?;
    let start = usize::try_from(t.offset)?;
    let end = start + usize::try_from(t.size)?;
    bytes
        .get(start..end)
        .with_context(|| format!("tensor {} lies outside its file", t.name))
}

/// Re-encodes a tensor row by row (rows in parallel): dequantize, quantize.
fn convert(t: &TensorInfo, data: &[u8], to: GgmlType) -> Result<Vec<u8>> {
    let row_len = usize::try_from(t.shape[0])?;
    let in_row = usize::try_from(t.ty.bytes_for(t.shape[0]).context("row size")?)?;
    let out_row = usize::try_from(to.bytes_for(t.shape[0]).with_context(|| {
        format!(
            "{}: rows of {} do not split into {to} blocks",
            t.name, row_len
        )
    })?)?;
    let rows: Vec<Vec<u8>> = data
        .par_chunks(in_row)
        .map(|row| -> Result<Vec<u8>> {
            let mut f32s = vec![0.0f32; row_len];
            reference::dequantize(t.ty, row, &mut f32s)?;
            let mut out = Vec::with_capacity(out_row);
            reference::quantize(to, &f32s, &mut out)?;
            Ok(out)
        })
        .collect::<Result<_>>()
        .with_context(|| format!("converting {} from {} to {to}", t.name, t.ty))?;
    Ok(rows.concat())
}
