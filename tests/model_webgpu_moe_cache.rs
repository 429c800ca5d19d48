//! The expert cache on the WebGPU backend: the synthetic MoE models with
//! their routed experts in host memory and device slots for a share of
//! them (from a tenth of one layer's experts to nearly all), prompt,
//! decode and batched steps. Where every routed expert found a slot the
//! logits are those of the model without the cache, bit for bit; where
//! some were computed on the host (no slot free, or a one-token miss with
//! `host_tokens = 1`) they agree within the two backends' rounding and give
//! the same greedy tokens.

mod model_support;
mod webgpu_support;

use hearth::gguf::open_model;
use hearth::graph::{KvCacheConfig, KvType};
use hearth::model::offload::ExpertOffload;
use hearth::model::{Batch, ForwardModel, LoadOptions, LogitsWanted, SeqInput};
use hearth::moe::{ExpertPlacement, Policy};
use model_support::{argmax, row_errors, synthetic_model};
use webgpu_support::*;

const MODELS: [&str; 2] = ["qwen3moe-Q4_K_M", "mixtral-Q4_0"];

fn options(experts: Option<ExpertOffload>) -> LoadOptions {
    LoadOptions {
        experts,
        ..LoadOptions::new(KvCacheConfig {
            num_blocks: 12,
            block_size: BLOCK,
            dtype: KvType::F16,
        })
    }
}

/// The logits of: a 9-token prompt (all rows), three decode steps, and a
/// batch of the first sequence's next token beside a second sequence's
/// 5-token prompt (its last row).
fn steps(m: &mut GpuModel) -> Vec<Vec<f32>> {
    let prompt: Vec<u32> = (0..9).map(|i| 3 + (i * 37) % 250).collect();
    let (ta, tb) = (table(1, 16), table(5, 16));
    let (sa, sb) = (slots(&ta, 0, 16), slots(&tb, 0, 16));
    let mut run =
        |seqs: &[SeqInput<'_>]| pollster::block_on(m.forward(&Batch { seqs })).expect("forward");
    fn seq<'a>(
        tokens: &'a [u32],
        start: usize,
        block_table: &'a [hearth::kv::BlockId],
        slots: &'a [hearth::kv::Slot],
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

/// Bytes of the routed experts in the file.
fn expert_bytes(name: &str) -> u64 {
    let (model, _) = open_model(&synthetic_model(name)).expect("open");
    model
        .tensors
        .iter()
        .filter(|t| t.name.contains("_exps."))
        .map(|t| t.size)
        .sum()
}

#[test]
fn the_cache_gives_the_models_tokens_at_any_slot_count() {
    for name in MODELS {
        let path = synthetic_model(name);
        let Some(mut plain) = load_gpu_opts(&path, &options(None), &gpu_options()) else {
            return;
        };
        let want = steps(&mut plain);
        let (n_layer, nv) = (plain.config().n_layer, plain.config().n_vocab);
        let all = expert_bytes(name);
        // (share of the experts' bytes for slots, host_tokens, policy)
        let cases = [
            (0.05, 0, Policy::Lru),
            (0.15, 0, Policy::Lru),
            (0.3, 0, Policy::Lfu),
            (0.6, 0, Policy::Lrfu),
            (0.95, 0, Policy::Lru),
            (0.95, 1, Policy::Lrfu),
        ];
        for (share, host_tokens, policy) in cases {
            let offload = ExpertOffload {
                policy,
                host_tokens,
                ..ExpertOffload::with_slot_bytes((all as f64 * share) as u64)
            };
            let mut m = load_gpu_opts(&path, &options(Some(offload)), &gpu_options())
                .expect("the adapter is there");
            // Below one expert's bytes a layer group runs on the host.
            let pooled = (0..n_layer)
                .filter(|&l| m.expert_placement(l) == ExpertPlacement::Slots)
                .count();
            assert!(
                (0..n_layer).all(|l| m.expert_placement(l) != ExpertPlacement::Device)
                    && (share < 0.1 || pooled == n_layer),
                "{name}: {pooled} of {n_layer} layers pooled with {share} of the experts' bytes"
            );
            let got = steps(&mut m);
            let stats = m.expert_stats().expect("the cache keeps count");
            println!("{name:<16} {share:.2} host_tokens {host_tokens} {policy}: {stats}");
            assert_eq!(stats.steps, 5, "{name}");
            assert_eq!(stats.hits + stats.misses > 0, pooled > 0, "{name}: {stats}");
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

/// With nothing said and a device budget short of the model (WebGPU's
/// `memory_budget`, `HEARTH_GPU_MEMORY`), the loader puts the routed
/// experts behind the cache by itself, within the budget, and the model
/// gives the greedy tokens of the model without a budget.
#[test]
fn a_short_device_budget_offloads_the_experts_by_itself() {
    use hearth::model::check_model;
    let name = "mixtral-Q4_0";
    let path = synthetic_model(name);
    let Some(mut plain) = load_gpu_opts(&path, &options(None), &gpu_options()) else {
        return;
    };
    let n_layer = plain.config().n_layer;
    let (gguf, _) = open_model(&path).expect("open");
    let need = check_model(&gguf, plain.backend(), &options(None))
        .expect("check")
        .memory
        .total();
    let budget = need - expert_bytes(name) / 2;
    let short = hearth::backend::webgpu::GpuOptions {
        memory_budget: Some(budget),
        ..gpu_options()
    };
    let mut m = load_gpu_opts(&path, &options(None), &short).expect("the adapter is there");
    assert!(
        (0..n_layer).all(|l| m.expert_placement(l) == ExpertPlacement::Slots),
        "{name}: every layer pooled within {budget} of {need} bytes"
    );
    let checked = check_model(&gguf, m.backend(), &options(None)).expect("check");
    assert!(
        checked.memory.total() <= budget,
        "{} > {budget}",
        checked.memory.total()
    );
    let (want, got) = (steps(&mut plain), steps(&mut m));
    let stats = m.expert_stats().expect("the cache keeps count");
    println!("{name} within {budget} of {need} bytes: {stats}");
    assert!(stats.misses > 0, "{stats}");
    let nv = m.config().n_vocab;
    let picks = |v: &[Vec<f32>]| -> Vec<usize> {
        v.iter()
            .flat_map(|s| s.chunks(nv).map(argmax).collect::<Vec<_>>())
            .collect()
    };
    let (a, b) = (picks(&want), picks(&got));
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same + a.len() / 7 >= a.len(), "top1 {same}/{}", a.len());
}
