//! The expert-store seam: a model with an [`ExpertStore`] that wants the
//! routes of its MoE layers stops after each layer's routing, hands the
//! store the step's routes (as the device computed them), and computes
//! exactly what it computes without a store, prompt and decode steps alike,
//! fused or not.

mod model_support;

use std::sync::{Arc, Mutex};

use hearth::graph::plan::SyncFuture;
use hearth::graph::KvType;
use hearth::model::{ForwardModel, LogitsWanted};
use hearth::moe::{ExpertStore, Routes};
use model_support::*;

/// What a store was asked: `(layer, routes)` per call.
type Calls = Arc<Mutex<Vec<(usize, Routes)>>>;

/// A store that asks for the routes of the even layers and records them.
struct Recording {
    calls: Calls,
}

impl ExpertStore for Recording {
    fn needs_routes(&self, layer: usize) -> bool {
        layer.is_multiple_of(2)
    }

    fn prepare<'a>(&'a mut self, layer: usize, routes: &'a Routes) -> SyncFuture<'a> {
        self.calls
            .lock()
            .expect("calls")
            .push((layer, routes.clone()));
        Box::pin(std::future::ready(Ok(())))
    }
}

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

#[test]
fn a_store_sees_every_routed_layer_and_changes_nothing() {
    for name in ["qwen3moe-Q4_K_M", "mixtral-Q4_0"] {
        for fused in [true, false] {
            let mut m = load(&synthetic_model(name), KvType::F16, false, 2, 8);
            m.set_fusion(fused);
            let without = run(&mut m);
            let calls = Calls::default();
            m.set_expert_store(Some(Box::new(Recording {
                calls: calls.clone(),
            })));
            let with = run(&mut m);
            let bits = |v: &[Vec<f32>]| -> Vec<Vec<u32>> {
                v.iter()
                    .map(|r| r.iter().map(|x| x.to_bits()).collect())
                    .collect()
            };
            assert_eq!(bits(&with), bits(&without), "{name} fused {fused}");
            let calls = calls.lock().expect("calls");
            let cfg = m.config();
            let (n_layer, n_expert, k) = (cfg.n_layer, cfg.n_expert, cfg.n_expert_used);
            let even: Vec<usize> = (0..n_layer).step_by(2).collect();
            // Three steps, each stopping at every even layer, in order.
            let layers: Vec<usize> = calls.iter().map(|(l, _)| *l).collect();
            assert_eq!(
                layers,
                [even.clone(), even.clone(), even].concat(),
                "{name}"
            );
            for (i, (layer, r)) in calls.iter().enumerate() {
                let tokens = if i < n_layer.div_ceil(2) { 9 } else { 1 };
                assert_eq!((r.k, r.tokens()), (k, tokens), "{name} layer {layer}");
                for (ids, w) in r.ids.chunks(k).zip(r.weights.chunks(k)) {
                    let mut distinct = ids.to_vec();
                    distinct.dedup();
                    assert!(ids.iter().all(|&e| (e as usize) < n_expert), "{ids:?}");
                    assert_eq!(distinct.len(), k, "{name}: a token routed twice: {ids:?}");
                    let sum: f32 = w.iter().sum();
                    assert!((sum - 1.0).abs() < 1e-5, "{name}: weights {w:?}");
                    assert!(w.windows(2).all(|p| p[0] >= p[1]), "{name}: not best first");
                }
                assert!(!r.experts().is_empty());
            }
        }
    }
}

/// A store that asks for nothing leaves the plans without stops.
#[test]
fn a_store_that_needs_no_routes_is_never_called() {
    struct Resident;
    impl ExpertStore for Resident {
        fn needs_routes(&self, _: usize) -> bool {
            false
        }
        fn prepare<'a>(&'a mut self, layer: usize, _: &'a Routes) -> SyncFuture<'a> {
            panic!("prepare called for layer {layer}");
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
