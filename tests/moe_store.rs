//! The expert-store seam on the CPU: a model whose MoE layers keep their
//! experts on the host only (llama.cpp's `--cpu-moe`, [`ExpertOffload`])
//! stops after each such layer's routing, has the expert cache compute
//! the layer's experts with the same kernels, and gives the logits of the
//! model without it bit for bit, prompt and decode steps alike, fused or
//! not, with every layer or the first few on the host.

mod model_support;

use hearth::graph::plan::SyncFuture;
use hearth::graph::{KvCacheConfig, KvType};
use hearth::model::offload::ExpertOffload;
use hearth::model::{ForwardModel, LoadOptions, LogitsWanted};
use hearth::moe::{ExpertPlacement, ExpertStore, Routes};
use model_support::*;

/// The logits of a 9-token prompt (all rows) and of two decode steps.
fn run(m: &mut CpuModel) -> Vec<Vec<f32>> {
    let prompt: Vec<u32> = (0..9).map(|i| 3 + (i * 37) % 150).collect();
    let total = prompt.len() + 2;
    let t = table(1, total);
    let s = slots(&t, 0, total);
    let mut out = vec![seq_step(m, &prompt, 0, (&t, &s), LogitsWanted::All)];
    for (i, tok) in [17u32, 42].into_iter().enumerate() {
        let at = prompt.len() + i;
        out.push(seq_step(m, &[tok], at, (&t, &s), LogitsWanted::Last));
    }
    out
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

fn options(experts: Option<ExpertOffload>) -> LoadOptions {
    LoadOptions {
        experts,
        ..LoadOptions::new(KvCacheConfig {
            num_blocks: 8,
            block_size: BLOCK,
            dtype: KvType::F16,
        })
    }
}

#[test]
fn experts_on_the_host_give_the_models_logits() {
    for name in ["qwen3moe-Q4_K_M", "mixtral-Q4_0"] {
        let path = synthetic_model(name);
        let mut plain = load_with(&path, &options(None), 2);
        let n_layer = plain.config().n_layer;
        for fused in [true, false] {
            plain.set_fusion(fused);
            let without = run(&mut plain);
            for host_layers in [usize::MAX, 1] {
                let offload = ExpertOffload {
                    host_layers,
                    ..ExpertOffload::with_slot_bytes(0)
                };
                let mut m = load_with(&path, &options(Some(offload)), 2);
                m.set_fusion(fused);
                let on_host = host_layers.min(n_layer);
                let placements: Vec<ExpertPlacement> =
                    (0..n_layer).map(|l| m.expert_placement(l)).collect();
                assert_eq!(
                    placements
                        .iter()
                        .filter(|&&p| p == ExpertPlacement::Host)
                        .count(),
                    on_host,
                    "{name}: {placements:?}"
                );
                let with = run(&mut m);
                assert_eq!(
                    bits(&with),
                    bits(&without),
                    "{name} fused {fused} host {host_layers}"
                );
                let stats = m.expert_stats().expect("the cache keeps count");
                let cfg = m.config();
                // Three steps of 9, 1 and 1 tokens; each token's k experts
                // in every host layer, some shared within the prompt.
                assert_eq!((stats.steps, stats.tokens), (3, 11), "{name}");
                let most = (11 * cfg.n_expert_used * on_host) as u64;
                let least = (3 * cfg.n_expert_used * on_host) as u64;
                assert!(
                    (least..=most).contains(&stats.host_experts),
                    "{name}: {stats}"
                );
                assert_eq!(
                    stats.hits + stats.misses + stats.copies,
                    0,
                    "{name}: {stats}"
                );
            }
        }
    }
}

/// A store that keeps every expert on the device leaves the plans without
/// stops.
#[test]
fn a_store_that_keeps_the_experts_on_the_device_is_never_called() {
    struct Resident;
    impl ExpertStore for Resident {
        fn placement(&self, _: usize) -> ExpertPlacement {
            ExpertPlacement::Device
        }
        fn prepare(&mut self, layer: usize, _: Routes, _: Vec<f32>) -> SyncFuture<'_> {
            panic!("prepare called for layer {layer}");
        }
        fn host_part(&mut self, layer: usize) -> SyncFuture<'_> {
            panic!("host_part called for layer {layer}");
        }
    }
    let mut m = load(
        &synthetic_model("qwen3moe-Q4_K_M"),
        KvType::F16,
        false,
        1,
        8,
    );
    let without = run(&mut m);
    m.set_expert_store(Some(Box::new(Resident)));
    assert_eq!(run(&mut m), without);
}
