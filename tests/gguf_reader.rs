//! The GGUF reader on real and synthetic models.

mod gguf_support;

use hearth::gguf::{open_path, GgufFile, MemSource, Value};
use hearth::quant::GgmlType;

use gguf_support::{real_model, synthetic_models};

/// Expected header facts, checked with the Python `gguf` package (gguf-py 0.17).
struct Known {
    file: &'static str,
    arch: &'static str,
    blocks: u32,
    embd: u32,
    heads: u32,
    kv_heads: u32,
    ctx: u32,
    ffn: u32,
    vocab: usize,
    n_kv: usize,
    n_tensors: usize,
    data_offset: u64,
    types: &'static [(GgmlType, usize)],
    first: (&'static str, &'static [u64], GgmlType, u64, u64),
}

const SMOLLM2: Known = Known {
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    arch: "llama",
    blocks: 30,
    embd: 576,
    heads: 9,
    kv_heads: 3,
    ctx: 8192,
    ffn: 1536,
    vocab: 49152,
    n_kv: 33,
    n_tensors: 272,
    data_offset: 1785664,
    types: &[
        (GgmlType::Q8_0, 1),
        (GgmlType::F32, 61),
        (GgmlType::Q4_1, 210),
    ],
    first: (
        "token_embd.weight",
        &[576, 49152],
        GgmlType::Q8_0,
        1785664,
        30081024,
    ),
};

const GEMMA3: Known = Known {
    file: "gemma-3-270m-q4_k_m.gguf",
    arch: "gemma3",
    blocks: 18,
    embd: 640,
    heads: 4,
    kv_heads: 1,
    ctx: 32768,
    ffn: 2048,
    vocab: 262144,
    n_kv: 33,
    n_tensors: 236,
    data_offset: 6525120,
    types: &[
        (GgmlType::F32, 109),
        (GgmlType::Q8_0, 10),
        (GgmlType::Q5_0, 81),
        (GgmlType::Q4_K, 27),
        (GgmlType::Q6_K, 9),
    ],
    first: ("output_norm.weight", &[640], GgmlType::F32, 6525120, 2560),
};

fn check_known(k: &Known) {
    let path = real_model(k.file);
    let (f, src) = open_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let m = &f.metadata;
    let key = |s: &str| format!("{}.{s}", k.arch);
    assert_eq!(f.version, 3);
    assert_eq!(m.architecture(), Some(k.arch));
    assert_eq!(m.get_u32(&key("block_count")), Some(k.blocks));
    assert_eq!(m.get_u32(&key("embedding_length")), Some(k.embd));
    assert_eq!(m.get_u32(&key("attention.head_count")), Some(k.heads));
    assert_eq!(m.get_u32(&key("attention.head_count_kv")), Some(k.kv_heads));
    assert_eq!(m.get_u32(&key("context_length")), Some(k.ctx));
    assert_eq!(m.get_u32(&key("feed_forward_length")), Some(k.ffn));
    assert_eq!(
        m.get_str_array("tokenizer.ggml.tokens").map(|t| t.len()),
        Some(k.vocab)
    );
    assert_eq!(m.len(), k.n_kv);
    assert_eq!(f.tensors.len(), k.n_tensors);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset, k.data_offset);
    assert_eq!(f.file_size, hearth::gguf::ByteSource::len(&src));
    for &(ty, n) in k.types {
        assert_eq!(
            f.tensors.iter().filter(|t| t.ty == ty).count(),
            n,
            "count of {ty}"
        );
    }
    let (name, shape, ty, offset, size) = k.first;
    let t = &f.tensors[0];
    assert_eq!(
        (t.name.as_str(), t.shape.as_slice(), t.ty, t.offset, t.size),
        (name, shape, ty, offset, size)
    );
    assert_eq!(f.tensor(name), Some(t));
}

#[test]
fn smollm2_header() {
    check_known(&SMOLLM2);
}

#[test]
fn gemma3_header() {
    check_known(&GEMMA3);
}

fn json(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&gguf_support::read(path)).unwrap()
}

