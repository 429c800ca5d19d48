//! `hearth info`: what a model is, how it is stored, and what it needs to run.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use hearth::gguf::GgufModel;
use hearth::graph::{KvCacheConfig, KvType};
use hearth::kv::DEFAULT_BLOCK_SIZE;
use hearth::model::offload::OffloadPlan;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::LoadOptions;
use hearth::model::ModelConfig;
use hearth::moe::ExpertPlacement;
use hearth::quant::GgmlType;
use serde_json::json;

use super::human_bytes;

/// Arguments of `hearth info`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model (the first file of a split model).
    #[arg(required_unless_present_any = ["platform", "tune"])]
    model: Option<PathBuf>,
    /// Describe this machine instead of a model: the CPU's instruction-set
    /// tiers, cores, memory and read bandwidth, each GPU adapter or CUDA
    /// device with its limits and features, and the defaults chosen from
    /// them with the reason for each (with `--json`, one JSON object).
    #[arg(long, conflicts_with_all = ["plan", "metadata", "ctx"])]
    platform: bool,
    /// List the per-device kernel choices stored for this machine and
    /// build (`hearth tune` measures them), and how many records of other
    /// devices or builds the store ignores.
    #[arg(long, conflicts_with_all = ["platform", "plan", "metadata", "ctx", "json"])]
    tune: bool,
    /// Where the tune store is (as `hearth run --tune-dir`).
    #[command(flatten)]
    tune_dir: super::tune::TuneArgs,
    /// Context length for the memory estimate (default: the model's trained length, at most 4096).
    #[arg(long)]
    ctx: Option<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Also list every metadata key (long arrays abbreviated).
    #[arg(long)]
    metadata: bool,
    /// Print the load plan on `--backend`: what goes on the device, what
    /// stays in host memory, and why (with `--gpu-mem`, `--cpu-moe`, ...).
    #[arg(long)]
    plan: bool,
    /// The backend of `--plan` (as `hearth run --backend`).
    #[arg(long, default_value = "auto", value_parser = super::backend::parse_backend)]
    backend: String,
    /// Where the weights live (as `hearth run`'s).
    #[command(flatten)]
    place: super::load::PlacementArgs,
}

/// Count and bytes of the tensors of one type.
#[derive(Default)]
struct TypeStats {
    count: usize,
    bytes: u64,
    elems: u64,
}

