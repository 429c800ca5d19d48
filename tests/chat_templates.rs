//! Chat templates rendered against expected texts produced by Jinja2
//! (tests/fixtures/chat/cases.json; see the README there).

use std::path::PathBuf;

use hearth::gguf::{Array, Metadata, Value};
use hearth::model::chat::{ChatError, ChatMessage, ChatTemplate};
use serde::Deserialize;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat")
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn template_source(file: &str) -> String {
    read(fixtures().join("templates").join(file))
}

#[derive(Deserialize)]
struct Case {
    template: String,
    case: String,
    bos_token: String,
    eos_token: String,
    now_unix: i64,
    add_generation_prompt: bool,
    /// The functions offered (tool_cases.json only).
    #[serde(default)]
    tools: Vec<serde_json::Value>,
    messages: Vec<ChatMessage>,
    expected: String,
}

/// A built-in format case: `expected` is llama.cpp's `llama_chat_apply_template`.
#[derive(Deserialize)]
struct BuiltinCase {
    builtin: String,
    case: String,
    add_generation_prompt: bool,
    messages: Vec<ChatMessage>,
    expected: String,
}

#[derive(Deserialize)]
struct Cases {
    cases: Vec<Case>,
    builtin_cases: Vec<BuiltinCase>,
}

fn load_all() -> Cases {
    serde_json::from_str(&read(fixtures().join("cases.json"))).expect("cases.json parses")
}

fn load_cases() -> Vec<Case> {
    load_all().cases
}

/// Renders `case` and compares with Jinja2's text; the message shows both.
fn check(case: &Case) -> Result<(), String> {
    let label = format!(
        "{} / {} / add_generation_prompt={}",
        case.template, case.case, case.add_generation_prompt
    );
    let template = ChatTemplate::new(
        &template_source(&case.template),
        &case.bos_token,
        &case.eos_token,
    )
    .map_err(|e| format!("{label}: {e}"))?
    .with_now(case.now_unix);
    let tools = (!case.tools.is_empty()).then_some(case.tools.as_slice());
    if tools.is_some() && !template.supports_tools() {
        return Err(format!("{label}: the template does not read `tools`"));
    }
    let got = template
        .render_with_tools(&case.messages, tools, case.add_generation_prompt)
        .map_err(|e| format!("{label}: {e}"))?;
    if got != case.expected {
        return Err(format!(
            "{label}:\n--- expected\n{}\n--- got\n{got}\n---",
            case.expected
        ));
    }
    Ok(())
}

#[test]
fn every_fixture_case_matches_jinja2() {
    let cases = load_cases();
    assert!(
        cases.len() >= 20,
        "cases.json has only {} cases",
        cases.len()
    );
    let failures: Vec<String> = cases.iter().filter_map(|c| check(c).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// Each template the task names has at least one case with a system turn.
#[test]
fn fixture_covers_the_common_templates() {
    let cases = load_cases();
    for name in [
        "smollm2",
        "llama3",
        "llama3.1",
        "llama3.2",
        "qwen2.5",
        "qwen3",
        "gemma3",
        "mistral-nemo",
        "features",
    ] {
        let file = format!("{name}.jinja");
        assert!(
            cases
                .iter()
                .any(|c| c.template == file
                    && c.messages.first().is_some_and(|m| m.role == "system")),
            "no case for {file}"
        );
    }
}

#[test]
fn builtins_match_llamacpp() {
    let cases = load_all().builtin_cases;
    assert!(cases.len() >= 24, "only {} built-in cases", cases.len());
    for c in &cases {
        let template = ChatTemplate::builtin(&c.builtin).unwrap();
        assert_eq!(template.builtin_name(), Some(c.builtin.as_str()));
        let got = template
            .render(&c.messages, c.add_generation_prompt)
            .unwrap();
        assert_eq!(
            got, c.expected,
            "{} / {} / add_generation_prompt={}",
            c.builtin, c.case, c.add_generation_prompt
        );
    }
}

fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
    pairs.iter().map(|&(r, c)| ChatMessage::new(r, c)).collect()
}

#[test]
fn raise_exception_becomes_a_raised_error() {
    let gemma3 = ChatTemplate::new(&template_source("gemma3.jinja"), "<bos>", "<eos>").unwrap();
    let err = gemma3
        .render(&msgs(&[("user", "a"), ("user", "b")]), true)
        .unwrap_err();
    match &err {
        ChatError::Raised { message } => {
            assert_eq!(
                message,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            )
        }
        other => panic!("expected Raised, got {other:?}"),
    }
    assert!(err
        .to_string()
        .contains("rejected the conversation: Conversation roles must alternate"));

    let inline = ChatTemplate::new("{% if messages | length > 1 %}{{ raise_exception('too many: ' ~ messages | length) }}{% endif %}ok", "", "").unwrap();
    assert_eq!(inline.render(&msgs(&[("user", "a")]), false).unwrap(), "ok");
    assert!(matches!(
        inline.render(&msgs(&[("user", "a"), ("user", "b")]), false),
        Err(ChatError::Raised { message }) if message == "too many: 2"
    ));
}

#[test]
fn a_template_that_does_not_parse_fails_at_compile() {
    let err = ChatTemplate::new("{% for m in messages %}{{ m.content }}", "", "").unwrap_err();
    assert!(matches!(err, ChatError::Syntax { .. }), "{err:?}");
    assert!(
        err.to_string().contains("chat_template:1"),
        "location missing: {err}"
    );
}

#[test]
fn engine_errors_are_render_errors() {
    let t = ChatTemplate::new("{{ messages[0].content + 1 }}", "", "").unwrap();
    let err = t.render(&msgs(&[("user", "a")]), false).unwrap_err();
    assert!(matches!(err, ChatError::Render { .. }), "{err:?}");
}

#[test]
fn unknown_builtin_lists_the_names() {
    let err = ChatTemplate::builtin("vicuna").unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ChatError::UnknownBuiltin { ref name } if name == "vicuna"));
    for name in ["chatml", "llama3", "gemma"] {
        assert!(text.contains(name), "{text}");
        assert!(ChatTemplate::builtin(name).is_ok());
    }
    assert_eq!(
        ChatTemplate::builtin_names(),
        &["chatml", "llama3", "gemma"]
    );
}