/// Every synthetic model matches specs.json and its eval JSON.
#[test]
fn synthetic_models_match_specs() {
    let specs = json(&gguf_support::synthetic_dir().join("specs.json"));
    for path in synthetic_models() {
        let stem = path.file_stem().unwrap().to_str().unwrap().to_string();
        let (model, format) = stem.split_once('-').unwrap();
        let spec = &specs[model];
        let eval = json(&gguf_support::synthetic_dir().join(format!("{stem}.json")));
        let (f, _src) = open_path(&path).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let m = &f.metadata;
        let arch = spec["arch"].as_str().unwrap();
        let key = |s: &str| format!("{arch}.{s}");
        let u = |v: &serde_json::Value| v.as_u64().unwrap() as u32;
        assert_eq!(m.architecture(), Some(arch), "{stem}");
        assert_eq!(
            m.get_u32(&key("block_count")),
            Some(u(&spec["L"])),
            "{stem}"
        );
        assert_eq!(
            m.get_u32(&key("embedding_length")),
            Some(u(&spec["d"])),
            "{stem}"
        );
        assert_eq!(
            m.get_u32(&key("attention.head_count")),
            Some(u(&spec["H"])),
            "{stem}"
        );
        assert_eq!(
            m.get_u32(&key("attention.head_count_kv")),
            Some(u(&spec["KV"])),
            "{stem}"
        );
        assert_eq!(
            m.get_u32(&key("context_length")),
            Some(u(&spec["ctx"])),
            "{stem}"
        );
        let n_vocab = eval["n_vocab"].as_u64().unwrap() as usize;
        assert_eq!(n_vocab, spec["n_vocab"].as_u64().unwrap() as usize);
        assert_eq!(
            m.get_str_array("tokenizer.ggml.tokens").map(|t| t.len()),
            Some(n_vocab),
            "{stem}"
        );
        let vocab = &eval["vocab"];
        assert_eq!(
            m.get_u32("tokenizer.ggml.bos_token_id"),
            Some(u(&vocab["bos"])),
            "{stem}"
        );
        assert_eq!(
            m.get_u32("tokenizer.ggml.eos_token_id"),
            Some(u(&vocab["eos"])),
            "{stem}"
        );
        assert_eq!(
            m.get_bool("tokenizer.ggml.add_bos_token"),
            vocab["add_bos"].as_bool(),
            "{stem}"
        );
        assert_eq!(m.get_str("tokenizer.ggml.model"), Some("llama"), "{stem}");
        assert!(matches!(
            m.get("general.architecture"),
            Some(Value::String(_))
        ));
        check_synthetic_tensors(&f, spec, format, &stem);
    }
}

/// Tensor count and types: with `--pure` every 2-D/3-D weight has the file's
/// format (the `_M` k-quants mean plain Q3_K/Q4_K/Q5_K); 1-D norms and biases and
/// the MoE router stay F32.
fn check_synthetic_tensors(f: &GgufFile, spec: &serde_json::Value, format: &str, stem: &str) {
    let weight_ty = GgmlType::from_name(format.trim_end_matches("_M")).unwrap();
    let layers = spec["L"].as_u64().unwrap() as usize;
    let tied = spec["tied"].as_bool().unwrap();
    let d = spec["d"].as_u64().unwrap();
    let n_vocab = spec["n_vocab"].as_u64().unwrap();
    for t in &f.tensors {
        let expect = if t.shape.len() == 1 || t.name.contains("ffn_gate_inp") {
            GgmlType::F32
        } else {
            weight_ty
        };
        assert_eq!(t.ty, expect, "{stem}: {}", t.name);
        assert!(t.offset >= f.data_offset && t.end() <= f.file_size);
    }
    let embd = f
        .tensor("token_embd.weight")
        .unwrap_or_else(|| panic!("{stem}: no token_embd"));
    assert_eq!(embd.shape, vec![d, n_vocab], "{stem}");
    assert_eq!(f.tensor("output.weight").is_none(), tied, "{stem}");
    let per_layer = f
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.0."))
        .count();
    let globals = if tied { 2 } else { 3 };
    assert_eq!(f.tensors.len(), globals + layers * per_layer, "{stem}");
    // Tensors are packed in header order, each padded to the alignment.
    for pair in f.tensors.windows(2) {
        assert_eq!(
            pair[1].offset,
            hearth::gguf::align_up(pair[0].end(), f.alignment).unwrap()
        );
    }
}

