//! `hearth logits` on a tiny synthetic model: the file holds one row of
//! logits per token; `--exact` (f32 activations) gives logits close to, but
//! not bit-equal with, the default int8-activation path; `--exact` on
//! another backend is a clear error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("run hearth")
}

/// Runs `hearth logits` with `extra` and returns the logits read back.
fn logits(model: &str, tokens: &str, out: &Path, extra: &[&str]) -> Vec<f32> {
    let out_s = out.to_string_lossy();
    let mut args = vec!["logits", "-m", model, "--tokens", tokens, "--out", &out_s];
    args.extend_from_slice(extra);
    let run = hearth(&args);
    assert!(
        run.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    std::fs::read(out)
        .expect("logits file")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn exact_mode_is_close_to_the_quantized_path_and_cpu_only() {
    let model = repo().join("tests/fixtures/llamacpp/synthetic/models/llama-Q4_0.gguf");
    assert!(model.exists(), "{} is missing", model.display());
    let model = model.to_string_lossy().into_owned();
    let dir = std::env::temp_dir().join(format!("hearth-logits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let tokens = "1,17,42,99,5";
    let q = logits(&model, tokens, &dir.join("q.f32"), &[]);
    let e = logits(&model, tokens, &dir.join("e.f32"), &["--exact"]);
    assert_eq!(q.len(), e.len());
    assert!(
        !q.is_empty() && q.len().is_multiple_of(5),
        "{} values for 5 tokens",
        q.len()
    );
    assert!(q.iter().chain(&e).all(|v| v.is_finite()));
    let mean = e.iter().sum::<f32>() / e.len() as f32;
    let var = e.iter().map(|v| (v - mean).powi(2)).sum::<f32>();
    let err = q.iter().zip(&e).map(|(a, b)| (a - b).powi(2)).sum::<f32>();
    let nrmse = (err / var).sqrt();
    assert!(
        nrmse > 0.0,
        "int8 activations should change the logits a little"
    );
    assert!(nrmse < 0.1, "quantized vs exact nrmse {nrmse}");

    let out_s = dir.join("x.f32").to_string_lossy().into_owned();
    let args = ["logits", "-m", &model, "--tokens", tokens, "--out", &out_s];
    let run = hearth(&[&args[..], &["--exact", "--backend", "webgpu"]].concat());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && err.contains("--backend cpu"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
