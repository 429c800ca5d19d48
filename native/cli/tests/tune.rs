//! The tune store: `hearth tune` writes it, a load reads it back and runs
//! no probe, a store of another device is ignored, and
//! `HEARTH_TUNE_DIR=off` writes nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/llamacpp/synthetic/models/llama-Q4_K_M.gguf")
}

/// A fresh empty directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hearth-tune-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn hearth(args: &[&str], tune_dir: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
    cmd.args(args)
        .env_remove("HEARTH_CPU_ISA")
        .env_remove("HEARTH_TUNE_DIR");
    if let Some(d) = tune_dir {
        cmd.env("HEARTH_TUNE_DIR", d);
    }
    let out = cmd.output().expect("run hearth");
    assert!(
        out.status.success(),
        "hearth {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn run_once(dir: &str) -> String {
    let m = model();
    let args = [
        "run",
        "-m",
        m.to_str().expect("utf-8 path"),
        "--backend",
        "cpu",
        "-n",
        "2",
        "--temp",
        "0",
        "-p",
        "hi",
    ];
    String::from_utf8_lossy(&hearth(&args, Some(dir)).stderr).into_owned()
}

/// Whether this CPU has two kernel tiers to choose between (else nothing
/// is probed or stored, and the tests say so).
fn has_choice() -> bool {
    let out = hearth(&["info", "--platform", "--json"], None);
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let tiers = v["cpu"]["isa_tiers"].as_array().map_or(0, |t| t.len());
    if tiers < 3 {
        eprintln!("skipped: this CPU has one SIMD tier, so no probe runs");
    }
    tiers >= 3
}

