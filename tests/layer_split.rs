//! A model split by blocks between the host's CPU and a device
//! (`LoadOptions::gpu_layers`, llama.cpp's `-ngl`). With the CPU on both
//! sides the split runs the same kernels in the same order, so the logits
//! are those of the whole model bit for bit at every split point, prompt,
//! decode and batched steps, dense and MoE. On WebGPU the split models'
//! prompt logits stay within the F16 bounds against llama.cpp's, and a
//! device budget short of the model splits it by itself.

mod model_support;
mod webgpu_support;

use hearth::gguf::open_model;
use hearth::model::{check_model, ForwardModel, LoadOptions, LogitsWanted};
use model_support::moe_cache::{cache_options, cache_steps};
use model_support::{
    agreement, argmax, bits, fixtures, ids, load_with, nrmse, read_f32, read_json, synthetic_model,
};
use webgpu_support::*;

/// One model of each architecture, in formats the split must carry over.
const MODELS: [&str; 6] = [
    "llama-Q4_K_M",
    "qwen2-Q8_0",
    "qwen3-Q4_0",
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
fn a_split_on_the_cpu_gives_the_models_logits_bit_for_bit() {
    for name in MODELS {
        let path = synthetic_model(name);
        let mut whole = load_with(&path, &split(None), 2);
        let n_layer = whole.config().n_layer;
        assert_eq!((whole.blocks(), whole.host_blocks()), (0..n_layer, 0..0));
        let want = bits(&cache_steps(&mut whole));
        for on_device in [0, 1, n_layer - 1, n_layer, n_layer + 3] {
            let mut m = load_with(&path, &split(Some(on_device)), 2);
            let k = n_layer - on_device.min(n_layer);
            assert_eq!(
                (m.host_blocks(), m.blocks()),
                (0..k, k..n_layer),
                "{name}: --gpu-layers {on_device}"
            );
            let got = bits(&cache_steps(&mut m));
            assert!(
                got == want,
                "{name}: blocks 0..{k} on the host, {k}..{n_layer} on the backend, yet other logits"
            );
        }
        // Unfused on both sides too (set_fusion reaches the host's blocks).
        whole.set_fusion(false);
        let mut m = load_with(&path, &split(Some(1)), 2);
        m.set_fusion(false);
        let (a, b) = (bits(&cache_steps(&mut whole)), bits(&cache_steps(&mut m)));
        assert!(a == b, "{name}: unfused, split at 1, other logits");
        println!("{name}: {n_layer} blocks, every split point bit for bit");
    }
}

/// The dense architectures' F16 models, split in the middle on WebGPU:
/// the bounds `tests/model_webgpu.rs` holds the whole model to.
#[test]
fn split_f16_prompt_logits_on_webgpu_match_llamacpp() {
    let dir = fixtures().join("synthetic");
    let mut failures = Vec::new();
    for arch in ["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "mixtral"] {
        let name = format!("{arch}-F16");
        let meta = read_json(&dir.join(format!("{name}.json")));
        let prompt = ids(&meta["prompt_ids"]);
        let reference = read_f32(&dir.join(format!("{name}.logits.f32")));
        let path = synthetic_model(&name);
        let (gguf, _) = open_model(&path).expect("open");
        let n_layer = hearth::model::ModelConfig::from_metadata(gguf.metadata())
            .expect("config")
            .n_layer;
        let opts = LoadOptions {
            gpu_layers: Some(n_layer / 2),
            ..cache_options(None, 8)
        };
        let Some(mut m) = load_gpu_opts(&path, &opts, &gpu_options()) else {
            return;
        };
        assert_eq!(m.host_blocks(), 0..n_layer - n_layer / 2, "{name}");
        let nv = m.config().n_vocab;
        let ours = run_all_gpu(&mut m, &prompt, LogitsWanted::All);
        let (e, t1, t20) = agreement(&ours, &reference, nv);
        println!(
            "{name:<12} {} of {n_layer} blocks on the host: nrmse {e:.2e} top1 {:.0}% top20 {t20:.2}",
            n_layer - n_layer / 2,
            t1 * 100.0
        );
        if !(e <= 2e-3 && t1 >= 0.75 && t20 >= 18.0) {
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "outside the bounds: {failures:?}");
}

/// A device budget short of the model and nothing else said: a dense
/// model keeps on the device the last blocks that fit, an MoE model whose
/// experts' offload would not be enough either does the same, and both
/// give the whole model's greedy tokens. A budget short of the head alone
/// is refused with what to do.
#[test]
fn a_short_device_budget_splits_the_layers_by_itself() {
    for name in ["llama-Q4_K_M", "mixtral-Q4_0"] {
        let path = synthetic_model(name);
        let Some(mut whole) = load_gpu_opts(&path, &split(None), &gpu_options()) else {
            return;
        };
        let n_layer = whole.config().n_layer;
        let (gguf, _) = open_model(&path).expect("open");
        let need = check_model(&gguf, whole.backend(), &split(None))
            .expect("check")
            .memory;
        // Dense: half the weights short. MoE: short of the model without
        // its routed experts, so that offloading them is not enough (with
        // two blocks, every block then runs on the host).
        let experts: u64 = gguf
            .tensors
            .iter()
            .filter(|t| t.name.contains("_exps."))
            .map(|t| t.size)
            .sum();
        let head_only = check_model(&gguf, whole.backend(), &split(Some(0)))
            .expect("check")
            .memory
            .total();
        let budget = match experts {
            0 => need.total() - need.weights / 2,
            e => (need.total() - e + head_only) / 2,
        };
        let short = hearth::backend::webgpu::GpuOptions {
            memory_budget: Some(budget),
            ..gpu_options()
        };
        let mut m = load_gpu_opts(&path, &split(None), &short).expect("the adapter is there");
        let host = m.host_blocks();
        assert!(
            host.end > 0 && (experts > 0 || host.end < n_layer),
            "{name}: blocks {host:?} on the host within {budget} of {} bytes",
            need.total()
        );
        let checked = check_model(&gguf, m.backend(), &split(None)).expect("check");
        assert!(checked.memory.total() <= budget, "{}", checked.memory);
        assert_eq!(checked.host_blocks, host.end);
        assert!(checked.offload.is_none(), "{name}: {:?}", checked.offload);
        println!("{name}: {}", checked.reason);
        let nv = m.config().n_vocab;
        let picks = |v: &[Vec<f32>]| -> Vec<usize> {
            v.iter()
                .flat_map(|s| s.chunks(nv).map(argmax).collect::<Vec<_>>())
                .collect()
        };
        let (a, b) = (picks(&cache_steps(&mut whole)), picks(&cache_steps(&mut m)));
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        assert!(
            same + a.len() / 7 >= a.len(),
            "{name}: top1 {same}/{}",
            a.len()
        );

        let tiny = hearth::backend::webgpu::GpuOptions {
            memory_budget: Some(need.activations),
            ..gpu_options()
        };
        let ctx = pollster::block_on(hearth::backend::webgpu::GpuContext::new(&tiny))
            .expect("the adapter is there");
        let backend = hearth::backend::webgpu::WebGpuBackend::new(ctx);
        let err = check_model(&gguf, &backend, &split(None))
            .expect_err("not even the head fits")
            .to_string();
        assert!(err.contains("raise --gpu-mem"), "{err}");
    }
}

/// SmolLM2 (30 blocks) split at three points on the CPU: its logits are
/// the whole model's bit for bit, prompt and decode.
#[test]
fn smollm2_split_on_the_cpu_gives_its_logits_bit_for_bit() {
    let path = model_support::real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut whole = load_with(&path, &split(None), 2);
    let want = bits(&cache_steps(&mut whole));
    for on_device in [1, 17, 29] {
        let mut m = load_with(&path, &split(Some(on_device)), 2);
        assert_eq!(m.host_blocks(), 0..30 - on_device);
        assert!(
            bits(&cache_steps(&mut m)) == want,
            "--gpu-layers {on_device}: other logits"
        );
    }
}

/// SmolLM2 split on WebGPU (20 of 30 blocks on the host): prompt, decode
/// and batched steps agree with the whole model on WebGPU within the
/// rounding that parts the CPU from WebGPU.
#[test]
fn smollm2_split_on_webgpu_agrees_with_the_whole_model() {
    let path = model_support::real_model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let Some(mut whole) = load_gpu_opts(&path, &split(None), &gpu_options()) else {
        return;
    };
    let nv = whole.config().n_vocab;
    let want = cache_steps(&mut whole);
    let mut cpu = load_with(&path, &split(None), 2);
    let on_cpu = cache_steps(&mut cpu);
    let mut m = load_gpu_opts(&path, &split(Some(10)), &gpu_options()).expect("adapter");
    let got = cache_steps(&mut m);
    for (i, ((g, w), c)) in got.iter().zip(&want).zip(&on_cpu).enumerate() {
        let (e, base) = (nrmse(g, w), nrmse(c, w));
        let same = g
            .chunks(nv)
            .zip(w.chunks(nv))
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count();
        let rows = w.len() / nv;
        println!(
            "step {i}: split vs whole nrmse {e:.2e} (CPU vs WebGPU {base:.2e}), top1 {same}/{rows}"
        );
        // Half the blocks' rounding is the CPU's: no further from the
        // whole model than the CPU is.
        assert!(e < 2.0 * base.max(5e-3), "step {i}: nrmse {e:.2e}");
        assert!(same + rows / 7 >= rows, "step {i}: top1 {same}/{rows}");
    }
}
