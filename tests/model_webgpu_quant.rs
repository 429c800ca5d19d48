//! Quantized synthetic models on the WebGPU backend: prompt logits against
//! llama.cpp's and against the CPU backend's exact-f32 mode. A handful of
//! formats and architectures: lavapipe is slow. The per-format kernels are
//! tested one by one in the library (`backend::webgpu::quant` tests).
//!
//! The prompt's matrix products run on the tiled kernel, which multiplies
//! dequantized weights by float activations (f16 tiles where the adapter
//! has f16), not by activations quantized as ggml's CPU backend quantizes
//! them. The fixtures README measures that difference alone at nrmse
//! 2.6e-2 .. 4.4e-2 on these models, so the bounds are those of the CPU
//! backend's exact-f32 mode (tests/model_synthetic.rs), and the tight check
//! is against that mode.

mod model_support;
mod webgpu_support;

use hearth::backend::webgpu::{GpuCounters, GpuOptions, GpuProfile};
use hearth::graph::KvType;
use hearth::model::{Batch, ForwardModel, LogitsWanted, SeqInput};
use model_support::{
    agreement, argmax, fixtures, ids, nrmse, read_f32, read_json, synthetic_model,
};
use webgpu_support::*;

/// Formats covering the block families (legacy 4-bit, 8-bit, k-quants with
/// 4- and 6-bit, a non-linear table) over three architectures.
const MODELS: [&str; 6] = [
    "llama-Q4_0",
    "llama-Q4_K_M",
    "llama-Q6_K",
    "llama-IQ4_NL",
    "gemma3-Q8_0",
    "qwen3-Q4_K_M",
];

/// Bound against the CPU's exact-f32 mode: the same math up to f16
/// rounding of the tiles and summation order (measured 1.3e-3 .. 1.7e-3).
const VS_CPU: f64 = 5e-3;

