//! Streamed blocks (`LoadOptions::stream_layers`) on WebGPU: every block's
//! matrices in host memory, written into one of two sets of device
//! buffers before the block runs. The same kernels run over the same
//! bytes, so the logits are the resident model's bit for bit, prompt,
//! decode and batched steps, dense and MoE, blocks whose matrices differ
//! in type (Q4_K_M) included; every step writes every block once.

mod model_support;
mod webgpu_support;

use hearth::gguf::open_model;
use hearth::model::{check_model, LoadOptions};
use model_support::moe_cache::{cache_options, cache_steps};
use model_support::{bits, synthetic_model};
use webgpu_support::*;

fn streamed(on: bool) -> LoadOptions {
    LoadOptions {
        stream_layers: on,
        ..cache_options(None, 12)
    }
}

fn check(path: &std::path::Path, label: &str) {
    let Some(mut whole) = load_gpu_opts(path, &streamed(false), &gpu_options()) else {
        return;
    };
    let want = bits(&cache_steps(&mut whole));
    let mut m = load_gpu_opts(path, &streamed(true), &gpu_options()).expect("adapter");
    let (gguf, _) = open_model(path).expect("open");
    let checked = check_model(&gguf, m.backend(), &streamed(true)).expect("check");
    let plan = checked.stream.expect("a stream plan");
    let resident = check_model(&gguf, m.backend(), &streamed(false))
        .expect("check")
        .memory;
    // Two sets hold two blocks: less than the blocks from three on.
    let n_layer = plan.blocks.len();
    assert!(
        checked.memory.weights < resident.weights
            || (n_layer <= 2 && checked.memory.weights <= resident.weights),
        "{label}: {} of weights streamed, {} resident",
        checked.memory.weights,
        resident.weights
    );
    assert_eq!(m.streamed_bytes(), 0);
    let got = bits(&cache_steps(&mut m));
    assert!(got == want, "{label}: streamed blocks gave other logits");
    // Five steps, each writing every block's matrices (the file's bytes).
    let file_bytes: u64 = gguf
        .tensors
        .iter()
        .filter(|t| t.name.starts_with("blk.") && t.shape.len() >= 2)
        .map(|t| t.size)
        .sum();
    assert_eq!(m.streamed_bytes(), 5 * file_bytes, "{label}");
    println!(
        "{label}: bit for bit; {} blocks, {:.1} MiB written per step, sets of {:.1} MiB",
        plan.blocks.len(),
        file_bytes as f64 / 1048576.0,
        plan.set_bytes as f64 / 2.0 / 1048576.0
    );
}

#[test]
fn streamed_blocks_give_the_resident_models_logits_bit_for_bit() {
    for name in [
        "llama-Q4_K_M",
        "qwen2-Q8_0",
        "qwen3-Q4_0",
        "gemma3-Q4_K_M",
        "qwen3moe-Q4_K_M",
        "mixtral-Q4_0",
    ] {
        check(&synthetic_model(name), name);
    }
    check(
        &model_support::real_model("SmolLM2-135M-Instruct.Q4_1.gguf"),
        "SmolLM2",
    );
}

/// Streaming needs a GPU and whole blocks: on the CPU backend, or beside
/// a layer split, it is refused with what to do instead.
#[test]
fn streaming_is_refused_where_it_cannot_apply() {
    let path = synthetic_model("llama-Q4_0");
    let (gguf, _) = open_model(&path).expect("open");
    let cpu = hearth::backend::cpu::CpuBackend::new(1);
    let err = check_model(&gguf, &cpu, &streamed(true))
        .expect_err("the CPU streams nothing")
        .to_string();
    assert!(err.contains("CPU backend"), "{err}");
    let Some(gpu) = gpu() else {
        return;
    };
    let both = LoadOptions {
        gpu_layers: Some(1),
        ..streamed(true)
    };
    let err = check_model(&gguf, &gpu, &both)
        .expect_err("streaming and a split are two placements")
        .to_string();
    assert!(err.contains("drop --gpu-layers"), "{err}");
}
