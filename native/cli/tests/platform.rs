//! `hearth info --platform`: the machine and the defaults chosen from it.

use std::process::{Command, Output};

use serde_json::Value;

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("run hearth")
}

fn stdout_of(args: &[&str]) -> String {
    let out = hearth(args);
    assert!(
        out.status.success(),
        "hearth {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn platform_json_has_the_cpu_memory_gpus_and_defaults() {
    let text = stdout_of(&["info", "--platform", "--json"]);
    let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    let cpu = &v["cpu"];
    assert!(cpu["arch"].as_str().is_some_and(|a| !a.is_empty()), "{cpu}");
    assert!(
        cpu["logical_cores"].as_u64().is_some_and(|n| n >= 1),
        "{cpu}"
    );
    assert_eq!(cpu["threads"], Value::Bool(true), "{cpu}");
    let tiers = cpu["isa_tiers"].as_array().expect("isa_tiers");
    assert!(tiers.iter().any(|t| t == "scalar"), "{cpu}");
    assert!(tiers.contains(&cpu["best_isa"]), "{cpu}");
    assert!(v["memory"].is_object(), "{v}");
    assert!(v["gpus"].is_array(), "{v}");
    for g in v["gpus"].as_array().into_iter().flatten() {
        assert!(g["features"]["f16"].is_boolean(), "{g}");
        assert!(g["limits"]["max_buffer_bytes"].as_u64().is_some(), "{g}");
    }
    let backend = v["defaults"]["backend"]["value"].as_str().expect("backend");
    assert!(["cpu", "webgpu", "cuda"].contains(&backend), "{v}");
    assert!(v["defaults"]["backend"]["why"]
        .as_str()
        .is_some_and(|w| !w.is_empty()));
    assert!(["f16", "f32"].contains(&v["defaults"]["kv_type"]["value"].as_str().unwrap_or("")));
    let threads = v["defaults"]["threads"]["value"].as_u64().expect("threads");
    assert_eq!(Some(threads), cpu["logical_cores"].as_u64());
}

#[test]
fn platform_table_prints_the_backend_choice_and_why() {
    let json: Value =
        serde_json::from_str(stdout_of(&["info", "--platform", "--json"]).trim()).expect("json");
    let chosen = json["defaults"]["backend"]["value"]
        .as_str()
        .expect("backend");
    let text = stdout_of(&["info", "--platform"]);
    assert!(text.lines().any(|l| l.starts_with("cpu ")), "{text}");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("backend "))
        .unwrap_or_else(|| panic!("no backend line in:\n{text}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.get(1), Some(&chosen), "{line}");
    assert!(words.len() > 2, "the line gives no reason: {line}");
}

#[test]
fn info_needs_a_model_or_platform() {
    let out = hearth(&["info"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("MODEL") || err.contains("model"), "{err}");
}
