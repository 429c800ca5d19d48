//! Loader errors say what is wrong: an unsupported architecture (naming the
//! supported ones), a tensor type without a CPU kernel (naming the tensor),
//! a missing tensor, a tensor of the wrong shape. Progress is reported.

mod model_support;

use hearth::backend::cpu::CpuBackend;
use hearth::gguf::{write_gguf, GgufFile, GgufModel, MemSource, Metadata, TensorSpec, Value};
use hearth::graph::{KvCacheConfig, KvType};
use hearth::model::{load_model, LoadOptions};
use hearth::quant::GgmlType;
use model_support::fixtures;

type Tensors = Vec<(TensorSpec, Vec<u8>)>;

/// The synthetic llama Q8_0 model, rewritten by `edit`, then loaded.
fn load_edited(edit: impl FnOnce(&mut Metadata, &mut Tensors)) -> hearth::Result<usize> {
    let bytes = std::fs::read(fixtures().join("synthetic/models/llama-Q8_0.gguf")).expect("model");
    let src = MemSource::new(bytes.clone());
    let file = pollster::block_on(GgufFile::read(&src)).expect("parse");
    let mut md = file.metadata.clone();
    let mut tensors: Tensors = file
        .tensors
        .iter()
        .map(|t| {
            let spec = TensorSpec {
                name: t.name.clone(),
                shape: t.shape.clone(),
                ty: t.ty,
            };
            (
                spec,
                bytes[t.offset as usize..(t.offset + t.size) as usize].to_vec(),
            )
        })
        .collect();
    edit(&mut md, &mut tensors);
    let refs: Vec<(TensorSpec, &[u8])> = tensors.iter().map(|(s, d)| (s.clone(), &d[..])).collect();
    let out = write_gguf(Vec::new(), &md, &refs).expect("write");
    let src = MemSource::new(out);
    let file = pollster::block_on(GgufFile::read(&src)).expect("reparse");
    let model = GgufModel::from_files(vec![file]).expect("model");
    let opts = LoadOptions::new(KvCacheConfig {
        num_blocks: 4,
        block_size: 16,
        dtype: KvType::F16,
    });
    let mut calls = 0;
    let backend = CpuBackend::new(1);
    pollster::block_on(load_model(backend, &model, &[src], &opts, &mut |_| {
        calls += 1
    }))?;
    Ok(calls)
}

fn find<'a>(t: &'a mut Tensors, name: &str) -> &'a mut (TensorSpec, Vec<u8>) {
    t.iter_mut().find(|(s, _)| s.name == name).expect("tensor")
}

#[test]
fn unedited_model_loads_with_progress() {
    let calls = load_edited(|_, _| {}).expect("load");
    assert!(calls >= 20, "progress after every tensor: {calls}");
}

#[test]
fn unsupported_architecture_names_the_supported_ones() {
    let err = load_edited(|md, _| md.set("general.architecture", Value::String("rwkv9".into())))
        .expect_err("rwkv9");
    let msg = err.to_string();
    assert!(
        msg.contains("rwkv9") && msg.contains("gemma3") && msg.contains("qwen3moe"),
        "{msg}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let err = load_edited(|_, t| t.retain(|(s, _)| s.name != "blk.1.ffn_up.weight"))
        .expect_err("missing");
    assert!(err.to_string().contains("blk.1.ffn_up.weight"), "{err}");
}

#[test]
fn wrong_shape_is_named() {
    let err = load_edited(|_, t| find(t, "output_norm.weight").0.shape = vec![128, 2])
        .expect_err("shape");
    let msg = err.to_string();
    assert!(
        msg.contains("output_norm.weight") && msg.contains("[128, 2]"),
        "{msg}"
    );
}

#[test]
fn unsupported_type_is_named() {
    let err = load_edited(|_, t| {
        let q = find(t, "blk.0.attn_q.weight");
        q.0.ty = GgmlType::IQ2_XS;
        q.1 = vec![0x11; 256 * 74];
    })
    .expect_err("type");
    let msg = err.to_string();
    assert!(
        msg.contains("blk.0.attn_q.weight") && msg.contains("IQ2_XS") && msg.contains("Q4_K"),
        "{msg}"
    );
}
