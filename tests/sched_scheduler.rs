//! Scheduler scenarios: prefix sharing, chunked prefill, preemption,
//! cancellation, stop rules and protocol errors, with the fake model.

mod sched_sim;

use hearth::kv::SeqId;
use hearth::sched::{
    FinishReason, RequestId, SchedError, SchedEvent, ScheduleKind, Scheduler, SchedulerConfig,
    SchedulerOutput,
};
use sched_sim::{check_limits, fake_token, reference_output, request, FakeKv, EOS};

fn cfg(budget: usize, seqs: usize, blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: budget,
        max_num_seqs: seqs,
        num_blocks: blocks,
        block_size: 16,
        enable_prefix_caching: true,
        prefill_tokens_per_4_decodes: 0,
    }
}

/// One step: schedule, fake forward, update; returns the output and events.
fn step(s: &mut Scheduler, kv: &mut FakeKv) -> (SchedulerOutput, Vec<SchedEvent>) {
    let out = s.schedule().expect("schedule");
    check_limits(s.config(), s, &out);
    let sampled = kv.forward(s, &out);
    let ev = s.update_from_output(&sampled).expect("update");
    (out, ev)
}

/// Steps until every request has finished, collecting their outputs.
fn run_to_end(s: &mut Scheduler, kv: &mut FakeKv) -> Vec<(RequestId, Vec<u32>)> {
    let mut done = Vec::new();
    for _ in 0..10_000 {
        if !s.has_unfinished() {
            return done;
        }
        for e in step(s, kv).1 {
            if let SchedEvent::Finished {
                id, output_tokens, ..
            } = e
            {
                done.push((id, output_tokens));
            }
        }
    }
    panic!("did not finish: {:?}", s.stats());
}

fn seq_prompt(base: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 2 + (base * 131 + i * 7) % 900)
        .collect()
}

