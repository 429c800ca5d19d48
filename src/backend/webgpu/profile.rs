//! [`Profiler`]: where a step's time goes, with `HEARTH_PROFILE=gpu`.
//!
//! Per step (everything recorded from the first buffer request or dispatch
//! after the previous step, up to the submission that ends it):
//! - host time recording the step (graph ops turned into dispatches),
//! - host time encoding and submitting it (bind groups, passes, submit;
//!   on lavapipe, whose queue submission runs the work, it includes the
//!   execution of the step's earlier pieces),
//! - time from that submission to the readback being ready,
//! - where the device has `TIMESTAMP_QUERY_INSIDE_PASSES`, GPU time per
//!   kernel kind (`matvec_i8.q4_k`, `attention`, `rms_norm`, ...): a
//!   timestamp before the first dispatch of each submission and after
//!   each dispatch, so dispatch `i` is charged `t[i+1] - t[i]` (its run,
//!   its launch and the barrier before it).
//!
//! Steps are grouped by the most token rows any matrix product of the
//! step had (1 for single-sequence decode, 4 for four sequences, 512 for a
//! prompt chunk). Each step prints one line; the table of every group
//! prints when the backend drops ([`Profiler::report`]).
//!
//! `HEARTH_PROFILE=gpu-host` does the same without timestamps.
//!
//! Off (no `HEARTH_PROFILE=gpu`, and always on wasm32, where `Instant`
//! does not exist) the backend holds no profiler and does none of this.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Timestamps per query set (wgpu's limit).
const SET_QUERIES: u32 = wgpu::QUERY_SET_MAX_QUERIES;

/// The timestamp features profiling asks the device for.
pub fn timestamp_features() -> wgpu::Features {
    wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
}

/// The step being recorded.
#[derive(Debug, Default)]
struct Step {
    start: Option<Instant>,
    /// Host time inside flushes (encoding and submitting).
    encode: Duration,
    rows: u64,
    dispatches: u64,
}

/// Totals of one group of steps.
#[derive(Debug, Default)]
struct Group {
    steps: u64,
    dispatches: u64,
    record: Duration,
    encode: Duration,
    /// Submission to readback ready, over `waited` steps.
    wait: Duration,
    waited: u64,
    /// GPU nanoseconds and calls per kernel kind.
    kinds: BTreeMap<String, (u64, f64)>,
}

/// Timestamps of one submission, mapping.
#[derive(Debug)]
struct Pending {
    buf: wgpu::Buffer,
    /// Per dispatch, its kind.
    kinds: Vec<Arc<str>>,
    rows: u64,
    mapped: Arc<AtomicBool>,
    /// When it was submitted, on the trace's clock (tracing only).
    submitted: Option<f64>,
}

/// Timestamps written into one submission (see [`Profiler::begin`]).
#[derive(Debug)]
pub struct Stamps<'a> {
    sets: &'a [wgpu::QuerySet],
    /// Timestamps written so far.
    pub next: u32,
}

impl Stamps<'_> {
    /// Writes the next timestamp inside `pass`.
    pub fn write(&mut self, pass: &mut wgpu::ComputePass<'_>) {
        let (set, at) = ((self.next / SET_QUERIES) as usize, self.next % SET_QUERIES);
        if let Some(s) = self.sets.get(set) {
            pass.write_timestamp(s, at);
            self.next += 1;
        }
    }
}

/// Step timings and GPU timestamps, aggregated until [`Profiler::report`].
#[derive(Debug)]
pub struct Profiler {
    /// Query sets, `SET_QUERIES` timestamps each (none: no timestamps).
    sets: Vec<wgpu::QuerySet>,
    timestamps: bool,
    resolve: Option<wgpu::Buffer>,
    period_ns: f64,
    kinds: HashMap<wgpu::ComputePipeline, Arc<str>>,
    step: Step,
    pending: Vec<Pending>,
    free: Vec<wgpu::Buffer>,
    groups: BTreeMap<u64, Group>,
    /// Whether the last pending timestamps still need mapping.
    to_map: bool,
    /// Rows and dispatches of the last ended step, host time, submit time.
    ended: Option<(u64, u64, Duration, Duration, Instant)>,
    /// Print nothing (timestamps for the trace alone).
    quiet: bool,
    /// Where the last kernel put in the trace ended (trace seconds).
    traced_to: f64,
    /// The trace's track of this device's kernels (`None`: not traced).
    track: Option<crate::trace::Track>,
}

impl Profiler {
    /// A profiler; `timestamps` when the device was created with
    /// [`timestamp_features`]; `quiet` prints nothing (the timestamps go
    /// to the trace alone).
    pub fn new(queue: &wgpu::Queue, timestamps: bool, quiet: bool) -> Self {
        Self {
            sets: Vec::new(),
            timestamps,
            resolve: None,
            period_ns: f64::from(queue.get_timestamp_period()),
            kinds: HashMap::new(),
            step: Step::default(),
            pending: Vec::new(),
            free: Vec::new(),
            groups: BTreeMap::new(),
            to_map: false,
            ended: None,
            quiet,
            traced_to: 0.0,
            track: None,
        }
    }

