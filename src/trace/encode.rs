//! A [`Trace`] in Perfetto's protobuf format.
//!
//! The messages below are the subset of `protos/perfetto/trace/` the
//! writer fills (`Trace`, `TracePacket`, `TrackDescriptor`,
//! `ProcessDescriptor`, `CounterDescriptor`, `TrackEvent`,
//! `DebugAnnotation`), with Perfetto's field numbers; `prost` does the
//! wire format. Fields inside a `oneof` upstream (an event's `name`, an
//! annotation's value) are plain fields here: the bytes are the same.
//!
//! Layout: one process track ("hearth") holds a child track per
//! [`Track`] and per counter; request tracks hang under a "requests"
//! track. Every event is a `TrackEvent` on one packet sequence, with
//! slices written as begin/end pairs in timestamp order.

use std::collections::BTreeMap;

use prost::Message;

use super::{ArgValue, SpanRecord, Trace, Track};

#[derive(Clone, PartialEq, Message)]
struct TracePacket {
    #[prost(uint64, optional, tag = "8")]
    timestamp: Option<u64>,
    #[prost(uint32, optional, tag = "10")]
    trusted_packet_sequence_id: Option<u32>,
    #[prost(message, optional, tag = "11")]
    track_event: Option<TrackEvent>,
    #[prost(uint32, optional, tag = "13")]
    sequence_flags: Option<u32>,
    #[prost(message, optional, tag = "60")]
    track_descriptor: Option<TrackDescriptor>,
}