#[test]
fn quantized_prompt_logits_match_llamacpp() {
    let dir = fixtures().join("synthetic");
    let mut failures = Vec::new();
    for name in MODELS {
        let meta = read_json(&dir.join(format!("{name}.json")));
        let prompt = ids(&meta["prompt_ids"]);
        let reference = read_f32(&dir.join(format!("{name}.logits.f32")));
        let Some(mut m) = load_gpu(&synthetic_model(name), KvType::F32, 8) else {
            return;
        };
        let nv = m.config().n_vocab;
        let ours = run_all_gpu(&mut m, &prompt, LogitsWanted::All);
        let mut c = model_support::load(&synthetic_model(name), KvType::F32, true, 2, 8);
        let cpu = model_support::run_all(&mut c, &prompt, LogitsWanted::All);
        let vs_cpu = nrmse(&ours, &cpu);
        let (e, t1, t20) = agreement(&ours, &reference, nv);
        println!(
            "{name:<14} nrmse {e:.2e} top1 {:.0}% top20 {t20:.2}; vs CPU exact-f32 {vs_cpu:.2e}",
            t1 * 100.0
        );
        // A wrong kernel gives nrmse > 0.3 on these random models.
        if !(e <= 6e-2 && t1 >= 0.75 && t20 >= 18.0 && vs_cpu <= VS_CPU) {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}

/// Decode runs the matrix-vector kernels (int8 dot products where the
/// adapter has them, activations quantized per 32 values): its logits
/// match the CPU backend's, which quantizes activations as ggml does.
#[test]
fn quantized_decode_logits_match_cpu_backend() {
    let prompt: Vec<u32> = (0..7).map(|i| 3 + (i * 41) % 250).collect();
    let next = [17, 230, 5, 99];
    for name in ["llama-Q4_K_M", "llama-Q4_0", "gemma3-Q8_0"] {
        let path = synthetic_model(name);
        let Some(mut g) = load_gpu(&path, KvType::F16, 8) else {
            return;
        };
        let mut c = model_support::load(&path, KvType::F16, false, 2, 8);
        let ours = decode(&mut g, &prompt, &next);
        let cpu = decode(&mut c, &prompt, &next);
        let nv = g.config().n_vocab;
        assert_eq!(ours.len(), next.len() * nv, "{name}");
        let e = nrmse(&ours, &cpu);
        let same_top1 = (0..next.len())
            .filter(|&r| argmax(&ours[r * nv..][..nv]) == argmax(&cpu[r * nv..][..nv]))
            .count();
        println!("{name:<14} decode vs CPU: nrmse {e:.2e}, top1 {same_top1}/4");
        // Both quantize activations to 8 bits (per 32 values here, per
        // block of the weight's dot type there), and these random models
        // amplify rounding (lavapipe: 1.9e-2 .. 4.2e-2); a wrong kernel is > 0.3.
        assert!(
            e < 8e-2 && same_top1 >= 3,
            "{name}: nrmse {e}, top1 {same_top1}/4"
        );
    }
}

/// Runs the 5-token prompt, then 3 single-token decode steps; returns the
/// counters of each step.
fn prompt_then_decode(m: &mut GpuModel) -> Vec<GpuCounters> {
    let prompt: Vec<u32> = (0..5).map(|i| 7 + i * 19).collect();
    let tbl = table(1, 2);
    let mut deltas = Vec::new();
    for i in 0..4 {
        let before = m.backend().counters();
        let (tokens, start) = if i == 0 {
            (prompt.clone(), 0)
        } else {
            (vec![40 + i as u32], prompt.len() + i - 1)
        };
        let sl = slots(&tbl, start, tokens.len());
        let seq = [SeqInput {
            tokens: &tokens,
            start,
            slots: &sl,
            block_table: &tbl,
            logits: LogitsWanted::Last,
        }];
        let picks = pollster::block_on(m.run_argmax(&Batch { seqs: &seq })).expect("step");
        assert_eq!(picks.len(), 1);
        deltas.push(m.backend().counters().since(&before));
    }
    for (i, d) in deltas.iter().enumerate() {
        println!("step {i}: {d}");
    }
    deltas
}

/// Once warm, a decode step creates no buffer and no bind group, and is one
/// submission with one readback (`HEARTH_PROFILE=gpu` prints these counts).
#[test]
fn warm_decode_step_is_one_submission_creating_nothing() {
    let Some(mut m) = load_gpu(&synthetic_model("llama-Q4_K_M"), KvType::F16, 8) else {
        return;
    };
    assert!(m.backend().profile_report().is_none(), "profiling is off");
    let deltas = prompt_then_decode(&mut m);
    let warm = deltas[3];
    assert_eq!((warm.submits, warm.readbacks), (1, 1), "{warm}");
    assert_eq!(
        (warm.buffers_created, warm.bind_groups_created),
        (0, 0),
        "{warm}"
    );
    assert!(warm.dispatches > 10, "{warm}");
}

/// Profiling groups the steps by token rows, times each, and (lavapipe has
/// timestamp queries inside passes) charges GPU time to kernel kinds; a
/// warm step is still one submission creating nothing.
#[test]
fn profiled_steps_report_host_and_kernel_times() {
    let opts = GpuOptions {
        profile: GpuProfile::Full,
        ..gpu_options()
    };
    let Some(mut m) = load_gpu_with(&synthetic_model("llama-Q4_K_M"), KvType::F16, 8, &opts) else {
        return;
    };
    let deltas = prompt_then_decode(&mut m);
    let warm = deltas[3];
    assert_eq!((warm.submits, warm.bind_groups_created), (1, 0), "{warm}");
    let ctx = m.backend().context();
    let lavapipe = ctx.caps.adapter_name.contains("llvmpipe");
    let timestamps = ctx.timestamps;
    let report = m.backend().profile_report().expect("profiling is on");
    println!("{report}");
    assert!(
        timestamps || !lavapipe,
        "lavapipe has timestamp queries inside passes"
    );
    let per_step = format!("steps of 1 rows: 3 steps, {}.0 dispatches", warm.dispatches);
    assert!(report.contains(&per_step), "wanted `{per_step}`");
    assert!(report.contains("steps of 5 rows: 1 steps"));
    if !timestamps {
        return;
    }
    // The decode group's kernel lines: calls per step add up to the
    // step's dispatches, and the matrix-vector products take time.
    let decode = report
        .split("steps of ")
        .find(|g| g.starts_with("1 rows"))
        .expect("decode group");
    let mut calls = 0.0;
    let mut matvec_us = 0.0;
    for line in decode.lines().skip(2) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (c, us): (f64, f64) = (f[1].parse().expect("calls"), f[2].parse().expect("us"));
        calls += c;
        if f[0].starts_with("matvec") {
            matvec_us += us;
        }
    }
    assert_eq!(calls, warm.dispatches as f64, "{decode}");
    assert!(matvec_us > 0.0, "{decode}");
    for kind in ["norm_quantize", "attention", "rope", "kv_write"] {
        assert!(decode.contains(kind), "no {kind} in {decode}");
    }
}

/// A step submitted in pieces (the GPU starts while the host records the
/// rest) computes exactly what one submission does, still with one
/// readback per step.
#[test]
fn decode_in_pieces_equals_one_submission() {
    let prompt: Vec<u32> = (0..6).map(|i| 11 + (i * 37) % 250).collect();
    let next = [23, 140, 7];
    let path = synthetic_model("llama-Q4_K_M");
    let mut runs = Vec::new();
    for every in [0, 5] {
        let opts = GpuOptions {
            submit_every: Some(every),
            ..gpu_options()
        };
        let Some(mut m) = load_gpu_with(&path, KvType::F16, 8, &opts) else {
            return;
        };
        let before = m.backend().counters();
        let logits = decode(&mut m, &prompt, &next);
        let d = m.backend().counters().since(&before);
        println!("submit every {every}: {d}");
        // Prefill and the decode steps: one readback per decode step.
        assert_eq!(d.readbacks, next.len() as u64, "{d}");
        let steps = 1 + next.len() as u64;
        if every == 0 {
            assert_eq!(d.submits, steps, "{d}");
        } else {
            assert!(d.submits >= steps * 4, "{d}");
        }
        runs.push(logits);
    }
    assert_eq!(
        runs[0], runs[1],
        "logits differ between pieces and one submission"
    );
}

/// A decode-only interval (the tune probe's) pieces the decode steps and
/// leaves prompt steps of more than `DECODE_TOKENS` tokens whole; the
/// logits are those of one submission a step.
#[test]
fn a_decode_interval_pieces_decode_steps_alone() {
    use hearth::backend::webgpu::DECODE_TOKENS;
    let prompt: Vec<u32> = (0..DECODE_TOKENS as u32 + 4)
        .map(|i| 11 + (i * 37) % 250)
        .collect();
    let next = [23, 140];
    let path = synthetic_model("llama-Q4_K_M");
    let opts = GpuOptions {
        submit_every: Some(0),
        ..gpu_options()
    };
    let Some(mut whole) = load_gpu_with(&path, KvType::F16, 8, &opts) else {
        return;
    };
    let want = decode(&mut whole, &prompt, &next);
    let Some(mut m) = load_gpu_with(&path, KvType::F16, 8, &opts) else {
        return;
    };
    m.backend_mut().set_decode_submit_every(Some(5));
    let before = m.backend().counters();
    let got = decode(&mut m, &prompt, &next[..0]);
    let prefill = m.backend().counters().since(&before);
    assert_eq!(prefill.submits, 1, "the prompt step stays whole: {prefill}");
    drop(got);
    let Some(mut m) = load_gpu_with(&path, KvType::F16, 8, &opts) else {
        return;
    };
    m.backend_mut().set_decode_submit_every(Some(5));
    let before = m.backend().counters();
    let got = decode(&mut m, &prompt, &next);
    let d = m.backend().counters().since(&before);
    assert!(
        d.submits > 4 * next.len() as u64,
        "decode steps in pieces: {d}"
    );
    assert_eq!(got, want, "logits differ between pieces and one submission");
}
