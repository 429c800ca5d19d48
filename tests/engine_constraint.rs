//! Constrained decoding: requests held to a JSON Schema, a JSON object, a
//! regex, a Lark or a GBNF grammar give output that matches, greedy and
//! sampled, on the real SmolLM2 model; bad constraints are refused at
//! `add_request`; unconstrained neighbours are untouched; log-probabilities
//! name only allowed tokens; preemption feeds nothing twice (fake model).

mod engine_support;

use std::collections::BTreeMap;
use std::path::PathBuf;

use engine_support::{assert_pool_full, collect, hash_rule, run_all, small_config, Outcome};
use hearth::backend::cpu::CpuBackend;
use hearth::engine::{
    ChatMessage, Constraint, Engine, EngineConfig, EngineError, FinishReason, GenerateRequest,
    Prompt, RequestId,
};
use hearth::model::chat::ChatTemplate;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::{load_model, LoadOptions, Model};
use hearth::sample::SamplingParams;
use serde_json::{json, Value};

type CpuModel = Model<CpuBackend>;

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/models"),
    }
}

/// SmolLM2 on the CPU backend (one thread: the tests run side by side).
fn smollm2() -> Engine<CpuModel> {
    let path = models_dir().join(SMOLLM2);
    assert!(
        path.exists(),
        "{} not found: run `make setup` (or set HEARTH_MODELS)",
        path.display()
    );
    let config = EngineConfig {
        n_ctx: 512,
        kv_tokens: 2048,
        ..EngineConfig::default()
    };
    let (file, sources) = hearth::gguf::open_model(&path).expect("open");
    let opts = LoadOptions::new(config.kv_cache_config());
    let model = pollster::block_on(load_model(
        CpuBackend::new(1),
        &file,
        &sources,
        &opts,
        &mut |_| {},
    ))
    .expect("load");
    let md = file.metadata();
    let tok = Tokenizer::from_metadata(md).expect("tokenizer");
    let template = ChatTemplate::from_metadata(md, None).expect("template");
    Engine::new(model, tok, Some(template), config).expect("engine")
}

fn run<M: hearth::model::ForwardModel>(engine: &mut Engine<M>) -> BTreeMap<RequestId, Outcome> {
    let mut outcomes = BTreeMap::new();
    for _ in 0..10_000 {
        if !engine.has_unfinished() {
            return outcomes;
        }
        collect(
            pollster::block_on(engine.step()).expect("step"),
            &mut outcomes,
        );
    }
    panic!("the engine did not finish");
}

/// The output text of `o`, which must have ended with `Stop` (its
/// constraint complete).
fn stopped_text(o: &Outcome, what: &str) -> String {
    let text = o.text();
    assert_eq!(o.reason, Some(FinishReason::Stop), "{what}: {text:?}");
    text
}

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::new("user", text)])
}

/// A request for `prompt` under `constraint`, greedy or drawn at
/// temperature 1 with no filter (`seed`).
fn request(
    prompt: Prompt,
    constraint: Option<Constraint>,
    seed: Option<u64>,
    max: usize,
) -> GenerateRequest {
    let mut r = GenerateRequest::new(prompt);
    r.max_tokens = Some(max);
    r.constraint = constraint;
    r.sampling = match seed {
        None => SamplingParams::greedy(),
        Some(seed) => SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..SamplingParams::default()
        },
    };
    r
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 16},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "colour": {"enum": ["red", "green", "blue"]}
        },
        "required": ["name", "age", "colour"],
        "additionalProperties": false
    })
}

/// Checks `text` against [`person_schema`] by hand.
fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("{text:?} is no object"));
    let mut keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["age", "colour", "name"], "{text:?}");
    let name = obj["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{text:?}: name"));
    assert!((1..=16).contains(&name.chars().count()), "{text:?}: name");
    let age = obj["age"]
        .as_i64()
        .unwrap_or_else(|| panic!("{text:?}: age"));
    assert!((0..=120).contains(&age), "{text:?}: age");
    let colour = obj["colour"]
        .as_str()
        .unwrap_or_else(|| panic!("{text:?}: colour"));
    assert!(["red", "green", "blue"].contains(&colour), "{text:?}");
}

