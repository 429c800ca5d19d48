//! `--tensor-parallel N`: SmolLM2 split into 3 shards on the CPU gives the
//! whole model's greedy tokens, `hearth info --plan` shows what each shard
//! holds, and a size that does not divide the model is one clear line.

use std::path::PathBuf;
use std::process::{Command, Output};

fn smollm2() -> PathBuf {
    let dir = match std::env::var_os("HEARTH_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/models"),
    };
    let path = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} not found: run `make setup`",
        path.display()
    );
    path
}

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .env("HEARTH_TUNE_DIR", "off")
        .output()
        .expect("run hearth")
}

fn greedy(tp: &str) -> String {
    let m = smollm2();
    let out = hearth(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "--backend",
        "cpu",
        "-p",
        "The capital of France is",
        "-n",
        "24",
        "--temp",
        "0",
        "--tensor-parallel",
        tp,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf8")
}

#[test]
fn three_shards_give_the_whole_models_greedy_tokens() {
    let whole = greedy("1");
    assert!(whole.contains("Paris"), "{whole}");
    assert_eq!(greedy("3"), whole);
}

#[test]
fn the_plan_lists_each_shards_heads_and_bytes() {
    let m = smollm2();
    let out = hearth(&[
        "info",
        m.to_str().unwrap(),
        "--plan",
        "--backend",
        "cpu",
        "--tensor-parallel",
        "3",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // 9 query heads, 3 K/V heads, 1536 FFN units.
    for want in [
        "3 tensor-parallel shards",
        "shard 0: query heads 0-2, K/V heads 0-0, 512 of 1536 FFN units",
        "shard 2: query heads 6-8, K/V heads 2-2, 512 of 1536 FFN units",
    ] {
        assert!(text.contains(want), "{want:?} not in:\n{text}");
    }
}

#[test]
fn a_size_that_does_not_divide_the_model_is_one_clear_line() {
    let m = smollm2();
    let out = hearth(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "--backend",
        "cpu",
        "-p",
        "hi",
        "-n",
        "2",
        "--tensor-parallel",
        "2",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("9 query heads do not split into 2 shards; pick a tensor-parallel size that divides them"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
