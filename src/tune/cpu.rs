//! The CPU backend's probe: which kernel tier (`avx2`, `avx512`, ...) runs
//! a model's matrix products fastest on this CPU.
//!
//! Hearth picks the widest tier a CPU has ([`Isa::best`]); on some CPUs a
//! narrower one is as fast or faster (AVX-512 run as two 256-bit halves,
//! clocks that drop under wide vectors). The probe multiplies synthetic
//! weights of the model's formats and shapes by one token (decode) and by
//! [`PROMPT_TOKENS`] tokens (a prompt chunk) on every tier but scalar,
//! checks each tier's products against `quant::reference` first, and
//! keeps the fastest by the rules of [`Probe`] (a lead under 3% over the
//! widest tier is a tie, and the widest tier stays).
//!
//! Work is bounded: at most [`MAX_SHAPES`] shapes, each weight cut to
//! [`MAX_WEIGHT_BYTES`] (repeating [`DISTINCT_ROWS`] quantized rows), so a
//! optimized build probes a model of four shapes in about 0.1 s (measured
//! on two shared cores: 107 ms for SmolLM2-135M, 142 ms for Gemma 3 270M).

use super::{build_id, Candidate, Clock, Probe, Record, Stored, TuneError, TuneKey, TuneStore};
use crate::backend::cpu::kernels::{Isa, KernelTable};
use crate::backend::cpu::matmul::{matmul, Weight};
use crate::backend::cpu::threads::Threads;
use crate::gguf::TensorInfo;
use crate::model::synth::rng::splitmix64;
use crate::quant::{reference, GgmlType};

/// The probe's name in the store.
pub const PROBE: &str = "cpu.isa";
/// Shapes measured at most (the ones with the most bytes in the model).
pub const MAX_SHAPES: usize = 4;
/// Bytes of one synthetic weight at most: larger than most cores' L2, so
/// reads come from the last-level cache or memory as in decode.
pub const MAX_WEIGHT_BYTES: usize = 4 << 20;
/// Distinct rows of a synthetic weight (the others repeat them).
pub const DISTINCT_ROWS: usize = 16;
/// Tokens of the prompt-chunk product.
pub const PROMPT_TOKENS: usize = 16;
/// Timed rounds (each tier runs every shape once a round).
pub const ROUNDS: usize = 5;
/// Bumped when the CPU kernels change between releases in a way that can
/// change the winner, so stores of the old kernels are ignored.
const KERNELS_REVISION: &str = "cpu-kernels-1";

/// The build id of this build's CPU kernels: the crate's version, the
/// target architecture and a revision of the CPU kernels bumped when
/// they change between releases.
pub fn kernels_build() -> String {
    build_id(&[
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        KERNELS_REVISION,
    ])
}

/// One weight matrix shape: its format, row length and row count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct WeightShape {
    /// The weight's format.
    pub ty: GgmlType,
    /// Elements per row (`ne[0]`, the product's inner dimension).
    pub cols: usize,
    /// Rows (outputs).
    pub rows: usize,
}

/// The weight shapes of `tensors` the probe measures: distinct 2-D
/// matrices the CPU kernels run, the [`MAX_SHAPES`] with the most bytes in
/// the model, in a stable order.
pub fn model_shapes(tensors: &[TensorInfo]) -> Vec<WeightShape> {
    let table = KernelTable::scalar();
    let mut bytes: Vec<(WeightShape, u64)> = Vec::new();
    for t in tensors {
        let (&[cols, rows], true) = (t.shape.as_slice(), table.supports(t.ty)) else {
            continue;
        };
        if rows < 2 || !(cols as usize).is_multiple_of(t.ty.block_elems()) {
            continue;
        }
        let s = WeightShape {
            ty: t.ty,
            cols: cols as usize,
            rows: rows as usize,
        };
        match bytes.iter_mut().find(|(x, _)| *x == s) {
            Some((_, b)) => *b += t.size,
            None => bytes.push((s, t.size)),
        }
    }
    bytes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut shapes: Vec<WeightShape> = bytes.into_iter().take(MAX_SHAPES).map(|x| x.0).collect();
    shapes.sort();
    shapes
}

