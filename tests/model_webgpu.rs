//! Whole models on the WebGPU backend: prompt logits of the synthetic F16
//! models against llama.cpp's, the F32 models against the CPU backend,
//! batched decode against single-sequence decode, and the on-device argmax.
//! Lavapipe is slow: shapes stay those of the synthetic models.

mod model_support;
mod webgpu_support;

use hearth::graph::KvType;
use hearth::kv::BlockId;
use hearth::model::{Batch, ForwardModel, LogitsWanted, SeqInput};
use model_support::{
    agreement, argmax, fixtures, ids, nrmse, read_f32, read_json, synthetic_model,
};
use webgpu_support::*;

/// The dense architectures (the MoE ones: tests/model_webgpu_moe.rs).
const ARCHS: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];

#[test]
fn f16_prompt_logits_match_llamacpp() {
    let dir = fixtures().join("synthetic");
    let mut failures = Vec::new();
    for arch in ARCHS {
        let name = format!("{arch}-F16");
        let meta = read_json(&dir.join(format!("{name}.json")));
        let prompt = ids(&meta["prompt_ids"]);
        let reference = read_f32(&dir.join(format!("{name}.logits.f32")));
        let Some(mut m) = load_gpu(&synthetic_model(&name), KvType::F32, 8) else {
            return;
        };
        let nv = m.config().n_vocab;
        let ours = run_all_gpu(&mut m, &prompt, LogitsWanted::All);
        let (e, t1, t20) = agreement(&ours, &reference, nv);
        println!(
            "{name:<12} nrmse {e:.2e} top1 {:.0}% top20 {t20:.2}",
            t1 * 100.0
        );
        // The CPU backend's bounds for F16 (tests/model_synthetic.rs).
        if !(e <= 2e-3 && t1 >= 0.75 && t20 >= 18.0) {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}

#[test]
fn f32_prompt_logits_match_cpu_backend() {
    for arch in ARCHS {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/synthetic-f32/{arch}.F32.gguf"));
        let prompt: Vec<u32> = (0..20).map(|i| 3 + (i * 37) % 200).collect();
        let Some(mut g) = load_gpu(&path, KvType::F16, 8) else {
            return;
        };
        let mut c = model_support::load(&path, KvType::F16, false, 1, 8);
        let ours = run_all_gpu(&mut g, &prompt, LogitsWanted::All);
        let cpu = model_support::run_all(&mut c, &prompt, LogitsWanted::All);
        let e = nrmse(&ours, &cpu);
        println!("{arch:<8} F32 weights, F16 cache: nrmse vs CPU {e:.2e}");
        assert!(e < 1e-4, "{arch}: nrmse {e} against the CPU backend");
    }
}

struct Seq {
    tokens: Vec<u32>,
    start: usize,
    table: Vec<BlockId>,
}

fn step(m: &mut GpuModel, seqs: &[Seq], greedy: bool) -> (Vec<f32>, Vec<u32>) {
    let sl: Vec<_> = seqs
        .iter()
        .map(|s| slots(&s.table, s.start, s.tokens.len()))
        .collect();
    let inputs: Vec<SeqInput<'_>> = seqs
        .iter()
        .zip(&sl)
        .map(|(s, sl)| SeqInput {
            tokens: &s.tokens,
            start: s.start,
            slots: sl,
            block_table: &s.table,
            logits: LogitsWanted::Last,
        })
        .collect();
    let batch = Batch { seqs: &inputs };
    if greedy {
        (
            Vec::new(),
            pollster::block_on(m.run_argmax(&batch)).expect("greedy step"),
        )
    } else {
        (pollster::block_on(m.run(&batch)).expect("step"), Vec::new())
    }
}

/// Two sequences prefilled alone, then decoded together in one batch
/// (in shuffled, non-contiguous blocks), give the logits each gives
/// decoded alone; the on-device argmax picks the logits' argmax.
#[test]
fn batched_decode_equals_single_sequence_decode() {
    let path = synthetic_model("qwen3-F16");
    let Some(mut m) = load_gpu(&path, KvType::F16, 16) else {
        return;
    };
    let nv = m.config().n_vocab;
    let a: Vec<u32> = (0..19).map(|i| 5 + (i * 13) % 300).collect();
    let b: Vec<u32> = (0..6).map(|i| 9 + (i * 29) % 300).collect();
    let ta = vec![BlockId(7), BlockId(2)];
    let tb = vec![BlockId(4)];
    let (solo_a, solo_b) = {
        step(
            &mut m,
            &[Seq {
                tokens: a.clone(),
                start: 0,
                table: ta.clone(),
            }],
            false,
        );
        let sa = step(
            &mut m,
            &[Seq {
                tokens: vec![11],
                start: a.len(),
                table: ta.clone(),
            }],
            false,
        )
        .0;
        step(
            &mut m,
            &[Seq {
                tokens: b.clone(),
                start: 0,
                table: tb.clone(),
            }],
            false,
        );
        let sb = step(
            &mut m,
            &[Seq {
                tokens: vec![12],
                start: b.len(),
                table: tb.clone(),
            }],
            false,
        )
        .0;
        (sa, sb)
    };
    // Decode both together (the K/V of the decoded tokens are rewritten in place).
    let both = [
        Seq {
            tokens: vec![11],
            start: a.len(),
            table: ta.clone(),
        },
        Seq {
            tokens: vec![12],
            start: b.len(),
            table: tb.clone(),
        },
    ];
    let (logits, _) = step(&mut m, &both, false);
    let d = |x: &[f32], y: &[f32]| {
        x.iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0.0f32, f32::max)
    };
    let (da, db) = (d(&logits[..nv], &solo_a), d(&logits[nv..], &solo_b));
    println!("batched vs solo: max |diff| {da:.2e}, {db:.2e}");
    assert!(da < 1e-4 && db < 1e-4, "batched decode differs: {da} {db}");
    let (_, picks) = step(&mut m, &both, true);
    assert_eq!(picks, vec![argmax(&solo_a) as u32, argmax(&solo_b) as u32]);
}
