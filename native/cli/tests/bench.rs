//! `hearth bench` on a tiny synthetic model: well-formed JSON rows with
//! positive speeds, the table, the memory bandwidth mode, clear errors for
//! bad arguments; and the `make bench` driver's own unit tests on canned
//! llama-bench output (no llama.cpp run).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny_model(name: &str) -> String {
    let path = repo()
        .join("tests/fixtures/llamacpp/synthetic/models")
        .join(name);
    assert!(path.exists(), "{} is missing", path.display());
    path.to_string_lossy().into_owned()
}

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("run hearth")
}

fn stdout_lines(out: &Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "hearth failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The one line of stderr, which must start with `error:` and contain `want`.
fn assert_error(args: &[&str], want: &str) {
    let out = hearth(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.contains(want),
        "{args:?}: stderr {err:?} lacks {want:?}"
    );
}

fn num(row: &Value, key: &str) -> f64 {
    row[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {row}"))
}

#[test]
fn json_rows_for_every_model_test_and_thread_count() {
    let llama = tiny_model("llama-Q4_0.gguf");
    let gemma = tiny_model("gemma3-Q4_K_M.gguf");
    let out = hearth(&[
        "bench", "-m", &llama, "-m", &gemma, "-p", "16", "-n", "4", "-r", "1", "-t", "1,2",
        "--json",
    ]);
    let rows: Vec<Value> = stdout_lines(&out)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    let keys: Vec<(String, String, u64)> = rows
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("model"), s("test"), r["threads"].as_u64().unwrap_or(0))
        })
        .collect();
    let mut want = Vec::new();
    for model in ["llama-Q4_0", "gemma3-Q4_K_M"] {
        for t in [1, 2] {
            for test in ["pp16", "tg4"] {
                want.push((model.to_string(), test.to_string(), t));
            }
        }
    }
    assert_eq!(keys, want);
    for row in &rows {
        assert!(num(row, "tps") > 0.0, "{row}");
        assert!(num(row, "tps_stddev") >= 0.0, "{row}");
        assert!(num(row, "model_bytes") > 100_000.0, "{row}");
        assert_eq!(row["backend"], "cpu", "{row}");
        assert!(!row["isa"].as_str().unwrap_or_default().is_empty(), "{row}");
        assert_eq!(
            row["samples_tps"].as_array().map(Vec::len),
            Some(1),
            "{row}"
        );
        let decode = row["test"] == "tg4";
        assert_eq!(row.get("gbps").is_some(), decode, "{row}");
        if decode {
            // Effective bandwidth is bytes per token times tokens/s.
            let expect = num(row, "read_bytes_per_token") * num(row, "tps") / 1e9;
            assert!(
                (num(row, "gbps") - expect).abs() <= 1e-9 * expect.max(1.0),
                "{row}"
            );
            assert!(
                num(row, "read_bytes_per_token") <= num(row, "model_bytes"),
                "{row}"
            );
        }
    }
}

#[test]
fn table_and_memory_bandwidth() {
    let llama = tiny_model("llama-Q4_0.gguf");
    let out = hearth(&[
        "bench",
        "-m",
        &llama,
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "2",
        "-t",
        "1",
        "--membw",
        "--membw-mib",
        "8",
    ]);
    let lines = stdout_lines(&out);
    assert!(
        lines[0].starts_with("memory read bandwidth, 1 thread: "),
        "{lines:?}"
    );
    assert!(
        lines[1].contains("| model") && lines[1].contains("t/s"),
        "{lines:?}"
    );
    assert!(
        lines[3].contains("llama-Q4_0") && lines[3].contains("pp8"),
        "{lines:?}"
    );
    // The decode row's GB/s is given as a share of the measured bandwidth.
    assert!(
        lines[4].contains("tg2") && lines[4].contains("%)"),
        "{lines:?}"
    );
    assert_eq!(lines.len(), 5, "{lines:?}");
}

#[test]
fn membw_alone_gives_positive_json() {
    let out = hearth(&[
        "bench",
        "--membw",
        "--membw-mib",
        "8",
        "-t",
        "1,2",
        "-r",
        "2",
        "--json",
    ]);
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (line, threads) in lines.iter().zip([1, 2]) {
        let row: Value = serde_json::from_str(line).expect("json");
        assert_eq!(row["test"], "membw");
        assert_eq!(row["threads"], threads);
        assert!(num(&row, "gbps") > 0.0, "{row}");
    }
}

#[test]
fn bad_arguments_say_what_to_do() {
    let llama = tiny_model("llama-Q4_0.gguf");
    let m = llama.as_str();
    assert_error(&["bench", "-m", m, "-r", "0"], "-r 0");
    assert_error(
        &["bench", "-m", m, "-t", "0"],
        "-t takes thread counts >= 1",
    );
    assert_error(&["bench", "-m", m, "-p", "0", "-n", "0"], "no test to run");
    assert_error(&["bench", "-m", m, "-b", "0"], "-b 0");
    assert_error(&["bench", "-m", m, "--backend", "tpu"], "backend `tpu`");
    assert_error(
        &["bench", "-m", "/nonexistent/model.gguf"],
        "does not exist",
    );
    let out = hearth(&["bench"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--model"),
        "no model and no --membw must ask for --model"
    );
}

#[test]
fn driver_script_unit_tests() {
    let script = repo().join("scripts/test_bench.py");
    let out = Command::new("python3")
        .arg(&script)
        .output()
        .expect("python3 is needed (scripts/setup.sh's test models need it too)");
    assert!(
        out.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}
