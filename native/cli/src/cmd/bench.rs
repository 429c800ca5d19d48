//! `hearth bench`: prefill and decode speed, measured as llama-bench measures
//! them, so the two can be run side by side on the same files.
//!
//! - `ppN` (prefill): N random token ids from position 0, one forward pass per
//!   `--batch` tokens (512 by default: the engine's step size and llama-bench's
//!   micro-batch, so pp512 is one pass), logits of the last token only.
//! - `tgN` (decode): N forward passes of one random token each, from an empty
//!   context (positions 0..N), logits of that token.
//!
//! Every pass ends as a greedy engine step does: the last logits row of
//! each sequence reduced to its argmax where it was computed (on a GPU, a
//! 4-byte readback per sequence).
//! - `tgNxS` (batched decode, `--seqs S`): N forward passes of S sequences
//!   together, one new token each (the engine's batched decode: one pass,
//!   one matmul per weight for all S rows); tokens/s counts all S.
//!
//! Each test runs once untimed (warm-up: the whole prompt, or one decode
//! step, as llama-bench does), then `-r` timed repetitions; the
//! figure is the mean and sample standard deviation of the per-repetition
//! tokens/s. The K/V cache is not cleared between repetitions: every one
//! writes positions from 0 again, and attention reads only what it wrote.
//! Threads are fixed when a model is loaded, so the model is loaded once per
//! thread count. `--membw` measures the machine's memory read bandwidth, the
//! ceiling of decode's effective GB/s.

pub mod membw;
mod report;

use hearth::graph::{KvCacheConfig, KvType};
use std::hint::black_box;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use hearth::backend::cpu::kernels::KernelTable;
use hearth::gguf::{GgufModel, MmapSource};
use hearth::kv::{BlockId, Slot, DEFAULT_BLOCK_SIZE};
use hearth::model::{Batch, ForwardModel, LoadOptions, LogitsWanted, SeqInput};
use hearth::trace::{self, Track};
use indicatif::{ProgressBar, ProgressStyle};

use hearth::model::AnyModel;

use super::backend::load_on;
use report::{ModelInfo, Reporter, Row};

/// Arguments of `hearth bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A GGUF model to measure (repeatable: `-m A -m B`).
    #[arg(short = 'm', long = "model", required_unless_present = "membw")]
    models: Vec<PathBuf>,
    /// Prompt lengths of the prefill tests `ppN`, comma separated (0: none).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Token counts of the decode tests `tgN`, comma separated (0: none).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    n_gen: Vec<usize>,
    /// Thread counts to measure, comma separated (default: all cores).
    #[arg(short = 't', long, value_delimiter = ',')]
    threads: Vec<usize>,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// Most prompt tokens per forward pass of a prefill test; longer prompts
    /// run in chunks of this size.
    #[arg(short = 'b', long = "batch", default_value_t = 512)]
    batch: usize,
    /// Where to run the models (as `hearth run --backend`).
    #[arg(long, default_value = "auto", value_parser = super::backend::parse_backend)]
    backend: String,
    /// One JSON object per result line instead of the table.
    #[arg(long)]
    json: bool,
    /// Skip the untimed run before each test's repetitions.
    #[arg(long)]
    no_warmup: bool,
    /// Also measure this machine's memory read bandwidth at each thread count
    /// (first; alone when no model is given).
    #[arg(long)]
    membw: bool,
    /// With --membw: MiB of the buffer read (far more than the last-level cache).
    #[arg(long, default_value_t = 2048)]
    membw_mib: usize,
    /// Seed of the random token ids.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Concurrent sequences of the decode tests, comma separated: `--seqs
    /// 1,4` measures tgN at batch 1 and tgNx4 (aggregate tokens/s of 4
    /// sequences decoding together).
    #[arg(long = "seqs", value_delimiter = ',', default_value = "1")]
    seqs: Vec<usize>,
    /// Where the weights live (as `hearth run`'s).
    #[command(flatten)]
    place: super::load::PlacementArgs,
}

