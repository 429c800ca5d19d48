//! `hearth synth` writes models that parse with the asked shapes, recipe
//! types and weight scales, the same bytes for the same seed, and a
//! tokenizer Hearth builds; bad arguments give one clear error line.
//! Tiny shapes only, so the whole file runs in seconds.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hearth::gguf::{self, ByteSource, GgufFile, MmapSource};
use hearth::model::tokenizer::Tokenizer;
use hearth::model::ModelConfig;
use hearth::quant::{reference, GgmlType};

const TINY: &[&str] = &[
    "--hidden",
    "256",
    "--layers",
    "2",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--ffn",
    "512",
    "--vocab",
    "512",
];

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hearth-synth-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn hearth(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hearth"))
        .args(args)
        .output()
        .expect("run hearth")
}

/// Runs `hearth synth ARGS OUT` and checks that it succeeded.
fn synth(out: &Path, args: &[&str]) {
    let mut all = vec!["synth"];
    all.extend_from_slice(args);
    let out_str = out.to_str().expect("utf-8 path");
    all.push(out_str);
    let output = hearth(&all);
    assert!(
        output.status.success(),
        "hearth {all:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn open(path: &Path) -> (GgufFile, MmapSource) {
    gguf::open_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn tiny_args<'a>(arch: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["--arch", arch];
    v.extend_from_slice(TINY);
    v.extend_from_slice(extra);
    v
}

#[test]
fn q4_k_m_file_has_the_shape_metadata_and_recipe_types() {
    let dir = temp_dir("recipe");
    let out = dir.join("llama.gguf");
    synth(
        &out,
        &tiny_args("llama", &["--type", "Q4_K_M", "--seed", "3"]),
    );
    let (file, _src) = open(&out);
    let md = &file.metadata;
    assert_eq!(md.get_str("general.name"), Some("synthetic llama h256 l2"));
    assert_eq!(md.get_u32("general.file_type"), Some(15));
    assert_eq!(md.get_u32("llama.attention.head_count_kv"), Some(2));
    assert_eq!(md.get_str("tokenizer.ggml.model"), Some("llama"));
    let cfg = ModelConfig::from_metadata_supported(md).expect("config");
    assert_eq!(
        (
            cfg.n_embd,
            cfg.n_layer,
            cfg.n_head,
            cfg.head_dim_k,
            cfg.n_ff,
            cfg.n_vocab
        ),
        (256, 2, 4, 64, 512, 512)
    );
    use GgmlType::*;
    let want: &[(&str, &[u64], GgmlType)] = &[
        ("token_embd.weight", &[256, 512], Q6_K),
        ("output_norm.weight", &[256], F32),
        ("blk.0.attn_q.weight", &[256, 256], Q4_K),
        ("blk.0.attn_k.weight", &[256, 128], Q4_K),
        ("blk.0.attn_v.weight", &[256, 128], Q4_K),
        ("blk.1.attn_v.weight", &[256, 128], Q6_K),
        ("blk.0.attn_output.weight", &[256, 256], Q4_K),
        ("blk.0.ffn_down.weight", &[512, 256], Q4_K),
        ("blk.1.ffn_down.weight", &[512, 256], Q6_K),
        ("blk.1.ffn_gate.weight", &[256, 512], Q4_K),
        ("blk.1.ffn_norm.weight", &[256], F32),
    ];
    for &(name, shape, ty) in want {
        let t = file
            .tensor(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!((t.shape.as_slice(), t.ty), (shape, ty), "{name}");
    }
    assert_eq!(file.tensors.len(), 2 + 2 * 9, "tied: no output.weight");
    assert!(file.tensor("output.weight").is_none());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_same_seed_writes_the_same_bytes() {
    let dir = temp_dir("seed");
    let paths: Vec<PathBuf> = ["a", "b", "c"]
        .iter()
        .map(|n| dir.join(format!("{n}.gguf")))
        .collect();
    synth(
        &paths[0],
        &tiny_args("qwen3", &["--type", "Q4_0", "--seed", "11"]),
    );
    synth(
        &paths[1],
        &tiny_args("qwen3", &["--type", "Q4_0", "--seed", "11", "-t", "1"]),
    );
    synth(
        &paths[2],
        &tiny_args("qwen3", &["--type", "Q4_0", "--seed", "12"]),
    );
    let read = |p: &PathBuf| std::fs::read(p).expect("read");
    let (a, b, c) = (read(&paths[0]), read(&paths[1]), read(&paths[2]));
    assert!(
        a == b,
        "seed 11 twice (all threads, then one) gave different files"
    );
    assert_eq!(a.len(), c.len());
    assert!(a != c, "seeds 11 and 12 gave the same file");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn weights_have_the_requested_scale() {
    let dir = temp_dir("std");
    let out = dir.join("std.gguf");
    let seed = "21";
    synth(
        &out,
        &tiny_args(
            "llama",
            &["--type", "Q4_K_M", "--seed", seed, "--std", "0.05"],
        ),
    );
    let (file, src) = open(&out);
    let bytes = src.as_slice().expect("mmap");
    for (name, want_mean, want_std) in [
        ("blk.0.ffn_up.weight", 0.0, 0.05),
        ("blk.1.attn_v.weight", 0.0, 0.05),
        ("token_embd.weight", 0.0, 0.02),
        ("blk.0.ffn_norm.weight", 1.0, 0.02),
    ] {
        let t = file.tensor(name).expect("tensor");
        let data = &bytes[t.offset as usize..(t.offset + t.size) as usize];
        let mut values = vec![0.0f32; t.n_elements() as usize];
        reference::dequantize(t.ty, data, &mut values).expect("dequantize");
        let n = values.len() as f64;
        let mean = values.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let std = (values
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n)
            .sqrt();
        assert!(
            (mean - want_mean).abs() < 0.1 * want_std,
            "seed {seed}, {name} ({}): mean {mean}",
            t.ty
        );
        assert!(
            (std / want_std - 1.0).abs() < 0.1,
            "seed {seed}, {name} ({}): std {std}, want {want_std}",
            t.ty
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_arch_writes_a_model_whose_tokenizer_builds() {
    let dir = temp_dir("archs");
    let moe = [
        "--experts",
        "4",
        "--experts-used",
        "2",
        "--expert-ffn",
        "128",
    ];
    for arch in ["llama", "qwen2", "qwen3", "gemma3", "qwen3moe"] {
        let out = dir.join(format!("{arch}.gguf"));
        let extra: Vec<&str> = if arch == "qwen3moe" {
            moe.to_vec()
        } else {
            vec!["--type", "Q8_0"]
        };
        synth(&out, &tiny_args(arch, &extra));
        let (file, _src) = open(&out);
        assert_eq!(file.metadata.architecture(), Some(arch));
        let cfg = ModelConfig::from_metadata_supported(&file.metadata).expect("config");
        assert_eq!((cfg.n_embd, cfg.n_layer), (256, 2), "{arch}");
        let tok = Tokenizer::from_metadata(&file.metadata).expect("tokenizer");
        let ids = tok
            .encode("the quick brown fox", true, false)
            .expect("encode");
        assert_eq!(ids.first(), Some(&1), "{arch}: BOS");
        assert_eq!(
            tok.decode(&ids, true, false).trim_start(),
            "the quick brown fox"
        );
        // `hearth info` and `hearth tokenize` read it too.
        let path = out.to_str().expect("utf-8");
        let info = hearth(&["info", path]);
        assert!(
            info.status.success(),
            "{arch}: {}",
            String::from_utf8_lossy(&info.stderr)
        );
        assert!(String::from_utf8_lossy(&info.stdout).contains(arch));
        let tokenize = hearth(&["tokenize", "-m", path, "hello"]);
        assert!(
            tokenize.status.success(),
            "{arch}: {}",
            String::from_utf8_lossy(&tokenize.stderr)
        );
        if arch == "qwen3moe" {
            let t = file.tensor("blk.0.ffn_gate_exps.weight").expect("experts");
            assert_eq!(t.shape, [256, 128, 4]);
            assert_eq!(cfg.n_expert, 4);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn named_shapes_can_be_cut_down() {
    let dir = temp_dir("named");
    let out = dir.join("qwen3.gguf");
    synth(
        &out,
        &[
            "--shape",
            "qwen3-0.6b",
            "--layers",
            "1",
            "--vocab",
            "1000",
            "--type",
            "Q8_0",
        ],
    );
    let (file, _src) = open(&out);
    let cfg = ModelConfig::from_metadata_supported(&file.metadata).expect("config");
    assert_eq!(
        (
            cfg.n_embd,
            cfg.n_layer,
            cfg.n_head,
            cfg.n_head_kv,
            cfg.head_dim_k,
            cfg.n_ff
        ),
        (1024, 1, 16, 8, 128, 3072)
    );
    assert_eq!(cfg.rope_base, 1_000_000.0);
    assert_eq!(
        file.metadata.get_str("general.name"),
        Some("synthetic qwen3-0.6b")
    );
    assert!(file.tensor("blk.0.attn_k_norm.weight").is_some());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_arguments_give_one_clear_error_line() {
    let dir = temp_dir("errors");
    let out = dir.join("bad.gguf");
    let out = out.to_str().expect("utf-8");
    let cases: &[(&[&str], &str)] = &[
        (&["--shape", "llama-9b"], "unknown --shape"),
        (&["--arch", "mamba", "--hidden", "256"], "unknown --arch"),
        (
            &["--arch", "llama", "--hidden", "256"],
            "needs --layers --heads --ffn --vocab",
        ),
        (
            &["--shape", "qwen3-0.6b", "--arch", "llama"],
            "is a qwen3 model",
        ),
        (
            &["--shape", "qwen3-0.6b", "--type", "Q9_K"],
            "unknown --type",
        ),
        (
            &[
                "--arch",
                "llama",
                "--hidden",
                "256",
                "--layers",
                "2",
                "--heads",
                "4",
                "--kv-heads",
                "3",
                "--ffn",
                "512",
                "--vocab",
                "512",
            ],
            "--kv-heads",
        ),
        (
            &[
                "--arch", "llama", "--hidden", "256", "--layers", "2", "--heads", "4", "--ffn",
                "512", "--vocab", "100",
            ],
            "--vocab 100 is too small",
        ),
        (
            &[
                "--arch", "qwen3moe", "--hidden", "256", "--layers", "2", "--heads", "4", "--ffn",
                "512", "--vocab", "512",
            ],
            "--experts",
        ),
        (
            &[
                "--arch", "llama", "--hidden", "250", "--layers", "2", "--heads", "4", "--ffn",
                "512", "--vocab", "512",
            ],
            "--head-dim",
        ),
        (&["--shape", "qwen3-0.6b", "--std=-1"], "scale"),
        (&[], "pass --shape"),
    ];
    for &(args, needle) in cases {
        let mut all = vec!["synth"];
        all.extend_from_slice(args);
        all.push(out);
        let output = hearth(&all);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?} succeeded");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(needle),
            "{args:?}: {stderr}"
        );
        assert!(!Path::new(out).exists(), "{args:?} left a file");
    }
    std::fs::remove_dir_all(&dir).ok();
}

fn real_model(name: &str) -> PathBuf {
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

/// The named shapes are the real models': same tensors, shapes and, for the
/// real file's type, the per-tensor types llama-quantize chose (and its
/// order, for the file llama-quantize wrote; SmolLM2's came from elsewhere).
#[test]
fn named_shapes_plan_the_real_models_tensor_tables() {
    use hearth::model::synth::{SynthModel, SynthOptions, SynthShape};
    use hearth::quant::recipe::FileType;
    type Table = Vec<(String, Vec<u64>, GgmlType)>;
    for (shape, file, ftype, same_order) in [
        (
            "gemma3-270m",
            "gemma-3-270m-q4_k_m.gguf",
            FileType::Q4_K_M,
            true,
        ),
        (
            "smollm2-135m",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            FileType::Q4_1,
            false,
        ),
    ] {
        let (real, _src) = open(&real_model(file));
        let planned = SynthModel::new(
            SynthShape::named(shape).expect("shape"),
            shape,
            &SynthOptions::new(ftype, 0),
        )
        .expect("plan");
        let mut want: Table = real
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone(), t.ty))
            .collect();
        let mut got: Table = planned
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone(), t.ty))
            .collect();
        if same_order {
            assert!(got == want, "{shape}: the tensor order differs from {file}");
        }
        want.sort();
        got.sort();
        let differ: Vec<_> = got
            .iter()
            .zip(&want)
            .filter(|(g, w)| g != w)
            .take(5)
            .collect();
        assert!(
            got.len() == want.len() && differ.is_empty(),
            "{shape} vs {file}: {differ:?}"
        );
        assert_eq!(planned.data_bytes(), real.tensor_bytes(), "{shape}");
        let cfg = ModelConfig::from_metadata_supported(&real.metadata).expect("config");
        let syn = ModelConfig::from_metadata_supported(&planned.metadata).expect("config");
        assert_eq!(
            (
                syn.n_ctx_train,
                syn.rope_base,
                syn.rms_eps,
                syn.sliding_window
            ),
            (
                cfg.n_ctx_train,
                cfg.rope_base,
                cfg.rms_eps,
                cfg.sliding_window
            ),
            "{shape}"
        );
    }
}
