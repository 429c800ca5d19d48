use super::*;
use std::sync::Mutex as TestLock;

/// Tests here share the process's one recorder.
static SERIAL: TestLock<()> = TestLock::new(());

/// A clock the test moves by hand, in seconds.
fn manual() -> (Clock, std::sync::Arc<Mutex<f64>>) {
    let t = std::sync::Arc::new(Mutex::new(0.0));
    let read = t.clone();
    (
        Clock::from_fn(move || *read.lock().unwrap_or_else(|e| e.into_inner())),
        t,
    )
}

fn set(t: &Mutex<f64>, s: f64) {
    *t.lock().unwrap() = s;
}

fn bench_spans(trace: &Trace) -> Vec<&SpanRecord> {
    trace
        .spans
        .iter()
        .filter(|s| s.track == Track::Bench)
        .collect()
}

#[test]
fn off_records_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(stop().is_none() || !on());
    let s = span(Track::Bench, "unseen");
    assert!(!s.is_recording());
    drop(s);
    counter("unseen", 1.0);
    assert!(now().is_none());
    assert!(stop().is_none());
}

#[test]
fn spans_nest_with_depths_and_times() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (clock, t) = manual();
    set(&t, 10.0);
    start(clock);
    {
        let _outer = span(Track::Bench, "outer").arg("tokens", 512usize);
        set(&t, 10.5);
        {
            let _inner = span(Track::Bench, "inner");
            set(&t, 11.0);
        }
        set(&t, 12.0);
    }
    complete(Track::Device(0), "kernel", 0.25, 0.75, vec![]);
    counter("kv blocks", 3.0);
    let trace = stop().expect("a recording");
    let spans = bench_spans(&trace);
    assert_eq!(spans.len(), 2);
    let (inner, outer) = (spans[0], spans[1]);
    assert_eq!((inner.name.as_ref(), inner.depth), ("inner", 1));
    assert_eq!((inner.start_ns, inner.end_ns), (500_000_000, 1_000_000_000));
    assert_eq!((outer.name.as_ref(), outer.depth), ("outer", 0));
    assert_eq!((outer.start_ns, outer.end_ns), (0, 2_000_000_000));
    assert_eq!(outer.args, vec![("tokens", ArgValue::Uint(512))]);
    let kernel = trace.spans.iter().find(|s| s.name == "kernel").unwrap();
    assert_eq!((kernel.start_ns, kernel.end_ns), (250_000_000, 750_000_000));
    assert_eq!(trace.counters.len(), 1);
}

#[test]
fn a_span_open_across_a_restart_is_not_kept() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (clock, _t) = manual();
    start(clock);
    let open = span(Track::Bench, "stale");
    let (clock, _t) = manual();
    start(clock);
    drop(open);
    let trace = stop().unwrap();
    assert!(bench_spans(&trace).is_empty());
}

/// The written events of the bench track, as (type, timestamp, name),
/// read back with the writer's own message types (the CLI's tests read
/// them with Perfetto's).
#[test]
fn slices_are_written_as_ordered_begin_end_pairs() {
    let trace = Trace {
        spans: vec![
            // Closed order: the child first.
            rec("child", 5, 8, 1),
            rec("parent", 0, 10, 0),
            rec("sibling", 10, 12, 0),
            // A child whose parent was never closed ends where it says.
            rec("orphan", 20, 21, 1),
        ],
        ..Trace::default()
    };
    let events = encode::bench_events(&trace.to_perfetto());
    assert_eq!(
        events,
        vec![
            (1, 0, "parent".to_string()),
            (1, 5, "child".to_string()),
            (2, 8, String::new()),
            (2, 10, String::new()),
            (1, 10, "sibling".to_string()),
            (2, 12, String::new()),
            (1, 20, "orphan".to_string()),
            (2, 21, String::new()),
        ]
    );
}

fn rec(name: &'static str, start_ns: u64, end_ns: u64, depth: u32) -> SpanRecord {
    SpanRecord {
        track: Track::Bench,
        name: name.into(),
        start_ns,
        end_ns,
        depth,
        args: Vec::new(),
    }
}
