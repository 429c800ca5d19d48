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
use hearth::model::offload::ExpertOffload;
use hearth::model::{ForwardModel, LoadOptions};
use hearth::moe::{ExpertPlacement, Policy};
use model_support::moe_cache::{assert_cache_agrees, cache_options, cache_steps};
use model_support::{argmax, synthetic_model};
use webgpu_support::*;

const MODELS: [&str; 2] = ["qwen3moe-Q4_K_M", "mixtral-Q4_0"];

fn options(experts: Option<ExpertOffload>) -> LoadOptions {
    cache_options(experts, 12)
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
        let want = cache_steps(&mut plain);
        let (n_layer, nv) = (plain.config().n_layer, plain.config().n_vocab);
        let all = expert_bytes(name);
        // (share of the experts' bytes for slots, host_tokens, policy,
        // prefetch)
        let cases = [
            (0.05, 0, Policy::Lru, false),
            (0.15, 0, Policy::Lru, false),
            (0.3, 0, Policy::Lfu, false),
            (0.6, 0, Policy::Lrfu, false),
            (0.6, 0, Policy::Lru, true),
            (0.95, 0, Policy::Lru, true),
            (0.95, 1, Policy::Lrfu, false),
        ];
        for (share, host_tokens, policy, prefetch) in cases {
            let offload = ExpertOffload {
                policy,
                host_tokens,
                prefetch,
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
            let got = cache_steps(&mut m);
            let stats = m.expert_stats().expect("the cache keeps count");
            println!("{name:<16} {share:.2} host_tokens {host_tokens} {policy}: {stats}");
            assert_eq!(stats.steps, 5, "{name}");
            // Layer 1's decode steps are predicted from layer 0 (a step
            // of few tokens), and right about some of its experts.
            assert_eq!(stats.predicted > 0, prefetch, "{name}: {stats}");
            assert!(!prefetch || stats.predicted_right > 0, "{name}: {stats}");
            assert_eq!(stats.hits + stats.misses > 0, pooled > 0, "{name}: {stats}");
            let label = format!("{name} {share}");
            assert_cache_agrees(&label, stats.host_experts, &got, &want, nv);
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
    let (want, got) = (cache_steps(&mut plain), cache_steps(&mut m));
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
