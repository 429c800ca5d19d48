//! Request handling: cancellation, token limits, context errors, prompt
//! tokenization (text, chat), log-probabilities, stats.

mod engine_support;

use engine_support::{
    assert_pool_full, collect, engine, hash_rule, run_all, small_config, synthetic, FakeModel,
};
use hearth::engine::{
    ChatMessage, Engine, EngineError, EngineEvent, FinishReason, GenerateRequest, Prompt,
};
use hearth::model::chat::ChatTemplate;
use hearth::sample::SamplingParams;

fn tokens_req(prompt: Vec<u32>, max_tokens: Option<usize>) -> GenerateRequest {
    let mut r = GenerateRequest::new(Prompt::Tokens(prompt));
    r.max_tokens = max_tokens;
    r.sampling = SamplingParams::greedy();
    r
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| 3 + (i * 13 + salt) % 500).collect()
}

#[test]
fn cancel_midway_frees_blocks_at_once() {
    let mut e = engine(small_config(256, 64), hash_rule());
    let keep = e
        .add_request(tokens_req(prompt(40, 1), Some(50)))
        .expect("add");
    let gone = e
        .add_request(tokens_req(prompt(60, 2), Some(50)))
        .expect("add");
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..6 {
        collect(pollster::block_on(e.step()).expect("step"), &mut outcomes);
    }
    let generated = outcomes[&gone].tokens.len();
    assert!(generated > 0, "cancel after some output");
    let free_before = e.stats().sched.num_free_blocks;
    let ev = e.cancel(gone).expect("cancel");
    let EngineEvent::Finished { reason, usage, .. } = ev else {
        panic!("not a Finished event: {ev:?}");
    };
    assert_eq!(reason, FinishReason::Cancelled);
    assert_eq!(usage.generated_tokens, generated);
    assert_eq!(usage.prompt_tokens, 60);
    // 60 prompt + some output tokens held at least 4 blocks of 16.
    assert!(e.stats().sched.num_free_blocks >= free_before + 4);
    assert!(e.cancel(gone).is_err(), "cancelling twice is an error");
    let rest = run_all(&mut e);
    assert_eq!(outcomes[&keep].tokens.len() + rest[&keep].tokens.len(), 50);
    assert_eq!(rest[&keep].reason, Some(FinishReason::Length));
    assert!(!rest.contains_key(&gone), "no events after cancel");
    assert_pool_full(&e);
}

#[test]
fn cancel_before_admission_and_unknown_ids() {
    let mut e = engine(small_config(64, 32), hash_rule());
    let id = e
        .add_request(tokens_req(prompt(10, 3), Some(5)))
        .expect("add");
    e.cancel(id).expect("cancel waiting request");
    assert!(!e.has_unfinished());
    let err = e.cancel(id).expect_err("gone");
    assert!(err.to_string().contains("not live"), "{err}");
    assert_pool_full(&e);
}

#[test]
fn max_tokens_and_the_context_bound_the_output() {
    let mut e = engine(small_config(32, 32), hash_rule());
    let five = e
        .add_request(tokens_req(prompt(10, 4), Some(5)))
        .expect("add");
    let fill = e.add_request(tokens_req(prompt(20, 5), None)).expect("add");
    let big = e
        .add_request(tokens_req(prompt(20, 6), Some(1000)))
        .expect("add");
    let out = run_all(&mut e);
    assert_eq!(out[&five].tokens.len(), 5);
    assert_eq!(out[&fill].tokens.len(), 12, "fills the 32-token context");
    assert_eq!(out[&big].tokens.len(), 12, "clamped to the context");
    for o in out.values() {
        assert_eq!(o.reason, Some(FinishReason::Length));
    }
    let usage = out[&five].usage.expect("usage");
    assert_eq!((usage.prompt_tokens, usage.generated_tokens), (10, 5));
}

