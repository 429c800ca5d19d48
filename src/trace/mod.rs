//! Where the time goes, as a [Perfetto](https://perfetto.dev) trace.
//!
//! One recorder per process, off until [`start`]: while it is off every
//! call here is one relaxed atomic load and nothing else, so the
//! instrumentation stays in the hot paths of release builds. While it is
//! on, spans are kept in memory and [`stop`] hands them back as a
//! [`Trace`], which [`Trace::to_perfetto`] writes in Perfetto's protobuf
//! format (open it at <https://ui.perfetto.dev> or with
//! `trace_processor`). The core writes no file: the CLI saves the bytes
//! (`--trace FILE.pftrace`), the browser build hands them to the page.
//!
//! What is traced, one track each (see [`Track`]):
//! - **load**: reading the GGUF, repacking and uploading each tensor, and
//!   the tune probes;
//! - **engine**: every scheduler step (schedule: admission and K/V
//!   reserve; model; sample; update), with counters of running requests
//!   and K/V blocks in use;
//! - **requests**: one child track per request, its phases (queued,
//!   prefill, decode) and its finish;
//! - **host**: each forward pass and each op the host records into it
//!   (on the CPU backend, its execution);
//! - **device**: each kernel as the GPU timed it (timestamp queries on
//!   WebGPU), placed on the host's clock;
//! - **bench**: `hearth bench`'s tests and repetitions.
//!
//! Time comes from the [`Clock`] given to [`start`] (the core has no
//! system clock of its own in browsers). Spans on one track nest: a
//! [`Span`] guard records its depth when it opens, so the writer can emit
//! begin/end pairs in an order Perfetto accepts.

mod encode;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::engine::Clock;

/// At most this many events are kept; later ones are counted, not kept,
/// so a long trace cannot exhaust memory (about 100 bytes an event).
pub const MAX_EVENTS: usize = 8 << 20;

/// A timeline in the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Track {
    /// Loading: read, repack, upload, probes.
    Load,
    /// Scheduler steps of the engine.
    Engine,
    /// One request's life, as a child of the `requests` track.
    Request(u64),
    /// Forward passes and the ops the host records.
    Host,
    /// Kernels as device `i` timed them (one track per backend that
    /// times its kernels: [`device_track`]).
    Device(u32),
    /// `hearth bench`'s tests.
    Bench,
}

impl Track {
    /// The track's default name.
    fn default_name(self) -> String {
        match self {
            Track::Load => "load".into(),
            Track::Engine => "engine".into(),
            Track::Request(id) => format!("request {id}"),
            Track::Host => "host".into(),
            Track::Device(i) => format!("device {i}"),
            Track::Bench => "bench".into(),
        }
    }
}

/// A value attached to a span ("debug annotation" in Perfetto).
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    /// An unsigned integer.
    Uint(u64),
    /// A signed integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
}

impl From<u64> for ArgValue {
    fn from(v: u64) -> Self {
        ArgValue::Uint(v)
    }
}

impl From<usize> for ArgValue {
    fn from(v: usize) -> Self {
        ArgValue::Uint(v as u64)
    }
}

impl From<u32> for ArgValue {
    fn from(v: u32) -> Self {
        ArgValue::Uint(u64::from(v))
    }
}

impl From<i64> for ArgValue {
    fn from(v: i64) -> Self {
        ArgValue::Int(v)
    }
}

impl From<f64> for ArgValue {
    fn from(v: f64) -> Self {
        ArgValue::Float(v)
    }
}

impl From<&str> for ArgValue {
    fn from(v: &str) -> Self {
        ArgValue::Str(v.to_string())
    }
}

impl From<String> for ArgValue {
    fn from(v: String) -> Self {
        ArgValue::Str(v)
    }
}

/// One recorded slice: `name` on `track` from `start_ns` to `end_ns`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRecord {
    /// Where it ran.
    pub track: Track,
    /// What it was.
    pub name: Cow<'static, str>,
    /// Start, nanoseconds since [`start`].
    pub start_ns: u64,
    /// End, nanoseconds since [`start`] (at least `start_ns`).
    pub end_ns: u64,
    /// Spans open on the track when this one opened (0: outermost).
    pub depth: u32,
    /// Its annotations.
    pub args: Vec<(&'static str, ArgValue)>,
}