#[test]
fn json_schema_output_validates_greedy_and_sampled() {
    let mut e = smollm2();
    let prompt = chat("Invent a person: their name, age and favourite colour, as JSON.");
    let schema = Constraint::JsonSchema(person_schema());
    let seeds = [None, Some(1), Some(2), Some(3)];
    let ids: Vec<RequestId> = seeds
        .iter()
        .map(|&seed| {
            let r = request(prompt.clone(), Some(schema.clone()), seed, 64);
            e.add_request(r).expect("add")
        })
        .collect();
    let out = run(&mut e);
    for (id, seed) in ids.iter().zip(seeds) {
        let o = &out[id];
        let text = stopped_text(o, &format!("seed {seed:?}"));
        check_person(&text);
    }
}

#[test]
fn json_object_output_is_one_object() {
    let mut e = smollm2();
    let prompt = chat("Reply with a JSON object describing a cat, with its name and age.");
    let id = e
        .add_request(request(prompt, Some(Constraint::JsonObject), None, 64))
        .expect("add");
    let o = &run(&mut e)[&id];
    let text = o.text();
    assert_eq!(o.reason, Some(FinishReason::Stop), "{text:?}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(v.is_object(), "{text:?}");
}

/// Whether `s` is a prefix of some string of `[0-9]{3}-[0-9]{4}`.
fn phone_prefix(s: &str) -> bool {
    s.len() <= 8
        && s.char_indices().all(|(i, c)| match i {
            3 => c == '-',
            _ => c.is_ascii_digit(),
        })
}

#[test]
fn regex_output_has_the_shape_and_logprobs_name_only_allowed_tokens() {
    let mut e = smollm2();
    let prompt = chat("What is the phone number of the town hall?");
    let rx = Constraint::Regex("[0-9]{3}-[0-9]{4}".into());
    let seeds = [None, Some(5), Some(6)];
    let ids: Vec<RequestId> = seeds
        .iter()
        .map(|&seed| {
            let mut r = request(prompt.clone(), Some(rx.clone()), seed, 32);
            r.logprobs = Some(8);
            e.add_request(r).expect("add")
        })
        .collect();
    let eog: Vec<u32> = (0..e.tokenizer().vocab_size() as u32)
        .filter(|&t| e.tokenizer().is_eog(t))
        .collect();
    let out = run(&mut e);
    let tok = e.tokenizer();
    for (id, seed) in ids.iter().zip(seeds) {
        let o = &out[id];
        let text = stopped_text(o, &format!("seed {seed:?}"));
        assert!(phone_prefix(&text) && text.len() == 8, "{text:?}");
        let mut so_far = String::new();
        for (i, (&token, alts)) in o.tokens.iter().zip(&o.top_logprobs).enumerate() {
            assert!(!alts.is_empty(), "token {i} has no alternatives");
            if seed.is_none() {
                assert_eq!(alts[0].0, token, "greedy token {i} is not the best allowed");
            }
            for &(alt, lp) in alts {
                let piece = String::from_utf8_lossy(&tok.token_to_piece(alt, false)).into_owned();
                let ok = if eog.contains(&alt) {
                    so_far.len() == 8
                } else {
                    !piece.is_empty() && phone_prefix(&format!("{so_far}{piece}"))
                };
                assert!(ok, "{text:?}: token {i} reports {alt} ({piece:?}, {lp})");
            }
            so_far.push_str(&String::from_utf8_lossy(&tok.token_to_piece(token, false)));
        }
    }
}

#[test]
fn gbnf_and_lark_grammars_give_exactly_their_language() {
    let mut e = smollm2();
    let yes_no = Constraint::Gbnf("root ::= \"yes\" | \"no\"\n".into());
    let list = Constraint::Lark("start: NUM (\", \" NUM){2}\nNUM: /[1-9][0-9]?/\n".into());
    let mut ids = Vec::new();
    for seed in [None, Some(11), Some(12)] {
        let q = chat("Is the sky blue? Answer yes or no.");
        ids.push((
            0,
            e.add_request(request(q, Some(yes_no.clone()), seed, 16))
                .expect("add"),
        ));
        let q = chat("Give three numbers.");
        ids.push((
            1,
            e.add_request(request(q, Some(list.clone()), seed, 32))
                .expect("add"),
        ));
    }
    let out = run(&mut e);
    for (kind, id) in ids {
        let o = &out[&id];
        let text = o.text();
        assert_eq!(o.reason, Some(FinishReason::Stop), "{text:?}");
        if kind == 0 {
            assert!(text == "yes" || text == "no", "{text:?}");
        } else {
            let nums: Vec<&str> = text.split(", ").collect();
            assert_eq!(nums.len(), 3, "{text:?}");
            for n in nums {
                let v: u32 = n.parse().unwrap_or_else(|_| panic!("{text:?}"));
                assert!((1..=99).contains(&v) && !n.starts_with('0'), "{text:?}");
            }
        }
    }
}

#[test]
fn constrained_request_leaves_greedy_neighbours_unchanged() {
    let prompts = [
        chat("Name three colours of the rainbow."),
        Prompt::Text("The capital of France is".into()),
    ];
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut e = smollm2();
            let id = e
                .add_request(request(p.clone(), None, None, 24))
                .expect("add");
            run(&mut e)[&id].tokens.clone()
        })
        .collect();
    let mut e = smollm2();
    let schema = Some(Constraint::JsonSchema(person_schema()));
    let q = chat("Invent a person as JSON.");
    let constrained = e.add_request(request(q, schema, Some(4), 64)).expect("add");
    let ids: Vec<RequestId> = prompts
        .iter()
        .map(|p| {
            e.add_request(request(p.clone(), None, None, 24))
                .expect("add")
        })
        .collect();
    let out = run(&mut e);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            out[id].tokens, solo[i],
            "prompt {i} changed beside a constrained request"
        );
    }
    check_person(&out[&constrained].text());
}

