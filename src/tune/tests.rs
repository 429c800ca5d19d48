use std::cell::Cell;

use super::*;
use crate::platform::CpuInfo;

/// A clock that only moves when a candidate advances it.
#[derive(Default)]
struct FakeClock(Cell<u64>);

impl FakeClock {
    fn advance(&self, ns: u64) {
        self.0.set(self.0.get() + ns);
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.0.get()
    }
}

fn key(build: &str) -> TuneKey {
    let cpu = CpuInfo {
        arch: "x86_64".into(),
        isa_tiers: vec!["scalar".into(), "avx2".into(), "avx512".into()],
        best_isa: "avx512".into(),
        logical_cores: 8,
        threads: true,
    };
    TuneKey::cpu(&cpu, Some("Test CPU 9000"), build)
}

/// Candidates whose `i`-th run takes `times[i % len]` ns and outputs `out`.
fn scripted<'a>(clock: &'a FakeClock, specs: &[(&str, Vec<u64>, Vec<f32>)]) -> Vec<Candidate<'a>> {
    specs
        .iter()
        .map(|(name, times, out)| {
            let (times, out) = (times.clone(), out.clone());
            let mut n = 0usize;
            Candidate::new(*name, move || {
                clock.advance(times[n % times.len()]);
                n += 1;
                Ok(out.clone())
            })
        })
        .collect()
}

fn probe() -> Probe {
    Probe::new("test.kernel", "Q4_K 4096x4096", "wide")
}

const REF: [f32; 3] = [1.0, -2.0, 3.0];

#[test]
fn probes_are_deterministic_given_fake_timings() {
    let run = || {
        let clock = FakeClock::default();
        let mut c = scripted(
            &clock,
            &[
                ("wide", vec![100, 130, 90, 110], REF.to_vec()),
                ("narrow", vec![80, 70, 95, 60], REF.to_vec()),
            ],
        );
        probe()
            .run(&key("b1"), &mut c, &REF, &clock)
            .expect("probe")
    };
    let (a, b) = (run(), run());
    assert_eq!(a, b);
    assert_eq!(a.winner, "narrow", "{a:?}");
    assert!(a.candidates.iter().all(|m| m.median_ns.is_some()));
}

#[test]
fn rounds_rotate_the_candidate_order() {
    let clock = FakeClock::default();
    let order = std::cell::RefCell::new(Vec::new());
    let mut c: Vec<Candidate<'_>> = ["a", "b", "c"]
        .into_iter()
        .map(|n| {
            let order = &order;
            Candidate::new(n, move || {
                order.borrow_mut().push(n);
                Ok(REF.to_vec())
            })
        })
        .collect();
    let p = Probe {
        rounds: 3,
        default: "a".into(),
        ..probe()
    };
    p.run(&key("b1"), &mut c, &REF, &clock).expect("probe");
    let timed: Vec<&str> = order.borrow()[3..].to_vec();
    assert_eq!(timed, ["a", "b", "c", "b", "c", "a", "c", "a", "b"]);
}

#[test]
fn a_lead_under_three_percent_is_a_tie_and_the_default_wins() {
    let clock = FakeClock::default();
    let mut c = scripted(
        &clock,
        &[
            ("wide", vec![1000], REF.to_vec()),
            ("narrow", vec![975], REF.to_vec()),
        ],
    );
    let r = probe()
        .run(&key("b1"), &mut c, &REF, &clock)
        .expect("probe");
    assert_eq!(r.winner, "wide", "{r:?}");
    assert!(r.why.contains("tie"), "{}", r.why);

    let mut c = scripted(
        &clock,
        &[
            ("wide", vec![1000], REF.to_vec()),
            ("narrow", vec![960], REF.to_vec()),
        ],
    );
    let r = probe()
        .run(&key("b1"), &mut c, &REF, &clock)
        .expect("probe");
    assert_eq!(r.winner, "narrow", "4% is a lead: {r:?}");
}

#[test]
fn a_candidate_off_the_reference_is_excluded_with_its_reason() {
    let clock = FakeClock::default();
    let mut c = scripted(
        &clock,
        &[
            ("wide", vec![1000], REF.to_vec()),
            ("broken", vec![10], vec![1.0, 2.0, 3.0]),
            ("nan", vec![10], vec![1.0, f32::NAN, 3.0]),
        ],
    );
    let r = probe()
        .run(&key("b1"), &mut c, &REF, &clock)
        .expect("probe");
    assert_eq!(r.winner, "wide", "{r:?}");
    for bad in &r.candidates[1..] {
        assert!(bad.median_ns.is_none(), "{bad:?}");
        assert!(bad.rejected.is_some(), "{bad:?}");
    }
    assert!(r.candidates[1]
        .rejected
        .as_deref()
        .is_some_and(|w| w.contains("error")));

    let mut c = scripted(&clock, &[("wide", vec![1], vec![0.0; 3])]);
    let e = probe().run(&key("b1"), &mut c, &REF, &clock);
    assert!(
        matches!(e, Err(TuneError::NoValidCandidate { .. })),
        "{e:?}"
    );
}

