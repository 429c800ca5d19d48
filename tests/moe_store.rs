//! The expert-store seam on the CPU: a model whose MoE layers keep their
//! experts on the host only (llama.cpp's `--cpu-moe`, [`ExpertOffload`])
//! stops after each such layer's routing, has the expert cache compute
//! the layer's experts with the same kernels, and gives the logits of the
//! model without it bit for bit, prompt and decode steps alike, fused or
//! not, with every layer or the first few on the host.

mod model_support;

use hearth::graph::plan::SyncFuture;
use hearth::graph::KvType;
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

fn options(experts: Option<ExpertOffload>) -> LoadOptions {
    model_support::moe_cache::cache_options(experts, 8)
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

/// The offload plan of qwen3moe-Q4_K_M (whose expert types differ between
/// layers, so it has two layer groups) at several budgets: the first
/// `host_layers` MoE layers on the host, the pools' slots in proportion to
/// what each group would take whole, a group that fits back on the device,
/// the pooled layers' expert weights pointed at their pool.
#[test]
fn the_offload_plan_splits_the_budget_between_the_layer_groups() {
    use hearth::model::arch::spec_for;
    use hearth::model::layout::Layout;
    use hearth::model::offload::{expert_bytes, plan_offload};
    use hearth::model::weights::FfnWeights;
    use hearth::model::ModelConfig;

    let (gguf, _) = hearth::gguf::open_model(&synthetic_model("qwen3moe-Q4_K_M")).expect("open");
    let cfg = ModelConfig::from_metadata_supported(gguf.metadata()).expect("config");
    let spec = spec_for(&cfg, gguf.metadata()).expect("spec");
    let backend = cpu_backend(1);
    let fresh = || {
        let mut layout = Layout::new(&gguf, &cfg.arch);
        let weights = layout.model(&cfg, &spec).expect("layout");
        (weights, layout.slots)
    };
    let (w0, s0) = fresh();
    let all = expert_bytes(&w0, &s0, 0, &backend);
    let per_layer = all / cfg.n_layer as u64;
    let mut pooled_cases = 0;
    for (share, host_layers) in [(0.25, 0), (0.5, 1), (0.999, 0), (2.0, 0)] {
        let (mut weights, mut slots) = fresh();
        let n_slots = slots.len();
        let offload = ExpertOffload {
            host_layers,
            ..ExpertOffload::with_slot_bytes((all as f64 * share) as u64)
        };
        let plan = plan_offload(
            &mut weights,
            &mut slots,
            cfg.n_expert,
            0,
            &offload,
            &backend,
        );
        let on_host = plan
            .layers
            .iter()
            .filter(|l| l.placement == ExpertPlacement::Host)
            .map(|l| l.layer)
            .collect::<Vec<_>>();
        assert_eq!(on_host, (0..host_layers).collect::<Vec<_>>(), "{share}");
        assert_eq!(
            slots.len(),
            n_slots + 3 * plan.pools.len(),
            "{share}: pool buffers appended"
        );
        assert!(
            plan.pool_bytes <= offload.slot_bytes,
            "{share}: {} over the budget",
            plan.pool_bytes
        );
        if share > 1.0 {
            assert!(
                plan.layers.is_empty() && plan.pools.is_empty(),
                "{share}: all fits"
            );
            continue;
        }
        let pooled = cfg.n_layer - host_layers;
        if plan.pools.is_empty() {
            // The budget holds every layer not on the host: they stay on
            // the device, only the host layers are in the plan.
            assert!(
                offload.slot_bytes >= all - host_layers as u64 * per_layer,
                "{share}"
            );
            assert_eq!(plan.layers.len(), host_layers, "{share}");
            continue;
        }
        pooled_cases += 1;
        // Every pool holds fewer experts than its layers have, and the
        // budget is used but for less than one expert per group.
        let slack = plan.pools.len() as u64 * 3 * per_layer / cfg.n_expert as u64;
        assert!(
            plan.pool_bytes + slack >= offload.slot_bytes.min(all - host_layers as u64 * per_layer),
            "{share}: {} of {} used",
            plan.pool_bytes,
            offload.slot_bytes
        );
        for (l, lw) in weights.layers.iter().enumerate() {
            let FfnWeights::Moe { gate, n_ff, .. } = lw.ffn else {
                panic!("layer {l} is not MoE");
            };
            let Some(placed) = plan.layers.iter().find(|p| p.layer == l) else {
                continue;
            };
            if placed.placement == ExpertPlacement::Slots {
                let pool = &plan.pools[placed.pool];
                assert_eq!(gate.id, pool.weights[0], "layer {l} points at its pool");
                assert_eq!(gate.rows, pool.slots * n_ff, "layer {l}");
                assert!(
                    pool.slots < cfg.n_expert * pooled,
                    "{share}: a pool as large as its layers"
                );
            }
        }
    }
    assert_eq!(
        pooled_cases, 2,
        "the 25% and 99.9% budgets pool every layer"
    );
}
