//! Chat prompts must equal the text llama.cpp built for the same messages
//! (tests/fixtures/llamacpp/real/*/prompt-02-chat.json).

use std::path::PathBuf;

use hearth::gguf::{Array, Metadata, Value};
use hearth::model::chat::{ChatMessage, ChatTemplate};

struct Reference {
    messages: Vec<ChatMessage>,
    template: String,
    prompt_text: String,
}

fn reference(model_dir: &str) -> Reference {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llamacpp/real")
        .join(model_dir)
        .join("prompt-02-chat.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("fixture parses");
    let messages = json["chat_messages"]
        .as_array()
        .expect("chat_messages")
        .iter()
        .map(|pair| {
            ChatMessage::new(
                pair[0].as_str().expect("role"),
                pair[1].as_str().expect("content"),
            )
        })
        .collect();
    Reference {
        messages,
        template: json["chat_template"]
            .as_str()
            .expect("chat_template")
            .to_string(),
        prompt_text: json["prompt_text"]
            .as_str()
            .expect("prompt_text")
            .to_string(),
    }
}

/// The vocabulary entries and special ids a template lookup needs, with the
/// ids the real model files use.
fn metadata(template: Option<&str>, tokens: &[(u32, &str)], bos: u32, eos: u32) -> Metadata {
    let n = tokens
        .iter()
        .map(|&(id, _)| id as usize + 1)
        .max()
        .unwrap_or(0);
    let mut vocab = vec![String::from("<filler>"); n];
    for &(id, text) in tokens {
        vocab[id as usize] = text.to_string();
    }
    let mut md = Metadata::new();
    if let Some(t) = template {
        md.insert("tokenizer.chat_template".into(), Value::String(t.into()));
    }
    md.insert(
        "tokenizer.ggml.tokens".into(),
        Value::Array(Array::String(vocab)),
    );
    md.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(bos));
    md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(eos));
    md
}

#[test]
fn smollm2_model_template_matches_llamacpp() {
    let r = reference("smollm2-135m-instruct-q4_1");
    assert_eq!(r.template, "model's tokenizer.chat_template");
    // The template text as stored in SmolLM2-135M-Instruct.Q4_1.gguf.
    let source_path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat/templates/smollm2.jinja");
    let source = std::fs::read_to_string(&source_path).expect("smollm2.jinja");
    let md = metadata(
        Some(&source),
        &[(0, "<|endoftext|>"), (1, "<|im_start|>"), (2, "<|im_end|>")],
        1,
        2,
    );
    let template = ChatTemplate::from_metadata(&md, None).expect("compiles");
    assert_eq!(
        template.render(&r.messages, true).expect("renders"),
        r.prompt_text
    );
}

#[test]
fn gemma_builtin_matches_llamacpp() {
    let r = reference("gemma-3-270m-q4_k_m");
    assert_eq!(r.template, "gemma");
    // Gemma 3 270M (base) has no template of its own; the built-in is chosen by name.
    let md = metadata(None, &[(1, "<eos>"), (2, "<bos>")], 2, 1);
    let template = ChatTemplate::from_metadata(&md, Some(&r.template)).expect("built-in exists");
    assert_eq!(
        template.render(&r.messages, true).expect("renders"),
        r.prompt_text
    );
    assert!(
        ChatTemplate::from_metadata(&md, None).is_err(),
        "the base model has no template"
    );
}

#[test]
fn chatml_builtin_matches_the_smollm2_reference_too() {
    // llama.cpp detects SmolLM2's template as chatml; the built-in gives the same
    // text for conversations that start with a system turn.
    let r = reference("smollm2-135m-instruct-q4_1");
    let template = ChatTemplate::builtin("chatml").unwrap();
    assert_eq!(template.render(&r.messages, true).unwrap(), r.prompt_text);
}