/// One point of a counter track.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterRecord {
    /// The counter's name (its track).
    pub name: &'static str,
    /// When, nanoseconds since [`start`].
    pub at_ns: u64,
    /// Its value from then on.
    pub value: f64,
}

/// One instant: `name` on `track` at `at_ns`.
#[derive(Debug, Clone, PartialEq)]
pub struct InstantRecord {
    /// Where.
    pub track: Track,
    /// What.
    pub name: Cow<'static, str>,
    /// When, nanoseconds since [`start`].
    pub at_ns: u64,
    /// Its annotations.
    pub args: Vec<(&'static str, ArgValue)>,
}

/// What a recording holds, from [`stop`].
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Trace {
    /// Names given to tracks with [`name_track`] (the others keep their
    /// default names).
    pub track_names: BTreeMap<Track, String>,
    /// Slices, in the order they closed.
    pub spans: Vec<SpanRecord>,
    /// Instants, in order.
    pub instants: Vec<InstantRecord>,
    /// Counter points, in order.
    pub counters: Vec<CounterRecord>,
    /// Events not kept because the recording held [`MAX_EVENTS`].
    pub dropped: u64,
}

impl Trace {
    /// The trace in Perfetto's protobuf format (`perfetto.protos.Trace`).
    pub fn to_perfetto(&self) -> Vec<u8> {
        encode::perfetto(self)
    }

    /// A track's name in the written trace.
    pub fn track_name(&self, track: Track) -> String {
        self.track_names
            .get(&track)
            .cloned()
            .unwrap_or_else(|| track.default_name())
    }

    fn events(&self) -> usize {
        self.spans.len() + self.instants.len() + self.counters.len()
    }
}

struct Recorder {
    /// Which recording this is (a span opened in another is not kept).
    generation: u64,
    clock: Clock,
    origin: f64,
    trace: Trace,
    /// Open guard spans per track.
    open: BTreeMap<Track, u32>,
}

impl Recorder {
    fn now_ns(&self) -> u64 {
        secs_to_ns(self.clock.now() - self.origin)
    }

    fn has_room(&mut self) -> bool {
        if self.trace.events() < MAX_EVENTS {
            true
        } else {
            self.trace.dropped += 1;
            false
        }
    }
}

fn secs_to_ns(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1e9).round() as u64
    } else {
        0
    }
}

static ON: AtomicBool = AtomicBool::new(false);
static DEVICES: AtomicU32 = AtomicU32::new(0);
static GENERATION: AtomicU64 = AtomicU64::new(0);
static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);

/// Runs `f` on the recorder, if one is recording.
fn with<R>(f: impl FnOnce(&mut Recorder) -> R) -> Option<R> {
    if !on() {
        return None;
    }
    let mut guard = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_mut().map(f)
}

/// Starts recording, timed by `clock` (a recording in progress is
/// dropped). Natively pass `Clock::system()`; in the browser a clock
/// reading `performance.now()`.
pub fn start(clock: Clock) {
    let origin = clock.now();
    let mut guard = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    *guard = Some(Recorder {
        generation: GENERATION.fetch_add(1, Ordering::Relaxed) + 1,
        clock,
        origin,
        trace: Trace::default(),
        open: BTreeMap::new(),
    });
    ON.store(true, Ordering::Release);
}

/// Stops recording and returns what was recorded (`None`: nothing was).
/// Spans still open are not in it.
pub fn stop() -> Option<Trace> {
    ON.store(false, Ordering::Release);
    let mut guard = RECORDER.lock().unwrap_or_else(|e| e.into_inner());
    guard.take().map(|r| r.trace)
}

/// Whether a recording is in progress.
#[inline]
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Seconds on the recording's clock since [`start`] (`None`: off). Pass
/// them back to [`complete`] for spans timed elsewhere.
pub fn now() -> Option<f64> {
    with(|r| r.clock.now() - r.origin)
}

/// A device track of its own for a backend that times its kernels (the
/// shards of a tensor-parallel model each get one), named `name`.
pub fn device_track(name: &str) -> Track {
    let i = DEVICES.fetch_add(1, Ordering::Relaxed);
    name_track(Track::Device(i), format!("device {i}: {name}"));
    Track::Device(i)
}

