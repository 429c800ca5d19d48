//! The expert cache on the CUDA backend: the stored synthetic MoE models
//! with their routed experts in host memory and device slots for a share
//! of them, prompt, decode and batched steps, as
//! tests/model_webgpu_moe_cache.rs on WebGPU. Where every routed expert
//! found a slot the logits are the uncached model's bit for bit; where the
//! host computed some (no slot free, one-token misses with
//! `host_tokens = 1`, or every layer with `--cpu-moe`) they agree within
//! the int8 paths' rounding and give the same greedy tokens.

#[path = "../../../tests/model_support/mod.rs"]
mod model_support;

use std::path::{Path, PathBuf};

use hearth::gguf::open_model;
use hearth::graph::{KvCacheConfig, KvType};
use hearth::kv::{BlockId, Slot};
use hearth::model::offload::ExpertOffload;
use hearth::model::{load_model, Batch, ForwardModel, LoadOptions, LogitsWanted, Model, SeqInput};
use hearth::moe::Policy;
use hearth_cuda::CudaBackend;
use model_support::{argmax, row_errors, slots, table, BLOCK};

const MODELS: [&str; 2] = ["qwen3moe-Q4_K_M", "mixtral-Q4_0"];

fn model_path(name: &str) -> PathBuf {
    std::env::var_os("HEARTH_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llamacpp")
        })
        .join(format!("synthetic/models/{name}.gguf"))
}

/// The model on CUDA with `experts`, or `None` (after printing why)
/// without a device.
fn load_cuda(path: &Path, experts: Option<ExpertOffload>) -> Option<Model<CudaBackend>> {
    let backend = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) if std::env::var("HEARTH_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("HEARTH_REQUIRE_CUDA=1 but {e}")
        }
        Err(e) => {
            eprintln!("CUDA test not run: {e} (set HEARTH_REQUIRE_CUDA=1 to make this fail)");
            return None;
        }
    };
    let (model, sources) = open_model(path).expect("open model");
    let opts = LoadOptions {
        experts,
        ..LoadOptions::new(KvCacheConfig {
            num_blocks: 12,
            block_size: BLOCK,
            dtype: KvType::F16,
        })
    };
    let m = pollster::block_on(load_model(backend, &model, &sources, &opts, &mut |_| {}))
        .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    Some(m)
}

fn seq<'a>(
    tokens: &'a [u32],
    start: usize,
    block_table: &'a [BlockId],
    slots: &'a [Slot],
    logits: LogitsWanted,
) -> SeqInput<'a> {
    SeqInput {
        tokens,
        start,
        slots: &slots[start..start + tokens.len()],
        block_table,
        logits,
    }
}

/// A 9-token prompt (all rows), three decode steps, and a batch of the
/// first sequence's next token beside a second sequence's 5-token prompt.
fn steps(m: &mut Model<CudaBackend>) -> Vec<Vec<f32>> {
    let prompt: Vec<u32> = (0..9).map(|i| 3 + (i * 37) % 250).collect();
    let (ta, tb) = (table(1, 16), table(5, 16));
    let (sa, sb) = (slots(&ta, 0, 16), slots(&tb, 0, 16));
    let mut run =
        |seqs: &[SeqInput<'_>]| pollster::block_on(m.forward(&Batch { seqs })).expect("forward");
    let mut out = vec![run(&[seq(&prompt, 0, &ta, &sa, LogitsWanted::All)])];
    for (i, tok) in [17u32, 230, 5].iter().enumerate() {
        let at = prompt.len() + i;
        out.push(run(&[seq(
            std::slice::from_ref(tok),
            at,
            &ta,
            &sa,
            LogitsWanted::Last,
        )]));
    }
    let other: Vec<u32> = (0..5).map(|i| 7 + (i * 53) % 250).collect();
    out.push(run(&[
        seq(&[99], prompt.len() + 3, &ta, &sa, LogitsWanted::Last),
        seq(&other, 0, &tb, &sb, LogitsWanted::Last),
    ]));
    out
}

#[test]
fn the_cache_gives_the_models_tokens_at_any_slot_count() {
    for name in MODELS {
        let path = model_path(name);
        let Some(mut plain) = load_cuda(&path, None) else {
            return;
        };
        let want = steps(&mut plain);
        let nv = plain.config().n_vocab;
        let (gguf, _) = open_model(&path).expect("open");
        let all: u64 = gguf
            .tensors
            .iter()
            .filter(|t| t.name.contains("_exps."))
            .map(|t| t.size)
            .sum();
        let cases = [
            (0.15, 0, usize::MIN, Policy::Lru),
            (0.6, 0, 0, Policy::Lrfu),
            (0.95, 0, 0, Policy::Lfu),
            (0.95, 1, 0, Policy::Lrfu),
            (1.0, 0, usize::MAX, Policy::Lrfu),
        ];
        for (share, host_tokens, host_layers, policy) in cases {
            let offload = ExpertOffload {
                policy,
                host_tokens,
                host_layers,
                ..ExpertOffload::with_slot_bytes((all as f64 * share) as u64)
            };
            let mut m = load_cuda(&path, Some(offload)).expect("the device is there");
            let got = steps(&mut m);
            let stats = m.expert_stats().expect("the cache keeps count");
            println!("{name:<16} {share:.2} host_tokens {host_tokens} host_layers {host_layers} {policy}: {stats}");
            assert_eq!(stats.steps, 5, "{name}");
            if stats.host_experts == 0 {
                assert_eq!(
                    got, want,
                    "{name} {share}: every expert in a slot, yet other logits"
                );
                continue;
            }
            // Rows of every step together: a token whose router scores
            // nearly tie may take another expert under the host's rounding,
            // which moves its row far (one of a batched step's two rows
            // did on CUDA); a kernel error would move the median.
            let (mut errors, mut rows_all, mut same_all) = (Vec::new(), 0, 0);
            for (g, w) in got.iter().zip(&want) {
                let rows = w.len() / nv;
                errors.extend(row_errors(g, w, nv));
                rows_all += rows;
                same_all += (0..rows)
                    .filter(|&r| argmax(&g[r * nv..][..nv]) == argmax(&w[r * nv..][..nv]))
                    .count();
            }
            errors.sort_by(f64::total_cmp);
            let median = errors[errors.len() / 2];
            // The bound of the WebGPU MoE decode against the CPU's
            // (tests/model_webgpu_moe.rs).
            assert!(median < 8e-2, "{name} {share}: median row {median:.2e}");
            assert!(
                same_all + rows_all / 7 >= rows_all,
                "{name} {share}: top1 {same_all}/{rows_all}"
            );
        }
    }
}
