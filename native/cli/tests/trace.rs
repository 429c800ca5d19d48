//! `--trace FILE` / `HEARTH_TRACE`: the Perfetto traces of `hearth bench`
//! and `hearth run`, read back by scripts/trace_summary.py with Perfetto's
//! own protobuf definitions (PyPI's `perfetto`, in .cache/pyenv from
//! `make setup`), not with the writer's code.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model() -> PathBuf {
    root().join("tests/fixtures/synthetic-f32/llama.F32.gguf")
}

fn python() -> PathBuf {
    let py = root().join(".cache/pyenv/bin/python");
    assert!(
        py.exists(),
        "{} not found: run `make setup` (it installs PyPI's perfetto, which reads the traces)",
        py.display()
    );
    py
}

fn hearth(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
    cmd.args(args).env_remove("HEARTH_TRACE");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run hearth")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hearth-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

/// The summary of `trace` (JSON), failing unless it is well formed and
/// holds every `TRACK=NAME` of `expect`.
fn summary(trace: &Path, expect: &[&str]) -> Value {
    let mut cmd = Command::new(python());
    cmd.arg(root().join("scripts/trace_summary.py"))
        .arg(trace)
        .args(["--json", "--top", "50"])
        .env("PYTHONDONTWRITEBYTECODE", "1");
    for e in expect {
        cmd.args(["--expect", e]);
    }
    let out = cmd.output().expect("run python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "trace_summary.py {}: {stderr}",
        trace.display()
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("summary JSON: {e}: {stderr}"))
}

fn count(summary: &Value, track: &str, name: &str) -> u64 {
    summary["tracks"][track]["by_name"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["name"] == name)
        .and_then(|r| r["count"].as_u64())
        .unwrap_or(0)
}

#[test]
fn bench_trace_has_load_tests_forward_passes_and_ops() {
    let path = scratch("bench.pftrace");
    let trace = path.to_str().expect("utf8 path");
    let m = model();
    let out = hearth(
        &[
            "bench",
            "-m",
            m.to_str().unwrap(),
            "--backend",
            "cpu",
            "-p",
            "16",
            "-n",
            "4",
            "-r",
            "2",
            "--trace",
            trace,
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ui.perfetto.dev"), "{stderr}");
    let s = summary(
        &path,
        &[
            "load=load model",
            "load=stream weights",
            "load=read",
            "load=repack + upload",
            "bench=pp16",
            "bench=tg4",
            "bench=warm-up",
            "host=forward",
            "host=MatMul",
            "host=PagedAttention",
        ],
    );
    // Two timed repetitions of each test, each a span of its own.
    assert_eq!(count(&s, "bench", "rep"), 4, "{s}");
    // Timed: pp16 one pass a repetition, tg4 four; the warm-up of each
    // test runs one pass.
    let passes = count(&s, "host", "forward");
    assert_eq!(passes, 2 + 2 * 4 + 2, "{s}");
    // One span per tensor chunk: the synthetic model's 20 tensors.
    assert!(count(&s, "load", "repack + upload") >= 20, "{s}");
}

#[test]
fn run_trace_has_scheduler_steps_and_request_phases() {
    let path = scratch("run.pftrace");
    let m = model();
    // Through the environment variable, as a server would be traced.
    let out = hearth(
        &[
            "run",
            "-m",
            m.to_str().unwrap(),
            "--backend",
            "cpu",
            "-p",
            "hello there",
            "-n",
            "6",
            "--temp",
            "0",
        ],
        &[("HEARTH_TRACE", path.to_str().unwrap())],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(
        &path,
        &[
            "engine=step",
            "engine=schedule",
            "engine=model",
            "engine=sample",
            "engine=update",
            "requests/=queued",
            "requests/=prefill",
            "requests/=decode",
            "requests/=finish",
        ],
    );
    // A step for the prompt and one per further token.
    assert!(count(&s, "engine", "step") >= 6, "{s}");
    assert_eq!(
        count(&s, "engine", "model"),
        count(&s, "host", "forward"),
        "{s}"
    );
    let blocks = &s["counters"]["kv blocks used"];
    assert!(blocks["max"].as_f64().unwrap_or(0.0) >= 1.0, "{s}");
}

#[test]
fn webgpu_trace_has_kernels_on_the_device_track() {
    let path = scratch("webgpu.pftrace");
    let m = model();
    let out = hearth(
        &[
            "run",
            "-m",
            m.to_str().unwrap(),
            "--backend",
            "webgpu",
            "-p",
            "hello",
            "-n",
            "3",
            "--temp",
            "0",
            "--trace",
            path.to_str().unwrap(),
        ],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && stderr.contains("no WebGPU adapter") {
        assert!(
            std::env::var("HEARTH_REQUIRE_GPU").as_deref() != Ok("1"),
            "HEARTH_REQUIRE_GPU=1 and no WebGPU adapter: {stderr}"
        );
        eprintln!("skipped: no WebGPU adapter ({stderr})");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let s = summary(
        &path,
        &["device=rms_norm", "device=attention", "engine=step"],
    );
    let device = s["tracks"]
        .as_object()
        .and_then(|t| t.keys().find(|k| k.starts_with("device")))
        .cloned();
    let device = device.unwrap_or_else(|| panic!("no device track: {s}"));
    assert!(
        s["tracks"][&device]["spans"].as_u64().unwrap_or(0) >= 10,
        "{s}"
    );

    // Two tensor-parallel shards, each a backend of its own: a device
    // track each, every one well formed.
    let out = hearth(
        &[
            "run",
            "-m",
            m.to_str().unwrap(),
            "--backend",
            "webgpu",
            "-p",
            "hello",
            "-n",
            "3",
            "--temp",
            "0",
            "--tensor-parallel",
            "2",
            "--trace",
            path.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&path, &["device 0=rms_norm", "device 1=rms_norm"]);
    let devices = s["tracks"]
        .as_object()
        .map_or(0, |t| t.keys().filter(|k| k.starts_with("device")).count());
    assert_eq!(devices, 2, "{s}");
}

#[test]
fn an_unwritable_trace_path_is_a_clear_error() {
    let m = model();
    let out = hearth(
        &[
            "bench",
            "-m",
            m.to_str().unwrap(),
            "--backend",
            "cpu",
            "-p",
            "8",
            "-n",
            "0",
            "-r",
            "1",
            "--trace",
            "/nonexistent-dir/x.pftrace",
        ],
        &[],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot write the trace to /nonexistent-dir/x.pftrace"),
        "{stderr}"
    );
}