/// One test: prefill or decode of `n` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Test {
    /// Prefill of a prompt of `n` tokens.
    Prompt(usize),
    /// `n` decode steps of `seqs` sequences together.
    Gen(usize, usize),
}

impl Test {
    /// llama-bench's name: `pp512`, `tg128`.
    fn name(self) -> String {
        match self {
            Test::Prompt(n) => format!("pp{n}"),
            Test::Gen(n, 1) => format!("tg{n}"),
            Test::Gen(n, s) => format!("tg{n}x{s}"),
        }
    }

    /// The untimed run before the repetitions, as llama-bench's: the whole
    /// prompt for prefill, one step for decode (enough to touch every weight).
    fn warm_up(self) -> Test {
        match self {
            Test::Prompt(n) => Test::Prompt(n),
            Test::Gen(_, s) => Test::Gen(1, s),
        }
    }

    /// Tokens the test computes.
    fn tokens(self) -> usize {
        match self {
            Test::Prompt(n) => n,
            Test::Gen(n, s) => n * s,
        }
    }

    /// Positions each sequence reaches.
    fn positions(self) -> usize {
        match self {
            Test::Prompt(n) | Test::Gen(n, _) => n,
        }
    }

    /// Sequences run together.
    fn seqs(self) -> usize {
        match self {
            Test::Prompt(_) => 1,
            Test::Gen(_, s) => s,
        }
    }
}

/// Runs `hearth bench`.
pub fn run(args: Args) -> Result<()> {
    check_args(&args)?;
    super::backend::check_backend(&args.backend)?;
    let threads = thread_counts(&args);
    let tests = tests_of(&args);
    let names: Vec<String> = args.models.iter().map(|m| model_name(m)).collect();
    let mut reporter = Reporter::new(args.json, &names);
    if args.membw {
        for &t in &threads {
            let result = membw::measure(args.membw_mib << 20, t, args.reps)?;
            reporter.membw(&result)?;
        }
    }
    if args.models.is_empty() {
        return reporter.finish();
    }
    bench_models(&args, &tests, &threads, &mut reporter)?;
    reporter.finish()
}

/// Rejects arguments that cannot give a measurement, saying what to pass.
fn check_args(args: &Args) -> Result<()> {
    if args.reps == 0 {
        bail!("-r 0 asks for no repetitions; give -r N with N >= 1");
    }
    if args.batch == 0 {
        bail!("-b 0 gives no tokens per forward pass; give -b N with N >= 1");
    }
    if args.seqs.is_empty() || args.seqs.contains(&0) {
        bail!("--seqs takes sequence counts >= 1 (1: decode at batch 1)");
    }
    if args.threads.contains(&0) {
        bail!("-t takes thread counts >= 1 (leave -t out for all cores)");
    }
    if args.membw && args.membw_mib == 0 {
        bail!("--membw-mib 0 reads nothing; give a size in MiB, far above the last-level cache");
    }
    let any_test = args.n_prompt.iter().chain(&args.n_gen).any(|&n| n > 0);
    if !args.models.is_empty() && !any_test {
        bail!("-p 0 and -n 0 leave no test to run; give -p N or -n N with N >= 1");
    }
    Ok(())
}

/// The thread counts to measure: `-t`, or all cores.
fn thread_counts(args: &Args) -> Vec<usize> {
    if args.threads.is_empty() {
        vec![std::thread::available_parallelism().map_or(1, |p| p.get())]
    } else {
        args.threads.clone()
    }
}

/// The tests, prefill first then decode, in the order given.
fn tests_of(args: &Args) -> Vec<Test> {
    let pp = args
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| Test::Prompt(n));
    let tg = args
        .n_gen
        .iter()
        .filter(|&&n| n > 0)
        .flat_map(|&n| args.seqs.iter().map(move |&s| Test::Gen(n, s)));
    pp.chain(tg).collect()
}

/// A model's name in the results: its file name without `.gguf`.
fn model_name(path: &Path) -> String {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    name.strip_suffix(".gguf").unwrap_or(&name).to_string()
}

