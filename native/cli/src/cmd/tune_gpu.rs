//! The WebGPU backend's probe: how many dispatches go into each submitted
//! piece of a decode step (`webgpu.submit_every`; prompt steps keep the
//! default, which a decode-only probe says nothing about: on lavapipe an
//! interval that tied in decode cost prefill 3%).
//!
//! A step is submitted in pieces so the GPU starts on the first layers
//! while the host records the rest; how big a piece should be depends on
//! the adapter and its driver (on a discrete GPU a submission costs tens
//! of microseconds; on lavapipe submitting runs the work). The probe runs
//! [`STEPS`] decode steps of the loaded model with each candidate interval,
//! checks each candidate's logits against the default's, and keeps the
//! fastest by the rules of [`Probe`] (a lead under 3% is a tie, and the
//! default stays). It runs before the engine starts, in K/V block 1 at
//! positions the first request's prefill overwrites.

use std::time::Instant;

use hearth::backend::webgpu::{GpuContext, WebGpuBackend, DEFAULT_SUBMIT_EVERY};
use hearth::kv::{BlockId, Slot};
use hearth::model::{AnyModel, Batch, ForwardModel, LogitsWanted, Model, SeqInput};
use hearth::tune::{build_id, Candidate, Probe, Record, Stored, TuneKey};

use super::tune::{FileStore, InstantClock, TuneArgs};

/// The probe's name in the store.
pub const PROBE: &str = "webgpu.submit_every";
/// Dispatches per submitted piece tried (0: the whole step at once).
pub const CANDIDATES: [usize; 5] = [0, 28, 56, 112, 224];
/// Decode steps one run of a candidate times.
pub const STEPS: usize = 1;
/// Timed rounds.
pub const ROUNDS: usize = 3;
/// Bumped when the WebGPU kernels or the way steps are recorded change in
/// a way that can change the winner.
const REVISION: &str = "webgpu-steps-1";

/// The build id of what this probe measured.
pub fn kernels_build() -> String {
    build_id(&[env!("CARGO_PKG_VERSION"), REVISION])
}

/// The store key of the adapter `ctx` runs on: its name, API and the
/// limits and features the kernels are chosen from.
pub fn key(ctx: &GpuContext) -> TuneKey {
    let c = &ctx.caps;
    TuneKey {
        backend: "webgpu".to_string(),
        device: c.adapter_name.clone(),
        geometry: format!(
            "{} cpu={} f16={} sg={}-{} buf={} bind={} wgmem={} wginv={}",
            c.api,
            c.is_cpu,
            c.f16,
            c.subgroup_min_size,
            c.subgroup_max_size,
            c.max_buffer,
            c.max_storage_binding,
            c.max_workgroup_storage,
            c.max_workgroup_invocations
        ),
        build: kernels_build(),
    }
}

/// The shape the interval depends on: the model's architecture, blocks
/// and width (a step's dispatches and their sizes).
fn shape(model: &Model<WebGpuBackend>) -> String {
    let c = model.config();
    format!("{} {}x{}", c.arch, c.n_layer, c.n_embd)
}

/// Whether `HEARTH_GPU_SUBMIT_EVERY` fixes the interval.
fn forced() -> bool {
    std::env::var("HEARTH_GPU_SUBMIT_EVERY").is_ok_and(|v| !v.trim().is_empty())
}

/// `STEPS` decode steps in K/V block 1, from position 0; the last step's
/// logits.
fn decode(model: &mut Model<WebGpuBackend>) -> Result<Vec<f32>, String> {
    let table = [BlockId(1)];
    let mut logits = Vec::new();
    for pos in 0..STEPS {
        let slots = [Slot {
            block: BlockId(1),
            offset: pos as u32,
        }];
        let tokens = [(pos as u32 * 7919 + 11) % model.config().n_vocab.max(1) as u32];
        let seqs = [SeqInput {
            tokens: &tokens,
            start: pos,
            slots: &slots,
            block_table: &table,
            logits: LogitsWanted::Last,
        }];
        logits =
            pollster::block_on(model.forward(&Batch { seqs: &seqs })).map_err(|e| e.to_string())?;
    }
    Ok(logits)
}

