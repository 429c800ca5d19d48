//! A rough timing of prefill and decode on SmolLM2-135M (not a test of
//! correctness; `cargo test --test model_speed -- --ignored --nocapture`).

mod model_support;

use hearth::model::{Batch, KvType, LogitsWanted, SeqInput};
use model_support::*;

fn time_model(file: &str, threads: usize, n_prompt: usize, n_decode: usize) {
    let mut m = load(&real_model(file), KvType::F16, false, threads, 64);
    let ids: Vec<u32> = (0..n_prompt as u32).map(|i| 100 + i * 7).collect();
    let t = table(1, n_prompt + n_decode);
    let s = slots(&t, 0, n_prompt);
    let start = std::time::Instant::now();
    let seqs = [SeqInput {
        tokens: &ids,
        start: 0,
        slots: &s,
        block_table: &t,
        logits: LogitsWanted::Last,
    }];
    m.forward_sync(&Batch { seqs: &seqs }).expect("prefill");
    let prefill = start.elapsed().as_secs_f64();
    let start = std::time::Instant::now();
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
    let decode = start.elapsed().as_secs_f64();
    println!(
        "{file} threads {threads}: prefill {:.1} tok/s ({n_prompt} tokens), decode {:.1} tok/s",
        n_prompt as f64 / prefill,
        n_decode as f64 / decode
    );
}

#[test]
#[ignore = "timing, not a test"]
fn smollm2_speed() {
    for threads in [1, 2] {
        time_model("SmolLM2-135M-Instruct.Q4_1.gguf", threads, 128, 16);
    }
}