#[test]
fn tune_writes_the_store_and_a_load_reads_it_without_probing() {
    if !has_choice() {
        return;
    }
    let dir = temp_dir("store");
    let d = dir.to_str().expect("utf-8 path");
    let m = model();
    let out = hearth(
        &["tune", "-m", m.to_str().expect("utf-8"), "--backend", "cpu"],
        Some(d),
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("cpu.isa") && table.contains("winner"),
        "{table}"
    );
    let file = dir.join("tune.json");
    let store: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("tune.json written")).expect("json");
    assert_eq!(
        store["records"].as_array().map(Vec::len),
        Some(1),
        "{store}"
    );

    let err = run_once(d);
    assert!(err.contains("tune: from store"), "{err}");
    assert!(!err.contains("tune: probed"), "{err}");

    let listed = String::from_utf8_lossy(&hearth(&["info", "--tune"], Some(d)).stdout).into_owned();
    assert!(listed.contains("cpu.isa"), "{listed}");
    assert!(listed.contains("0 record(s) for other devices"), "{listed}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_first_load_probes_once_and_a_store_of_another_device_is_ignored() {
    if !has_choice() {
        return;
    }
    let dir = temp_dir("edited");
    let d = dir.to_str().expect("utf-8 path");
    let first = run_once(d);
    assert_eq!(first.matches("tune: probed").count(), 1, "{first}");
    let file = dir.join("tune.json");
    let mut store: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("tune.json")).expect("json");
    store["records"][0]["key"]["device"] = Value::String("Another CPU".into());
    std::fs::write(&file, serde_json::to_vec(&store).expect("json")).expect("write");

    let again = run_once(d);
    assert!(
        again.contains("tune: probed"),
        "edited key believed: {again}"
    );
    let listed = String::from_utf8_lossy(&hearth(&["info", "--tune"], Some(d)).stdout).into_owned();
    assert!(listed.contains("1 record(s) for other devices"), "{listed}");

    // A build id of other kernels is ignored too.
    let mut store: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("tune.json")).expect("json");
    for r in store["records"].as_array_mut().expect("records") {
        r["key"]["build"] = Value::String("0000000000000000".into());
    }
    std::fs::write(&file, serde_json::to_vec(&store).expect("json")).expect("write");
    assert!(run_once(d).contains("tune: probed"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tune_dir_off_writes_nothing() {
    let dir = temp_dir("off");
    // HOME and XDG_CACHE_HOME point into the directory: nothing may appear there.
    let m = model();
    let out = Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(["run", "-m", m.to_str().expect("utf-8"), "--backend", "cpu"])
        .args(["-n", "2", "--temp", "0", "-p", "hi"])
        .env_remove("HEARTH_CPU_ISA")
        .env("HEARTH_TUNE_DIR", "off")
        .env("HOME", &dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .output()
        .expect("run hearth");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("tune:"), "{err}");
    let entries: Vec<_> = std::fs::read_dir(&dir).expect("read dir").collect();
    assert!(entries.is_empty(), "{entries:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_stored_tier_this_build_lacks_falls_back_with_a_message() {
    if !has_choice() {
        return;
    }
    let dir = temp_dir("gone");
    let d = dir.to_str().expect("utf-8 path");
    run_once(d);
    let file = dir.join("tune.json");
    let mut store: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("tune.json")).expect("json");
    store["records"][0]["winner"] = Value::String("avx1024".into());
    std::fs::write(&file, serde_json::to_vec(&store).expect("json")).expect("write");
    let err = run_once(d);
    assert!(
        err.contains("avx1024") && err.contains("hearth tune"),
        "no fallback message: {err}"
    );
    assert!(!err.contains("tune: probed"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `hearth run` of the synthetic model on WebGPU, with `envs`; `None`
/// when there is no adapter (said, and a failure with HEARTH_REQUIRE_GPU=1).
fn run_webgpu(dir: &str, envs: &[(&str, &str)]) -> Option<String> {
    let m = model();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hearth"));
    cmd.args([
        "run",
        "-m",
        m.to_str().expect("utf-8 path"),
        "--backend",
        "webgpu",
        "-n",
        "2",
        "--temp",
        "0",
        "-p",
        "hi",
    ])
    .env_remove("HEARTH_GPU_SUBMIT_EVERY")
    .env("HEARTH_TUNE_DIR", dir);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run hearth");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() && stderr.contains("no WebGPU adapter") {
        assert!(
            std::env::var("HEARTH_REQUIRE_GPU").as_deref() != Ok("1"),
            "HEARTH_REQUIRE_GPU=1 and no WebGPU adapter: {stderr}"
        );
        eprintln!("skipped: no WebGPU adapter ({stderr})");
        return None;
    }
    assert!(out.status.success(), "{stderr}");
    Some(stderr)
}

#[test]
fn webgpu_submit_interval_is_probed_once_then_read_from_the_store() {
    let dir = temp_dir("webgpu");
    let d = dir.to_str().expect("utf-8 path");
    let Some(first) = run_webgpu(d, &[]) else {
        return;
    };
    assert!(
        first.contains("tune: probed webgpu.submit_every on llama"),
        "{first}"
    );
    let store: Value =
        serde_json::from_slice(&std::fs::read(dir.join("tune.json")).expect("store"))
            .expect("json");
    let record = store["records"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["probe"] == "webgpu.submit_every"))
        .unwrap_or_else(|| panic!("no webgpu record: {store}"));
    assert_eq!(record["key"]["backend"], "webgpu");
    // Every candidate ran and matched the default's logits.
    let cands = record["candidates"].as_array().expect("candidates");
    assert_eq!(cands.len(), 5, "{record}");
    assert!(
        cands
            .iter()
            .all(|c| c["rejected"].is_null() && c["median_ns"].as_u64().is_some()),
        "{record}"
    );
    let winner = record["winner"].as_str().expect("winner").to_string();

    let second = run_webgpu(d, &[]).expect("the adapter is still there");
    assert!(
        second.contains(&format!("tune: from store (webgpu.submit_every {winner})")),
        "{second}"
    );
    assert!(!second.contains("tune: probed"), "{second}");

    // `hearth info --tune` lists the adapter's record as this machine's.
    let out = hearth(&["info", "--tune"], Some(d));
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("this machine: webgpu"), "{listed}");
    assert!(listed.contains("webgpu.submit_every on llama"), "{listed}");
    assert!(listed.contains("0 record(s) for other devices"), "{listed}");

    // An interval set by hand wins: nothing probed, nothing said.
    let forced = run_webgpu(d, &[("HEARTH_GPU_SUBMIT_EVERY", "8")]).expect("adapter");
    assert!(!forced.contains("tune:"), "{forced}");
}
