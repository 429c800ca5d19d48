//! The per-step plans the models build: every op a synthetic architecture
//! emits is one the CPU backend supports, and a plan whose buffers do not
//! fit its ops fails with an error (never a panic).

mod model_support;

use hearth::backend::cpu::CpuBackend;
use hearth::backend::{Backend, BackendError, BufKind};
use hearth::graph::plan::{execute, BufId, Held, NoSync, Plan, StepInputs};
use hearth::graph::KvType;
use hearth::graph::Op;
use hearth::model::arch::plan::{build_plan, step_inputs, PlanSource};
use hearth::model::{Batch, ForwardModel, LogitsWanted, SeqInput};
use hearth::quant::GgmlType;
use model_support::rng::Rng;
use model_support::*;

/// One model per synthetic architecture.
const ARCHS: [&str; 6] = [
    "llama-Q8_0",
    "mixtral-Q4_0",
    "qwen2-Q8_0",
    "qwen3-Q8_0",
    "qwen3moe-Q4_K_M",
    "gemma3-Q8_0",
];

fn synthetic(name: &str) -> CpuModel {
    let path = fixtures()
        .join("synthetic/models")
        .join(format!("{name}.gguf"));
    load(&path, KvType::F16, false, 1, 16)
}

/// The op's variant name (`PagedAttention`), for coverage checks.
fn kind(op: &Op) -> String {
    let s = format!("{op:?}");
    s.split([' ', '(', '{']).next().unwrap_or("").to_string()
}

/// Builds the plan of a two-sequence batch (a prefill chunk that continues
/// at position 3 and a fresh 5-token prompt) on `m`, and its host data.
fn plan_of(m: &CpuModel) -> (Plan, StepInputs) {
    let (t0, t1) = (table(1, 7), table(4, 5));
    let (s0, s1) = (slots(&t0, 3, 4), slots(&t1, 0, 5));
    let seqs = [
        SeqInput {
            tokens: &[5, 6, 7, 8],
            start: 3,
            slots: &s0,
            block_table: &t0,
            logits: LogitsWanted::Last,
        },
        SeqInput {
            tokens: &[1, 2, 3, 4, 9],
            start: 0,
            slots: &s1,
            block_table: &t1,
            logits: LogitsWanted::All,
        },
    ];
    let batch = Batch { seqs: &seqs };
    let plan = build_plan(m, &batch).expect("plan");
    (plan, step_inputs(&PlanSource::from(m), &batch))
}

#[test]
fn cpu_supports_every_op_of_every_architecture() {
    for name in ARCHS {
        let m = synthetic(name);
        let (plan, _) = plan_of(&m);
        let n_layer = m.weights().layers.len();
        let mut kinds: Vec<String> = Vec::new();
        for step in &plan.steps {
            assert!(
                m.backend().supports(&step.op),
                "{name}: the CPU backend does not support {:?}",
                step.op
            );
            let k = kind(&step.op);
            if !kinds.contains(&k) {
                kinds.push(k);
            }
        }
        let mut want = vec!["GetRows", "MatMul", "RmsNorm", "Rope", "KvWrite"];
        want.extend(["PagedAttention", "Add"]);
        if m.spec().moe {
            want.extend(["MoeTopK", "MoeExperts"]);
        } else {
            want.push(if name.starts_with("gemma3") {
                "GeluTanhMul"
            } else {
                "SiluMul"
            });
        }
        for w in want {
            assert!(kinds.iter().any(|k| k == w), "{name}: no {w} in {kinds:?}");
        }
        let attn = plan
            .steps
            .iter()
            .filter(|s| matches!(s.op, Op::PagedAttention { .. }))
            .count();
        assert_eq!(attn, n_layer, "{name}: one attention op per layer");
        assert!(plan.check(usize::MAX, n_layer).is_ok(), "{name}");
        // 1 + 5 logits rows of the vocabulary.
        let (_, bytes) = plan.result.expect("result");
        assert_eq!(bytes as usize, 6 * m.config().n_vocab * 4, "{name}");
    }
}

/// A plan of one MatMul of a `[3, 4]` f32 weight over an x of `x_values`.
fn matmul_plan(x_values: usize) -> Plan {
    let mut p = Plan::default();
    let x = p.act(x_values * 4);
    let y = p.act(2 * 3 * 4);
    let op = Op::MatMul {
        ty: GgmlType::F32,
        k: 4,
        n: 3,
        exact: false,
    };
    p.push(op, &[x, BufId::Weight(0)], &[y]);
    p.result = Some((1, 24));
    p
}

#[test]
fn wrong_shapes_in_a_plan_are_errors() {
    let seed = 0x9a17;
    let mut rng = Rng::new(seed);
    let mut b = CpuBackend::new(1);
    let w: Vec<f32> = rng.normals(12, 1.0);
    let wb = b.alloc(48, BufKind::Weights).expect("alloc");
    b.upload(&wb, 0, bytemuck::cast_slice(&w)).expect("upload");
    let weights = [wb];
    let held = Held {
        weights: &weights,
        kv: &[],
    };
    let inputs = StepInputs::default();
    let run = |b: &mut CpuBackend, p: &Plan| {
        pollster::block_on(execute(b, p, &inputs, &held, &mut NoSync))
    };
    // x of 2 rows of 4: fits (zeros in, zeros out).
    let ok = run(&mut b, &matmul_plan(8)).expect("a plan that fits");
    assert_eq!(ok.len(), 24, "seed {seed:#x}");
    // x of 7 values: not whole rows of 4.
    let err = run(&mut b, &matmul_plan(7));
    assert!(matches!(err, Err(BackendError::Shape(_))), "{err:?}");
    // x of 3 rows: y has room for 2.
    assert!(run(&mut b, &matmul_plan(12)).is_err());
    // A weight the model does not hold, and a step without its inputs.
    let mut p = matmul_plan(8);
    p.steps[0].inputs[1] = BufId::Weight(1);
    assert!(run(&mut b, &p).is_err());
    let mut p = matmul_plan(8);
    p.steps[0].inputs.pop();
    assert!(run(&mut b, &p).is_err());
    // The weight read as another type than it was first used as.
    let mut p = matmul_plan(8);
    p.steps[0].op = Op::MatMul {
        ty: GgmlType::F16,
        k: 4,
        n: 6,
        exact: false,
    };
    assert!(run(&mut b, &p).is_err());
}

/// Every step of a real plan, given a one-value buffer in place of its first
/// activation input, fails with an error rather than a panic (ops that take
/// any number of values excepted).
#[test]
fn every_op_of_a_model_plan_checks_its_shapes() {
    for name in ["llama-Q8_0", "qwen3moe-Q4_K_M", "gemma3-Q8_0"] {
        let m = synthetic(name);
        let (plan, inputs) = plan_of(&m);
        let held = m.held();
        let mut b = CpuBackend::new(1);
        for (i, step) in plan.steps.iter().enumerate() {
            let any_len = matches!(
                step.op,
                Op::Scale(_) | Op::LogitSoftcap(_) | Op::Softmax { .. }
            );
            let Some(at) = step.inputs.iter().position(|b| matches!(b, BufId::Act(_))) else {
                continue;
            };
            if any_len {
                continue;
            }
            let mut p = plan.clone();
            p.steps.truncate(i + 1);
            let small = p.act(4);
            p.steps[i].inputs[at] = small;
            let r = pollster::block_on(execute(&mut b, &p, &inputs, &held, &mut NoSync));
            assert!(
                r.is_err(),
                "{name}: step {i} {:?} accepted a 1-value input",
                step.op
            );
        }
    }
}
