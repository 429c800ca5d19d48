//! Tokenizer behaviour beyond the llama.cpp corpus: streaming decode of characters split
//! across tokens, error messages, end-of-generation ids and speed on long inputs.

mod tokenizer_support;

use std::time::{Duration, Instant};

use hearth::gguf::{Array, Metadata, Value};
use hearth::model::tokenizer::{StreamDecoder, Tokenizer, TokenizerError, TokenizerKind};
use tokenizer_support::*;

fn smollm2() -> Tokenizer {
    load_tokenizer(&models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}

fn gemma3() -> Tokenizer {
    load_tokenizer(&models_dir().join("gemma-3-270m-q4_k_m.gguf"))
}

fn synthetic() -> Tokenizer {
    load_tokenizer(&llamacpp_fixtures().join("synthetic/models/llama-Q8_0.gguf"))
}

/// Streams `ids` one at a time; returns the chunks emitted.
fn stream(tok: &Tokenizer, ids: &[u32], special: bool) -> Vec<String> {
    let mut dec = StreamDecoder::new(tok, special);
    let mut chunks: Vec<String> = ids.iter().map(|&id| dec.push(id)).collect();
    chunks.push(dec.finish());
    chunks
}

#[test]
fn stream_holds_an_emoji_split_across_byte_tokens() {
    let tok = synthetic();
    // The synthetic vocabulary has no emoji piece: llama.cpp falls back to its 4 bytes.
    let ids = tok.encode("zq 😀 ok", false, false).expect("encode");
    let bytes: Vec<u32> = "😀".bytes().map(|b| u32::from(b) + 3).collect();
    let at = ids
        .windows(4)
        .position(|w| w == bytes.as_slice())
        .expect("byte tokens of the emoji");
    let chunks = stream(&tok, &ids, false);
    assert_eq!(
        &chunks[at..at + 3],
        ["", "", ""],
        "partial character must be held"
    );
    assert!(
        chunks[at + 3].starts_with('😀'),
        "chunk {:?}",
        chunks[at + 3]
    );
    assert_eq!(chunks.concat(), tok.decode(&ids, false, false));
    assert_eq!(chunks.concat(), "zq 😀 ok");
}

#[test]
fn stream_equals_decode_for_every_corpus_string() {
    // SmolLM2 splits CJK and emoji across byte-level BPE tokens; Gemma 3 keeps most whole.
    for (dir, tok) in [
        ("smollm2-135m-instruct-q4_1", smollm2()),
        ("gemma-3-270m-q4_k_m", gemma3()),
    ] {
        let fixture = read_json(
            &llamacpp_fixtures()
                .join("real")
                .join(dir)
                .join("tokenizer.json"),
        );
        let mut split_chars = 0;
        for case in fixture["cases"].as_array().expect("cases") {
            let ids = ids(&case["ids_add1_parse1"]);
            for special in [false, true] {
                let chunks = stream(&tok, &ids, special);
                assert!(
                    chunks.iter().all(|c| !c.contains('\u{FFFD}')),
                    "{dir}: replacement char in {chunks:?}"
                );
                assert_eq!(
                    chunks.concat(),
                    tok.decode(&ids, false, special),
                    "{dir} {}",
                    case["text"]
                );
                split_chars += ids
                    .iter()
                    .filter(|&&id| std::str::from_utf8(&tok.token_to_piece(id, special)).is_err())
                    .count();
            }
        }
        println!("{dir}: {split_chars} pieces that are not whole UTF-8");
        if dir.starts_with("smollm2") {
            assert!(
                split_chars > 10,
                "the corpus should exercise split characters"
            );
        }
    }
}

#[test]
fn stream_flushes_a_dangling_partial_character() {
    let tok = synthetic();
    let first_byte_of_emoji = u32::from("😀".as_bytes()[0]) + 3;
    let mut dec = StreamDecoder::new(&tok, false);
    assert_eq!(dec.push(first_byte_of_emoji), "");
    assert_eq!(dec.finish(), "\u{FFFD}");
}

#[test]
fn special_ids_and_end_of_generation() {
    let s = smollm2();
    assert_eq!(
        s.kind(),
        TokenizerKind::Bpe {
            pre: "smollm".into()
        }
    );
    assert!(
        s.is_eog(0) && s.is_eog(2),
        "<|endoftext|> and <|im_end|> end generation"
    );
    assert!(!s.is_eog(1));
    assert_eq!(s.token_text(1), Some("<|im_start|>"));
    let g = gemma3();
    assert_eq!(g.kind(), TokenizerKind::Spm);
    assert!(
        g.is_eog(1) && g.is_eog(106),
        "<eos> and <end_of_turn> end generation"
    );
    assert!(g.is_control(2) && !g.is_control(107));
    assert_eq!(
        g.encode("<bos>hi", true, true).expect("encode")[..2],
        [2, 2]
    );
    // Control tokens render only with `special`.
    assert_eq!(g.token_to_piece(106, false), b"");
    assert_eq!(g.token_to_piece(106, true), b"<end_of_turn>");
}

fn bpe_metadata(pre: &str) -> Metadata {
    let mut md = Metadata::new();
    md.set("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.set("tokenizer.ggml.pre", Value::String(pre.into()));
    let tokens = ["a", "b", "ab", "\u{120}"].map(String::from).to_vec();
    md.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    md.set(
        "tokenizer.ggml.merges",
        Value::Array(Array::String(vec!["a b".into()])),
    );
    md
}

#[test]
fn unknown_pre_tokenizer_is_a_clear_error() {
    let err = Tokenizer::from_metadata(&bpe_metadata("no-such-pre")).expect_err("must fail");
    assert!(matches!(err, TokenizerError::UnsupportedPre { .. }));
    let msg = err.to_string();
    for name in [
        "no-such-pre",
        "llama-bpe",
        "smollm",
        "qwen2",
        "deepseek-r1-qwen",
        "gpt-2",
        "default",
    ] {
        assert!(msg.contains(name), "message {msg:?} should name {name}");
    }
    let mut md = bpe_metadata("gpt-2");
    md.set("tokenizer.ggml.model", Value::String("bert".into()));
    assert!(matches!(
        Tokenizer::from_metadata(&md),
        Err(TokenizerError::UnsupportedModel(_))
    ));
    md.remove("tokenizer.ggml.model");
    assert!(matches!(
        Tokenizer::from_metadata(&md),
        Err(TokenizerError::MissingKey(_))
    ));
}

#[test]
fn tiny_bpe_vocab_merges_and_falls_back() {
    let tok = Tokenizer::from_metadata(&bpe_metadata("gpt-2")).expect("tokenizer");
    assert_eq!(tok.encode("ab", false, false).expect("encode"), [2]);
    assert_eq!(
        tok.encode("ba b", false, false).expect("encode"),
        [1, 0, 3, 1]
    );
    // Characters without tokens are dropped byte by byte, as llama.cpp does.
    assert_eq!(tok.encode("aéb", false, false).expect("encode"), [0, 1]);
    assert_eq!(tok.decode(&[2, 3, 0], false, false), "ab a");
}

/// ~100 KB of mixed text plus pathological inputs (one huge word, long whitespace runs,
/// runs of `<`, the prefix of many special tokens).
fn long_inputs() -> Vec<(&'static str, String)> {
    let fixture = read_json(&llamacpp_fixtures().join("real/gemma-3-270m-q4_k_m/tokenizer.json"));
    let mut mixed = String::new();
    let texts: Vec<&str> = fixture["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect();
    while mixed.len() < 100_000 {
        for t in &texts {
            mixed.push_str(t);
            mixed.push(' ');
        }
    }
    vec![
        ("mixed", mixed),
        ("one word", "a".repeat(100_000)),
        ("spaces", " ".repeat(100_000)),
        ("newlines", "\n".repeat(100_000)),
        ("angle brackets", "<".repeat(100_000)),
        ("digits", "7".repeat(100_000)),
    ]
}

#[test]
fn long_inputs_are_fast() {
    let limit = Duration::from_secs(if cfg!(debug_assertions) { 20 } else { 2 });
    for (name, tok) in [("smollm2", smollm2()), ("gemma3", gemma3())] {
        for (what, text) in long_inputs() {
            let t = Instant::now();
            let ids = tok.encode(&text, true, true).expect("encode");
            let took = t.elapsed();
            println!(
                "{name} {what}: {} bytes -> {} tokens in {took:?}",
                text.len(),
                ids.len()
            );
            assert!(took < limit, "{name} {what} took {took:?}");
            assert!(!ids.is_empty());
            assert_eq!(
                tok.decode(&ids, true, true).len(),
                text.len(),
                "{name} {what} round trip length"
            );
        }
    }
}

#[test]
fn long_prompt_speed() {
    for dir in ["smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m"] {
        let p = read_json(
            &llamacpp_fixtures()
                .join("real")
                .join(dir)
                .join("prompt-07-long.json"),
        );
        let text = String::from_utf8(unhex(p["prompt_hex"].as_str().expect("hex"))).expect("utf-8");
        let tok = if dir.starts_with("smollm2") {
            smollm2()
        } else {
            gemma3()
        };
        let runs = 50;
        let t = Instant::now();
        let mut n = 0;
        for _ in 0..runs {
            n = tok.encode(&text, true, true).expect("encode").len();
        }
        let per = t.elapsed() / runs;
        let per100 = per * 100 / n as u32;
        println!("{dir}: {n} tokens in {per:?} ({per100:?} per 100 tokens)");
        assert!(per100 < Duration::from_millis(if cfg!(debug_assertions) { 20 } else { 2 }));
    }
}

#[test]
fn load_time() {
    for file in [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ] {
        let path = models_dir().join(file);
        let (f, _src) = hearth::gguf::open_path(&path).expect("open");
        let t = Instant::now();
        let tok = Tokenizer::from_metadata(&f.metadata).expect("tokenizer");
        println!(
            "{file}: {} tokens, tokenizer built in {:?}",
            tok.vocab_size(),
            t.elapsed()
        );
    }
}

#[test]
fn debug_output_is_a_summary() {
    let s = format!("{:?}", smollm2());
    assert!(
        s.contains("vocab_size: 49152") && s.contains("smollm"),
        "{s}"
    );
    assert!(s.len() < 300, "{s}");
}

#[test]
fn continuation_stream_keeps_the_leading_space_of_its_first_piece() {
    let tok = smollm2();
    let ids = tok.encode(" Paris is", false, false).unwrap();
    let mut fresh = StreamDecoder::new(&tok, false);
    let mut cont = StreamDecoder::continuation(&tok, false);
    let a: String = ids.iter().map(|&id| fresh.push(id)).collect();
    let b: String = ids.iter().map(|&id| cont.push(id)).collect();
    assert_eq!(b, " Paris is");
    // SmolLM2 adds no space prefix, so both agree there; the SPM model differs.
    assert_eq!(a, b);
    let spm = synthetic();
    let ids = spm.encode("hello world", false, false).unwrap();
    let mut fresh = StreamDecoder::new(&spm, false);
    let mut cont = StreamDecoder::continuation(&spm, false);
    let a: String = ids.iter().map(|&id| fresh.push(id)).collect();
    let b: String = ids.iter().map(|&id| cont.push(id)).collect();
    assert_eq!(a, "hello world");
    assert_eq!(b, " hello world");
}
