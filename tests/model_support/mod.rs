//! Shared helpers of the model tests: loading, one-sequence runs, metrics.
#![allow(dead_code)]

pub mod moe_cache;
pub mod rng;

use hearth::graph::{KvCacheConfig, KvType};
use std::path::{Path, PathBuf};

use hearth::backend::cpu::{CpuBackend, CpuOptions};
use hearth::gguf::open_model;
use hearth::kv::{BlockId, Slot};
use hearth::model::quantize::{quantize_model, QuantPlan};
use hearth::model::{load_model, Batch, ForwardModel, LoadOptions, LogitsWanted, Model, SeqInput};
use hearth::quant::recipe::FileType;

pub const BLOCK: usize = 16;

/// A model on the CPU backend.
pub type CpuModel = Model<CpuBackend>;

/// The forward pass of a model whose backend never waits (the CPU), run to
/// its end on the calling thread.
pub trait ForwardSync {
    /// [`Model::run`], blocking.
    fn forward_sync(&mut self, batch: &Batch<'_>) -> hearth::Result<Vec<f32>>;
}

impl<M: ForwardModel> ForwardSync for M {
    fn forward_sync(&mut self, batch: &Batch<'_>) -> hearth::Result<Vec<f32>> {
        pollster::block_on(self.forward(batch))
    }
}

/// One step of the sequence in blocks `table` (`slots` from position 0):
/// `tokens` at positions `start..`, the `wanted` logits rows read back.
pub fn seq_step(
    m: &mut impl ForwardSync,
    tokens: &[u32],
    start: usize,
    (table, slots): (&[BlockId], &[Slot]),
    wanted: LogitsWanted,
) -> Vec<f32> {
    let seqs = [SeqInput {
        tokens,
        start,
        slots: &slots[start..start + tokens.len()],
        block_table: table,
        logits: wanted,
    }];
    m.forward_sync(&Batch { seqs: &seqs })
        .unwrap_or_else(|e| panic!("step of {} tokens at {start}: {e}", tokens.len()))
}

/// A CPU backend on `threads` threads, with the `HEARTH_*` settings of the
/// environment (`HEARTH_CPU_ISA`, `HEARTH_FUSE`, ...) as the CLI reads them.
pub fn cpu_backend(threads: usize) -> CpuBackend {
    let (opts, warnings) = CpuOptions::from_settings(threads, |k| std::env::var(k).ok());
    for w in warnings {
        eprintln!("{w}");
    }
    CpuBackend::with_options(&opts)
}

/// The synthetic model `name` (`qwen2-Q4_0`): the stored file, or, for the
/// combinations the fixtures do not store, the file made from its F32 source
/// with Hearth's quantizer (`--pure`, as llama.cpp made them), checked
/// against the sha256 of llama.cpp's file. Made files are kept in the
/// build tree between runs.
pub fn synthetic_model(name: &str) -> PathBuf {
    use sha2::{Digest, Sha256};
    let stored = fixtures().join(format!("synthetic/models/{name}.gguf"));
    if stored.exists() {
        return stored;
    }
    let meta = read_json(&fixtures().join(format!("synthetic/{name}.json")));
    let want = meta["model_sha256"]
        .as_str()
        .expect("model_sha256")
        .to_string();
    let hex = |bytes: &[u8]| -> String {
        Sha256::digest(bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("synthetic-models");
    std::fs::create_dir_all(&dir).expect("model cache dir");
    let out = dir.join(format!("{name}.gguf"));
    if std::fs::read(&out).is_ok_and(|b| hex(&b) == want) {
        return out;
    }
    let (arch, format) = name.split_once('-').expect("ARCH-FORMAT");
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/synthetic-f32/{arch}.F32.gguf"));
    let (model, sources) = open_model(&source).expect("open F32 source");
    let ftype = FileType::from_name(format).expect("file type");
    let plan = QuantPlan::new(&model, ftype, true).expect("plan");
    let bytes = pollster::block_on(quantize_model(
        &model,
        &sources,
        &plan,
        Vec::new(),
        &mut |_, _, _| {},
    ))
    .expect("quantize");
    assert_eq!(
        hex(&bytes),
        want,
        "{name}: Hearth's quantizer did not reproduce llama.cpp's file"
    );
    // Write then rename, so tests running at once never read half a file.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let unique = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{name}.{}.{unique}.tmp", std::process::id()));
    std::fs::write(&tmp, &bytes).expect("write model");
    std::fs::rename(&tmp, &out).expect("rename model");
    out
}

/// Every synthetic model with llama.cpp reference logits (all six
/// architectures in all 14 formats).
pub fn synthetic_names() -> Vec<String> {
    let dir = fixtures().join("synthetic");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("synthetic dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".logits.f32").map(str::to_string))
        .collect();
    names.sort();
    assert_eq!(names.len(), 84, "expected 6 architectures x 14 formats");
    names
}

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llamacpp")
}

/// Real models directory: `$HEARTH_MODELS` or `.cache/models`.
pub fn real_model(file: &str) -> PathBuf {
    let dir = std::env::var_os("HEARTH_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/models"));
    let p = dir.join(file);
    assert!(p.exists(), "{} is missing: run `make setup`", p.display());
    p
}

pub fn load(
    path: &Path,
    dtype: KvType,
    exact: bool,
    threads: usize,
    num_blocks: usize,
) -> CpuModel {
    let opts = LoadOptions {
        exact_f32: exact,
        ..LoadOptions::new(KvCacheConfig {
            num_blocks,
            block_size: BLOCK,
            dtype,
        })
    };
    load_with(path, &opts, threads)
}

/// [`load`] with `opts`, checking the progress reported.
pub fn load_with(path: &Path, opts: &LoadOptions, threads: usize) -> CpuModel {
    let (model, sources) = open_model(path).expect("open model");
    let mut last = None;
    let backend = cpu_backend(threads);
    let m = pollster::block_on(load_model(backend, &model, &sources, opts, &mut |p| {
        last = Some(*p)
    }))
    .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    let p = last.expect("progress reported");
    assert_eq!(
        (p.bytes_done, p.tensors_done),
        (p.bytes_total, p.tensors_total)
    );
    m
}

/// Blocks `first..` for a sequence of `n` tokens.
pub fn table(first: u32, n: usize) -> Vec<BlockId> {
    (0..n.div_ceil(BLOCK) as u32)
        .map(|i| BlockId(first + i))
        .collect()
}

pub fn slots(table: &[BlockId], start: usize, n: usize) -> Vec<Slot> {
    (start..start + n)
        .map(|p| Slot {
            block: table[p / BLOCK],
            offset: (p % BLOCK) as u32,
        })
        .collect()
}

/// Runs `ids` as one sequence from position 0 in blocks 1.. and returns the logits.
pub fn run_all(m: &mut impl ForwardSync, ids: &[u32], wanted: LogitsWanted) -> Vec<f32> {
    let t = table(1, ids.len());
    let s = slots(&t, 0, ids.len());
    let seqs = [SeqInput {
        tokens: ids,
        start: 0,
        slots: &s,
        block_table: &t,
        logits: wanted,
    }];
    m.forward_sync(&Batch { seqs: &seqs }).expect("forward")
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("json")
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// `[(id, logit)]` of a top-k list.
pub fn top_list(v: &serde_json::Value) -> Vec<(usize, f32)> {
    v.as_array()
        .expect("top list")
        .iter()
        .map(|p| {
            (
                p[0].as_u64().expect("id") as usize,
                p[1].as_f64().expect("logit") as f32,
            )
        })
        .collect()
}

/// rms(a - b) / rms(b).
pub fn nrmse(a: &[f32], b: &[f32]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (f64::from(x) - f64::from(y)).powi(2);
        den += f64::from(y).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

/// Per-row nrmse of two `[rows, nv]` logit tables, sorted (the median row is
/// what a kernel error moves; a MoE token that takes another expert under
/// other rounding moves only its own row).
pub fn row_errors(a: &[f32], b: &[f32], nv: usize) -> Vec<f64> {
    let mut e: Vec<f64> = a
        .chunks(nv)
        .zip(b.chunks(nv))
        .map(|(x, y)| nrmse(x, y))
        .collect();
    e.sort_by(f64::total_cmp);
    e
}

pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// Ids of the `k` largest, ties to the lower id.
pub fn top_k(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

pub fn overlap(a: &[usize], b: &[usize]) -> usize {
    a.iter().filter(|i| b.contains(i)).count()
}

/// Every value of every row as its bits, for comparisons bit for bit
/// (NaN included).
pub fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// How `ours` agrees with `reference`, rows of `nv` logits: the nrmse over
/// all of them, the share of rows with the same top token, and the mean
/// overlap of the rows' top 20.
pub fn agreement(ours: &[f32], reference: &[f32], nv: usize) -> (f64, f64, f64) {
    assert_eq!(ours.len(), reference.len(), "rows of logits to compare");
    let rows = reference.len() / nv.max(1);
    let (mut top1, mut top20) = (0, 0);
    for r in 0..rows {
        let (a, b) = (&ours[r * nv..][..nv], &reference[r * nv..][..nv]);
        top1 += usize::from(argmax(a) == argmax(b));
        top20 += overlap(&top_k(a, 20), &top_k(b, 20));
    }
    let n = rows.max(1) as f64;
    (nrmse(ours, reference), top1 as f64 / n, top20 as f64 / n)
}
