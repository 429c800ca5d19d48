//! Batched equals solo: requests run together (chunked prefill, mixed
//! prefill/decode batches, preemption, a failed pass) give exactly the
//! tokens each gives alone; the pool returns to full.

mod engine_support;

use engine_support::{assert_pool_full, engine, hash_rule, run_all, run_alone, small_config};
use hearth::engine::{EngineConfig, FinishReason, GenerateRequest, Prompt};
use hearth::sample::SamplingParams;

/// Four different prompts (lengths 5, 23, 50, 70: the last two need several
/// prefill chunks with a budget of 32), two greedy and two sampled.
fn requests() -> Vec<GenerateRequest> {
    let lens = [5usize, 23, 50, 70];
    lens.iter()
        .enumerate()
        .map(|(i, &n)| {
            let prompt: Vec<u32> = std::iter::once(1)
                .chain((1..n as u32).map(|j| 3 + (j * 37 + i as u32 * 101) % 500))
                .collect();
            let mut r = GenerateRequest::new(Prompt::Tokens(prompt));
            r.max_tokens = Some(20 + 7 * i);
            r.sampling = if i % 2 == 0 {
                SamplingParams::greedy()
            } else {
                SamplingParams {
                    seed: 42 + i as u64,
                    temperature: 1.5,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    ..SamplingParams::default()
                }
            };
            r
        })
        .collect()
}

fn check_batched_equals_solo(config: EngineConfig, expect_preemption: bool) {
    let reqs = requests();
    let solo: Vec<_> = reqs
        .iter()
        .map(|r| run_alone(config.clone(), hash_rule(), r.clone()))
        .collect();
    let mut e = engine(config, hash_rule());
    let ids: Vec<_> = reqs
        .into_iter()
        .map(|r| e.add_request(r).expect("add"))
        .collect();
    let outcomes = run_all(&mut e);
    for (i, id) in ids.iter().enumerate() {
        let got = &outcomes[id];
        assert_eq!(
            got.tokens, solo[i].tokens,
            "request {i}: batched tokens differ from solo"
        );
        assert_eq!(got.text(), solo[i].text(), "request {i}");
        assert_eq!(got.reason, Some(FinishReason::Length));
        assert_eq!(got.tokens.len(), 20 + 7 * i);
    }
    assert!(
        e.model().batch_seqs.iter().any(|&n| n >= 3),
        "requests never shared a batch: {:?}",
        e.model().batch_seqs
    );
    let stats = e.stats();
    assert_eq!(
        stats.sched.num_preemptions > 0,
        expect_preemption,
        "preemptions: {}",
        stats.sched.num_preemptions
    );
    assert_pool_full(&e);
}

#[test]
fn four_concurrent_prompts_give_their_solo_tokens() {
    check_batched_equals_solo(small_config(128, 32), false);
}

#[test]
fn preemption_by_recompute_keeps_the_tokens() {
    // A pool of 128 tokens cannot hold four requests of up to ~100 tokens.
    let config = EngineConfig {
        kv_tokens: 128,
        ..small_config(128, 32)
    };
    check_batched_equals_solo(config, true);
}

#[test]
fn failed_forward_pass_is_retried_with_the_same_result() {
    let config = small_config(128, 32);
    let reqs = requests();
    let solo = run_alone(config.clone(), hash_rule(), reqs[2].clone());
    let mut e = engine(config, hash_rule());
    let id = e.add_request(reqs[2].clone()).expect("add");
    let mut outcomes = std::collections::BTreeMap::new();
    for step in 0..200 {
        if !e.has_unfinished() {
            break;
        }
        if step == 1 || step == 4 {
            e.model_mut().fail_next = true;
            let err = pollster::block_on(e.step()).expect_err("injected failure");
            assert!(err.to_string().contains("injected failure"), "{err}");
            continue;
        }
        engine_support::collect(pollster::block_on(e.step()).expect("step"), &mut outcomes);
    }
    assert_eq!(outcomes[&id].tokens, solo.tokens);
    assert_pool_full(&e);
}

#[test]
fn step_with_nothing_live_returns_no_events() {
    let mut e = engine(small_config(64, 32), hash_rule());
    assert!(pollster::block_on(e.step()).expect("step").is_empty());
    assert!(pollster::block_on(e.step()).expect("step").is_empty());
    assert!(
        e.model().batch_tokens.is_empty(),
        "no forward pass when idle"
    );
}

#[test]
fn all_logits_returns_every_position() {
    let mut e = engine(small_config(64, 32), hash_rule());
    let tokens = [1u32, 300, 301, 302, 303, 40, 41];
    let logits = pollster::block_on(e.all_logits(&tokens)).expect("logits");
    let n_vocab = e.model().config.n_vocab;
    assert_eq!(logits.len(), tokens.len() * n_vocab);
    for p in 0..tokens.len() {
        let want = e.model().row(&tokens[..=p]);
        assert_eq!(
            &logits[p * n_vocab..(p + 1) * n_vocab],
            &want[..],
            "position {p}"
        );
    }
    assert_eq!(e.model().batch_tokens, [tokens.len()], "one forward pass");
    assert_pool_full(&e);
}