#[test]
fn prompt_over_the_context_is_refused_clearly() {
    let mut e = engine(small_config(16, 32), hash_rule());
    for n in [16, 20] {
        let err = e
            .add_request(tokens_req(prompt(n, 7), Some(4)))
            .expect_err("too long");
        assert_eq!(
            err.to_string(),
            format!("prompt is {n} tokens but the context is 16; shorten it or raise --ctx")
        );
    }
    assert!(
        e.add_request(tokens_req(prompt(15, 7), Some(4))).is_ok(),
        "one token of room"
    );
}

#[test]
fn bad_requests_are_refused() {
    let mut e = engine(small_config(64, 32), hash_rule());
    let err = e
        .add_request(tokens_req(vec![], Some(4)))
        .expect_err("empty");
    assert!(
        matches!(err, hearth::Error::Engine(EngineError::EmptyPrompt)),
        "{err}"
    );
    let err = e
        .add_request(GenerateRequest::new(Prompt::Text(String::new())))
        .expect_err("empty text");
    assert!(
        matches!(err, hearth::Error::Engine(EngineError::EmptyPrompt)),
        "{err}"
    );
    let err = e
        .add_request(tokens_req(vec![1, 512], Some(4)))
        .expect_err("vocab");
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let err = e
        .add_request(tokens_req(vec![1, 2], Some(0)))
        .expect_err("zero");
    assert!(err.to_string().contains("max_tokens is 0"), "{err}");
    let mut r = tokens_req(vec![1, 2], Some(3));
    r.sampling.top_p = 0.0;
    assert!(e.add_request(r).is_err(), "bad sampling parameters");
    assert!(!e.has_unfinished());
}

#[test]
fn text_prompts_get_bos_and_literal_special_text() {
    let e = engine(small_config(64, 32), hash_rule());
    let (_, tok) = synthetic();
    let text = "hello <|im_start|> world";
    let ids = e
        .tokenize_prompt(&Prompt::Text(text.into()))
        .expect("tokenize");
    assert_eq!(ids, tok.encode(text, true, false).expect("encode"));
    assert_eq!(
        ids[0], 1,
        "BOS added: the synthetic model sets add_bos_token"
    );
    assert!(!ids.contains(&510), "special text stays text: {ids:?}");
}

#[test]
fn chat_prompts_render_the_template_and_parse_special_tokens() {
    let e = engine(small_config(256, 32), hash_rule());
    let (_, tok) = synthetic();
    let messages = vec![
        ChatMessage::new("system", "be brief"),
        ChatMessage::new("user", "hello there"),
    ];
    let ids = e
        .tokenize_prompt(&Prompt::Chat(messages.clone()))
        .expect("chat");
    let rendered = ChatTemplate::builtin("chatml")
        .expect("chatml")
        .render(&messages, true)
        .expect("render");
    assert!(
        rendered.ends_with("<|im_start|>assistant\n"),
        "{rendered:?}"
    );
    assert_eq!(ids, tok.encode(&rendered, true, true).expect("encode"));
    assert_eq!(
        ids.iter().filter(|&&t| t == 510).count(),
        3,
        "three <|im_start|>: {ids:?}"
    );
    assert_eq!(ids.iter().filter(|&&t| t == 1).count(), 1, "one BOS");
}

#[test]
fn a_template_printing_bos_does_not_double_it() {
    let (mc, tok) = synthetic();
    let config = small_config(256, 32);
    let model = FakeModel::new(mc, &config, hash_rule());
    let source = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let template = ChatTemplate::new(source, "<s>", "</s>").expect("template");
    let mut e = Engine::new(model, tok, Some(template), config).expect("engine");
    let messages = vec![ChatMessage::new("user", "hi")];
    let ids = e
        .tokenize_prompt(&Prompt::Chat(messages.clone()))
        .expect("chat");
    assert_eq!(ids[0], 1);
    assert_ne!(ids[1], 1, "BOS doubled: {ids:?}");
    let id = e
        .add_request(GenerateRequest::new(Prompt::Chat(messages)))
        .expect("add");
    assert!(run_all(&mut e).contains_key(&id));
}

