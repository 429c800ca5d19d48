//! Conformance with llama.cpp on every synthetic model of
//! `tests/fixtures/llamacpp/synthetic/` (prompt logits at all 32 positions,
//! F32 K/V cache as the references) and teacher-forced greedy decoding.

mod model_support;

use hearth::graph::KvType;
use hearth::model::{ForwardModel, LogitsWanted};
use model_support::*;

struct Bounds {
    nrmse: f64,
    top1: f64,
    top20_mean: f64,
    moe_median: Option<f64>,
}

/// Bounds per format, from what llama.cpp's own CPU backend does
/// (fixtures README "Tolerances") and what this backend measures; see the
/// comment on `bounds_for`.
fn bounds_for(name: &str) -> Bounds {
    let moe = name.starts_with("qwen3moe") || name.starts_with("mixtral");
    // Activations are rounded exactly as ggml's CPU backend rounds them, so
    // the remaining differences are f32 summation order and the odd int8
    // value flipped by it. llama.cpp measured itself: rounded activations
    // give 4.7e-4 (F16), 2.1e-4 (BF16), <= 2.3e-2 (quantized). A wrong
    // kernel (a swapped nibble, a bad scale) gives nrmse > 0.3 on these
    // random models, so these bounds catch it with a wide margin.
    let nrmse = if name.ends_with("-F16") {
        2e-3
    } else if name.ends_with("-BF16") {
        1e-2
    } else {
        3e-2
    };
    Bounds {
        nrmse,
        top1: 0.75,
        top20_mean: if moe { 17.0 } else { 18.0 },
        moe_median: moe.then_some(8e-2),
    }
}

fn models() -> Vec<String> {
    synthetic_names()
}

struct Measured {
    nrmse: f64,
    max_abs: f64,
    top1: f64,
    top20_mean: f64,
    median: f64,
}

fn measure(ours: &[f32], reference: &[f32], n_vocab: usize) -> Measured {
    let rows = reference.len() / n_vocab;
    let (mut top1, mut top20) = (0usize, 0usize);
    let mut per_pos = Vec::with_capacity(rows);
    for r in 0..rows {
        let (a, b) = (
            &ours[r * n_vocab..][..n_vocab],
            &reference[r * n_vocab..][..n_vocab],
        );
        top1 += usize::from(argmax(a) == argmax(b));
        top20 += overlap(&top_k(a, 20), &top_k(b, 20));
        per_pos.push(nrmse(a, b));
    }
    per_pos.sort_by(f64::total_cmp);
    let max_abs = ours
        .iter()
        .zip(reference)
        .map(|(a, b)| f64::from((a - b).abs()))
        .fold(0.0, f64::max);
    Measured {
        nrmse: nrmse(ours, reference),
        max_abs,
        top1: top1 as f64 / rows as f64,
        top20_mean: top20 as f64 / rows as f64,
        median: per_pos[rows / 2],
    }
}

