//! Seeded random workloads through the scheduler with a fake model: limits
//! hold every step, nothing leaks, nothing starves, and outputs equal those
//! of each request run alone, whatever the pool size (preemption included).

mod sched_sim;

use hearth::sched::{RequestId, SchedulerConfig};
use sched_sim::{reference_output, request, run, run_with, TestRng};

/// A workload: requests with arrival steps; prompts often share prefixes.
fn workload(seed: u64, n: usize) -> Vec<(u64, hearth::sched::Request)> {
    let mut rng = TestRng(seed);
    let bases: Vec<Vec<u32>> = (0..3)
        .map(|_| {
            (0..rng.range(16, 70))
                .map(|_| 2 + (rng.next() % 500) as u32)
                .collect()
        })
        .collect();
    (0..n)
        .map(|i| {
            let mut prompt = if rng.next().is_multiple_of(2) {
                bases[rng.range(0, 2)].clone()
            } else {
                Vec::new()
            };
            prompt.extend((0..rng.range(1, 40)).map(|_| 2 + (rng.next() % 500) as u32));
            let at = rng.range(0, 12) as u64;
            (at, request(i as u64 + 1, prompt, rng.range(1, 40)))
        })
        .collect()
}

fn config(rng: &mut TestRng, num_blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: rng.range(4, 64),
        max_num_seqs: rng.range(1, 8),
        num_blocks,
        block_size: [4, 8, 16][rng.range(0, 2)],
        enable_prefix_caching: !rng.next().is_multiple_of(4),
        prefill_tokens_per_4_decodes: [0, 1, 3, 8][rng.range(0, 3)],
    }
}

/// Blocks the largest request needs alone, plus the null block.
fn min_blocks(reqs: &[(u64, hearth::sched::Request)], bs: usize) -> usize {
    reqs.iter()
        .map(|(_, r)| (r.prompt_tokens.len() + r.max_tokens - 1).div_ceil(bs))
        .max()
        .unwrap_or(1)
        + 1
}

#[test]
fn random_workloads_match_solo_outputs_with_any_pool() {
    let mut total_preemptions = 0;
    for seed in 0..40u64 {
        let reqs = workload(seed, 12);
        let mut rng = TestRng(seed ^ 0xabcdef);
        let mut cfg = config(&mut rng, 0);
        let tiny = min_blocks(&reqs, cfg.block_size);
        let total_tokens: usize = reqs
            .iter()
            .map(|(_, r)| r.prompt_tokens.len() + r.max_tokens)
            .sum();
        for num_blocks in [10_000, tiny, tiny + 3] {
            cfg.num_blocks = num_blocks;
            let res = run(&cfg, &reqs, &[], 50_000);
            for (_, r) in &reqs {
                assert_eq!(
                    res.outputs[&r.id],
                    reference_output(r),
                    "seed {seed}, {num_blocks} blocks, {cfg:?}: {} differs",
                    r.id
                );
                // No starvation: each request ends within a bound of its arrival.
                let bound = (total_tokens * 2) as u64;
                assert!(
                    res.latency[&r.id] <= bound,
                    "seed {seed}: {} took {} steps",
                    r.id,
                    res.latency[&r.id]
                );
            }
            if num_blocks == 10_000 {
                assert_eq!(
                    res.preemptions, 0,
                    "seed {seed}: a huge pool never preempts"
                );
            }
            total_preemptions += res.preemptions;
        }
    }
    eprintln!("preemptions {total_preemptions}");
    assert!(
        total_preemptions > 50,
        "tiny pools should force preemptions, got {total_preemptions}"
    );
}

#[test]
fn random_cancels_leak_nothing() {
    for seed in 100..130u64 {
        let reqs = workload(seed, 10);
        let mut rng = TestRng(seed);
        let mut cfg = config(&mut rng, 0);
        cfg.num_blocks = min_blocks(&reqs, cfg.block_size) + rng.range(0, 10);
        let mut cancels: Vec<(RequestId, u64)> = Vec::new();
        for (at, r) in &reqs {
            if rng.next().is_multiple_of(3) {
                cancels.push((r.id, at + rng.range(0, 6) as u64));
            }
        }
        let res = run(&cfg, &reqs, &cancels, 50_000);
        for (_, r) in &reqs {
            let out = &res.outputs[&r.id];
            let full = reference_output(r);
            // Cancelled requests stop early, but what they produced is a prefix of the solo output.
            assert!(
                full.starts_with(out),
                "seed {seed}: {} produced {out:?}, solo {full:?}",
                r.id
            );
            if !cancels.iter().any(|(id, _)| *id == r.id) {
                assert_eq!(out, &full, "seed {seed}: {} differs", r.id);
            }
        }
    }
}

#[test]
fn preemption_keeps_seeded_sampling_streams_identical() {
    // Tokens come from one seeded Sampler per request (temperature, top-k,
    // repetition penalty over prompt + output): a token sampled twice or a
    // lost output token would change every later token.
    let mut total_preemptions = 0;
    for seed in 200..220u64 {
        let reqs = workload(seed, 10);
        let mut rng = TestRng(seed);
        let mut cfg = config(&mut rng, 10_000);
        let huge = run_with(&cfg, &reqs, &[], 50_000, true);
        cfg.num_blocks = min_blocks(&reqs, cfg.block_size);
        let tiny = run_with(&cfg, &reqs, &[], 50_000, true);
        total_preemptions += tiny.preemptions;
        for (_, r) in &reqs {
            assert_eq!(
                tiny.outputs[&r.id], huge.outputs[&r.id],
                "seed {seed}, {cfg:?}: {} differs",
                r.id
            );
        }
    }
    assert!(
        total_preemptions > 20,
        "tiny pools should force preemptions, got {total_preemptions}"
    );
}
