//! What `run`, `chat` and `logits` share: model arguments, sampling
//! arguments, and loading a model into an engine with a progress bar.

use hearth::graph::KvType;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use hearth::engine::{Engine, EngineConfig};
use hearth::model::chat::ChatTemplate;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::ModelConfig;
use hearth::sample::SamplingParams;
use indicatif::{ProgressBar, ProgressStyle};

use hearth::model::offload::ExpertOffload;
use hearth::model::{AnyModel, LoadOptions, LoadProgress};
use hearth::moe::Policy;

use super::backend;

/// Which model to load and where to run it.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// The GGUF model file (any split of a split model).
    #[arg(short, long)]
    pub model: PathBuf,
    /// Context length: most tokens of prompt plus output (0: the model's
    /// trained length, at most 4096; `logits`: the number of tokens).
    #[arg(long, default_value_t = 0)]
    pub ctx: usize,
    /// Worker threads (0: the platform's default, one per logical core;
    /// `hearth info --platform` shows it).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run the model: `cpu`, `webgpu` (the GPU through Vulkan,
    /// Metal or DX12; `HEARTH_GPU_ADAPTER` picks an adapter by name), `cuda`
    /// (NVIDIA GPUs, in builds with `--features cuda`), or `auto`: chosen from
    /// the machine (`hearth info --platform` says what and why).
    #[arg(long, default_value = "auto", value_parser = backend::parse_backend)]
    pub backend: String,
    /// Where the weights live: device, host, or both.
    #[command(flatten)]
    pub place: PlacementArgs,
    /// Where per-device kernel choices are stored.
    #[command(flatten)]
    pub tune: super::tune::TuneArgs,
}

/// Where the weights live when the model is larger than the device
/// (llama.cpp's names where it has them).
#[derive(clap::Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Device memory the model may use, in bytes with an optional K, M or G
    /// suffix (`8G`). When the model is larger, an MoE model's routed
    /// experts stay in host memory and the expert cache keeps the ones in
    /// use in device slots, in what the rest of the model leaves of it;
    /// where even that is too much, or for a dense model, the last blocks
    /// that fit run on the device and the others on the CPU. Default: the
    /// device's free memory (CUDA) or `HEARTH_GPU_MEMORY` (WebGPU).
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_mem: Option<u64>,
    /// Run the last N blocks and the output head on the device and the
    /// blocks before on the CPU, the hidden state crossing once per step
    /// (llama.cpp's `-ngl N+1`, which counts the head as a layer).
    #[arg(long)]
    pub gpu_layers: Option<usize>,
    /// Keep every block's matrices in host memory and stream them through
    /// two device buffers per step, the next block's copy queued behind
    /// this one's work: the whole model crosses the bus every step, so
    /// this is for long prompts and big batches of a model too large for
    /// the device.
    #[arg(long, conflicts_with_all = ["gpu_layers", "cpu_moe", "n_cpu_moe"])]
    pub stream_layers: bool,
    /// Split every block across N devices (tensor parallelism): each
    /// holds its share of the attention heads and FFN units and of the K/V
    /// cache, and the shards' partial sums are added after each block's
    /// attention and FFN. CUDA: devices 0..N; on one device or the CPU the
    /// shards run side by side (for testing). 1: off.
    #[arg(long, default_value_t = 1, value_name = "N",
          conflicts_with_all = ["gpu_layers", "stream_layers", "cpu_moe", "n_cpu_moe", "gpu_mem"])]
    pub tensor_parallel: usize,
    /// Keep every MoE layer's routed experts in host memory and compute
    /// them there (llama.cpp's `--cpu-moe`).
    #[arg(long)]
    pub cpu_moe: bool,
    /// Keep the routed experts of the first N MoE layers in host memory and
    /// compute them there (llama.cpp's `--n-cpu-moe`).
    #[arg(long, default_value_t = 0)]
    pub n_cpu_moe: usize,
    /// Which expert a full pool of device slots gives up: `lru`, `lfu`, or
    /// `lrfu` (recency and frequency combined).
    #[arg(long, default_value = "lrfu")]
    pub moe_policy: Policy,
    /// A missing expert that at most N tokens of a step route to is
    /// computed on the host instead of copied into a slot (0: copy every
    /// miss a slot can take). 1 was faster than 0 in every test measured
    /// (Qwen3-30B-A3B shape, H100: decode 63 against 43 tokens/s).
    #[arg(long, default_value_t = 1)]
    pub moe_host_tokens: usize,
    /// Predict each layer's experts from the layer before and copy them
    /// ahead, for decode steps (off by default: on CUDA its copies still
    /// stall the host; it raised the hit rate from 93% to 97% but cut
    /// decode from 255 to 97 tokens/s on the 30B-A3B shape, docs/perf.md).
    #[arg(long)]
    pub moe_prefetch: bool,
}

