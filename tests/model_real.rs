//! Conformance with llama.cpp on the two real models (SmolLM2-135M Q4_1,
//! Gemma 3 270M Q4_K_M): every prompt of `tests/fixtures/llamacpp/real/`,
//! run with its greedy continuation teacher-forced in ONE pass.
//!
//! - last prompt position vs `*.last.f32`: nrmse <= 0.1, top-1 equal unless
//!   llama.cpp's top-1/top-2 gap is under the model's clear gap;
//! - every prompt position: top-20 overlap >= 15 with `prompt_pos_top20`;
//! - every greedy step whose llama.cpp gap is at least the clear gap picks
//!   llama.cpp's token (close calls are printed).

mod model_support;

use hearth::graph::KvType;
use std::path::Path;

use hearth::model::{Batch, LogitsWanted, SeqInput};
use model_support::*;

/// Gap under which llama.cpp's own configurations (F16 KV, flash attention)
/// can flip the top-1 (fixtures README: flips at gaps <= 0.27): SmolLM2's.
const CLEAR_GAP: f32 = 0.5;

/// Gemma 3's: its logits move by a few percent with any rounding-level
/// change (a float summation order, re-rounding the int8 activations of the
/// next matmul), and an exact float64 forward differs from llama.cpp's by
/// up to 1.13 on single logits (`crosscheck.json`, SmolLM2: up to 0.76);
/// flips at gaps just over 0.5 are that noise, not a wrong result.
const CLEAR_GAP_GEMMA: f32 = 0.75;

/// Prompts longer than this get the chunked, last-position-only check.
const LONG: usize = 100;

/// Runs `ids` as one sequence: `ids[..first]` as a first chunk without
/// logits, then the rest with logits at every position.
fn run_chunked(m: &mut CpuModel, ids: &[u32], first: usize) -> Vec<f32> {
    let t = table(1, ids.len());
    if first > 0 {
        let s = slots(&t, 0, first);
        let seqs = [SeqInput {
            tokens: &ids[..first],
            start: 0,
            slots: &s,
            block_table: &t,
            logits: LogitsWanted::None,
        }];
        let out = m.forward_sync(&Batch { seqs: &seqs }).expect("first chunk");
        assert!(out.is_empty());
    }
    let s = slots(&t, first, ids.len() - first);
    let seqs = [SeqInput {
        tokens: &ids[first..],
        start: first,
        slots: &s,
        block_table: &t,
        logits: LogitsWanted::All,
    }];
    m.forward_sync(&Batch { seqs: &seqs }).expect("forward")
}

fn gap(top: &[(usize, f32)]) -> f32 {
    top[0].1 - top[1].1
}

/// Checks one prompt; returns (last-position nrmse, close calls, failures).
fn check_prompt(
    m: &mut CpuModel,
    dir: &Path,
    stem: &str,
    clear_gap: f32,
) -> (f64, Vec<String>, Vec<String>) {
    let meta = read_json(&dir.join(format!("{stem}.json")));
    let prompt = ids(&meta["prompt_ids"]);
    let greedy = ids(&meta["greedy_ids"]);
    let n_vocab = meta["n_vocab"].as_u64().expect("n_vocab") as usize;
    let mut all = prompt.clone();
    all.extend_from_slice(&greedy[..greedy.len() - 1]);
    let np = prompt.len();
    // Long prompts: every position's logits would cost minutes of scalar
    // output matmul, so prefill all but the last prompt token in a first
    // chunk without logits (this also checks chunked prefill) and check the
    // all-position top-20 on the short prompts only.
    let first = if np > LONG { np - 1 } else { 0 };
    let logits = run_chunked(m, &all, first);
    let row = |i: usize| &logits[(i - first) * n_vocab..(i - first + 1) * n_vocab];
    let (mut close, mut fail) = (Vec::new(), Vec::new());
    let last = read_f32(&dir.join(format!("{stem}.last.f32")));
    let e = nrmse(row(np - 1), &last);
    let ref_top = top_k(&last, 2);
    if e > 0.1 {
        fail.push(format!("{stem}: last-position nrmse {e:.3e}"));
    }
    if argmax(row(np - 1)) != ref_top[0] && last[ref_top[0]] - last[ref_top[1]] >= clear_gap {
        fail.push(format!("{stem}: last-position top-1 differs"));
    }
    let tops = meta["prompt_pos_top20"].as_array().expect("top20");
    for (i, top) in tops.iter().enumerate().skip(first) {
        let reference: Vec<usize> = top_list(top).iter().map(|p| p.0).collect();
        let ov = overlap(&top_k(row(i), 20), &reference);
        if ov < 15 {
            fail.push(format!("{stem}: position {i} top-20 overlap {ov}"));
        }
    }
    for (s, step) in meta["greedy_steps"]
        .as_array()
        .expect("steps")
        .iter()
        .enumerate()
    {
        let top = top_list(&step["top"]);
        let ours = argmax(row(np - 1 + s));
        if ours != top[0].0 {
            let msg = format!(
                "{stem}: step {s} ours {ours} llama.cpp {} (gap {:.3})",
                top[0].0,
                gap(&top)
            );
            if gap(&top) >= clear_gap {
                fail.push(msg);
            } else {
                close.push(msg);
            }
        }
    }
    (e, close, fail)
}