#[test]
fn chat_without_a_template_is_refused() {
    let (mc, tok) = synthetic();
    let config = small_config(64, 32);
    let model = FakeModel::new(mc, &config, hash_rule());
    let mut e = Engine::new(model, tok, None, config).expect("engine");
    let err = e
        .add_request(GenerateRequest::new(Prompt::Chat(vec![ChatMessage::new(
            "user", "hi",
        )])))
        .expect_err("no template");
    assert!(err.to_string().contains("--chat-template"), "{err}");
}

#[test]
fn logprobs_are_reported_when_asked() {
    let mut e = engine(small_config(64, 32), hash_rule());
    let mut with = tokens_req(prompt(8, 8), Some(6));
    with.logprobs = Some(3);
    let with = e.add_request(with).expect("add");
    let without = e
        .add_request(tokens_req(prompt(8, 9), Some(6)))
        .expect("add");
    let out = run_all(&mut e);
    let o = &out[&with];
    for (i, (lp, top)) in o.logprobs.iter().zip(&o.top_logprobs).enumerate() {
        let lp = lp.unwrap_or_else(|| panic!("token {i} has no logprob"));
        assert!(
            lp < 0.0 && lp > -1.0,
            "greedy pick with an 8-logit lead: {lp}"
        );
        assert_eq!(top.len(), 3);
        assert_eq!(top[0], (o.tokens[i], lp), "greedy token is the most likely");
        assert!(top[1].1 <= top[0].1 && top[2].1 <= top[1].1);
    }
    assert!(out[&without].logprobs.iter().all(Option::is_none));
    assert!(out[&without].top_logprobs.iter().all(Vec::is_empty));
}

