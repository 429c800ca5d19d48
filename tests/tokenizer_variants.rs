//! Differential test against llama.cpp on a stress corpus (edge cases and seeded random
//! mixes of scripts, digits, whitespace and special-token text) for every tokenizer
//! variant: both real models, the synthetic SPM vocabulary with and without a space
//! prefix, and SmolLM2's BPE vocabulary under each supported pre-tokenizer family.
//! Fixture: `tests/fixtures/tokenizer/variants.json` (see the README there).

mod tokenizer_support;

use std::path::{Path, PathBuf};

use hearth::gguf::{Metadata, Value};
use hearth::model::tokenizer::Tokenizer;
use tokenizer_support::*;

fn base_model(base: &str) -> PathBuf {
    let synthetic = llamacpp_fixtures().join("synthetic/models");
    match base {
        "smollm2" => models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf"),
        "gemma3" => models_dir().join("gemma-3-270m-q4_k_m.gguf"),
        "synthetic-llama" => synthetic.join("llama-Q8_0.gguf"),
        "synthetic-gemma3" => synthetic.join("gemma3-Q8_0.gguf"),
        other => panic!("unknown base model {other} in variants.json"),
    }
}

fn metadata(path: &Path) -> Metadata {
    assert!(
        path.exists(),
        "model {} not found: run `make setup` (or set HEARTH_MODELS)",
        path.display()
    );
    let (file, _src) =
        hearth::gguf::open_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.metadata
}

#[test]
fn every_variant_matches_llamacpp_on_the_stress_corpus() {
    let fixture = read_json(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/variants.json"),
    );
    let strings: Vec<String> = fixture["strings_hex"]
        .as_array()
        .expect("strings_hex")
        .iter()
        .map(|h| String::from_utf8(unhex(h.as_str().unwrap_or(""))).expect("utf-8"))
        .collect();
    let mut failures = Vec::new();
    let mut bases: Vec<(String, Metadata)> = Vec::new();
    for variant in fixture["variants"].as_array().expect("variants") {
        let name = variant["name"].as_str().unwrap_or("?");
        let base = variant["base"].as_str().unwrap_or("?");
        if !bases.iter().any(|(b, _)| b == base) {
            bases.push((base.to_string(), metadata(&base_model(base))));
        }
        let mut md = bases
            .iter()
            .find(|(b, _)| b == base)
            .map(|(_, m)| m.clone())
            .expect("base");
        if let Some(pre) = variant["set_pre"].as_str() {
            md.set("tokenizer.ggml.pre", Value::String(pre.to_string()));
        }
        for key in variant["remove_keys"].as_array().into_iter().flatten() {
            md.remove(key.as_str().unwrap_or(""));
        }
        let tok = Tokenizer::from_metadata(&md).unwrap_or_else(|e| panic!("{name}: {e}"));
        let cases = variant["cases"].as_array().expect("cases");
        let mut ok = 0;
        for (text, case) in strings.iter().zip(cases) {
            let mut good = true;
            for (m, want) in case["ids"].as_array().expect("ids").iter().enumerate() {
                let got = tok.encode(text, m >= 2, m & 1 == 1).expect("encode");
                if got != ids(want) {
                    good = false;
                    failures.push(format!(
                        "{name} mode {m} {text:?}\n  got:  {got:?}\n  want: {:?}",
                        ids(want)
                    ));
                }
            }
            let d01 = hex(&tok.decode_bytes(&ids(&case["ids"][1]), false, true));
            let d11 = hex(&tok.decode_bytes(&ids(&case["ids"][3]), true, false));
            for (got, key) in [(d01, "detok01_hex"), (d11, "detok11_hex")] {
                if got != case[key].as_str().unwrap_or("") {
                    good = false;
                    failures.push(format!(
                        "{name} {key} {text:?}\n  got:  {got}\n  want: {}",
                        case[key]
                    ));
                }
            }
            ok += usize::from(good);
        }
        println!("{name}: {ok}/{}", cases.len());
    }
    for f in failures.iter().take(12) {
        eprintln!("MISMATCH {f}");
    }
    assert!(
        failures.is_empty(),
        "{} mismatches with llama.cpp (first ones above)",
        failures.len()
    );
}