    /// Puts the kernels' timestamps on `track` of the trace.
    pub fn set_track(&mut self, track: crate::trace::Track) {
        self.track = Some(track);
    }

    /// Whether it prints nothing.
    pub fn quiet(&self) -> bool {
        self.quiet
    }

    /// Waits for the device and takes in every timestamp (into the trace
    /// when tracing).
    pub fn flush(&mut self, device: &wgpu::Device) {
        let _ = device.poll(wgpu::PollType::wait_indefinitely());
        self.collect(true);
    }

    /// Notes activity of the step being recorded (its start, if first).
    pub fn touch(&mut self) {
        if self.step.start.is_none() {
            self.step.start = Some(Instant::now());
        }
    }

    /// Notes a matrix product of `rows` token rows in the step.
    pub fn note_rows(&mut self, rows: u64) {
        self.touch();
        self.step.rows = self.step.rows.max(rows);
    }

    /// Names `pipeline`'s kind (`matvec_i8.q4_k`) for the table.
    pub fn name_kind(&mut self, pipeline: &wgpu::ComputePipeline, kind: &str) {
        if !self.kinds.contains_key(pipeline) {
            self.kinds.insert(pipeline.clone(), Arc::from(kind));
        }
    }

    /// Timestamps for a submission of `dispatches` dispatches (one before
    /// the first, one after each), or `None` without the feature.
    pub fn begin(&mut self, device: &wgpu::Device, dispatches: usize) -> Option<Stamps<'_>> {
        self.collect(false);
        if !self.timestamps || dispatches == 0 {
            return None;
        }
        let need = (dispatches as u32 + 1).div_ceil(SET_QUERIES) as usize;
        while self.sets.len() < need {
            self.sets
                .push(device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: SET_QUERIES,
                }));
        }
        Some(Stamps {
            sets: &self.sets,
            next: 0,
        })
    }

    /// After the passes of a submission that wrote `count` timestamps for
    /// `pipelines` (in dispatch order): resolves them into a mappable
    /// buffer, to be mapped by [`Profiler::submitted`].
    pub fn resolve(
        &mut self,
        device: &wgpu::Device,
        enc: &mut wgpu::CommandEncoder,
        count: u32,
        pipelines: &[&wgpu::ComputePipeline],
    ) {
        if count == 0 {
            return;
        }
        let bytes = u64::from(count) * 8;
        let set_bytes = u64::from(SET_QUERIES) * 8;
        let cap = self.sets.len() as u64 * set_bytes;
        let resolve = match &self.resolve {
            Some(b) if b.size() >= cap => b.clone(),
            _ => {
                let b = device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("profile resolve"),
                    size: cap,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                self.resolve = Some(b.clone());
                b
            }
        };
        for (j, set) in self.sets.iter().enumerate() {
            let first = j as u32 * SET_QUERIES;
            if first >= count {
                break;
            }
            let n = (count - first).min(SET_QUERIES);
            enc.resolve_query_set(set, 0..n, &resolve, j as u64 * set_bytes);
        }
        let buf = match self.free.iter().position(|b| b.size() >= bytes) {
            Some(i) => self.free.swap_remove(i),
            None => device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("profile readback"),
                size: bytes.next_power_of_two(),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        enc.copy_buffer_to_buffer(&resolve, 0, &buf, 0, bytes);
        let unknown: Arc<str> = Arc::from("?");
        let kinds = pipelines
            .iter()
            .map(|p| {
                self.kinds
                    .get(*p)
                    .cloned()
                    .unwrap_or_else(|| unknown.clone())
            })
            .collect();
        self.pending.push(Pending {
            buf,
            kinds,
            rows: self.step.rows,
            mapped: Arc::new(AtomicBool::new(false)),
            submitted: None,
        });
        self.to_map = true;
    }

    /// After a submission: maps its timestamps (if any), and adds the
    /// flush's host time and dispatches to the step.
    pub fn submitted(&mut self, flush: Duration, dispatches: u64) {
        self.step.encode += flush;
        self.step.dispatches += dispatches;
        if !std::mem::take(&mut self.to_map) {
            return;
        }
        if let Some(p) = self.pending.last_mut() {
            p.submitted = crate::trace::now();
            let flag = p.mapped.clone();
            let size = (p.kinds.len() as u64 + 1) * 8;
            p.buf.map_async(wgpu::MapMode::Read, 0..size, move |r| {
                flag.store(r.is_ok(), Ordering::Release);
            });
        }
    }

    /// Ends the step after its last submission; [`Profiler::finish`]
    /// adds the wait once the readback is ready.
    pub fn end_step(&mut self) {
        let now = Instant::now();
        let s = std::mem::take(&mut self.step);
        let host = s.start.map_or(Duration::ZERO, |t| now - t);
        let g = self.groups.entry(s.rows).or_default();
        g.steps += 1;
        g.dispatches += s.dispatches;
        g.encode += s.encode;
        g.record += host.saturating_sub(s.encode);
        self.ended = Some((s.rows, s.dispatches, host, s.encode, now));
    }

    /// The readback of the last ended step is ready (`waited`: whether
    /// there was one); prints the step's line.
    pub fn finish(&mut self, waited: bool, counts: &str) {
        let Some((rows, dispatches, host, encode, at)) = self.ended.take() else {
            return;
        };
        if self.quiet {
            return;
        }
        let wait = at.elapsed();
        let g = self.groups.entry(rows).or_default();
        if waited {
            g.wait += wait;
            g.waited += 1;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "gpu step ({rows} rows, {dispatches} dispatches): host record {:.3} ms + encode {:.3} ms, submit to ready {}; {counts}",
            ms(host.saturating_sub(encode)),
            ms(encode),
            if waited {
                format!("{:.3} ms", ms(wait))
            } else {
                "(no readback)".into()
            }
        );
    }

    /// Adds the timestamps whose buffers are mapped (all of them, after
    /// waiting for the device, when `wait`).
    fn collect(&mut self, wait: bool) {
        let mut keep = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            if !wait && !p.mapped.load(Ordering::Acquire) {
                keep.push(p);
                continue;
            }
            let n = p.kinds.len() + 1;
            if p.mapped.load(Ordering::Acquire) {
                if let Ok(view) = p.buf.get_mapped_range(0..n as u64 * 8) {
                    let ticks: &[u64] = bytemuck::cast_slice(&view);
                    if let (Some(at), Some(track)) = (p.submitted, self.track) {
                        let from = at.max(self.traced_to);
                        self.traced_to =
                            trace_kernels(track, &p.kinds, ticks, self.period_ns, from);
                    }
                    let g = self.groups.entry(p.rows).or_default();
                    for (i, kind) in p.kinds.iter().enumerate() {
                        let dt = ticks[i + 1].saturating_sub(ticks[i]) as f64 * self.period_ns;
                        let e = g.kinds.entry(kind.to_string()).or_default();
                        e.0 += 1;
                        e.1 += dt;
                    }
                }
                p.buf.unmap();
                self.free.push(p.buf);
            }
        }
        self.pending = keep;
    }

    /// The table of every group of steps so far (after waiting for the
    /// device to finish, so that every timestamp is in).
    pub fn report(&mut self, device: &wgpu::Device, adapter: &str) -> String {
        let _ = device.poll(wgpu::PollType::wait_indefinitely());
        self.collect(true);
        let mut s = format!(
            "gpu profile on {adapter}: per step, mean over the steps of each group{}\n",
            if self.timestamps {
                ""
            } else {
                " (no TIMESTAMP_QUERY_INSIDE_PASSES: no GPU times)"
            }
        );
        for (rows, g) in &self.groups {
            write_group(&mut s, *rows, g);
        }
        s
    }
}