/// The store's shape key of `shapes`: `Q4_K 4096x4096, Q6_K 4096x32000`
/// (row length by rows).
pub fn shape_key(shapes: &[WeightShape]) -> String {
    let parts: Vec<String> = shapes
        .iter()
        .map(|s| format!("{} {}x{}", s.ty, s.cols, s.rows))
        .collect();
    parts.join(", ")
}

/// The tiers the probe chooses among: every tier this CPU runs but
/// scalar (never faster where another exists), widest last.
pub fn candidates() -> Vec<Isa> {
    let all: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.available()).collect();
    let simd: Vec<Isa> = all.iter().copied().filter(|&i| i != Isa::Scalar).collect();
    if simd.is_empty() {
        all
    } else {
        simd
    }
}

/// What [`choose_isa`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct IsaChoice {
    /// The tier to run.
    pub isa: Isa,
    /// The new record, when the probe ran (store it).
    pub probed: Option<Record>,
    /// Whether the tier came from the store.
    pub from_store: bool,
    /// Something to show (a stored winner that no longer exists).
    pub message: Option<String>,
}

/// The tier for a model of `shapes` on the CPU of `key`: the stored winner
/// where `store` has one for this device and build, else (`probe` true)
/// the winner of a probe on `threads` threads timed by `clock`, else the
/// widest tier. A stored winner this build lacks falls back to the widest
/// tier, with a message.
pub fn choose_isa(
    store: &TuneStore,
    key: &TuneKey,
    shapes: &[WeightShape],
    threads: usize,
    clock: &dyn Clock,
    probe: bool,
) -> Result<IsaChoice, TuneError> {
    let default = Isa::best();
    let cands = candidates();
    let names: Vec<&str> = cands.iter().map(|i| i.name()).collect();
    let plain = |message| IsaChoice {
        isa: default,
        probed: None,
        from_store: false,
        message,
    };
    if cands.len() < 2 || shapes.is_empty() {
        return Ok(plain(None));
    }
    let shape = shape_key(shapes);
    match store.choose(key, PROBE, &shape, &names, default.name()) {
        Stored::Winner(w) => Ok(IsaChoice {
            isa: Isa::parse(&w).unwrap_or(default),
            probed: None,
            from_store: true,
            message: None,
        }),
        Stored::Fallback { message, .. } => Ok(plain(Some(message))),
        Stored::Missing if !probe => Ok(plain(None)),
        Stored::Missing => {
            let record = probe_isa(key, shapes, threads, clock)?;
            let isa = Isa::parse(&record.winner).unwrap_or(default);
            Ok(IsaChoice {
                isa,
                probed: Some(record),
                from_store: false,
                message: None,
            })
        }
    }
}