/// Measures every test of every model at every thread count on
/// `args.backend`, reporting each result as it comes.
fn bench_models(
    args: &Args,
    tests: &[Test],
    threads: &[usize],
    reporter: &mut Reporter,
) -> Result<()> {
    let ctx = KvSpan {
        positions: tests
            .iter()
            .map(|t| t.positions())
            .max()
            .unwrap_or(1)
            .max(2),
        seqs: tests.iter().map(|t| t.seqs()).max().unwrap_or(1),
    };
    for path in &args.models {
        let (gguf, sources) = super::open_model(path)?;
        let info = ModelInfo::new(model_name(path), &gguf);
        for &t in threads {
            let loading = trace::span(Track::Bench, "load").arg("model", info.name.as_str());
            let mut model = load(args, &gguf, &sources, ctx, t)
                .with_context(|| format!("cannot load {}", path.display()))?;
            drop(loading);
            let device = model.device_name();
            for &test in tests {
                let before = model.expert_stats();
                let samples = measure(&mut model, test, args, &info.name, t, &ctx)
                    .with_context(|| format!("{} on {}", test.name(), path.display()))?;
                if let (Some(a), Some(b)) = (before, model.expert_stats()) {
                    eprintln!("{} {}: {}", info.name, test.name(), b.since(&a));
                }
                reporter.row(&Row {
                    model: &info,
                    backend: &args.backend,
                    isa: isa_of(&args.backend, &device),
                    device: &device,
                    threads: t,
                    test: test.name(),
                    decode: matches!(test, Test::Gen(..)),
                    seqs: test.seqs(),
                    samples_tps: samples,
                })?;
            }
        }
    }
    Ok(())
}

/// The instruction set the CPU kernels use (`HEARTH_CPU_ISA` honoured), or
/// the device name on other backends.
fn isa_of(backend: &str, device: &str) -> String {
    if backend == "cpu" {
        let isa = super::backend::cpu_options(1).isa;
        KernelTable::for_isa_or_best(isa).isa().name().to_string()
    } else {
        device.to_string()
    }
}

/// The K/V cache the tests need: `seqs` sequences of up to `positions`.
#[derive(Debug, Clone, Copy)]
struct KvSpan {
    positions: usize,
    seqs: usize,
}

impl KvSpan {
    /// Cache blocks of one sequence; sequence `i` owns blocks
    /// `1 + i * blocks_per_seq ..` (block 0 is the null block).
    fn blocks_per_seq(&self) -> usize {
        self.positions.div_ceil(DEFAULT_BLOCK_SIZE)
    }
}

/// Loads `gguf` onto the backend named `backend` with a K/V cache for
/// `ctx` (f16, as llama-bench's default).
fn load(
    args: &Args,
    gguf: &GgufModel,
    sources: &[MmapSource],
    ctx: KvSpan,
    threads: usize,
) -> Result<AnyModel> {
    let backend = &args.backend;
    let opts = args.place.apply(LoadOptions::new(KvCacheConfig {
        num_blocks: ctx.seqs * ctx.blocks_per_seq() + 1,
        block_size: DEFAULT_BLOCK_SIZE,
        dtype: KvType::F16,
    }));
    pollster::block_on(load_on(
        backend,
        threads,
        args.place.tensor_parallel,
        None,
        gguf,
        sources,
        &opts,
        &mut |_| {},
    ))
}