/// Names `track` in the trace (e.g. the device track after the adapter).
pub fn name_track(track: Track, name: impl Into<String>) {
    let name = name.into();
    with(|r| r.trace.track_names.insert(track, name));
}

/// Opens a span on `track`, closed when the guard drops. Off, this costs
/// one atomic load and `name` is never looked at.
#[inline]
pub fn span(track: Track, name: impl Into<Cow<'static, str>>) -> Span {
    if !on() {
        return Span(None);
    }
    span_slow(track, name.into())
}

#[cold]
fn span_slow(track: Track, name: Cow<'static, str>) -> Span {
    let open = with(|r| {
        let depth = r.open.entry(track).or_insert(0);
        let d = *depth;
        *depth += 1;
        (r.now_ns(), d, r.generation)
    });
    Span(open.map(|(start_ns, depth, generation)| {
        Box::new(OpenSpan {
            generation,
            track,
            name,
            start_ns,
            depth,
            args: Vec::new(),
        })
    }))
}

/// Records a span timed elsewhere: `start` and `end` are seconds since
/// [`start`] (see [`now`]), e.g. device timestamps placed on the host's
/// clock. Such spans must not overlap others on their track.
pub fn complete(
    track: Track,
    name: impl Into<Cow<'static, str>>,
    start: f64,
    end: f64,
    args: Vec<(&'static str, ArgValue)>,
) {
    if !on() {
        return;
    }
    let name = name.into();
    with(|r| {
        if r.has_room() {
            let start_ns = secs_to_ns(start);
            let depth = r.open.get(&track).copied().unwrap_or(0);
            r.trace.spans.push(SpanRecord {
                track,
                name,
                start_ns,
                end_ns: secs_to_ns(end).max(start_ns),
                depth,
                args,
            });
        }
    });
}

/// Records an instant on `track` now.
pub fn instant(
    track: Track,
    name: impl Into<Cow<'static, str>>,
    args: Vec<(&'static str, ArgValue)>,
) {
    if !on() {
        return;
    }
    let name = name.into();
    with(|r| {
        if r.has_room() {
            let at_ns = r.now_ns();
            r.trace.instants.push(InstantRecord {
                track,
                name,
                at_ns,
                args,
            });
        }
    });
}

/// Sets counter `name` to `value` now (its own track in the trace).
pub fn counter(name: &'static str, value: f64) {
    if !on() {
        return;
    }
    with(|r| {
        if r.has_room() {
            let at_ns = r.now_ns();
            r.trace.counters.push(CounterRecord { name, at_ns, value });
        }
    });
}

struct OpenSpan {
    generation: u64,
    track: Track,
    name: Cow<'static, str>,
    start_ns: u64,
    depth: u32,
    args: Vec<(&'static str, ArgValue)>,
}

/// An open span from [`span`]; it closes when dropped.
#[must_use = "a span closes when dropped: bind it (`let _s = trace::span(..)`)"]
pub struct Span(Option<Box<OpenSpan>>);

impl Span {
    /// Attaches `key = value` to the span.
    pub fn arg(mut self, key: &'static str, value: impl Into<ArgValue>) -> Self {
        self.set(key, value);
        self
    }

    /// Attaches `key = value` to the span, in place.
    pub fn set(&mut self, key: &'static str, value: impl Into<ArgValue>) {
        if let Some(open) = self.0.as_mut() {
            open.args.push((key, value.into()));
        }
    }

    /// Whether this span is being recorded.
    pub fn is_recording(&self) -> bool {
        self.0.is_some()
    }
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(s) => write!(f, "Span({:?} {})", s.track, s.name),
            None => f.write_str("Span(off)"),
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let Some(open) = self.0.take() else { return };
        let OpenSpan {
            generation,
            track,
            name,
            start_ns,
            depth,
            args,
        } = *open;
        // A recording stopped (or restarted) while the span was open
        // ends it here: `with` finds no recorder, or another one.
        with(|r| {
            if r.generation != generation {
                return;
            }
            let known = r.open.get_mut(&track).filter(|d| **d > 0);
            let Some(d) = known else { return };
            *d -= 1;
            if r.has_room() {
                let end_ns = r.now_ns().max(start_ns);
                r.trace.spans.push(SpanRecord {
                    track,
                    name,
                    start_ns,
                    end_ns,
                    depth,
                    args,
                });
            }
        });
    }
}

#[cfg(test)]
mod tests;