/// Times every [`candidates`] tier on synthetic weights of `shapes` with
/// `threads` threads (0: one per core) and returns the record for `key`.
pub fn probe_isa(
    key: &TuneKey,
    shapes: &[WeightShape],
    threads: usize,
    clock: &dyn Clock,
) -> Result<Record, TuneError> {
    let setup = |detail: String| TuneError::Setup {
        probe: PROBE.to_string(),
        detail,
    };
    let mut rng = SplitMix(0x7475_6e65);
    let work: Vec<Synthetic> = shapes
        .iter()
        .map(|&s| Synthetic::new(s, &mut rng).map_err(&setup))
        .collect::<Result<_, _>>()?;
    let reference: Vec<f32> = work
        .iter()
        .flat_map(|w| w.reference.iter().copied())
        .collect();
    let pool = Threads::new(threads);
    let mut per_isa = Vec::new();
    for isa in candidates() {
        let Some(table) = KernelTable::with_isa(isa) else {
            continue;
        };
        let weights = work
            .iter()
            .map(|w| w.weight(&table).map_err(|e| setup(e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        per_isa.push((isa, table, weights));
    }
    let mut cands: Vec<Candidate<'_>> = per_isa
        .iter()
        .map(|(isa, table, weights)| {
            let (work, pool, len) = (&work, &pool, reference.len());
            Candidate::new(isa.name(), move || {
                let mut out = Vec::with_capacity(len);
                for (w, s) in weights.iter().zip(work) {
                    for x in [&s.x1, &s.xp] {
                        let mut y = vec![0.0f32; x.len() / w.cols * w.rows];
                        matmul(pool, table, w, 0..w.rows, x, &mut y, false)
                            .map_err(|e| e.to_string())?;
                        out.extend_from_slice(&y);
                    }
                }
                Ok(out)
            })
        })
        .collect();
    let probe = Probe {
        rounds: ROUNDS,
        ..Probe::new(PROBE, shape_key(shapes), Isa::best().name())
    };
    probe.run(key, &mut cands, &reference, clock)
}

/// A synthetic weight of one shape, its activations and the reference
/// products.
struct Synthetic {
    shape: WeightShape,
    /// Rows used (the shape's, cut to [`MAX_WEIGHT_BYTES`]).
    rows: usize,
    /// The weight's blocks, [`DISTINCT_ROWS`] rows repeated.
    bytes: Vec<u8>,
    /// One token: `[1, cols]`.
    x1: Vec<f32>,
    /// A prompt chunk: `[PROMPT_TOKENS, cols]`.
    xp: Vec<f32>,
    /// `x1 · Wᵀ` then `xp · Wᵀ` by `quant::reference`, in f64.
    reference: Vec<f32>,
}

impl Synthetic {
    fn new(s: WeightShape, rng: &mut SplitMix) -> Result<Self, String> {
        let row_bytes = s.cols / s.ty.block_elems() * s.ty.block_bytes();
        let cap = (MAX_WEIGHT_BYTES / row_bytes.max(1)) / DISTINCT_ROWS * DISTINCT_ROWS;
        let rows = s.rows.min(cap.max(DISTINCT_ROWS));
        let mut distinct = Vec::with_capacity(DISTINCT_ROWS * row_bytes);
        let mut dense = vec![0.0f32; DISTINCT_ROWS * s.cols];
        for r in 0..DISTINCT_ROWS {
            let row: Vec<f32> = (0..s.cols).map(|_| rng.signed()).collect();
            reference::quantize(s.ty, &row, &mut distinct).map_err(|e| e.to_string())?;
            let q = &distinct[r * row_bytes..(r + 1) * row_bytes];
            reference::dequantize(s.ty, q, &mut dense[r * s.cols..(r + 1) * s.cols])
                .map_err(|e| e.to_string())?;
        }
        let bytes: Vec<u8> = (0..rows)
            .flat_map(|r| {
                let d = r % DISTINCT_ROWS;
                distinct[d * row_bytes..(d + 1) * row_bytes].iter().copied()
            })
            .collect();
        let x1: Vec<f32> = (0..s.cols).map(|_| rng.signed()).collect();
        let xp: Vec<f32> = (0..PROMPT_TOKENS * s.cols).map(|_| rng.signed()).collect();
        let mut reference = Vec::with_capacity((1 + PROMPT_TOKENS) * rows);
        for x in x1.chunks_exact(s.cols).chain(xp.chunks_exact(s.cols)) {
            // Rows repeat every DISTINCT_ROWS: compute those, then tile them.
            let dots: Vec<f32> = dense
                .chunks_exact(s.cols)
                .map(|w| {
                    let dot: f64 = w
                        .iter()
                        .zip(x)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    dot as f32
                })
                .collect();
            reference.extend((0..rows).map(|r| dots[r % DISTINCT_ROWS]));
        }
        Ok(Self {
            shape: s,
            rows,
            bytes,
            x1,
            xp,
            reference,
        })
    }

    /// The weight as `table`'s kernels store it.
    fn weight(&self, table: &KernelTable) -> Result<Weight, crate::backend::BackendError> {
        let mut words = vec![0u32; self.bytes.len().div_ceil(4)];
        bytemuck::cast_slice_mut::<u32, u8>(&mut words)[..self.bytes.len()]
            .copy_from_slice(&self.bytes);
        let s = self.shape;
        let name = format!("tune.{} {}x{}", s.ty, s.cols, self.rows);
        Weight::new(
            table,
            &name,
            s.ty,
            s.cols,
            self.rows,
            words,
            self.bytes.len(),
        )
    }
}

/// A small seeded generator (SplitMix64): the same weights every run.
struct SplitMix(u64);

impl SplitMix {
    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        let z = splitmix64(self.0);
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}
