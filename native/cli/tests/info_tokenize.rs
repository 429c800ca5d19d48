//! `hearth info` and `hearth tokenize` on the two real test models.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn model(name: &str) -> PathBuf {
    let dir = std::env::var_os("HEARTH_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models"));
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `make setup`",
        path.display()
    );
    path
}

fn hearth(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("run hearth");
    assert!(
        out.status.success(),
        "hearth {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

#[test]
fn info_json_describes_both_models() {
    // (file, arch, layers, embedding, heads, kv heads, vocab, tokenizer)
    let cases = [
        (SMOLLM2, "llama", 30, 576, 9, 3, 49152, "Bpe"),
        (GEMMA3, "gemma3", 18, 640, 4, 1, 262144, "Spm"),
    ];
    for (file, arch, layers, embd, heads, kv, vocab, tok) in cases {
        let path = model(file);
        let info: Value =
            serde_json::from_str(&hearth(&["info", "--json", path.to_str().expect("path")]))
                .expect("one JSON object");
        assert_eq!(info["architecture"], arch, "{file}");
        assert_eq!(info["layers"], layers, "{file}");
        assert_eq!(info["embedding"], embd, "{file}");
        assert_eq!(info["heads"], heads, "{file}");
        assert_eq!(info["kv_heads"], kv, "{file}");
        assert_eq!(info["vocab"], vocab, "{file}");
        assert!(
            info["tokenizer"]
                .as_str()
                .expect("tokenizer")
                .starts_with(tok),
            "{file}"
        );
        let size = std::fs::metadata(&path).expect("stat").len();
        assert_eq!(info["file_bytes"], size, "{file}");
        // The type histogram accounts for every tensor and fits in the file.
        let types = info["types"].as_object().expect("types");
        let tensors: u64 = types
            .values()
            .map(|t| t["tensors"].as_u64().expect("count"))
            .sum();
        let bytes: u64 = types
            .values()
            .map(|t| t["bytes"].as_u64().expect("bytes"))
            .sum();
        assert_eq!(info["tensors"], tensors, "{file}");
        assert!(
            bytes < size && bytes > size / 2,
            "{file}: {bytes} of {size}"
        );
        let memory = &info["memory"];
        assert!(
            memory["total"].as_u64() > memory["weights"].as_u64(),
            "{file}"
        );
    }
}

#[test]
fn tokenize_json_matches_llama_cpp() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llamacpp/real");
    for (file, dir) in [
        (SMOLLM2, "smollm2-135m-instruct-q4_1"),
        (GEMMA3, "gemma-3-270m-q4_k_m"),
    ] {
        let corpus: Value = serde_json::from_slice(
            &std::fs::read(fixtures.join(dir).join("tokenizer.json")).expect("fixture"),
        )
        .expect("json");
        let path = model(file);
        let path = path.to_str().expect("path");
        let mut checked = 0;
        for case in corpus["cases"].as_array().expect("cases").iter().take(12) {
            let text = case["text"].as_str().expect("text");
            if text.is_empty() || text.starts_with('-') {
                continue; // not passable as a plain argument
            }
            for (flags, key) in [
                (vec![], "ids_add1_parse0"),
                (vec!["--parse-special"], "ids_add1_parse1"),
                (vec!["--no-bos"], "ids_add0_parse0"),
            ] {
                let mut args = vec!["tokenize", "--json", "-m", path];
                args.extend(flags);
                args.push(text);
                let got: Value = serde_json::from_str(&hearth(&args)).expect("JSON array");
                assert_eq!(got, case[key], "{file} {key} {text:?}");
                checked += 1;
            }
        }
        assert!(checked >= 20, "{file}: only {checked} cases");
    }
}

#[test]
fn tokenize_reads_a_file_and_prints_pieces() {
    let path = model(SMOLLM2);
    let text = std::env::temp_dir().join(format!("hearth-tok-{}.txt", std::process::id()));
    std::fs::write(&text, "Hello world").expect("write");
    let out = hearth(&[
        "tokenize",
        "-m",
        path.to_str().expect("path"),
        "--file",
        text.to_str().expect("path"),
    ]);
    std::fs::remove_file(&text).ok();
    assert!(
        out.contains("\"Hello\"")
            && out.contains("\" world\"")
            && out.trim_end().ends_with("2 tokens"),
        "{out}"
    );
}

#[test]
fn a_closed_stdout_ends_quietly() {
    use std::process::Stdio;
    let path = model(SMOLLM2);
    let mut child = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["info", "--metadata", path.to_str().expect("path")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run hearth");
    drop(child.stdout.take()); // the reader goes away before anything is printed
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