/// Metadata as a GGUF reader would produce it for a small chat model.
fn chat_metadata(template: Option<&str>) -> Metadata {
    let mut md = Metadata::new();
    md.insert("general.architecture".into(), Value::String("llama".into()));
    if let Some(t) = template {
        md.insert("tokenizer.chat_template".into(), Value::String(t.into()));
    }
    let tokens = ["<unk>", "<s>", "</s>", "hi"].map(String::from).to_vec();
    md.insert(
        "tokenizer.ggml.tokens".into(),
        Value::Array(Array::String(tokens)),
    );
    md.insert("tokenizer.ggml.bos_token_id".into(), Value::U32(1));
    md.insert("tokenizer.ggml.eos_token_id".into(), Value::U32(2));
    md
}

#[test]
fn from_metadata_passes_bos_and_eos_texts() {
    let md = chat_metadata(Some(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
    ));
    let t = ChatTemplate::from_metadata(&md, None).unwrap();
    assert_eq!(t.builtin_name(), None);
    assert_eq!((t.bos_token(), t.eos_token()), ("<s>", "</s>"));
    assert_eq!(
        t.render(&msgs(&[("user", "a"), ("assistant", "b")]), false)
            .unwrap(),
        "<s>a</s>b</s>"
    );
}

#[test]
fn from_metadata_override_wins_over_the_model_template() {
    let md = chat_metadata(Some("{{ 'model template' }}"));
    let t = ChatTemplate::from_metadata(&md, Some("llama3")).unwrap();
    assert_eq!(t.builtin_name(), Some("llama3"));
    assert!(matches!(
        ChatTemplate::from_metadata(&md, Some("nope")),
        Err(ChatError::UnknownBuiltin { .. })
    ));
}

#[test]
fn no_template_and_no_override_says_what_to_do() {
    let err = ChatTemplate::from_metadata(&chat_metadata(None), None).unwrap_err();
    assert!(matches!(err, ChatError::NoTemplate), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("--chat-template chatml|llama3|gemma"),
        "{text}"
    );
}

#[test]
fn a_special_token_id_outside_the_vocabulary_is_an_error() {
    let mut md = chat_metadata(Some("x"));
    md.set("tokenizer.ggml.eos_token_id", Value::U32(4));
    let err = ChatTemplate::from_metadata(&md, None).unwrap_err();
    assert!(
        matches!(
            err,
            ChatError::BadTokenId {
                key: "tokenizer.ggml.eos_token_id",
                id: 4,
                n_tokens: 4
            }
        ),
        "{err:?}"
    );
}

#[test]
fn strftime_now_uses_the_system_clock_by_default() {
    let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
    let year: i64 = t.render(&[], false).unwrap().parse().expect("a year");
    assert!((2024..3000).contains(&year), "{year}");
    let fixed = t.with_now(0);
    assert_eq!(fixed.render(&[], false).unwrap(), "1970");
}

#[test]
fn python_str_forms_for_printed_values() {
    let t = ChatTemplate::new(
        "{{ add_generation_prompt }} {{ none }} {{ [1, 'a', true] }} {{ 2.0 }} {{ undefined_thing }}|{{ messages[0] }}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        t.render(&msgs(&[("user", "it's")]), true).unwrap(),
        "True None [1, 'a', True] 2.0 |{'role': 'user', 'content': \"it's\"}"
    );
}

/// Templates rendered with `tools`, against Hugging Face's
/// `apply_chat_template(messages, tools=...)` (tool_cases.json).
#[derive(Deserialize)]
struct ToolCases {
    cases: Vec<Case>,
}

#[test]
fn tools_and_tool_calls_render_as_hugging_face_does() {
    let cases: ToolCases = serde_json::from_str(&read(fixtures().join("tool_cases.json")))
        .expect("tool_cases.json parses");
    assert!(cases.cases.len() >= 4);
    assert!(cases.cases.iter().all(|c| !c.tools.is_empty()));
    let failures: Vec<String> = cases.cases.iter().filter_map(|c| check(c).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn templates_without_tools_say_so() {
    let smollm2 = ChatTemplate::new(&template_source("smollm2.jinja"), "", "").unwrap();
    assert!(!smollm2.supports_tools());
    assert!(!ChatTemplate::builtin("chatml").unwrap().supports_tools());
}
