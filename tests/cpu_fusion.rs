//! The CPU backend's fused row ops (RMS norm + activation quantizing,
//! gated activation + quantizing, RoPE + K/V write, and activations shared
//! by the products that read one input) give the logits of the ops run one
//! by one, bit for bit: on every architecture of the synthetic models, with
//! 32-element and 256-element formats, F16 and F32 K/V caches, one and two
//! threads, a prompt and then single-token decode steps.

mod model_support;

use hearth::graph::KvType;
use hearth::graph::Op;
use hearth::model::arch::plan::{PlanOptions, PlanSource, StepShape};
use hearth::model::plans::{plan_for, PlanRecipe};
use hearth::model::{ForwardModel, LogitsWanted, Readout};
use model_support::*;

/// The prompt's logits (all rows), then those of `steps` decode steps, each
/// feeding the last step's greedy token.
fn run(m: &mut CpuModel, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let total = prompt.len() + steps;
    let t = table(1, total);
    let s = slots(&t, 0, total);
    let n_vocab = m.config().n_vocab;
    let mut out = vec![seq_step(m, prompt, 0, (&t, &s), LogitsWanted::All)];
    for step in 0..steps {
        let last = out.last().expect("logits");
        let next = [argmax(&last[last.len() - n_vocab..]) as u32];
        let at = prompt.len() + step;
        out.push(seq_step(m, &next, at, (&t, &s), LogitsWanted::Last));
    }
    out
}

/// The fused ops in the CPU's plan of a step of `tokens` tokens, one
/// logits row read back: `(kind, prologue)` of each, as the plan has them.
fn fused_ops(m: &CpuModel, tokens: usize) -> Vec<String> {
    let recipe = PlanRecipe {
        src: PlanSource::from(m),
        n_weights: m.held().weights.len(),
        opts: &PlanOptions::default(),
        fused: true,
    };
    let shape = StepShape {
        tokens,
        logit_rows: 1,
    };
    let plan = plan_for(&recipe, shape, Readout::Logits, m.backend()).expect("plan");
    plan.steps
        .iter()
        .filter_map(|s| match &s.op {
            Op::FusedMatMul { pre, .. } => Some(format!("{pre:?}")),
            Op::RopeKvWrite { .. } => Some("RopeKvWrite".into()),
            _ => None,
        })
        .collect()
}

/// The CPU's plans of prompts fuse the norm and the gated activation into
/// the products reading them and the RoPE of k into the K/V write; those
/// of decode steps fuse nothing.
#[test]
fn prompt_plans_fuse_and_decode_plans_do_not() {
    for name in ["llama-Q4_0", "gemma3-Q8_0", "qwen3moe-Q4_K_M"] {
        let m = load(&synthetic_model(name), KvType::F16, false, 1, 20);
        let prompt = fused_ops(&m, 16);
        let layers = m.weights().layers.len();
        let count = |what: &str| prompt.iter().filter(|p| p.starts_with(what)).count();
        assert_eq!(count("RopeKvWrite"), layers, "{name}: {prompt:?}");
        // The attention norm and the FFN norm of every layer.
        assert_eq!(count("RmsNorm"), 2 * layers, "{name}: {prompt:?}");
        let glu = if m.spec().moe { 0 } else { layers };
        assert_eq!(count("Glu"), glu, "{name}: {prompt:?}");
        assert!(fused_ops(&m, 1).is_empty(), "{name}: a decode step fused");
    }
}

#[test]
fn fused_row_ops_give_the_logits_of_the_ops_apart() {
    let names = [
        "llama-Q4_0",
        "llama-Q4_K_M",
        "gemma3-Q8_0",
        "gemma3-Q6_K",
        "qwen2-Q5_0",
        "qwen3-IQ4_XS",
        "qwen3moe-Q4_K_M",
        "mixtral-Q4_1",
    ];
    // 252 tokens and 4 steps fill the models' context of 256; a prompt
    // this long takes the fused ops' parallel paths (rows over the
    // threads, K/V rows split by slot), a step the serial ones.
    let prompt: Vec<u32> = (0..252).map(|i| (i * 7919 + 11) % 200 + 3).collect();
    for name in names {
        for (dtype, threads) in [(KvType::F16, 1), (KvType::F16, 2), (KvType::F32, 2)] {
            let mut m = load(&synthetic_model(name), dtype, false, threads, 20);
            m.set_fusion(true);
            let fused = run(&mut m, &prompt, 4);
            m.set_fusion(false);
            // A fresh cache: the same slots are written again, apart.
            let apart = run(&mut m, &prompt, 4);
            for (i, (a, b)) in fused.iter().zip(&apart).enumerate() {
                let same =
                    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(
                    same,
                    "{name} {dtype:?} x{threads}: pass {i} differs with fusion"
                );
            }
        }
    }
}