#[test]
fn synthetic_prompt_logits_match_llamacpp() {
    let dir = fixtures().join("synthetic");
    let mut failures = Vec::new();
    println!(
        "{:<18} {:>9} {:>8} {:>6} {:>7} {:>9}",
        "model", "nrmse", "max|d|", "top1", "top20", "median"
    );
    for name in models() {
        let meta = read_json(&dir.join(format!("{name}.json")));
        let prompt = ids(&meta["prompt_ids"]);
        let reference = read_f32(&dir.join(format!("{name}.logits.f32")));
        let mut m = load(&synthetic_model(&name), KvType::F32, false, 2, 8);
        let n_vocab = m.config().n_vocab;
        let ours = run_all(&mut m, &prompt, LogitsWanted::All);
        assert_eq!(ours.len(), reference.len(), "{name}");
        let got = measure(&ours, &reference, n_vocab);
        let b = bounds_for(&name);
        println!(
            "{name:<18} {:>9.2e} {:>8.3} {:>5.0}% {:>7.2} {:>9.2e}",
            got.nrmse,
            got.max_abs,
            got.top1 * 100.0,
            got.top20_mean,
            got.median
        );
        let moe_ok = b.moe_median.is_none_or(|m| got.median <= m);
        let dense_ok = b.moe_median.is_some() || got.nrmse <= b.nrmse;
        if !(dense_ok && moe_ok && got.top1 >= b.top1 && got.top20_mean >= b.top20_mean) {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}

/// Largest |ours - llama.cpp| over the listed top-20 logits of a greedy step.
///
/// The fixtures README suggests ~4x the rms logit difference; the measured
/// rms is <= 0.03 (quantized, logit std 1.6), so 0.25 leaves room for a
/// cascaded int8 flip while a wrong kernel (differences of whole logits)
/// still fails.
const STEP_MAX_DIFF: f32 = 0.25;

#[test]
fn synthetic_greedy_teacher_forced() {
    let dir = fixtures().join("synthetic");
    let mut failures = Vec::new();
    for name in models() {
        let meta = read_json(&dir.join(format!("{name}.json")));
        let mut all = ids(&meta["prompt_ids"]);
        let np = all.len();
        let greedy = ids(&meta["greedy_ids"]);
        all.extend_from_slice(&greedy[..greedy.len() - 1]);
        let mut m = load(&synthetic_model(&name), KvType::F32, false, 2, 8);
        let n_vocab = m.config().n_vocab;
        let logits = run_all(&mut m, &all, LogitsWanted::All);
        let (mut worst, mut min_overlap, mut flips) = (0.0f32, 20, 0);
        for (s, step) in meta["greedy_steps"]
            .as_array()
            .expect("steps")
            .iter()
            .enumerate()
        {
            let row = &logits[(np - 1 + s) * n_vocab..][..n_vocab];
            let top = top_list(&step["top"]);
            for &(id, want) in &top {
                worst = worst.max((row[id] - want).abs());
            }
            let reference: Vec<usize> = top.iter().map(|p| p.0).collect();
            min_overlap = min_overlap.min(overlap(&top_k(row, 20), &reference));
            if argmax(row) != top[0].0 {
                flips += 1;
                // A flip is only allowed where llama.cpp's own top-2 is within
                // twice the largest difference we allow.
                if top[0].1 - top[1].1 > 2.0 * STEP_MAX_DIFF {
                    failures.push(format!("{name} step {s}: clear top-1 differs"));
                }
            }
        }
        println!("{name:<18} greedy steps: max |diff| {worst:.4}, min top-20 overlap {min_overlap}, top-1 flips {flips}");
        if worst > STEP_MAX_DIFF || min_overlap < 15 {
            failures.push(format!(
                "{name}: max diff {worst}, min overlap {min_overlap}"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Exact-f32 mode (f32 activations, weight rows expanded on the fly) is the
/// README's "float activations" column: llama.cpp measured numpy float64 at
/// 1.0e-3 (F16), 7.8e-3 (BF16), 2.6e-2 .. 4.4e-2 (quantized dense) against
/// itself, so the bounds are those with a margin.
#[test]
fn synthetic_exact_f32_mode_within_float_tolerance() {
    let dir = fixtures().join("synthetic");
    for (name, bound) in [
        ("llama-F16", 2e-3),
        ("llama-BF16", 1.2e-2),
        ("llama-Q4_K_M", 6e-2),
        ("qwen2-Q8_0", 6e-2),
        ("gemma3-Q4_K_M", 6e-2),
    ] {
        let meta = read_json(&dir.join(format!("{name}.json")));
        let prompt = ids(&meta["prompt_ids"]);
        let reference = read_f32(&dir.join(format!("{name}.logits.f32")));
        let mut m = load(&synthetic_model(name), KvType::F32, true, 2, 8);
        let n_vocab = m.config().n_vocab;
        let got = measure(
            &run_all(&mut m, &prompt, LogitsWanted::All),
            &reference,
            n_vocab,
        );
        println!(
            "exact-f32 {name:<14} nrmse {:.2e} top1 {:.0}%",
            got.nrmse,
            got.top1 * 100.0
        );
        assert!(
            got.nrmse <= bound && got.top1 >= 0.75,
            "{name}: nrmse {} top1 {}",
            got.nrmse,
            got.top1
        );
    }
}
