//! A rough timing of prefill and decode on SmolLM2-135M (not a test of
//! correctness; `cargo test --test model_speed -- --ignored --nocapture`).

mod model_support;

use hearth::graph::KvType;
use hearth::model::{Batch, LogitsWanted, SeqInput};
use model_support::*;

/// CPU seconds this process has used (Linux `/proc/self/stat`, 100 Hz ticks);
/// 0 elsewhere. On a shared machine it measures work, where wall time
/// measures the neighbours too.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the ")".
    (f.get(10).copied().unwrap_or(0.0) + f.get(11).copied().unwrap_or(0.0)) / 100.0
}

fn time_model(file: &str, threads: usize, n_prompt: usize, n_decode: usize) {
    let mut m = load(&real_model(file), KvType::F16, false, threads, 64);
    let ids: Vec<u32> = (0..n_prompt as u32).map(|i| 100 + i * 7).collect();
    let t = table(1, n_prompt + n_decode);
    let s = slots(&t, 0, n_prompt);
    let (start, cpu0) = (std::time::Instant::now(), cpu_seconds());
    let seqs = [SeqInput {
        tokens: &ids,
        start: 0,
        slots: &s,
        block_table: &t,
        logits: LogitsWanted::Last,
    }];
    m.forward_sync(&Batch { seqs: &seqs }).expect("prefill");
    let (prefill, prefill_cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    let (start, cpu0) = (std::time::Instant::now(), cpu_seconds());
    for i in 0..n_decode {
        let tok = [200 + i as u32];
        let s = slots(&t, n_prompt + i, 1);
        let seqs = [SeqInput {
            tokens: &tok,
            start: n_prompt + i,
            slots: &s,
            block_table: &t,
            logits: LogitsWanted::Last,
        }];
        m.forward_sync(&Batch { seqs: &seqs }).expect("decode");
    }
    let (decode, decode_cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    println!(
        "{file} threads {threads}: prefill {:.1} tok/s wall, {:.1} tok per CPU-s ({n_prompt} tokens); \
         decode {:.1} tok/s wall, {:.1} tok per CPU-s",
        n_prompt as f64 / prefill,
        n_prompt as f64 / prefill_cpu,
        n_decode as f64 / decode,
        n_decode as f64 / decode_cpu,
    );
}

#[test]
#[ignore = "timing, not a test"]
fn smollm2_speed() {
    for threads in [1, 2] {
        time_model("SmolLM2-135M-Instruct.Q4_1.gguf", threads, 128, 16);
    }
}