/// Runs `hearth info`.
pub fn run(args: Args) -> Result<()> {
    if args.tune {
        return super::tune::print_stored(&args.tune_dir);
    }
    let Some(path) = args.model.clone().filter(|_| !args.platform) else {
        return super::platform::print(args.json);
    };
    let (file, _sources) = super::open_model(&path)?;
    let file_bytes: u64 = file.splits.iter().map(|s| s.file_size).sum();
    let version = file.splits.first().map_or(0, |s| s.version);
    let cfg = ModelConfig::from_metadata(file.metadata())?;
    let tokenizer = Tokenizer::from_metadata(file.metadata())
        .map(|t| format!("{:?}", t.kind()))
        .unwrap_or_else(|e| format!("unavailable ({e})"));
    let histogram = type_histogram(&file);
    let weight_bytes: u64 = histogram.values().map(|s| s.bytes).sum();
    let params: u64 = histogram.values().map(|s| s.elems).sum();
    let ctx = args.ctx.unwrap_or(cfg.n_ctx_train.min(4096));
    let kv_bytes = cfg.kv_cache_bytes(ctx, 2);
    // Activations for one token plus the logits row; small next to weights and KV.
    let scratch = (cfg.n_vocab as u64 + 8 * cfg.n_embd.max(cfg.n_ff) as u64) * 4;
    let total = weight_bytes + kv_bytes + scratch;

    if args.plan {
        return print_plan(&args, &file, &cfg, ctx);
    }
    if args.json {
        let types: BTreeMap<String, _> = histogram
            .iter()
            .map(|(ty, s)| {
                (
                    ty.to_string(),
                    json!({"tensors": s.count, "bytes": s.bytes}),
                )
            })
            .collect();
        let out = json!({
            "file": path.display().to_string(),
            "gguf_version": version, "splits": file.splits.len(),
            "file_bytes": file_bytes,
            "architecture": cfg.arch,
            "name": cfg.name,
            "layers": cfg.n_layer, "embedding": cfg.n_embd, "heads": cfg.n_head,
            "kv_heads": cfg.n_head_kv, "head_dim": cfg.head_dim_k, "ffn": cfg.n_ff,
            "experts": cfg.n_expert, "experts_used": cfg.n_expert_used,
            "vocab": cfg.n_vocab, "context_length": cfg.n_ctx_train,
            "rope_base": cfg.rope_base, "sliding_window": cfg.sliding_window,
            "tokenizer": tokenizer, "parameters": params, "tensors": file.tensors.len(),
            "types": types,
            "memory": {"ctx": ctx, "weights": weight_bytes, "kv_cache_f16": kv_bytes, "total": total},
        });
        println!("{out}");
        return Ok(());
    }

    println!(
        "file          {} ({}, GGUF v{})",
        path.display(),
        human_bytes(file_bytes),
        version
    );
    println!("name          {}", cfg.name.as_deref().unwrap_or("-"));
    println!("architecture  {}", cfg.arch);
    println!(
        "parameters    {:.1} M in {} tensors",
        params as f64 / 1e6,
        file.tensors.len()
    );
    println!("layers        {}", cfg.n_layer);
    println!("embedding     {}", cfg.n_embd);
    println!(
        "heads         {} query, {} key/value, head dim {}",
        cfg.n_head, cfg.n_head_kv, cfg.head_dim_k
    );
    println!("ffn           {}", cfg.n_ff);
    if cfg.n_expert > 0 {
        println!(
            "experts       {} ({} per token)",
            cfg.n_expert, cfg.n_expert_used
        );
    }
    println!("vocab         {}", cfg.n_vocab);
    println!("context       {} (trained)", cfg.n_ctx_train);
    println!("rope base     {}", cfg.rope_base);
    if let Some(w) = cfg.sliding_window {
        println!("sliding win   {w}");
    }
    println!("tokenizer     {tokenizer}");
    println!();
    println!(
        "{:<8} {:>8} {:>12} {:>8}",
        "type", "tensors", "bytes", "share"
    );
    for (ty, s) in &histogram {
        let share = 100.0 * s.bytes as f64 / weight_bytes.max(1) as f64;
        println!(
            "{:<8} {:>8} {:>12} {:>7.1}%",
            ty.to_string(),
            s.count,
            human_bytes(s.bytes),
            share
        );
    }
    println!();
    println!("memory at context {ctx}:");
    println!("  weights          {:>12}", human_bytes(weight_bytes));
    println!("  KV cache (f16)   {:>12}", human_bytes(kv_bytes));
    println!("  scratch          {:>12}", human_bytes(scratch));
    println!("  total            {:>12}", human_bytes(total));
    if args.metadata {
        println!();
        for (key, value) in file.metadata().iter() {
            println!("{key:<44} {value}");
        }
    }
    Ok(())
}

fn type_histogram(file: &GgufModel) -> BTreeMap<GgmlType, TypeStats> {
    let mut histogram: BTreeMap<GgmlType, TypeStats> = BTreeMap::new();
    for t in &file.tensors {
        let s = histogram.entry(t.ty).or_default();
        s.count += 1;
        s.bytes += t.size;
        s.elems += t.shape.iter().product::<u64>();
    }
    histogram
}

/// `hearth info --plan`: the load plan on `args.backend` at context `ctx`.
fn print_plan(args: &Args, file: &GgufModel, cfg: &ModelConfig, ctx: usize) -> Result<()> {
    let opts = args.place.apply(LoadOptions::new(KvCacheConfig {
        num_blocks: ctx.div_ceil(DEFAULT_BLOCK_SIZE) + 1,
        block_size: DEFAULT_BLOCK_SIZE,
        dtype: KvType::F16,
    }));
    if args.place.tensor_parallel > 1 {
        return print_shards(args, file, cfg);
    }
    let (checked, device) =
        pollster::block_on(super::backend::check_on(&args.backend, 0, file, &opts))?;
    let m = &checked.memory;
    println!("load plan on {} ({device}), context {ctx}:", args.backend);
    println!(
        "  device: {} ({} weights, {} K/V cache, {} activations)",
        human_bytes(m.total()),
        human_bytes(m.weights),
        human_bytes(m.kv),
        human_bytes(m.activations)
    );
    let n_layer = cfg.n_layer;
    let host_blocks = checked.host_blocks;
    if host_blocks > 0 {
        println!(
            "  blocks 0-{} and the token embeddings on the CPU, in host memory",
            host_blocks - 1
        );
        if host_blocks < n_layer {
            println!(
                "  blocks {host_blocks}-{} and the output head on the device",
                n_layer - 1
            );
        } else {
            println!("  the output head alone on the device");
        }
    }
    if let Some(s) = &checked.stream {
        println!(
            "  every block's matrices in host memory ({}), streamed through two device sets of {} each step",
            human_bytes(s.streamed_bytes),
            human_bytes(s.set_bytes / 2)
        );
    }
    match &checked.offload {
        Some(plan) => print_experts(plan, cfg, host_blocks),
        None if host_blocks == 0 && checked.stream.is_none() => {
            println!("  every weight on the device")
        }
        None => {}
    }
    println!("  why: {}", checked.reason);
    Ok(())
}