/// One group's lines of the table.
fn write_group(s: &mut String, rows: u64, g: &Group) {
    let n = g.steps.max(1) as f64;
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / n;
    let gpu_ns: f64 = g.kinds.values().map(|k| k.1).sum();
    let wait = g.wait.as_secs_f64() * 1e3 / g.waited.max(1) as f64;
    let gpu = if g.kinds.is_empty() {
        "n/a".to_string()
    } else {
        format!("{:.3} ms", gpu_ns / n / 1e6)
    };
    let _ = writeln!(
        s,
        "steps of {rows} rows: {} steps, {:.1} dispatches; host record {:.3} ms, encode+submit {:.3} ms, submit to ready {wait:.3} ms, GPU (timestamps) {gpu}",
        g.steps,
        g.dispatches as f64 / n,
        ms(g.record),
        ms(g.encode),
    );
    if g.kinds.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "  {:<28} {:>10} {:>10} {:>10} {:>6}",
        "kernel", "calls/step", "us/step", "us/call", "share"
    );
    let mut kinds: Vec<_> = g.kinds.iter().collect();
    kinds.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    for (kind, &(calls, ns)) in kinds {
        let _ = writeln!(
            s,
            "  {:<28} {:>10.1} {:>10.1} {:>10.2} {:>5.1}%",
            kind,
            calls as f64 / n,
            ns / n / 1e3,
            ns / calls.max(1) as f64 / 1e3,
            100.0 * ns / gpu_ns.max(1.0),
        );
    }
}

/// Puts one submission's kernels on the trace's device track, the first
/// starting at `from` (trace seconds: the submission, or the end of the
/// one before if that ran later) and each lasting what its timestamps
/// say. Returns where the last one ended.
fn trace_kernels(
    track: crate::trace::Track,
    kinds: &[Arc<str>],
    ticks: &[u64],
    period_ns: f64,
    from: f64,
) -> f64 {
    let Some(&first) = ticks.first() else {
        return from;
    };
    let at = |t: u64| from + t.saturating_sub(first) as f64 * period_ns * 1e-9;
    let mut end = from;
    for (i, kind) in kinds.iter().enumerate() {
        let (Some(&t0), Some(&t1)) = (ticks.get(i), ticks.get(i + 1)) else {
            break;
        };
        end = at(t1.max(t0));
        crate::trace::complete(track, kind.to_string(), at(t0), end, Vec::new());
    }
    end
}
