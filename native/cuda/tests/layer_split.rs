//! A model split by blocks between the host's CPU and the CUDA device
//! (`LoadOptions::gpu_layers`, llama.cpp's `-ngl`), as tests/layer_split.rs
//! on the CPU and WebGPU: the stored synthetic models with their first
//! block on the host agree with llama.cpp's prompt logits and with the
//! whole model on the device, prompt, decode and batched steps, within
//! the rounding that parts the CPU's int8 paths from the device's.

mod cuda_support;
#[path = "../../../tests/model_support/mod.rs"]
mod model_support;

use cuda_support::{fixtures, load_cuda_with};
use hearth::model::{ForwardModel, LoadOptions, LogitsWanted};
use model_support::moe_cache::{assert_cache_agrees, cache_options, cache_steps};
use model_support::{argmax, ids, read_f32, read_json, row_errors, run_all};

const MODELS: [&str; 7] = [
    "llama-F16",
    "llama-Q4_K_M",
    "qwen2-Q8_0",
    "qwen3-Q4_K_M",
    "gemma3-Q4_K_M",
    "qwen3moe-Q4_K_M",
    "mixtral-Q4_0",
];

fn split(gpu_layers: Option<usize>) -> LoadOptions {
    LoadOptions {
        gpu_layers,
        ..cache_options(None, 12)
    }
}

#[test]
fn a_split_model_agrees_with_llamacpp_and_the_whole_model() {
    let dir = fixtures().join("synthetic");
    for name in MODELS {
        let path = dir.join(format!("models/{name}.gguf"));
        let Some(mut whole) = load_cuda_with(&path, &split(None)) else {
            return;
        };
        let n_layer = whole.config().n_layer;
        let mut m = load_cuda_with(&path, &split(Some(n_layer - 1))).expect("the device is there");
        assert_eq!((m.host_blocks(), m.blocks()), (0..1, 1..n_layer), "{name}");

        let meta = read_json(&dir.join(format!("{name}.json")));
        let prompt = ids(&meta["prompt_ids"]);
        let reference = read_f32(&dir.join(format!("{name}.logits.f32")));
        let nv = m.config().n_vocab;
        let ours = run_all(&mut m, &prompt, LogitsWanted::All);
        let rows = reference.len() / nv;
        let median = row_errors(&ours, &reference, nv)[rows / 2];
        let top1 = (0..rows)
            .filter(|&r| argmax(&ours[r * nv..][..nv]) == argmax(&reference[r * nv..][..nv]))
            .count();
        println!("{name:<16} block 0 on the host: median row vs llama.cpp {median:.2e}, top1 {top1}/{rows}");
        assert!(
            median < 8e-2 && 4 * top1 >= 3 * rows,
            "{name}: {median:.2e} {top1}/{rows}"
        );

        let want = cache_steps(&mut whole);
        let mut m = load_cuda_with(&path, &split(Some(n_layer - 1))).expect("the device is there");
        let got = cache_steps(&mut m);
        assert_cache_agrees(&format!("{name} split"), 1, &got, &want, nv);
    }
}

/// Streamed blocks (`LoadOptions::stream_layers`) on the device: the same
/// kernels over the same bytes, written into one of two sets of buffers
/// before each block runs, give the resident model's logits bit for bit
/// (the resident model replays CUDA graphs; a plan that stops for the host
/// runs op by op, which tests/model.rs shows equal to the replay).
#[test]
fn streamed_blocks_give_the_resident_models_logits_bit_for_bit() {
    let dir = fixtures().join("synthetic");
    for name in MODELS {
        let path = dir.join(format!("models/{name}.gguf"));
        let opts = |on| LoadOptions {
            stream_layers: on,
            ..cache_options(None, 12)
        };
        let Some(mut whole) = load_cuda_with(&path, &opts(false)) else {
            return;
        };
        let want = cache_steps(&mut whole);
        let mut m = load_cuda_with(&path, &opts(true)).expect("the device is there");
        let got = cache_steps(&mut m);
        assert!(got == want, "{name}: streamed blocks gave other logits");
        assert!(m.streamed_bytes() > 0, "{name}: nothing streamed");
        println!(
            "{name}: streamed, bit for bit ({} bytes written)",
            m.streamed_bytes()
        );
    }
}
