//! A fake model and a step loop for scheduler tests: the "model" writes each
//! input token into its KV slot, checks that attention would read exactly the
//! sequence's tokens through the block table, and samples a token that is a
//! pure function of (request id, position), with EOS at some positions.

#![allow(dead_code)]

use std::collections::HashMap;

use hearth::kv::Slot;
use hearth::sample::{Sampler, SamplingParams};
use hearth::sched::{Request, RequestId, SchedEvent, Scheduler, SchedulerConfig, SchedulerOutput};

/// The fake model's end-of-sequence token.
pub const EOS: u32 = 1;

/// splitmix64: a seeded, stateless mixer for test data.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The token the fake model samples for request `id` at `position`.
pub fn fake_token(id: RequestId, position: usize) -> u32 {
    let h = mix(id.0.wrapping_mul(1_000_003) ^ position as u64);
    if h.is_multiple_of(29) {
        EOS
    } else {
        2 + (h % 997) as u32
    }
}

/// Logits over a 32-token vocabulary, a pure function of (request, position).
pub fn fake_logits(id: RequestId, position: usize) -> Vec<f32> {
    (0..32u64)
        .map(|v| (mix(id.0 ^ (position as u64) << 20 ^ v << 40) % 1000) as f32 / 250.0)
        .collect()
}

/// The output the fake model gives `req` when run alone.
pub fn reference_output(req: &Request) -> Vec<u32> {
    let mut out = Vec::new();
    for i in 0..req.max_tokens {
        let t = fake_token(req.id, req.prompt_tokens.len() + i);
        out.push(t);
        if req.stop_token_ids.contains(&t) {
            break;
        }
    }
    out
}

/// A tiny deterministic generator for workloads.
pub struct TestRng(pub u64);

impl TestRng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

/// The simulated KV memory: `(token, position)` per flat slot.
pub struct FakeKv {
    pub cells: Vec<Option<(u32, usize)>>,
    pub block_size: usize,
    /// When set, tokens are drawn by one seeded [`Sampler`] per request from
    /// [`fake_logits`] (so a token sampled twice would shift the stream).
    pub samplers: Option<HashMap<RequestId, Sampler>>,
}

impl FakeKv {
    pub fn new(cfg: &SchedulerConfig) -> Self {
        FakeKv {
            cells: vec![None; cfg.num_blocks * cfg.block_size],
            block_size: cfg.block_size,
            samplers: None,
        }
    }

    /// Runs the fake forward pass over `out`, checking every read; returns
    /// the sampled tokens.
    pub fn forward(&mut self, sched: &Scheduler, out: &SchedulerOutput) -> Vec<(RequestId, u32)> {
        let bs = self.block_size;
        for r in &out.requests {
            assert_eq!(
                r.tokens.len(),
                r.slots.len(),
                "{}: one slot per token",
                r.id
            );
            for (i, (&t, s)) in r.tokens.iter().zip(&r.slots).enumerate() {
                let p = r.start + i;
                assert_eq!(
                    *s,
                    Slot {
                        block: r.block_table[p / bs],
                        offset: (p % bs) as u32
                    },
                    "{}: slot of position {p}",
                    r.id
                );
                assert_ne!(s.block.0, 0, "null block written");
                self.cells[s.flat(bs)] = Some((t, p));
            }
        }
        // Attention reads happen after every write of the batch.
        let mut sampled = Vec::new();
        for r in &out.requests {
            let all = sched.all_tokens(r.id).expect("scheduled request is live");
            let end = r.start + r.tokens.len();
            for (p, &want) in all.iter().enumerate().take(end) {
                let cell = self.cells[r.block_table[p / bs].0 as usize * bs + p % bs];
                assert_eq!(
                    cell,
                    Some((want, p)),
                    "{}: KV at position {p} is wrong",
                    r.id
                );
            }
            if r.samples {
                sampled.push((r.id, self.next_token(sched, r.id, end)));
            }
        }
        sampled
    }
}