/// An engine over the fake model and the synthetic 512-token vocabulary.
fn fake_engine(config: EngineConfig) -> Engine<engine_support::FakeModel> {
    engine_support::engine(config, hash_rule())
}

#[test]
fn bad_constraints_are_refused_and_the_engine_goes_on() {
    let mut e = fake_engine(small_config(128, 32));
    let bad = [
        (
            Constraint::JsonSchema(json!({"type": "strung"})),
            "json_schema",
        ),
        (
            Constraint::JsonSchema(json!({"$ref": "#/$defs/nowhere"})),
            "json_schema",
        ),
        (
            Constraint::JsonSchema(json!({"type": "string", "minLength": 5, "maxLength": 2})),
            "json_schema",
        ),
        (Constraint::Lark("start: missing_rule\n".into()), "lark"),
        (Constraint::Lark("start: \"a\" |\n| )\n".into()), "lark"),
        (Constraint::Gbnf("root ::= item\n".into()), "gbnf"),
        (Constraint::Gbnf("root ::= [a-\n".into()), "gbnf"),
        (Constraint::Regex("[0-9".into()), "regex"),
    ];
    for (c, want) in bad {
        let r = request(Prompt::Tokens(vec![1, 300, 301]), Some(c.clone()), None, 8);
        match e.add_request(r) {
            Err(hearth::Error::Engine(EngineError::BadGrammar { kind, detail })) => {
                assert_eq!(kind, want, "{c:?}: {detail}");
                assert!(!detail.is_empty());
            }
            other => panic!("{c:?}: expected BadGrammar, got {other:?}"),
        }
    }
    assert_eq!(e.num_unfinished(), 0);
    let ok = Constraint::Regex("[a-z]{4}".into());
    let id = e
        .add_request(request(Prompt::Tokens(vec![1, 300]), Some(ok), None, 8))
        .expect("a good constraint after bad ones");
    let plain = e
        .add_request(request(Prompt::Tokens(vec![1, 301]), None, None, 8))
        .expect("add");
    let out = run_all(&mut e);
    assert_eq!(out[&id].reason, Some(FinishReason::Stop));
    assert!(out[&id].text().chars().all(|c| c.is_ascii_lowercase()));
    assert_eq!(out[&id].text().len(), 4, "{:?}", out[&id].text());
    assert_eq!(out[&plain].tokens.len(), 8);
    assert_pool_full(&e);
}

