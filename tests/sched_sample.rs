//! Sampler: greedy, each filter on small hand-made distributions, llama.cpp's
//! penalties, seeded determinism, draw frequencies and log-probabilities.

use hearth::sample::{Pcg32, SampleError, Sampler, SamplingParams};

fn plain(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 42,
        ..SamplingParams::default()
    }
}

/// Every token `sampler` can draw from `logits`, over many draws.
fn support(p: SamplingParams, logits: &[f32]) -> Vec<u32> {
    let mut s = Sampler::new(p).unwrap();
    let mut seen: Vec<u32> = (0..2000)
        .map(|_| s.sample(logits, &[]).unwrap().token)
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

fn ln_probs(p: &[f64]) -> Vec<f32> {
    p.iter().map(|x| x.ln() as f32).collect()
}

#[test]
fn greedy_picks_argmax_with_ties_to_the_lowest_id() {
    let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
    assert_eq!(s.sample(&[0.1, 2.5, -1.0, 2.4], &[]).unwrap().token, 1);
    assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0, 3.0], &[]).unwrap().token, 1);
    let r = s.sample(&[1.0, 2.0], &[]).unwrap();
    // Plain softmax: p(1) = e / (1 + e).
    let want = (std::f64::consts::E / (1.0 + std::f64::consts::E)).ln() as f32;
    assert!((r.logprob - want).abs() < 1e-6, "{} vs {want}", r.logprob);
}

#[test]
fn top_k_keeps_the_k_most_likely() {
    let logits = [1.0, 3.0, 2.0, 0.5, 2.9];
    assert_eq!(
        support(
            SamplingParams {
                top_k: 2,
                ..plain(1.0)
            },
            &logits
        ),
        vec![1, 4]
    );
    assert_eq!(
        support(
            SamplingParams {
                top_k: 1,
                ..plain(5.0)
            },
            &logits
        ),
        vec![1]
    );
}

#[test]
fn top_p_and_min_p_filter_hand_made_distributions() {
    // Probabilities 0.15, 0.5, 0.05, 0.3.
    let logits = ln_probs(&[0.15, 0.5, 0.05, 0.3]);
    let cases: [(&str, SamplingParams, Vec<u32>); 5] = [
        (
            "top_p 0.75 keeps 0.5 + 0.3",
            SamplingParams {
                top_p: 0.75,
                ..plain(1.0)
            },
            vec![1, 3],
        ),
        (
            "top_p 0.85 adds 0.15",
            SamplingParams {
                top_p: 0.85,
                ..plain(1.0)
            },
            vec![0, 1, 3],
        ),
        (
            "top_p 0.1 keeps at least one",
            SamplingParams {
                top_p: 0.1,
                ..plain(1.0)
            },
            vec![1],
        ),
        // min_p: threshold = 0.5 * min_p.
        (
            "min_p 0.25 drops 0.05 only",
            SamplingParams {
                min_p: 0.25,
                ..plain(1.0)
            },
            vec![0, 1, 3],
        ),
        (
            "min_p 0.65 keeps the best",
            SamplingParams {
                min_p: 0.65,
                ..plain(1.0)
            },
            vec![1],
        ),
    ];
    for (what, params, want) in cases {
        assert_eq!(support(params, &logits), want, "{what}");
    }
}

#[test]
fn penalties_follow_llama_cpp() {
    let p = SamplingParams {
        repeat_penalty: 2.0,
        top_logprobs: 4,
        ..SamplingParams::greedy()
    };
    let mut s = Sampler::new(p).unwrap();
    // Token 0 (positive logit) is divided, token 1 (negative) multiplied.
    let r = s.sample(&[3.0, -1.0, 2.0, -1.5], &[0, 1, 0]).unwrap();
    assert_eq!(r.token, 2);
    let order: Vec<u32> = r.top_logprobs.iter().map(|t| t.0).collect();
    assert_eq!(
        order,
        vec![2, 0, 3, 1],
        "penalized logits 1.5, -2.0, 2.0, -1.5"
    );
    // Frequency and presence: 3.0 - 2 * 0.6 - 0.5 = 1.3 < 1.4.
    let p = SamplingParams {
        frequency_penalty: 0.6,
        presence_penalty: 0.5,
        ..SamplingParams::greedy()
    };
    let mut s = Sampler::new(p.clone()).unwrap();
    assert_eq!(s.sample(&[3.0, 1.4], &[0, 0]).unwrap().token, 1);
    // Only the last penalty_last_n tokens count.
    let mut s = Sampler::new(SamplingParams {
        penalty_last_n: 1,
        ..p
    })
    .unwrap();
    assert_eq!(s.sample(&[3.0, 1.4], &[0, 0, 1]).unwrap().token, 0);
}

