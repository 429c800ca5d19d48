//! The engine over the real CPU backend: requests batched together give
//! exactly the tokens each gives alone (ragged batches, chunked prefill,
//! mixed prefill and decode), and the pool returns to full.

use hearth::graph::KvType;
use std::collections::BTreeMap;
use std::path::Path;

use hearth::backend::cpu::CpuBackend;
use hearth::engine::{Engine, EngineConfig, EngineEvent, GenerateRequest, Prompt, RequestId};
use hearth::model::chat::ChatTemplate;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::{load_model, LoadOptions, Model};

type CpuModel = Model<CpuBackend>;
use hearth::sample::SamplingParams;

fn engine(name: &str, config: &EngineConfig) -> Engine<CpuModel> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llamacpp/synthetic/models")
        .join(format!("{name}.gguf"));
    let (model, sources) =
        hearth::gguf::open_model(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let opts = LoadOptions::new(config.kv_cache_config());
    let backend = CpuBackend::new(1);
    let cpu = pollster::block_on(load_model(backend, &model, &sources, &opts, &mut |_| {}))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let tok = Tokenizer::from_metadata(model.metadata()).expect("tokenizer");
    let chatml = ChatTemplate::builtin("chatml").expect("chatml");
    Engine::new(cpu, tok, Some(chatml), config.clone()).expect("engine")
}

fn requests() -> Vec<GenerateRequest> {
    [3usize, 17, 40, 29]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let prompt: Vec<u32> = std::iter::once(1)
                .chain((1..n as u32).map(|j| 3 + (j * 53 + i as u32 * 211) % 505))
                .collect();
            let mut r = GenerateRequest::new(Prompt::Tokens(prompt));
            r.max_tokens = Some(12 + 3 * i);
            r.ignore_eos = true;
            r.sampling = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    seed: 7 + i as u64,
                    ..SamplingParams::default()
                }
            };
            r
        })
        .collect()
}

fn run(engine: &mut Engine<CpuModel>) -> BTreeMap<RequestId, Vec<u32>> {
    let mut out: BTreeMap<RequestId, Vec<u32>> = BTreeMap::new();
    while engine.has_unfinished() {
        for e in pollster::block_on(engine.step()).expect("step") {
            if let EngineEvent::Token { request, token, .. } = e {
                out.entry(request).or_default().push(token);
            }
        }
    }
    out
}

#[test]
fn batched_equals_solo_on_the_cpu_backend() {
    let config = EngineConfig {
        n_ctx: 128,
        kv_tokens: 512,
        max_num_seqs: 4,
        max_num_batched_tokens: 24,
        block_size: 16,
        kv_type: KvType::F32,
        enable_prefix_caching: true,
        prefill_tokens_per_4_decodes: 0,
    };
    for name in [
        "llama-Q4_K_M",
        "qwen3-Q8_0",
        "gemma3-Q8_0",
        "qwen3moe-Q4_K_M",
    ] {
        let solo: Vec<Vec<u32>> = requests()
            .into_iter()
            .map(|r| {
                let mut e = engine(name, &config);
                let id = e.add_request(r).expect("add");
                run(&mut e).remove(&id).expect("tokens")
            })
            .collect();
        let mut e = engine(name, &config);
        let ids: Vec<_> = requests()
            .into_iter()
            .map(|r| e.add_request(r).expect("add"))
            .collect();
        let batched = run(&mut e);
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(
                batched[id], solo[i],
                "{name}: request {i} batched differs from solo"
            );
        }
        let s = e.stats().sched;
        assert_eq!(
            s.num_free_blocks, s.num_usable_blocks,
            "{name}: pool not full"
        );
    }
}

#[test]
fn an_engine_can_move_to_a_worker_thread() {
    fn assert_send<T: Send>() {}
    assert_send::<Engine<CpuModel>>();
}