/// `hearth info --plan --tensor-parallel N`: what each shard holds.
fn print_shards(args: &Args, file: &GgufModel, cfg: &ModelConfig) -> Result<()> {
    use hearth::model::shard::{ExpertSplit, ShardLayout};
    let n = args.place.tensor_parallel;
    let l = ShardLayout::new(cfg, n)?;
    let total: u64 = file.tensors.iter().map(|t| t.size).sum();
    println!(
        "load plan on {}: {n} tensor-parallel shards of {} weights",
        args.backend,
        human_bytes(total)
    );
    for i in 0..n {
        let (q, kv) = (l.heads(i), l.kv_heads(i));
        let copied = if l.n_head_kv < n { ", copied" } else { "" };
        let ffn = match l.experts {
            ExpertSplit::Whole => {
                let e = l.experts(i);
                format!("experts {}-{} of {}", e.start, e.end - 1, l.n_expert)
            }
            ExpertSplit::Units => format!(
                "{} of {} units of every expert",
                l.n_ff_expert / n,
                l.n_ff_expert
            ),
            ExpertSplit::None => format!("{} of {} FFN units", l.n_ff / n, l.n_ff),
        };
        println!(
            "  shard {i}: query heads {}-{}, K/V heads {}-{}{copied}, {ffn}, {} of weights",
            q.start,
            q.end - 1,
            kv.start,
            kv.end - 1,
            human_bytes(l.shard_bytes(file, cfg, i))
        );
    }
    if l.experts == ExpertSplit::Whole {
        println!(
            "  every shard routes every token and runs the experts it holds (expert parallel)"
        );
    }
    println!("  every shard: the norms, the token embeddings and the output head, whole");
    println!("  each block's attention and FFN outputs are summed over the shards (all-reduce)");
    Ok(())
}

/// The expert lines of `hearth info --plan`.
fn print_experts(plan: &OffloadPlan, cfg: &ModelConfig, host_blocks: usize) {
    let layers = |p: ExpertPlacement, pool: Option<usize>| -> Vec<usize> {
        plan.layers
            .iter()
            .filter(|l| l.placement == p && pool.is_none_or(|i| l.pool == i))
            .map(|l| l.layer)
            .collect()
    };
    let host = layers(ExpertPlacement::Host, None);
    if !host.is_empty() {
        println!(
            "  routed experts in host memory, computed there: layers {}",
            ranges(&host)
        );
    }
    for (i, pool) in plan.pools.iter().enumerate() {
        println!(
            "  routed experts in host memory, {} device slots ({:?}) shared by layers {}",
            pool.slots,
            pool.tys,
            ranges(&layers(ExpertPlacement::Slots, Some(i)))
        );
    }
    let resident = cfg.n_layer - host_blocks - plan.layers.len();
    if resident > 0 && cfg.n_expert > 0 {
        println!("  {resident} layers keep their experts on the device");
    }
    println!(
        "  host memory for experts: {}; device slots: {}",
        human_bytes(plan.offloaded_bytes),
        human_bytes(plan.pool_bytes)
    );
}

/// `0-3, 7, 9-11` of sorted layer indices.
fn ranges(layers: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < layers.len() {
        let mut j = i;
        while j + 1 < layers.len() && layers[j + 1] == layers[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            layers[i].to_string()
        } else {
            format!("{}-{}", layers[i], layers[j])
        });
        i = j + 1;
    }
    out.join(", ")
}
