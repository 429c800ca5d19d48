//! `quant::reference::quantize` gives the bytes llama.cpp's `llama-quantize
//! --pure` wrote for the synthetic llama model (`tests/fixtures/quant/quantize`,
//! see its README): the F32 source rows and, per format, the same rows as
//! stored in `llama-<FORMAT>.gguf`.

use std::path::PathBuf;

use hearth::quant::reference::quantize;
use hearth::quant::GgmlType;
use serde_json::Value;

fn read(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant/quantize")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn quantize_matches_llama_quantize() {
    let index: Value = serde_json::from_slice(&read("index.json")).expect("index.json");
    let mut checked = Vec::new();
    for slice in index["slices"].as_array().expect("slices") {
        let name = slice["name"].as_str().expect("name");
        let src: Vec<f32> = read(slice["f32_file"].as_str().expect("f32_file"))
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let rows = slice["rows"].as_u64().expect("rows") as usize;
        assert_eq!(
            src.len(),
            rows * slice["n_per_row"].as_u64().expect("n_per_row") as usize
        );
        for (ty_name, q) in slice["quantized"].as_object().expect("quantized") {
            let ty = GgmlType::from_name(ty_name).expect("known type");
            let expected = read(q["file"].as_str().expect("file"));
            let mut got = Vec::new();
            if let Err(e) = quantize(ty, &src, &mut got) {
                panic!("{name} {ty}: {e}");
            }
            assert_eq!(got.len(), expected.len(), "{name} {ty}: size");
            if let Some(at) = got.iter().zip(&expected).position(|(a, b)| a != b) {
                let block = at / ty.block_bytes();
                let span = block * ty.block_bytes()..(block + 1) * ty.block_bytes();
                let first = block * ty.block_elems();
                panic!(
                    "{name} {ty}: first difference at byte {at} (block {block}, source elements {first}..)\n got  {:02x?}\n want {:02x?}\n src  {:?}",
                    &got[span.clone()],
                    &expected[span],
                    &src[first..first + ty.block_elems().min(32)],
                );
            }
            checked.push(ty);
        }
    }
    eprintln!("byte-identical: {checked:?}");
    use GgmlType::*;
    for ty in [
        F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ] {
        assert_eq!(
            checked.iter().filter(|&&t| t == ty).count(),
            2,
            "{ty} checked on both slices"
        );
    }
}
