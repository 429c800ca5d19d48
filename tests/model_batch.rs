//! Batch invariants: sequences batched together (different lengths, a decode
//! step beside prefills, non-contiguous blocks in shuffled order) give the
//! same logits as each run alone, and a prompt prefilled in two chunks gives
//! the same logits as one pass. F16 K/V cache (the default).

mod model_support;

use hearth::graph::KvType;
use hearth::kv::BlockId;
use hearth::model::{Batch, LogitsWanted, SeqInput};
use model_support::*;

const MODELS: [&str; 4] = [
    "llama-Q4_K_M",
    "qwen2-Q8_0",
    "qwen3moe-Q4_K_M",
    "gemma3-Q8_0",
];

fn model(name: &str) -> CpuModel {
    let path = fixtures().join(format!("synthetic/models/{name}.gguf"));
    load(&path, KvType::F16, false, 2, 32)
}

struct Seq {
    tokens: Vec<u32>,
    start: usize,
    table: Vec<BlockId>,
    wanted: LogitsWanted,
}

fn forward(m: &mut CpuModel, seqs: &[Seq]) -> Vec<f32> {
    let slots: Vec<_> = seqs
        .iter()
        .map(|s| slots(&s.table, s.start, s.tokens.len()))
        .collect();
    let inputs: Vec<SeqInput<'_>> = seqs
        .iter()
        .zip(&slots)
        .map(|(s, sl)| SeqInput {
            tokens: &s.tokens,
            start: s.start,
            slots: sl,
            block_table: &s.table,
            logits: s.wanted,
        })
        .collect();
    m.forward_sync(&Batch { seqs: &inputs }).expect("forward")
}

fn blocks(ids: &[u32]) -> Vec<BlockId> {
    ids.iter().map(|&b| BlockId(b)).collect()
}

fn ids(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i * 97 + seed * 31) % 500)
        .collect()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn batched_sequences_match_each_alone() {
    for name in MODELS {
        let mut m = model(name);
        let (a, b, c) = (ids(1, 20), ids(2, 7), ids(3, 13));
        // C's first 12 tokens are already cached; its 13th is a decode step.
        let seq_a = |t: &[u32]| Seq {
            tokens: a.clone(),
            start: 0,
            table: blocks(t),
            wanted: LogitsWanted::All,
        };
        let seq_b = |t: &[u32]| Seq {
            tokens: b.clone(),
            start: 0,
            table: blocks(t),
            wanted: LogitsWanted::Last,
        };
        let prefill_c = |t: &[u32]| Seq {
            tokens: c[..12].to_vec(),
            start: 0,
            table: blocks(t),
            wanted: LogitsWanted::None,
        };
        let decode_c = |t: &[u32]| Seq {
            tokens: c[12..].to_vec(),
            start: 12,
            table: blocks(t),
            wanted: LogitsWanted::Last,
        };
        forward(&mut m, &[prefill_c(&[21])]);
        let alone: Vec<f32> = [
            forward(&mut m, &[seq_a(&[9, 3])]),
            forward(&mut m, &[seq_b(&[5])]),
            forward(&mut m, &[decode_c(&[21])]),
        ]
        .concat();
        forward(&mut m, &[prefill_c(&[17])]);
        let batched = forward(&mut m, &[seq_a(&[12, 30]), seq_b(&[2]), decode_c(&[17])]);
        let d = max_diff(&batched, &alone);
        println!("{name}: batched vs alone max |diff| {d:e}");
        assert!(d <= 1e-5, "{name}: batched logits differ by {d}");
    }
}

#[test]
fn chunked_prefill_matches_one_pass() {
    for name in MODELS {
        let mut m = model(name);
        let p = ids(4, 29);
        let one = forward(
            &mut m,
            &[Seq {
                tokens: p.clone(),
                start: 0,
                table: blocks(&[4, 8]),
                wanted: LogitsWanted::All,
            }],
        );
        let mut two = forward(
            &mut m,
            &[Seq {
                tokens: p[..11].to_vec(),
                start: 0,
                table: blocks(&[11, 6]),
                wanted: LogitsWanted::All,
            }],
        );
        two.extend(forward(
            &mut m,
            &[Seq {
                tokens: p[11..].to_vec(),
                start: 11,
                table: blocks(&[11, 6]),
                wanted: LogitsWanted::All,
            }],
        ));
        let d = max_diff(&one, &two);
        println!("{name}: chunked vs one pass max |diff| {d:e}");
        assert!(d <= 1e-5, "{name}: chunked prefill differs by {d}");
    }
}

#[test]
fn batch_errors_are_values() {
    let mut m = model("llama-Q4_0");
    let t = blocks(&[1]);
    let s = slots(&t, 0, 2);
    let bad_token = [SeqInput {
        tokens: &[1, 100_000],
        start: 0,
        slots: &s,
        block_table: &t,
        logits: LogitsWanted::Last,
    }];
    let err = m
        .forward_sync(&Batch { seqs: &bad_token })
        .expect_err("token outside the vocabulary");
    assert!(err.to_string().contains("100000"), "{err}");
    let few_slots = [SeqInput {
        tokens: &[1, 2, 3],
        start: 0,
        slots: &s,
        block_table: &t,
        logits: LogitsWanted::Last,
    }];
    assert!(m.forward_sync(&Batch { seqs: &few_slots }).is_err());
    let empty = [SeqInput {
        tokens: &[],
        start: 0,
        slots: &[],
        block_table: &t,
        logits: LogitsWanted::Last,
    }];
    assert!(m.forward_sync(&Batch { seqs: &empty }).is_err());
    let s = slots(&t, 0, 2);
    let short_table = [SeqInput {
        tokens: &[1, 2],
        start: 20,
        slots: &s,
        block_table: &t,
        logits: LogitsWanted::Last,
    }];
    let err = m
        .forward_sync(&Batch { seqs: &short_table })
        .expect_err("table too short");
    assert!(err.to_string().contains("block table"), "{err}");
}