#[test]
fn same_seed_same_tokens_other_seed_other_tokens() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
    let draw = |seed| {
        let mut s = Sampler::new(SamplingParams { seed, ..plain(1.0) }).unwrap();
        (0..64)
            .map(|_| s.sample(&logits, &[]).unwrap().token)
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(7), draw(7));
    assert_ne!(draw(7), draw(8));
    // The generator itself is pinned: same numbers on every target.
    let mut r = Pcg32::new(42, 54);
    assert_eq!(
        [r.next_u32(), r.next_u32(), r.next_u32()],
        [0xa15c_02b7, 0x7b47_f409, 0xba1d_3330]
    );
}

#[test]
fn temperature_one_draw_frequencies_match_the_distribution() {
    let probs = [0.1, 0.2, 0.3, 0.4];
    let logits = ln_probs(&probs);
    let n = 10_000;
    let mut s = Sampler::new(SamplingParams {
        seed: 1234,
        ..plain(1.0)
    })
    .unwrap();
    let mut counts = [0usize; 4];
    for _ in 0..n {
        counts[s.sample(&logits, &[]).unwrap().token as usize] += 1;
    }
    let chi2: f64 = probs
        .iter()
        .zip(counts)
        .map(|(p, c)| (c as f64 - p * n as f64).powi(2) / (p * n as f64))
        .sum();
    // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
    assert!(chi2 < 16.27, "seed 1234: counts {counts:?}, chi2 {chi2}");
}

#[test]
fn temperature_sharpens_and_flattens() {
    let logits = ln_probs(&[0.2, 0.8]);
    let freq = |t: f32| {
        let mut s = Sampler::new(SamplingParams {
            seed: 5,
            ..plain(t)
        })
        .unwrap();
        (0..4000)
            .filter(|_| s.sample(&logits, &[]).unwrap().token == 1)
            .count() as f64
            / 4000.0
    };
    // p1 at temperature t: 0.8^(1/t) / (0.8^(1/t) + 0.2^(1/t)).
    assert!((freq(0.5) - 16.0 / 17.0).abs() < 0.02);
    assert!((freq(2.0) - 2.0 / 3.0).abs() < 0.03);
}

#[test]
fn logprobs_are_those_of_the_final_distribution() {
    let logits = [0.5, 2.0, 1.0, -1.0, 1.5];
    let p = SamplingParams {
        top_k: 3,
        top_logprobs: 10,
        temperature: 0.7,
        ..plain(0.7)
    };
    let mut s = Sampler::new(p).unwrap();
    for _ in 0..50 {
        let r = s.sample(&logits, &[]).unwrap();
        assert_eq!(r.top_logprobs.len(), 3, "filtered tokens are absent");
        let ids: Vec<u32> = r.top_logprobs.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 4, 2]);
        let sum: f64 = r.top_logprobs.iter().map(|t| f64::from(t.1).exp()).sum();
        assert!((sum - 1.0).abs() < 1e-5, "probabilities sum to {sum}");
        let own = r.top_logprobs.iter().find(|t| t.0 == r.token).unwrap().1;
        assert_eq!(own, r.logprob);
        // Softmax of (2.0, 1.5, 1.0) / 0.7 for token 1.
        let z: f64 = [2.0f64, 1.5, 1.0].iter().map(|l| (l / 0.7).exp()).sum();
        assert!((f64::from(r.top_logprobs[0].1) - ((2.0f64 / 0.7).exp() / z).ln()).abs() < 1e-5);
    }
}

#[test]
fn bad_params_and_logits_are_errors() {
    assert!(matches!(
        Sampler::new(SamplingParams {
            repeat_penalty: 0.0,
            ..plain(1.0)
        }),
        Err(SampleError::BadParam { .. })
    ));
    assert!(matches!(
        Sampler::new(SamplingParams {
            temperature: f32::NAN,
            ..plain(1.0)
        }),
        Err(SampleError::BadParam { .. })
    ));
    assert!(matches!(
        Sampler::new(SamplingParams {
            top_p: 0.0,
            ..plain(1.0)
        }),
        Err(SampleError::BadParam { .. })
    ));
    let mut s = Sampler::new(plain(1.0)).unwrap();
    assert!(matches!(s.sample(&[], &[]), Err(SampleError::EmptyLogits)));
    assert!(matches!(
        s.sample(&[0.0, f32::NAN], &[]),
        Err(SampleError::NonFinite { token: 1, .. })
    ));
    // History ids outside the vocabulary are ignored.
    let mut s = Sampler::new(SamplingParams {
        repeat_penalty: 1.5,
        ..SamplingParams::greedy()
    })
    .unwrap();
    assert_eq!(s.sample(&[1.0, 2.0], &[7, 1_000_000]).unwrap().token, 1);
}
