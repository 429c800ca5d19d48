//! `hearth serve` through real HTTP clients: OpenAI's Python client
//! (tests/serve/test_openai.py) and a load / hostile-input suite on raw
//! sockets (tests/serve/test_load.py), and two replicas behind SGLang's
//! cache-aware router (tests/serve/test_router.py), each against servers it
//! starts on loopback with SmolLM2. The Python environment comes from
//! `make setup` (.cache/pyenv: PyPI's `openai` and `sglang-router`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> PathBuf {
    let py = root().join(".cache/pyenv/bin/python");
    assert!(
        py.exists(),
        "{} not found: run `make setup` (it installs the openai client the server tests use)",
        py.display()
    );
    py
}

fn run_suite(script: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/serve");
    let out = Command::new(python())
        .arg(dir.join(script))
        .current_dir(&dir)
        .env("HEARTH_BIN", env!("CARGO_BIN_EXE_hearth"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{log}");
    assert!(out.status.success(), "{script} failed:\n{log}");
}

#[test]
fn openai_python_client() {
    run_suite("test_openai.py");
}

#[test]
fn load_cancellation_and_hostile_http() {
    run_suite("test_load.py");
}

#[test]
fn replicas_behind_sglang_router() {
    run_suite("test_router.py");
}

#[test]
fn a_file_that_is_not_a_model_fails_before_listening() {
    let dir = std::env::temp_dir().join(format!("hearth-serve-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"not a gguf file at all").unwrap();
    for (path, want) in [
        (dir.join("missing.gguf"), "does not exist"),
        (bad, "not a GGUF file"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
            .args(["serve", "--port", "0", "-m"])
            .arg(&path)
            .output()
            .expect("run hearth");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{path:?}: {err}");
        assert!(err.contains(want), "{path:?}: {err}");
        assert!(!err.contains("listening"), "fails before listening: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
