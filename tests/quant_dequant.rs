//! `quant::reference::dequantize` against values computed independently by
//! gguf-py's numpy dequantizers (`tests/fixtures/quant/dequant`, see its
//! README): rows of the synthetic llama models in all 14 formats, rows of the
//! two real models, and random blocks of every type.
//!
//! Agreement is bit for bit: for every format, ggml, gguf-py and the reference
//! compute each value with the same f32 operations in the same order (a
//! product of the f16 scale widened to f32 and a small integer, or a
//! sub-scale product then a product with the quant, then the min subtracted),
//! each correctly rounded, so there is no association difference to allow for.

use std::path::PathBuf;

use hearth::quant::reference::dequantize;
use hearth::quant::GgmlType;
use serde_json::Value;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quant/dequant")
}

fn read(name: &str) -> Vec<u8> {
    let path = fixture_dir().join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn dequantize_matches_gguf_py() {
    let index: Value = serde_json::from_slice(&read("index.json")).expect("index.json");
    let fixtures = index["fixtures"].as_array().expect("fixtures");
    let mut checked = std::collections::BTreeMap::<GgmlType, usize>::new();
    for f in fixtures {
        let name = f["name"].as_str().expect("name");
        let ty = GgmlType::from_name(f["type"].as_str().expect("type")).expect("known type");
        assert_eq!(
            u64::from(ty.id()),
            f["type_id"].as_u64().expect("type_id"),
            "{name}"
        );
        let raw = read(&format!("{name}.bin"));
        let expected: Vec<f32> = read(&format!("{name}.f32"))
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(
            expected.len() as u64,
            f["n_elems"].as_u64().expect("n_elems"),
            "{name}"
        );

        // Unaligned on purpose: the blocks start one byte into the buffer.
        let mut shifted = vec![0u8; raw.len() + 1];
        shifted[1..].copy_from_slice(&raw);
        let mut got = vec![f32::NAN; expected.len()];
        if let Err(e) = dequantize(ty, &shifted[1..], &mut got) {
            panic!("{name}: {e}");
        }
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                g.to_bits(),
                e.to_bits(),
                "{name} ({ty}) element {i}: got {g:e}, gguf-py {e:e}"
            );
        }
        assert!(
            expected.iter().any(|&v| v != 0.0),
            "{name}: fixture is not all zeros"
        );
        *checked.entry(ty).or_default() += 1;
    }
    eprintln!("checked {checked:?}");
    use GgmlType::*;
    for ty in [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ] {
        assert!(
            checked.get(&ty).copied().unwrap_or(0) >= 2,
            "{ty}: too few fixtures checked ({checked:?})"
        );
    }
}