fn record(key: TuneKey, winner: &str) -> Record {
    Record {
        key,
        probe: "test.kernel".into(),
        shape: "Q4_K 4096x4096".into(),
        default: "wide".into(),
        winner: winner.into(),
        why: "fastest".into(),
        candidates: vec![Measured {
            name: winner.into(),
            median_ns: Some(5),
            rejected: None,
        }],
    }
}

#[test]
fn records_of_another_device_or_build_are_ignored() {
    let mut store = TuneStore::default();
    store.insert(record(key("old-build"), "narrow"));
    let mut other = key("b1");
    other.device = "Another CPU".into();
    store.insert(record(other, "narrow"));
    let cands = ["wide", "narrow"];
    let got = store.choose(&key("b1"), "test.kernel", "Q4_K 4096x4096", &cands, "wide");
    assert_eq!(got, Stored::Missing);
    let (mine, ignored) = store.for_key(&key("b1"));
    assert_eq!((mine.len(), ignored), (0, 2));

    store.insert(record(key("b1"), "narrow"));
    let got = store.choose(&key("b1"), "test.kernel", "Q4_K 4096x4096", &cands, "wide");
    assert_eq!(got, Stored::Winner("narrow".into()));
    let got = store.choose(&key("b1"), "test.kernel", "Q6_K 4096x4096", &cands, "wide");
    assert_eq!(got, Stored::Missing, "another shape");
}

#[test]
fn a_stored_winner_that_no_longer_exists_falls_back_with_a_message() {
    let mut store = TuneStore::default();
    store.insert(record(key("b1"), "avx1024"));
    let got = store.choose(
        &key("b1"),
        "test.kernel",
        "Q4_K 4096x4096",
        &["wide"],
        "wide",
    );
    let Stored::Fallback { default, message } = got else {
        panic!("{got:?}");
    };
    assert_eq!(default, "wide");
    assert!(
        message.contains("avx1024") && message.contains("hearth tune"),
        "{message}"
    );
}

#[test]
fn the_store_round_trips_through_json_and_its_store() {
    let mut store = TuneStore::default();
    store.insert(record(key("b1"), "narrow"));
    store.insert(record(key("b1"), "wide"));
    assert_eq!(store.records.len(), 1, "same key, probe and shape replace");
    let mem = MemoryStore::default();
    assert_eq!(TuneStore::load(&mem), (TuneStore::default(), None));
    store.save(&mem).expect("save");
    assert_eq!(TuneStore::load(&mem), (store.clone(), None));
    assert_eq!(TuneStore::from_json(&store.to_json()).expect("json"), store);

    let (empty, why) = TuneStore::load(&MemoryStore::with_bytes(b"{not json".to_vec()));
    assert_eq!(empty, TuneStore::default());
    assert!(why.is_some_and(|w| w.contains("hearth tune")));
}

#[test]
fn build_ids_are_stable_and_tell_builds_apart() {
    assert_eq!(build_id(&["a", "b"]), build_id(&["a", "b"]));
    assert_ne!(build_id(&["a", "b"]), build_id(&["ab"]));
    assert_eq!(build_id(&[]).len(), 16);
}

/// A real clock is not in the core; the CPU probe's timing here uses a
/// fake one, so this checks validation and the record, not speed.
#[test]
fn the_cpu_probe_validates_every_tier_on_a_model_shape() {
    let clock = FakeClock::default();
    let shapes = [
        cpu::WeightShape {
            ty: crate::quant::GgmlType::Q4_K,
            cols: 512,
            rows: 64,
        },
        cpu::WeightShape {
            ty: crate::quant::GgmlType::Q8_0,
            cols: 256,
            rows: 48,
        },
    ];
    let k = TuneKey::cpu(&CpuInfo::detect(), None, &cpu::kernels_build());
    let r = cpu::probe_isa(&k, &shapes, 1, &clock).expect("probe");
    assert_eq!(r.shape, "Q4_K 512x64, Q8_0 256x48");
    assert_eq!(r.candidates.len(), cpu::candidates().len());
    for m in &r.candidates {
        assert!(m.rejected.is_none(), "{m:?}");
    }
    // Every run took no fake time: a tie, the widest tier kept.
    assert_eq!(r.winner, crate::backend::cpu::kernels::Isa::best().name());
}