impl PlacementArgs {
    /// `opts` with the placement these ask for.
    pub fn apply(&self, opts: LoadOptions) -> LoadOptions {
        LoadOptions {
            experts: self.offload(),
            gpu_layers: self.gpu_layers,
            stream_layers: self.stream_layers,
            ..opts
        }
    }

    /// The expert offload these ask for (`None`: every expert on the device,
    /// unless the device's budget is short).
    pub fn offload(&self) -> Option<ExpertOffload> {
        let host_layers = if self.cpu_moe {
            usize::MAX
        } else {
            self.n_cpu_moe
        };
        if self.gpu_mem.is_none() && host_layers == 0 {
            return None;
        }
        Some(ExpertOffload {
            // Without --gpu-mem the layers not on the host keep their
            // experts on the device.
            slot_bytes: u64::MAX,
            device_bytes: self.gpu_mem,
            host_layers,
            policy: self.moe_policy,
            host_tokens: self.moe_host_tokens,
            prefetch: self.moe_prefetch,
        })
    }
}

/// Bytes from `8G`, `512M`, `64K` or a plain count (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift): (&str, u32) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => {
                    return Err(format!(
                        "'{s}': give bytes with an optional K, M, G or T suffix"
                    ))
                }
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': give bytes with an optional K, M, G or T suffix (8G)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("'{s}' is not a size"));
    }
    Ok((v * (1u64 << shift) as f64) as u64)
}

/// Element type of the K/V cache.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvArg {
    /// Half precision.
    F16,
    /// Single precision.
    F32,
}

impl From<KvArg> for KvType {
    fn from(kv: KvArg) -> Self {
        match kv {
            KvArg::F16 => KvType::F16,
            KvArg::F32 => KvType::F32,
        }
    }
}

/// Sampling settings (llama.cpp's names and defaults).
#[derive(clap::Args, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy (argmax).
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens up to probability P (1: off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely (0: off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize repeated tokens (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Subtract this from the logit of every token already seen.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this times its count from the logit of a seen token.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock; printed in the summary).
    #[arg(long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler's parameters, with the seed chosen.
    pub fn params(&self) -> SamplingParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
            ..SamplingParams::default()
        }
    }
}

/// How a command wants its engine.
pub struct EngineWish<'a> {
    /// K/V element type (`None`: the platform's default for the backend).
    pub kv: Option<KvType>,
    /// A built-in chat template to use instead of the model's.
    pub chat_template: Option<&'a str>,
    /// Fail when no chat template can be had (else run without one).
    pub need_chat_template: bool,
    /// Show the load progress bar (when stderr is a terminal).
    pub progress: bool,
    /// Context length when `--ctx` is not given (`None`: the model's
    /// trained length, at most 4096).
    pub default_ctx: Option<usize>,
    /// Multiply weights with f32 activations (the CPU backend's exact-f32
    /// mode) instead of int8-quantized ones.
    pub exact_f32: bool,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Tokens the K/V pool holds over all sequences (0: `kv_contexts`
    /// full contexts).
    pub kv_tokens: usize,
    /// Full contexts the K/V pool holds when `kv_tokens` is 0 (>= 1).
    pub kv_contexts: usize,
    /// Most prompt tokens a step computes beside each four running decodes
    /// (0: the whole step budget).
    pub prefill_tokens_per_4_decodes: usize,
}

impl Default for EngineWish<'_> {
    /// One interactive user: the platform's K/V type, the model's template if it has one,
    /// a progress bar, four requests at most, a pool of one context.
    fn default() -> Self {
        EngineWish {
            kv: None,
            chat_template: None,
            need_chat_template: false,
            progress: true,
            default_ctx: None,
            exact_f32: false,
            max_num_seqs: 4,
            kv_tokens: 0,
            kv_contexts: 1,
            prefill_tokens_per_4_decodes: 0,
        }
    }
}