/// The in-memory source and the mmap source give identical results.
#[test]
fn mem_and_mmap_sources_agree() {
    for path in synthetic_models().iter().take(3) {
        let (a, _) = open_path(path).unwrap();
        let bytes = gguf_support::read(path);
        let b = pollster::block_on(GgufFile::read(&MemSource::new(bytes))).unwrap();
        assert_eq!(a.tensors, b.tensors);
        assert_eq!(
            a.metadata.iter().collect::<Vec<_>>(),
            b.metadata.iter().collect::<Vec<_>>()
        );
    }
}

/// Files written by gguf-py (`tests/fixtures/gguf/make_fixtures.py`): every
/// value type, a nested array, custom alignment; values as gguf-py 0.19 reads them.
#[test]
fn gguf_py_fixtures_parse() {
    use hearth::gguf::Array;
    let dir = gguf_support::root().join("tests/fixtures/gguf");
    for (name, alignment, data_offset) in [
        ("gguf-py-small.gguf", 32, 800),
        ("gguf-py-align64.gguf", 64, 832),
    ] {
        let (f, src) = open_path(&dir.join(name)).unwrap();
        let m = &f.metadata;
        assert_eq!(
            (f.alignment, f.data_offset),
            (alignment, data_offset),
            "{name}"
        );
        assert_eq!(m.architecture(), Some("llama"));
        assert_eq!(m.get("test.u8"), Some(&Value::U8(200)));
        assert_eq!(m.get("test.i8"), Some(&Value::I8(-100)));
        assert_eq!(m.get("test.u16"), Some(&Value::U16(60000)));
        assert_eq!(m.get("test.i16"), Some(&Value::I16(-30000)));
        assert_eq!(m.get("test.u32"), Some(&Value::U32(4_000_000_000)));
        assert_eq!(m.get("test.i32"), Some(&Value::I32(-2_000_000_000)));
        assert_eq!(m.get("test.f32"), Some(&Value::F32(0.15625)));
        assert_eq!(m.get("test.u64"), Some(&Value::U64((1 << 63) + 5)));
        assert_eq!(m.get("test.i64"), Some(&Value::I64(-(1 << 62))));
        assert_eq!(m.get("test.f64"), Some(&Value::F64(-2.5)));
        assert_eq!(m.get("test.bool"), Some(&Value::Bool(true)));
        assert_eq!(m.get_str("test.string"), Some("héllo wörld ✓"));
        let strings = ["a", "", "ü猫"].map(String::from).to_vec();
        assert_eq!(m.get_str_array("test.strings"), Some(strings.as_slice()));
        assert_eq!(m.get_array("test.ints"), Some(&Array::I32(vec![1, -2, 3])));
        assert_eq!(
            m.get_array("test.floats"),
            Some(&Array::F32(vec![0.5, -1.25]))
        );
        let nested = Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])]);
        assert_eq!(m.get_array("test.nested"), Some(&nested));
        let shapes: Vec<_> = f
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.shape.clone(), t.ty, t.size))
            .collect();
        assert_eq!(
            shapes,
            [
                ("t.f32", vec![8, 3], GgmlType::F32, 96),
                ("t.f16", vec![64, 2], GgmlType::F16, 256),
                ("t.q8_0", vec![64, 2], GgmlType::Q8_0, 136),
            ]
        );
        let a = pollster::block_on(hearth::gguf::read_tensor(&f, &src, "t.f32")).unwrap();
        let bits = |i: usize| u32::from_le_bytes(a[4 * i..4 * i + 4].try_into().unwrap());
        assert_eq!(
            (bits(0), bits(1)),
            (0xbfc86d30, 0x3d897766),
            "f32 bits as gguf-py reads them"
        );
        let b = pollster::block_on(hearth::gguf::read_tensor(&f, &src, "t.f16")).unwrap();
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0xb2aa);
    }
}

#[test]
fn open_path_errors_name_the_path() {
    let dir = gguf_support::temp_dir("open-errors");
    let missing = dir.join("missing.gguf");
    let e = open_path(&missing).unwrap_err();
    assert!(matches!(e, hearth::gguf::GgufError::Io { .. }), "{e}");
    assert!(e.to_string().contains("missing.gguf"), "{e}");
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    let e = open_path(&empty).unwrap_err();
    assert!(
        matches!(
            e,
            hearth::gguf::GgufError::Truncated {
                offset: 0,
                available: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = open_path(&dir).unwrap_err();
    assert!(e.to_string().contains(dir.to_str().unwrap()), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}