impl FakeKv {
    fn next_token(&mut self, sched: &Scheduler, id: RequestId, position: usize) -> u32 {
        let Some(samplers) = self.samplers.as_mut() else {
            return fake_token(id, position);
        };
        let s = samplers.entry(id).or_insert_with(|| {
            let params = SamplingParams {
                seed: id.0,
                repeat_penalty: 1.3,
                top_k: 20,
                ..SamplingParams::default()
            };
            Sampler::new(params).expect("params")
        });
        let history = sched.all_tokens(id).expect("live");
        s.sample(&fake_logits(id, position), history)
            .expect("sample")
            .token
    }
}

/// What a simulated run produced.
#[derive(Debug, Default)]
pub struct RunResult {
    pub outputs: HashMap<RequestId, Vec<u32>>,
    pub steps: u64,
    pub preemptions: u64,
    /// Steps from arrival to finish, per request.
    pub latency: HashMap<RequestId, u64>,
}

/// Runs `reqs` (each with its arrival step) to completion, cancelling
/// `cancels` (request, step) on the way, checking limits every step.
pub fn run(
    cfg: &SchedulerConfig,
    reqs: &[(u64, Request)],
    cancels: &[(RequestId, u64)],
    max_steps: u64,
) -> RunResult {
    run_with(cfg, reqs, cancels, max_steps, false)
}

/// [`run`], with tokens drawn by real samplers when `sampling`.
pub fn run_with(
    cfg: &SchedulerConfig,
    reqs: &[(u64, Request)],
    cancels: &[(RequestId, u64)],
    max_steps: u64,
    sampling: bool,
) -> RunResult {
    let mut sched = Scheduler::new(cfg.clone()).expect("config");
    let mut kv = FakeKv::new(cfg);
    if sampling {
        kv.samplers = Some(HashMap::new());
    }
    let mut res = RunResult::default();
    let mut arrival = HashMap::new();
    let mut step = 0u64;
    loop {
        for (at, r) in reqs.iter().filter(|(at, _)| *at == step) {
            sched.add_request(r.clone()).expect("add");
            arrival.insert(r.id, *at);
        }
        for &(id, _) in cancels.iter().filter(|(_, at)| *at == step) {
            if let Ok(SchedEvent::Finished { output_tokens, .. }) = sched.cancel(id) {
                res.outputs.insert(id, output_tokens);
            }
        }
        if !sched.has_unfinished() && reqs.iter().all(|(at, _)| *at <= step) {
            break;
        }
        assert!(
            step < max_steps,
            "not done after {max_steps} steps: {:?}",
            sched.stats()
        );
        let out = sched.schedule().expect("schedule");
        check_limits(cfg, &sched, &out);
        let sampled = kv.forward(&sched, &out);
        for ev in sched.update_from_output(&sampled).expect("update") {
            if let SchedEvent::Finished {
                id, output_tokens, ..
            } = ev
            {
                res.latency.insert(id, step + 1 - arrival[&id]);
                res.outputs.insert(id, output_tokens);
            }
        }
        step += 1;
    }
    let st = sched.stats();
    assert_eq!(st.num_free_blocks, st.num_usable_blocks, "blocks leaked");
    sched
        .kv()
        .pool()
        .check_invariants()
        .expect("pool invariants");
    res.steps = step;
    res.preemptions = st.num_preemptions;
    res
}

/// The token budget and the sequence limit hold.
pub fn check_limits(cfg: &SchedulerConfig, sched: &Scheduler, out: &SchedulerOutput) {
    let total: usize = out.requests.iter().map(|r| r.num_tokens()).sum();
    assert_eq!(total, out.num_batched_tokens);
    assert!(
        total <= cfg.max_num_batched_tokens,
        "step {}: {total} tokens > budget",
        out.step
    );
    assert!(
        out.requests.len() <= cfg.max_num_seqs,
        "step {}: too many sequences",
        out.step
    );
    assert!(sched.stats().num_running <= cfg.max_num_seqs);
    let mut ids: Vec<_> = out.requests.iter().map(|r| r.id).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(
        ids.len(),
        out.requests.len(),
        "a request scheduled twice in one step"
    );
}

/// A request with EOS as its stop token.
pub fn request(id: u64, prompt: Vec<u32>, max_tokens: usize) -> Request {
    let mut r = Request::new(RequestId(id), prompt, max_tokens);
    r.stop_token_ids = vec![EOS];
    r
}