/// Times every candidate interval on `model` and returns the record.
pub fn probe(
    model: &mut Model<WebGpuBackend>,
    key: &TuneKey,
    clock: &InstantClock,
) -> Result<Record, String> {
    let shape = shape(model);
    model.backend_mut().set_decode_submit_every(None);
    let reference = decode(model)?;
    let cell = std::cell::RefCell::new(model);
    let mut candidates: Vec<Candidate<'_>> = CANDIDATES
        .iter()
        .map(|&n| {
            let cell = &cell;
            Candidate::new(n.to_string(), move || {
                let mut m = cell.borrow_mut();
                m.backend_mut().set_decode_submit_every(Some(n));
                decode(&mut m)
            })
        })
        .collect();
    let probe = Probe {
        rounds: ROUNDS,
        // The same kernels in another order of submission: equal bits.
        tolerance: 1e-9,
        ..Probe::new(PROBE, shape, DEFAULT_SUBMIT_EVERY.to_string())
    };
    let record = probe
        .run(key, &mut candidates, &reference, clock)
        .map_err(|e| e.to_string());
    drop(candidates);
    let model = cell.into_inner();
    model.backend_mut().set_decode_submit_every(None);
    record
}

/// The interval for `model` when it runs on WebGPU: the stored winner,
/// else the winner of a probe now (stored for the next load); returns the
/// line to show (`tune: probed ...`, `tune: from store ...`). Nothing
/// when tuning is off, `HEARTH_GPU_SUBMIT_EVERY` is set or the model is
/// on another backend. Problems are warnings on stderr, never errors.
pub fn submit_every(args: &TuneArgs, model: &mut AnyModel) -> Option<String> {
    let path = args.path()?;
    if forced() {
        return None;
    }
    let model = model.downcast_mut::<WebGpuBackend>()?;
    let key = key(model.backend().context());
    let shape = shape(model);
    let file = FileStore::new(path);
    let mut store = file.open();
    let names: Vec<String> = CANDIDATES.iter().map(usize::to_string).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let default = DEFAULT_SUBMIT_EVERY.to_string();
    match store.choose(&key, PROBE, &shape, &names, &default) {
        Stored::Winner(w) => {
            let n = w.parse().unwrap_or(DEFAULT_SUBMIT_EVERY);
            model.backend_mut().set_decode_submit_every(Some(n));
            Some(format!("tune: from store ({PROBE} {n})"))
        }
        Stored::Fallback { message, .. } => {
            eprintln!("hearth: {message}");
            None
        }
        Stored::Missing => {
            let clock = InstantClock(Instant::now());
            match probe(model, &key, &clock) {
                Ok(record) => {
                    let n = record.winner.parse().unwrap_or(DEFAULT_SUBMIT_EVERY);
                    model.backend_mut().set_decode_submit_every(Some(n));
                    let line = format!(
                        "tune: probed {PROBE} on {} in {:.0} ms: {} ({})",
                        record.shape,
                        clock.elapsed_ms(),
                        record.winner,
                        record.why
                    );
                    store.insert(record);
                    if let Err(e) = store.save(&file) {
                        eprintln!("hearth: {e}");
                    }
                    Some(line)
                }
                Err(e) => {
                    eprintln!("hearth: tune probe {PROBE}: {e}; the default ({DEFAULT_SUBMIT_EVERY}) is used");
                    None
                }
            }
        }
    }
}

/// Runs the probe on `model` for `hearth tune` (no store read).
pub fn probe_for_tune(model: &mut AnyModel) -> anyhow::Result<Option<Record>> {
    let Some(model) = model.downcast_mut::<WebGpuBackend>() else {
        return Ok(None);
    };
    let key = key(model.backend().context());
    let clock = InstantClock(Instant::now());
    probe(model, &key, &clock)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("tune probe {PROBE}: {e}"))
}