#[test]
fn stats_count_prefill_and_decode_tokens() {
    let mut e = engine(small_config(128, 16), hash_rule());
    // A clock that ticks one second per reading.
    let ticks = std::sync::atomic::AtomicU32::new(0);
    e.set_clock(hearth::engine::Clock::from_fn(move || {
        f64::from(ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }));
    let id = e
        .add_request(tokens_req(prompt(40, 10), Some(10)))
        .expect("add");
    let mut finished = None;
    while e.has_unfinished() {
        for ev in pollster::block_on(e.step()).expect("step") {
            if let EngineEvent::Finished {
                request, timings, ..
            } = ev
            {
                assert_eq!(request, id);
                finished = Some(timings);
            }
        }
    }
    let s = e.stats();
    assert_eq!(s.prefill_tokens, 40, "prompt in 3 chunks of <= 16");
    assert_eq!(s.decode_tokens, 9, "the last token is never fed back");
    assert_eq!(s.sampled_tokens, 10);
    assert_eq!(s.steps, 3 + 9);
    assert!(s.prefill_tps() > 0.0 && s.decode_tps() > 0.0);
    let t = finished.expect("finished");
    assert!(
        t.queue_s > 0.0 && t.prefill_s > 0.0 && t.decode_s > 0.0,
        "{t:?}"
    );
}

#[test]
fn a_repeated_prompt_reuses_cached_blocks() {
    let mut e = engine(small_config(128, 64), hash_rule());
    let p = prompt(40, 11);
    let a = e.add_request(tokens_req(p.clone(), Some(3))).expect("add");
    let first = run_all(&mut e);
    let b = e.add_request(tokens_req(p, Some(3))).expect("add");
    let second = run_all(&mut e);
    assert_eq!(first[&a].tokens, second[&b].tokens);
    assert_eq!(second[&b].usage.expect("usage").cached_prompt_tokens, 32);
    assert_pool_full(&e);
}

#[test]
fn non_finite_logits_end_only_their_request() {
    let mut e = engine(small_config(128, 64), hash_rule());
    e.model_mut().nan_after = Some(77);
    let mut bad = prompt(20, 12);
    bad.push(77);
    let bad = e.add_request(tokens_req(bad, Some(8))).expect("add");
    let good = e
        .add_request(tokens_req(prompt(20, 13), Some(8)))
        .expect("add");
    let out = run_all(&mut e);
    assert_eq!(out[&bad].reason, Some(FinishReason::Error));
    assert!(out[&bad].tokens.is_empty());
    let error = out[&bad].error.clone().expect("error text");
    assert!(error.contains("non-finite"), "{error}");
    assert_eq!(out[&good].reason, Some(FinishReason::Length));
    assert_eq!(out[&good].tokens.len(), 8);
    assert_eq!(out[&good].error, None);
    assert_pool_full(&e);
}

#[test]
fn greedy_steps_pick_on_the_model_and_match_host_sampling() {
    // Plain greedy rows are picked by the model (a GPU reads back one u32
    // per row); rows that want log-probabilities still read the logits.
    // Both give the same tokens.
    let mut e = engine(small_config(128, 64), hash_rule());
    let p = prompt(20, 14);
    let greedy = e.add_request(tokens_req(p.clone(), Some(6))).expect("add");
    let out = run_all(&mut e);
    let steps = e.model_mut().batch_seqs.len();
    assert_eq!(
        e.model_mut().argmax_passes,
        steps,
        "every step picked on the model"
    );
    let mut with = tokens_req(p, Some(6));
    with.logprobs = Some(2);
    let logprobs = e.add_request(with).expect("add");
    let out2 = run_all(&mut e);
    let steps2 = e.model_mut().batch_seqs.len() - steps;
    assert!(steps2 > 0);
    assert_eq!(
        e.model_mut().argmax_passes,
        steps,
        "a request with log-probabilities reads the logits"
    );
    assert_eq!(out[&greedy].tokens, out2[&logprobs].tokens);
    assert_eq!(out[&greedy].tokens.len(), 6);
    assert_pool_full(&e);
}

#[test]
fn sampled_steps_select_on_the_model_and_match_host_sampling() {
    // A top-k draw needs only the row's best candidates, which the model
    // selects (a GPU reads back k pairs per row); beside a request with a
    // penalty the step reads whole rows instead. The draws, log-probabilities
    // and random stream are the same either way.
    let sampled = || {
        let mut r = tokens_req(prompt(20, 15), Some(12));
        r.sampling = SamplingParams {
            temperature: 4.0,
            top_k: 10,
            top_p: 0.9,
            min_p: 0.01,
            seed: 7,
            ..SamplingParams::default()
        };
        r.logprobs = Some(3);
        r
    };
    let mut e = engine(small_config(128, 64), hash_rule());
    let a = e.add_request(sampled()).expect("add");
    let alone = run_all(&mut e);
    let steps = e.model_mut().batch_seqs.len();
    assert_eq!(
        e.model_mut().top_k_passes,
        steps,
        "every step selected on the model"
    );

    let mut e = engine(small_config(128, 64), hash_rule());
    let b = e.add_request(sampled()).expect("add");
    let mut penalised = tokens_req(prompt(20, 16), Some(16));
    penalised.sampling.repeat_penalty = 1.3;
    e.add_request(penalised).expect("add");
    let beside = run_all(&mut e);
    assert_eq!(e.model_mut().top_k_passes, 0, "a penalty needs whole rows");

    let (x, y) = (&alone[&a], &beside[&b]);
    assert_eq!(x.tokens.len(), 12);
    assert_eq!(x.tokens, y.tokens);
    assert_eq!(x.logprobs, y.logprobs);
    assert_eq!(x.top_logprobs, y.top_logprobs);
    let distinct: std::collections::BTreeSet<_> = x.tokens.iter().collect();
    assert!(distinct.len() > 3, "the draws are random: {:?}", x.tokens);
}