#[test]
fn prefix_sharing_computes_only_the_remainder() {
    let c = cfg(256, 8, 64);
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    let common = seq_prompt(1, 48);
    let a = request(1, [common.clone(), seq_prompt(2, 10)].concat(), 30);
    let b = request(2, [common.clone(), seq_prompt(3, 7)].concat(), 30);
    s.add_request(a.clone()).unwrap();
    let (out, _) = step(&mut s, &mut kv);
    assert_eq!(out.num_tokens_by_request(), vec![(a.id, 58)]);
    s.add_request(b.clone()).unwrap();
    let (out, _) = step(&mut s, &mut kv);
    let rb = out.requests.iter().find(|r| r.id == b.id).unwrap();
    assert_eq!(
        (rb.kind, rb.start, rb.num_tokens()),
        (ScheduleKind::New, 48, 7),
        "only the 7-token remainder is computed"
    );
    let ta = s.kv().block_table(SeqId(1)).unwrap().to_vec();
    let tb = s.kv().block_table(SeqId(2)).unwrap().to_vec();
    assert_eq!(ta[..3], tb[..3], "the 3 prefix blocks are shared");
    assert_ne!(ta[3], tb[3]);
    for blk in &ta[..3] {
        assert_eq!(s.kv().pool().ref_count(*blk), Some(2));
    }
    assert!(s.stats().prefix_hit_rate > 0.4, "{:?}", s.stats());
    let done = run_to_end(&mut s, &mut kv);
    for (id, out) in done {
        let r = if id == a.id { &a } else { &b };
        assert_eq!(out, reference_output(r), "{id}: sharing changed the output");
    }
    assert_eq!(s.kv().num_free_blocks(), s.kv().num_usable_blocks());
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_token() {
    let c = cfg(256, 8, 64);
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    let prompt = seq_prompt(5, 32);
    s.add_request(request(1, prompt.clone(), 1)).unwrap();
    run_to_end(&mut s, &mut kv);
    s.add_request(request(2, prompt, 1)).unwrap();
    let (out, _) = step(&mut s, &mut kv);
    // Two full blocks are cached, but only one may be used: the last token needs logits.
    assert_eq!(
        (out.requests[0].start, out.requests[0].num_tokens()),
        (16, 16)
    );
}

#[test]
fn chunked_prefill_takes_four_steps_while_decodes_continue() {
    let c = cfg(32, 8, 64);
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    let short = request(1, seq_prompt(7, 5), 200);
    let long = request(2, seq_prompt(8, 100), 5);
    let mut short_nonstop = short.clone();
    short_nonstop.stop_token_ids.clear();
    s.add_request(short_nonstop).unwrap();
    step(&mut s, &mut kv);
    s.add_request(long.clone()).unwrap();
    let mut chunks = Vec::new();
    loop {
        let (out, ev) = step(&mut s, &mut kv);
        assert!(
            out.requests
                .iter()
                .any(|r| r.id == short.id && r.num_tokens() == 1),
            "the decode continues"
        );
        assert!(ev
            .iter()
            .any(|e| matches!(e, SchedEvent::Token { id, .. } if *id == short.id)));
        let r = out.requests.iter().find(|r| r.id == long.id).unwrap();
        chunks.push(r.num_tokens());
        if r.samples {
            break;
        }
    }
    assert_eq!(chunks.len(), 4, "chunks {chunks:?}");
    assert_eq!(chunks.iter().sum::<usize>(), 100);
    assert!(
        chunks.iter().all(|&n| n <= 31),
        "the decode keeps one token of the budget: {chunks:?}"
    );
}

#[test]
fn prefill_beside_decodes_is_capped_and_a_lone_prefill_is_not() {
    let c = SchedulerConfig {
        prefill_tokens_per_4_decodes: 8,
        ..cfg(64, 8, 64)
    };
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    let mut first = request(1, seq_prompt(7, 40), 200);
    first.stop_token_ids.clear();
    s.add_request(first.clone()).unwrap();
    let (out, _) = step(&mut s, &mut kv);
    assert_eq!(out.num_batched_tokens, 40, "no decodes: the whole budget");
    s.add_request(request(2, seq_prompt(8, 30), 5)).unwrap();
    let mut chunks = Vec::new();
    loop {
        let (out, _) = step(&mut s, &mut kv);
        assert!(out
            .requests
            .iter()
            .any(|r| r.id == first.id && r.num_tokens() == 1));
        let r = out.requests.iter().find(|r| r.id.0 == 2).unwrap();
        chunks.push(r.num_tokens());
        if r.samples {
            break;
        }
    }
    assert_eq!(
        chunks,
        vec![8, 8, 8, 6],
        "beside a decode, 8 prompt tokens a step"
    );
}

#[test]
fn blocks_running_out_preempt_the_newest_which_resumes_identically() {
    // 6 usable blocks of 16 tokens; each request grows to 3 blocks.
    let c = cfg(64, 4, 7);
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    let reqs: Vec<_> = (1..=3)
        .map(|i| {
            let mut r = request(i, seq_prompt(i as u32, 12), 30);
            r.stop_token_ids.clear();
            r
        })
        .collect();
    for r in &reqs {
        s.add_request(r.clone()).unwrap();
    }
    let mut preempted = Vec::new();
    let mut resumed = Vec::new();
    let mut done = Vec::new();
    for _ in 0..1000 {
        if !s.has_unfinished() {
            break;
        }
        let (out, ev) = step(&mut s, &mut kv);
        preempted.extend(out.preempted.iter().copied());
        resumed.extend(
            out.requests
                .iter()
                .filter(|r| r.kind == ScheduleKind::Resumed)
                .map(|r| r.id),
        );
        done.extend(ev.into_iter().filter_map(|e| match e {
            SchedEvent::Finished {
                id, output_tokens, ..
            } => Some((id, output_tokens)),
            _ => None,
        }));
    }
    assert_eq!(
        preempted.first(),
        Some(&RequestId(3)),
        "the newest goes first"
    );
    assert!(resumed.contains(&RequestId(3)));
    assert_eq!(done.len(), 3);
    for (id, out) in done {
        assert_eq!(out, reference_output(&reqs[id.0 as usize - 1]), "{id}");
    }
    assert_eq!(s.kv().num_free_blocks(), 6);
}

#[test]
fn max_num_seqs_and_fcfs_admission() {
    let c = cfg(1000, 2, 64);
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    for i in 1..=4 {
        s.add_request(request(i, seq_prompt(i as u32, 5), 3))
            .unwrap();
    }
    let (out, _) = step(&mut s, &mut kv);
    let ids: Vec<_> = out.requests.iter().map(|r| r.id.0).collect();
    assert_eq!(ids, vec![1, 2]);
    assert_eq!(s.stats().num_waiting, 2);
}

#[test]
fn cancel_frees_blocks_at_once_even_mid_step() {
    let c = cfg(64, 4, 32);
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    s.add_request(request(1, seq_prompt(1, 40), 50)).unwrap();
    s.add_request(request(2, seq_prompt(2, 10), 50)).unwrap();
    step(&mut s, &mut kv);
    let free = s.kv().num_free_blocks();
    let ev = s.cancel(RequestId(1)).unwrap();
    assert!(matches!(
        ev,
        SchedEvent::Finished {
            reason: FinishReason::Cancelled,
            ..
        }
    ));
    assert_eq!(s.kv().num_free_blocks(), free + 3);
    // Cancel between schedule and update: the step's token for it is ignored.
    let out = s.schedule().unwrap();
    let sampled = kv.forward(&s, &out);
    s.cancel(RequestId(2)).unwrap();
    assert_eq!(s.update_from_output(&sampled).unwrap(), vec![]);
    assert!(!s.has_unfinished());
    assert_eq!(s.kv().num_free_blocks(), 31);
    assert!(matches!(
        s.cancel(RequestId(2)),
        Err(SchedError::UnknownRequest { .. })
    ));
}

#[test]
fn stop_token_length_and_stop_string_finish() {
    let c = cfg(64, 4, 32);
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    // Find a request whose solo output hits EOS.
    let eos_req = (1..500u64)
        .map(|i| request(i, seq_prompt(i as u32, 4), 60))
        .find(|r| reference_output(r).last() == Some(&EOS))
        .unwrap();
    s.add_request(eos_req.clone()).unwrap();
    let mut len_req = request(1000, seq_prompt(9, 4), 3);
    len_req.stop_token_ids.clear();
    s.add_request(len_req).unwrap();
    let mut stop_req = request(1001, seq_prompt(10, 4), 50);
    stop_req.stop_token_ids.clear();
    s.add_request(stop_req).unwrap();
    let mut reasons = Vec::new();
    while s.has_unfinished() {
        let out = s.schedule().unwrap();
        let sampled = kv.forward(&s, &out);
        // The "stop string": the request's 4th output token.
        let ev = s
            .update_from_output_with(&sampled, &mut |id, out| {
                id == RequestId(1001) && out.len() == 4
            })
            .unwrap();
        for e in ev {
            if let SchedEvent::Finished {
                id,
                reason,
                output_tokens,
            } = e
            {
                reasons.push((id.0, reason, output_tokens.len()));
            }
        }
    }
    reasons.sort_by_key(|r| r.0);
    let eos_len = reference_output(&eos_req).len();
    assert_eq!(
        reasons,
        vec![
            (eos_req.id.0, FinishReason::StopToken(EOS), eos_len),
            (1000, FinishReason::Length, 3),
            (1001, FinishReason::StopString, 4)
        ]
    );
}

#[test]
fn protocol_and_request_errors() {
    let c = cfg(64, 4, 8);
    let mut s = Scheduler::new(c).unwrap();
    assert!(matches!(
        s.update_from_output(&[]),
        Err(SchedError::NoStepInFlight)
    ));
    assert!(matches!(
        s.add_request(request(1, vec![], 3)),
        Err(SchedError::EmptyRequest { .. })
    ));
    assert!(matches!(
        s.add_request(request(1, vec![5; 100], 20)),
        Err(SchedError::TooLong { .. })
    ));
    s.add_request(request(1, vec![5; 10], 3)).unwrap();
    assert!(matches!(
        s.add_request(request(1, vec![5; 10], 3)),
        Err(SchedError::DuplicateId { .. })
    ));
    let out = s.schedule().unwrap();
    assert!(matches!(s.schedule(), Err(SchedError::StepInFlight)));
    assert!(
        matches!(
            s.update_from_output(&[]),
            Err(SchedError::BadSamples { .. })
        ),
        "missing token"
    );
    assert!(matches!(
        s.update_from_output(&[(RequestId(9), 3)]),
        Err(SchedError::BadSamples { .. })
    ));
    // The step stayed in flight: a correct update still works.
    let id = out.requests[0].id;
    let ev = s.update_from_output(&[(id, fake_token(id, 10))]).unwrap();
    assert!(matches!(ev[0], SchedEvent::Token { index: 0, .. }));
    assert!(Scheduler::new(SchedulerConfig {
        max_num_seqs: 0,
        ..SchedulerConfig::default()
    })
    .is_err());
}

#[test]
fn an_aborted_step_is_recomputed_with_the_same_outputs() {
    let c = cfg(48, 4, 64);
    let (mut s, mut kv) = (Scheduler::new(c.clone()).unwrap(), FakeKv::new(&c));
    let reqs: Vec<_> = (1..=3)
        .map(|i| request(i, seq_prompt(i as u32, 20 + i as usize), 12))
        .collect();
    for r in &reqs {
        s.add_request(r.clone()).unwrap();
    }
    step(&mut s, &mut kv);
    step(&mut s, &mut kv);
    let out = s.schedule().unwrap();
    let ids: Vec<_> = out.requests.iter().map(|r| r.id).collect();
    assert!(matches!(
        s.update_from_output(&[]),
        Err(SchedError::BadSamples { .. })
    ));
    let aborted = s.abort_step().unwrap();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(
        aborted, sorted,
        "every live request of the step, oldest first"
    );
    assert!(matches!(s.abort_step(), Err(SchedError::NoStepInFlight)));
    let (out, _) = step(&mut s, &mut kv);
    assert!(out
        .requests
        .iter()
        .filter(|r| aborted.contains(&r.id))
        .all(|r| r.kind == ScheduleKind::Resumed));
    let mut done = run_to_end(&mut s, &mut kv);
    done.sort();
    for (id, out) in done {
        assert_eq!(out, reference_output(&reqs[id.0 as usize - 1]), "{id}");
    }
    assert_eq!(s.kv().num_free_blocks(), s.kv().num_usable_blocks());
}
