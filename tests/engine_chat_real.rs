//! Chat prompts of the real models tokenize to exactly llama.cpp's ids:
//! SmolLM2 through its own Jinja template, Gemma 3 (no template in the
//! file) through the built-in `gemma` one.

mod engine_support;

use std::path::PathBuf;

use engine_support::{hash_rule, FakeModel};
use hearth::engine::{ChatMessage, Engine, EngineConfig, Prompt};
use hearth::model::chat::ChatTemplate;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::ModelConfig;
use serde_json::Value;

fn models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/models"),
    }
}

fn check(model_file: &str, fixture: &str, builtin: Option<&str>) {
    let path = models_dir().join(model_file);
    assert!(
        path.exists(),
        "{} not found: run `make setup` (or set HEARTH_MODELS)",
        path.display()
    );
    let (file, _src) = hearth::gguf::open_path(&path).expect("open");
    let md = &file.metadata;
    let config = EngineConfig {
        n_ctx: 256,
        ..EngineConfig::default()
    };
    let mc = ModelConfig::from_metadata(md).expect("config");
    let model = FakeModel::new(mc, &config, hash_rule());
    let tok = Tokenizer::from_metadata(md).expect("tokenizer");
    let template = ChatTemplate::from_metadata(md, builtin).expect("template");
    let engine = Engine::new(model, tok, Some(template), config).expect("engine");

    let json = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llamacpp/real")
        .join(fixture)
        .join("prompt-02-chat.json");
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("fixture")).expect("json");
    let messages: Vec<ChatMessage> = reference["chat_messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| ChatMessage::new(m[0].as_str().expect("role"), m[1].as_str().expect("text")))
        .collect();
    let want: Vec<u32> = reference["prompt_ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect();
    let ids = engine
        .tokenize_prompt(&Prompt::Chat(messages))
        .expect("tokenize chat");
    assert_eq!(
        ids, want,
        "{model_file}: chat prompt ids differ from llama.cpp's"
    );
}

#[test]
fn smollm2_chat_prompt_matches_llamacpp() {
    check(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "smollm2-135m-instruct-q4_1",
        None,
    );
}

#[test]
fn gemma3_chat_prompt_matches_llamacpp() {
    check(
        "gemma-3-270m-q4_k_m.gguf",
        "gemma-3-270m-q4_k_m",
        Some("gemma"),
    );
}
