//! The expert cache on the CUDA backend: the stored synthetic MoE models
//! with their routed experts in host memory and device slots for a share
//! of them, prompt, decode and batched steps, as
//! tests/model_webgpu_moe_cache.rs on WebGPU. Where every routed expert
//! found a slot the logits are the uncached model's bit for bit; where the
//! host computed some (no slot free, one-token misses with
//! `host_tokens = 1`, or every layer with `--cpu-moe`) they agree within
//! the int8 paths' rounding and give the same greedy tokens.

mod cuda_support;
#[path = "../../../tests/model_support/mod.rs"]
mod model_support;

use std::path::Path;

use cuda_support::{fixtures, load_cuda_with};
use hearth::gguf::open_model;
use hearth::model::offload::ExpertOffload;
use hearth::model::{ForwardModel, Model};
use hearth::moe::Policy;
use hearth_cuda::CudaBackend;
use model_support::moe_cache::{assert_cache_agrees, cache_options, cache_steps};

const MODELS: [&str; 2] = ["qwen3moe-Q4_K_M", "mixtral-Q4_0"];

fn load_cuda(path: &Path, experts: Option<ExpertOffload>) -> Option<Model<CudaBackend>> {
    load_cuda_with(path, &cache_options(experts, 12))
}

#[test]
fn the_cache_gives_the_models_tokens_at_any_slot_count() {
    for name in MODELS {
        let path = fixtures().join(format!("synthetic/models/{name}.gguf"));
        let Some(mut plain) = load_cuda(&path, None) else {
            return;
        };
        let want = cache_steps(&mut plain);
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
            let got = cache_steps(&mut m);
            let stats = m.expert_stats().expect("the cache keeps count");
            println!("{name:<16} {share:.2} host_tokens {host_tokens} host_layers {host_layers} {policy}: {stats}");
            assert_eq!(stats.steps, 5, "{name}");
            let label = format!("{name} {share}");
            assert_cache_agrees(&label, stats.host_experts, &got, &want, nv);
        }
    }
}