/// Prompts of 30 to 60 tokens with lowercase-only constraints of various
/// lengths, greedy and sampled.
fn lowercase_requests() -> Vec<GenerateRequest> {
    (0..4u32)
        .map(|i| {
            let n = 30 + 10 * i;
            let prompt: Vec<u32> = std::iter::once(1)
                .chain((1..n).map(|j| 3 + (j * 41 + i * 97) % 500))
                .collect();
            let rx = format!("[a-z]{{{}}}( [a-z]{{2,6}}){{2}}", 20 + 5 * i);
            let seed = (i % 2 == 1).then_some(u64::from(i));
            let mut r = request(
                Prompt::Tokens(prompt),
                Some(Constraint::Regex(rx)),
                seed,
                60,
            );
            if seed.is_some() {
                r.sampling.top_k = 20;
            }
            r
        })
        .collect()
}

/// Whether `text` is `[a-z]{n}( [a-z]{2,6}){2}`.
fn lowercase_shape(text: &str, n: usize) -> bool {
    let words: Vec<&str> = text.split(' ').collect();
    let lower = |w: &str, r: std::ops::RangeInclusive<usize>| {
        r.contains(&w.len()) && w.chars().all(|c| c.is_ascii_lowercase())
    };
    words.len() == 3 && lower(words[0], n..=n) && words[1..].iter().all(|w| lower(w, 2..=6))
}

#[test]
fn preemption_keeps_the_grammar_in_step_and_the_device_paths_stay_unused() {
    let run_with = |config: EngineConfig| {
        let mut e = fake_engine(config);
        let ids: Vec<RequestId> = lowercase_requests()
            .into_iter()
            .map(|r| e.add_request(r).expect("add"))
            .collect();
        let out = run_all(&mut e);
        assert_pool_full(&e);
        let m = e.model();
        // Greedy and top-k rows would take the device shortcuts unconstrained.
        assert_eq!((m.argmax_passes, m.top_k_passes), (0, 0));
        let outs: Vec<Outcome> = ids.iter().map(|id| out[id].clone()).collect();
        (outs, e.stats().sched.num_preemptions)
    };
    let (roomy, none) = run_with(small_config(128, 32));
    assert_eq!(none, 0);
    let (tight, preempted) = run_with(EngineConfig {
        kv_tokens: 128,
        ..small_config(128, 32)
    });
    assert!(preempted > 0, "the tight pool never preempted");
    for (i, (a, b)) in roomy.iter().zip(&tight).enumerate() {
        let text = a.text();
        assert_eq!(a.reason, Some(FinishReason::Stop), "request {i}: {text:?}");
        assert!(lowercase_shape(&text, 20 + 5 * i), "request {i}: {text:?}");
        assert_eq!(a.tokens, b.tokens, "request {i} changed under preemption");
        assert_eq!(b.reason, Some(FinishReason::Stop));
    }
}

#[test]
fn a_grammar_complete_on_the_last_allowed_token_ends_with_stop() {
    let rx = Constraint::Regex("[a-z]{12}".into());
    let run_with = |max: usize| {
        let mut e = fake_engine(small_config(128, 32));
        let r = request(
            Prompt::Tokens(vec![1, 300, 301]),
            Some(rx.clone()),
            None,
            max,
        );
        let id = e.add_request(r).expect("add");
        run_all(&mut e)[&id].clone()
    };
    let free = run_with(30);
    assert_eq!(free.reason, Some(FinishReason::Stop));
    assert_eq!(free.text().len(), 12, "{:?}", free.text());
    let n = free.tokens.len();
    assert!(n > 1, "one token: {:?}", free.text());
    let exact = run_with(n);
    assert_eq!(exact.tokens, free.tokens);
    assert_eq!(
        exact.reason,
        Some(FinishReason::Stop),
        "complete at max_tokens"
    );
    let short = run_with(n - 1);
    assert_eq!(short.reason, Some(FinishReason::Length));
}