/// Runs `test` once untimed (unless `--no-warmup`) and `args.reps` times
/// timed; returns each repetition's tokens/s.
fn measure<M: ForwardModel>(
    model: &mut M,
    test: Test,
    args: &Args,
    name: &str,
    threads: usize,
    ctx: &KvSpan,
) -> Result<Vec<f64>> {
    let n_vocab = model.config().n_vocab.max(1);
    let mut rng = Rng(args.seed ^ 0x9e37_79b9_7f4a_7c15);
    let bar = progress(args.reps, &format!("{name} {} t={threads}", test.name()));
    let _test = trace::span(Track::Bench, test.name())
        .arg("model", name)
        .arg("threads", threads)
        .arg("reps", args.reps);
    if !args.no_warmup {
        let _warm = trace::span(Track::Bench, "warm-up");
        bar.set_message(format!("{name} {} t={threads} warm-up", test.name()));
        run_test(model, test.warm_up(), args.batch, ctx, &mut || {
            rng.token(n_vocab)
        })?;
        bar.set_message(format!("{name} {} t={threads}", test.name()));
    }
    let mut samples = Vec::with_capacity(args.reps);
    for rep in 0..args.reps {
        let mut span = trace::span(Track::Bench, "rep").arg("rep", rep);
        let start = Instant::now();
        run_test(model, test, args.batch, ctx, &mut || rng.token(n_vocab))?;
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        span.set("tokens_per_s", test.tokens() as f64 / secs);
        drop(span);
        samples.push(test.tokens() as f64 / secs);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(samples)
}

/// One run of `test`: the forward passes it is made of.
fn run_test<M: ForwardModel>(
    model: &mut M,
    test: Test,
    batch: usize,
    ctx: &KvSpan,
    token: &mut dyn FnMut() -> u32,
) -> Result<()> {
    let per_seq = ctx.blocks_per_seq();
    match test {
        Test::Prompt(n) => {
            let prompt: Vec<u32> = (0..n).map(|_| token()).collect();
            for (i, chunk) in prompt.chunks(batch).enumerate() {
                forward(model, &[chunk], i * batch, per_seq)?;
            }
        }
        Test::Gen(n, seqs) => {
            for pos in 0..n {
                let toks: Vec<[u32; 1]> = (0..seqs).map(|_| [token()]).collect();
                let inputs: Vec<&[u32]> = toks.iter().map(|t| &t[..]).collect();
                forward(model, &inputs, pos, per_seq)?;
            }
        }
    }
    Ok(())
}

/// One forward pass of `tokens.len()` sequences, sequence `i` taking
/// `tokens[i]` at positions `start..` through blocks `1 + i * per_seq ..`
/// (block 0 is the null block). Each sequence's last row is reduced to its
/// argmax where the logits are, as a greedy engine step does (a GPU reads
/// back one u32 per sequence), and handed to nobody.
fn forward<M: ForwardModel>(
    model: &mut M,
    tokens: &[&[u32]],
    start: usize,
    per_seq: usize,
) -> Result<()> {
    let bs = DEFAULT_BLOCK_SIZE;
    let end = start + tokens.first().map_or(0, |t| t.len());
    let tables: Vec<Vec<BlockId>> = (0..tokens.len())
        .map(|i| {
            (0..end.div_ceil(bs))
                .map(|b| BlockId((1 + i * per_seq + b) as u32))
                .collect()
        })
        .collect();
    let slots: Vec<Vec<Slot>> = tables
        .iter()
        .map(|table| {
            (start..end)
                .map(|p| Slot {
                    block: table[p / bs],
                    offset: (p % bs) as u32,
                })
                .collect()
        })
        .collect();
    let seqs: Vec<SeqInput<'_>> = tokens
        .iter()
        .zip(tables.iter().zip(&slots))
        .map(|(t, (table, slots))| SeqInput {
            tokens: t,
            start,
            slots,
            block_table: table,
            logits: LogitsWanted::Last,
        })
        .collect();
    let picks = pollster::block_on(model.forward_argmax(&Batch { seqs: &seqs }))?;
    black_box(picks);
    Ok(())
}

/// A bar over a test's repetitions on stderr, hidden when stderr is not a
/// terminal.
fn progress(reps: usize, message: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(reps as u64);
    if let Ok(style) = ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} ({elapsed})") {
        bar.set_style(style);
    }
    bar.set_message(message.to_string());
    bar.tick();
    bar
}

/// xorshift64*: token ids that are random enough and the same for a seed.
struct Rng(u64);

impl Rng {
    /// A token id below `n_vocab`.
    fn token(&mut self, n_vocab: usize) -> u32 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as u32 % n_vocab as u32
    }
}