#[derive(Clone, PartialEq, Message)]
struct TrackDescriptor {
    #[prost(uint64, optional, tag = "1")]
    uuid: Option<u64>,
    #[prost(string, optional, tag = "2")]
    name: Option<String>,
    #[prost(message, optional, tag = "3")]
    process: Option<ProcessDescriptor>,
    #[prost(uint64, optional, tag = "5")]
    parent_uuid: Option<u64>,
    #[prost(message, optional, tag = "8")]
    counter: Option<CounterDescriptor>,
    #[prost(int32, optional, tag = "11")]
    child_ordering: Option<i32>,
    #[prost(int32, optional, tag = "12")]
    sibling_order_rank: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct ProcessDescriptor {
    #[prost(int32, optional, tag = "1")]
    pid: Option<i32>,
    #[prost(string, optional, tag = "6")]
    process_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct CounterDescriptor {
    #[prost(int32, optional, tag = "3")]
    unit: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
struct TrackEvent {
    #[prost(message, repeated, tag = "4")]
    debug_annotations: Vec<DebugAnnotation>,
    #[prost(int32, optional, tag = "9")]
    r#type: Option<i32>,
    #[prost(uint64, optional, tag = "11")]
    track_uuid: Option<u64>,
    #[prost(string, optional, tag = "23")]
    name: Option<String>,
    #[prost(double, optional, tag = "44")]
    double_counter_value: Option<f64>,
}

#[derive(Clone, PartialEq, Message)]
struct DebugAnnotation {
    #[prost(uint64, optional, tag = "3")]
    uint_value: Option<u64>,
    #[prost(int64, optional, tag = "4")]
    int_value: Option<i64>,
    #[prost(double, optional, tag = "5")]
    double_value: Option<f64>,
    #[prost(string, optional, tag = "6")]
    string_value: Option<String>,
    #[prost(string, optional, tag = "10")]
    name: Option<String>,
}

/// `TrackEvent.Type`.
const SLICE_BEGIN: i32 = 1;
const SLICE_END: i32 = 2;
const INSTANT: i32 = 3;
const COUNTER: i32 = 4;
/// `TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED`.
const SEQ_CLEARED: u32 = 1;
/// `TrackDescriptor.ChildTracksOrdering.EXPLICIT`.
const ORDER_EXPLICIT: i32 = 3;
/// `CounterDescriptor.Unit.UNIT_COUNT`.
const UNIT_COUNT: i32 = 2;
/// The one packet sequence every event is on.
const SEQUENCE: u32 = 1;

const ROOT: u64 = 1;
const REQUESTS: u64 = 2;
const COUNTERS: u64 = 100;
const REQUEST_BASE: u64 = 1 << 32;
const DEVICE_BASE: u64 = 1 << 31;

fn uuid(track: Track) -> u64 {
    match track {
        Track::Load => 10,
        Track::Bench => 11,
        Track::Engine => 12,
        Track::Host => 13,
        Track::Device(i) => DEVICE_BASE + u64::from(i),
        Track::Request(id) => REQUEST_BASE + id,
    }
}

/// Where a track sits under its parent (the UI's top-to-bottom order).
fn rank(track: Track) -> i32 {
    match track {
        Track::Load => 0,
        Track::Bench => 1,
        Track::Engine => 2,
        Track::Host => 3,
        Track::Device(i) => 4 + i32::try_from(i).unwrap_or(i32::MAX - 4),
        Track::Request(id) => i32::try_from(id).unwrap_or(i32::MAX),
    }
}

fn descriptor(uuid: u64, parent: Option<u64>, name: String, rank: i32) -> TracePacket {
    TracePacket {
        trusted_packet_sequence_id: Some(SEQUENCE),
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(uuid),
            name: Some(name),
            parent_uuid: parent,
            child_ordering: Some(ORDER_EXPLICIT),
            sibling_order_rank: Some(rank),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn annotations(args: &[(&'static str, ArgValue)]) -> Vec<DebugAnnotation> {
    args.iter()
        .map(|(k, v)| {
            let mut a = DebugAnnotation {
                name: Some((*k).to_string()),
                ..Default::default()
            };
            match v {
                ArgValue::Uint(x) => a.uint_value = Some(*x),
                ArgValue::Int(x) => a.int_value = Some(*x),
                ArgValue::Float(x) => a.double_value = Some(*x),
                ArgValue::Str(x) => a.string_value = Some(x.clone()),
            }
            a
        })
        .collect()
}

fn event(ts: u64, track: u64, ty: i32) -> (u64, TracePacket) {
    let packet = TracePacket {
        timestamp: Some(ts),
        trusted_packet_sequence_id: Some(SEQUENCE),
        track_event: Some(TrackEvent {
            r#type: Some(ty),
            track_uuid: Some(track),
            ..Default::default()
        }),
        ..Default::default()
    };
    (ts, packet)
}

/// The begin/end events of one track's spans, in time order: sorted by
/// start and depth (a parent before the children it opened with), each
/// span ending before the next one that is not inside it begins.
fn slices(track: u64, spans: &mut [&SpanRecord], out: &mut Vec<(u64, TracePacket)>) {
    spans.sort_by_key(|s| (s.start_ns, s.depth));
    let mut stack: Vec<u64> = Vec::new();
    for s in spans.iter() {
        while let Some(&end) = stack.last() {
            if stack.len() > s.depth as usize || end < s.start_ns {
                out.push(event(end, track, SLICE_END));
                stack.pop();
            } else {
                break;
            }
        }
        let (ts, mut packet) = event(s.start_ns, track, SLICE_BEGIN);
        if let Some(e) = packet.track_event.as_mut() {
            e.name = Some(s.name.to_string());
            e.debug_annotations = annotations(&s.args);
        }
        out.push((ts, packet));
        // A child never outlasts its parent on the page.
        let end = stack.last().map_or(s.end_ns, |&p| s.end_ns.min(p));
        stack.push(end);
    }
    while let Some(end) = stack.pop() {
        out.push(event(end, track, SLICE_END));
    }
}

/// Writes `trace` as a `perfetto.protos.Trace`.
pub(super) fn perfetto(trace: &Trace) -> Vec<u8> {
    let mut head = vec![TracePacket {
        trusted_packet_sequence_id: Some(SEQUENCE),
        sequence_flags: Some(SEQ_CLEARED),
        track_descriptor: Some(TrackDescriptor {
            uuid: Some(ROOT),
            name: Some("hearth".into()),
            process: Some(ProcessDescriptor {
                pid: Some(1),
                process_name: Some("hearth".into()),
            }),
            child_ordering: Some(ORDER_EXPLICIT),
            ..Default::default()
        }),
        ..Default::default()
    }];
    let mut tracks: BTreeMap<Track, Vec<&SpanRecord>> = BTreeMap::new();
    for s in &trace.spans {
        tracks.entry(s.track).or_default().push(s);
    }
    for i in &trace.instants {
        tracks.entry(i.track).or_default();
    }
    if tracks.keys().any(|t| matches!(t, Track::Request(_))) {
        head.push(descriptor(REQUESTS, Some(ROOT), "requests".into(), 5));
    }
    for &track in tracks.keys() {
        let parent = match track {
            Track::Request(_) => REQUESTS,
            _ => ROOT,
        };
        head.push(descriptor(
            uuid(track),
            Some(parent),
            trace.track_name(track),
            rank(track),
        ));
    }
    let mut counters: BTreeMap<&'static str, u64> = BTreeMap::new();
    for c in &trace.counters {
        let next = COUNTERS + counters.len() as u64;
        counters.entry(c.name).or_insert(next);
    }
    for (&name, &id) in &counters {
        let mut d = descriptor(
            id,
            Some(ROOT),
            name.to_string(),
            10 + (id - COUNTERS) as i32,
        );
        if let Some(t) = d.track_descriptor.as_mut() {
            t.counter = Some(CounterDescriptor {
                unit: Some(UNIT_COUNT),
            });
        }
        head.push(d);
    }

    let mut events: Vec<(u64, TracePacket)> = Vec::with_capacity(2 * trace.spans.len());
    for (track, spans) in &mut tracks {
        slices(uuid(*track), spans, &mut events);
    }
    for i in &trace.instants {
        let (ts, mut packet) = event(i.at_ns, uuid(i.track), INSTANT);
        if let Some(e) = packet.track_event.as_mut() {
            e.name = Some(i.name.to_string());
            e.debug_annotations = annotations(&i.args);
        }
        events.push((ts, packet));
    }
    for c in &trace.counters {
        let id = counters.get(c.name).copied().unwrap_or(COUNTERS);
        let (ts, mut packet) = event(c.at_ns, id, COUNTER);
        if let Some(e) = packet.track_event.as_mut() {
            e.double_counter_value = Some(c.value);
        }
        events.push((ts, packet));
    }
    // Stable: events of one track at one time keep their order.
    events.sort_by_key(|(ts, _)| *ts);

    let mut out = Vec::new();
    for packet in head.iter().chain(events.iter().map(|(_, p)| p)) {
        // `Trace { repeated TracePacket packet = 1; }`
        prost::encoding::message::encode(1, packet, &mut out);
    }
    out
}

/// The bench track's events of an encoded trace as `(type, ts, name)`.
#[cfg(test)]
pub(super) fn bench_events(bytes: &[u8]) -> Vec<(i32, u64, String)> {
    #[derive(Clone, PartialEq, Message)]
    struct Decoded {
        #[prost(message, repeated, tag = "1")]
        packet: Vec<TracePacket>,
    }
    let decoded = Decoded::decode(bytes).expect("a trace");
    decoded
        .packet
        .into_iter()
        .filter_map(|p| {
            let e = p.track_event?;
            (e.track_uuid == Some(uuid(Track::Bench))).then(|| {
                (
                    e.r#type.unwrap_or(0),
                    p.timestamp.unwrap_or(0),
                    e.name.unwrap_or_default(),
                )
            })
        })
        .collect()
}