/// A loaded engine and how long loading took.
pub struct Loaded {
    /// The engine.
    pub engine: Engine<AnyModel>,
    /// Seconds from opening the file to a ready engine.
    pub load_s: f64,
    /// What the tune store gave or a probe measured, for stderr once the
    /// model runs (`tune: from store (cpu.isa avx512)`), if anything.
    pub tune: Option<String>,
}

/// Opens the model, checks it, loads its weights and builds the engine.
pub fn load_engine(args: &ModelArgs, wish: &EngineWish<'_>) -> Result<Loaded> {
    backend::check_backend(&args.backend)?;
    // What no option says comes from the platform (threads, K/V type,
    // the step's token budget).
    let defaults = super::platform::defaults_for(&args.backend);
    let threads = match args.threads {
        0 => defaults.threads.value,
        n => n,
    };
    let t0 = Instant::now();
    let (model, sources) = super::open_model(&args.model)?;
    let md = model.metadata();
    let mc = ModelConfig::from_metadata_supported(md)
        .with_context(|| format!("cannot run {}", args.model.display()))?;
    let tokenizer = Tokenizer::from_metadata(md)
        .with_context(|| format!("cannot build the tokenizer of {}", args.model.display()))?;
    let template = match ChatTemplate::from_metadata(md, wish.chat_template) {
        Ok(t) => Some(t),
        Err(e) if wish.need_chat_template || wish.chat_template.is_some() => return Err(e.into()),
        Err(_) => None,
    };
    let n_ctx = match (args.ctx, wish.default_ctx) {
        (0, Some(n)) => n,
        (0, None) => mc.n_ctx_train.min(4096),
        (n, _) => n,
    }
    .max(2);
    let config = EngineConfig {
        n_ctx,
        max_num_seqs: wish.max_num_seqs,
        kv_tokens: match wish.kv_tokens {
            0 => n_ctx * wish.kv_contexts.max(1),
            n => n,
        },
        max_num_batched_tokens: defaults.batch_tokens.value,
        prefill_tokens_per_4_decodes: wish.prefill_tokens_per_4_decodes,
        kv_type: wish.kv.unwrap_or(defaults.kv_type.value),
        ..EngineConfig::default()
    };
    let opts = args.place.apply(LoadOptions {
        exact_f32: wish.exact_f32,
        max_step_tokens: config.max_num_batched_tokens,
        ..LoadOptions::new(config.kv_cache_config())
    });
    let bar = progress_bar(wish.progress);
    let mut report = |p: &LoadProgress| {
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_done);
    };
    // The CPU kernel tier measured on this machine (stored, or probed now).
    let (cpu_isa, tune) = match args.backend.as_str() {
        "cpu" => super::tune::cpu_isa(&args.tune, &model, threads),
        _ => (None, None),
    };
    let loaded = pollster::block_on(backend::load_on(
        &args.backend,
        threads,
        args.place.tensor_parallel,
        cpu_isa,
        &model,
        &sources,
        &opts,
        &mut report,
    ));
    bar.finish_and_clear();
    let mut m = loaded.with_context(|| format!("cannot load {}", args.model.display()))?;
    // On WebGPU, the step's submit interval measured on this adapter.
    let tune = tune.or_else(|| super::tune_gpu::submit_every(&args.tune, &mut m));
    let engine = Engine::new(m, tokenizer, template, config)?;
    Ok(Loaded {
        engine,
        load_s: t0.elapsed().as_secs_f64(),
        tune,
    })
}

/// A byte progress bar on stderr, hidden when stderr is not a terminal or
/// `show` is false.
fn progress_bar(show: bool) -> ProgressBar {
    if !show || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    let style = ProgressStyle::with_template(
        "loading {bar:40.cyan/blue} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    );
    if let Ok(style) = style {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("8G"), Ok(8 << 30));
        assert_eq!(parse_bytes("512m"), Ok(512 << 20));
        assert_eq!(parse_bytes("1.5K"), Ok(1536));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        for bad in ["", "G", "8Q", "-1G", "lots"] {
            assert!(parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
