//! `hearth quantize` writes what llama-quantize writes: the same file, byte
//! for byte, from the same F32 source, for every file type it supports.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn quantize(out_dir: &Path, ftype: &str, pure: bool) -> PathBuf {
    let source = fixtures().join("synthetic-f32/llama.F32.gguf");
    let out = out_dir.join(format!(
        "llama-{ftype}{}.gguf",
        if pure { "-pure" } else { "" }
    ));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
    cmd.arg("quantize").arg(&source).arg(&out).arg(ftype);
    if pure {
        cmd.arg("--pure");
    }
    let output = cmd.output().expect("run hearth");
    assert!(
        output.status.success(),
        "hearth quantize {ftype} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hearth-quantize-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn every_file_type_is_byte_identical_to_llama_quantize() {
    let recipes: Value = serde_json::from_slice(
        &std::fs::read(fixtures().join("quantize/llama-recipes.json")).expect("fixture"),
    )
    .expect("json");
    let dir = temp_dir("recipes");
    let mut checked = Vec::new();
    for (ftype, expected) in recipes["recipes"].as_object().expect("recipes") {
        let out = quantize(&dir, ftype, false);
        assert_eq!(
            sha256_hex(&out),
            expected["file_sha256"].as_str().expect("sha"),
            "{ftype}: the file differs from llama-quantize's; compare tensor types and hashes with the fixture"
        );
        checked.push(ftype.clone());
    }
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(checked.len(), 18, "{checked:?}");
}

#[test]
fn pure_files_equal_the_stored_reference_models() {
    let dir = temp_dir("pure");
    let models = fixtures().join("llamacpp/synthetic/models");
    let formats = [
        "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_M", "Q4_K_M",
        "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS",
    ];
    for ftype in formats {
        let out = quantize(&dir, ftype, true);
        let reference = models.join(format!("llama-{ftype}.gguf"));
        assert_eq!(sha256_hex(&out), sha256_hex(&reference), "--pure {ftype}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_requests_fail_with_one_clear_line() {
    let dir = temp_dir("errors");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(args)
            .output()
            .expect("run");
        assert!(!out.status.success(), "{args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let source = fixtures().join("synthetic-f32/llama.F32.gguf");
    let source = source.to_str().expect("utf-8 path");
    let out = dir.join("x.gguf");
    let out = out.to_str().expect("utf-8 path");
    let err = run(&["quantize", source, out, "Q9_9"]);
    assert!(
        err.contains("unknown file type") && err.contains("Q4_K_M"),
        "{err}"
    );
    let err = run(&["quantize", "/no/such/model.gguf", out, "Q8_0"]);
    assert!(err.contains("does not exist"), "{err}");
    // A truncated input: an error, and no output file left behind.
    let truncated = dir.join("truncated.gguf");
    let bytes = std::fs::read(fixtures().join("synthetic-f32/llama.F32.gguf")).expect("read");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).expect("write");
    let err = run(&["quantize", truncated.to_str().expect("path"), out, "Q8_0"]);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!Path::new(out).exists(), "no partial output");
    std::fs::remove_dir_all(&dir).ok();
}