fn check_model(file: &str, fixture_dir: &str, clear_gap: f32) {
    let path = real_model(file);
    // llama.cpp's references use an F32 cache; `HEARTH_TEST_KV=f16` checks
    // the default F16 cache against the same bounds.
    let kv = match std::env::var("HEARTH_TEST_KV").as_deref() {
        Ok("f16") => KvType::F16,
        _ => KvType::F32,
    };
    let mut m = load(&path, kv, false, 2, 64);
    let dir = fixtures().join("real").join(fixture_dir);
    let mut stems: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixture dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|n| n.strip_suffix(".last.f32").map(str::to_string))
        .collect();
    stems.sort();
    assert_eq!(stems.len(), 8, "{fixture_dir}: expected 8 prompts");
    let mut failures = Vec::new();
    for stem in &stems {
        let t = std::time::Instant::now();
        let (e, close, fail) = check_prompt(&mut m, &dir, stem, clear_gap);
        println!(
            "{fixture_dir} {stem:<20} last nrmse {e:.3e}  ({:.1} s)",
            t.elapsed().as_secs_f64()
        );
        for c in close {
            println!("  close call: {c}");
        }
        failures.extend(fail);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn smollm2_matches_llamacpp() {
    check_model(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct-q4_1",
        CLEAR_GAP,
    );
}

#[test]
fn gemma3_matches_llamacpp() {
    check_model(
        "gemma-3-270m-q4_k_m.gguf",
        "gemma-3-270m-q4_k_m",
        CLEAR_GAP_GEMMA,
    );
}

/// Greedy decode of `steps` tokens after `prompt`, one token per forward
/// (the decode path: matrix-vector products, ~240 short parallel regions
/// per token); returns the tokens and the last step's logits.
fn greedy_decode(m: &mut CpuModel, prompt: &[u32], steps: usize) -> (Vec<u32>, Vec<f32>) {
    let t = table(1, prompt.len() + steps);
    let mut logits = run_chunked_last(m, prompt, &t);
    let mut out = Vec::new();
    for step in 0..steps {
        let next = argmax(&logits) as u32;
        out.push(next);
        let pos = prompt.len() + step;
        let s = slots(&t, pos, 1);
        let tok = [next];
        let seqs = [SeqInput {
            tokens: &tok,
            start: pos,
            slots: &s,
            block_table: &t,
            logits: LogitsWanted::Last,
        }];
        logits = m.forward_sync(&Batch { seqs: &seqs }).expect("decode step");
    }
    (out, logits)
}

/// The prompt's last-position logits (prefill: matrix-matrix products).
fn run_chunked_last(m: &mut CpuModel, prompt: &[u32], t: &[hearth::kv::BlockId]) -> Vec<f32> {
    let s = slots(t, 0, prompt.len());
    let seqs = [SeqInput {
        tokens: prompt,
        start: 0,
        slots: &s,
        block_table: t,
        logits: LogitsWanted::Last,
    }];
    m.forward_sync(&Batch { seqs: &seqs }).expect("prefill")
}

/// One thread and two (the default pool, and rayon's) decode the same
/// greedy tokens; logits agree to rounding (the split of attention over
/// threads changes the order of a few sums).
#[test]
fn smollm2_decodes_the_same_tokens_at_one_and_two_threads() {
    let path = real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = fixtures().join("real").join("smollm2-135m-instruct-q4_1");
    let meta = read_json(&dir.join("prompt-01-story.json"));
    let prompt = ids(&meta["prompt_ids"]);
    let mut one = load(&path, KvType::F16, false, 1, 64);
    let (want, want_logits) = greedy_decode(&mut one, &prompt, 24);
    drop(one);
    for pool in ["spin", "rayon"] {
        std::env::set_var("HEARTH_POOL", pool);
        let mut two = load(&path, KvType::F16, false, 2, 64);
        std::env::remove_var("HEARTH_POOL");
        let (got, logits) = greedy_decode(&mut two, &prompt, 24);
        assert_eq!(got, want, "{pool}: tokens at 2 threads differ from 1");
        let e = nrmse(&logits, &want_logits);
        assert!(
            e < 1e-3,
            "{pool}: last logits nrmse {e:.3e} between 1 and 2 threads"
        );
    }
}
