//! A backend from outside the core crate (as CUDA's and ROCm's will be):
//! it implements [`Backend`] alone, loads through [`load_model`], runs as
//! an [`AnyModel`], and computes what the CPU computes. A backend that
//! refuses an op the model needs fails at the check, before one tensor
//! byte is read or one buffer allocated, naming the op.

mod model_support;

use std::cell::Cell;
use std::future::Future;
use std::ops::Range;
use std::rc::Rc;

use hearth::backend::cpu::CpuBackend;
use hearth::backend::{Backend, BackendError, BufKind, Caps, OpIo};
use hearth::gguf::open_model;
use hearth::graph::{KvCacheConfig, KvType, Op};
use hearth::model::{check_model, load_model, AnyModel, ForwardModel, LoadOptions, LogitsWanted};
use hearth::quant::GgmlType;
use model_support::*;

/// What a backend was asked to do.
#[derive(Debug, Default)]
struct Counts {
    allocs: Cell<usize>,
    records: Cell<usize>,
}

/// The CPU backend behind a type of this crate, refusing `refuse` ops.
struct Outside {
    inner: CpuBackend,
    caps: Caps,
    refuse: fn(&Op) -> bool,
    counts: Rc<Counts>,
}

impl Outside {
    fn new(refuse: fn(&Op) -> bool) -> (Self, Rc<Counts>) {
        let inner = cpu_backend(2);
        let caps = Caps {
            backend: "Outside",
            ..inner.caps().clone()
        };
        let counts = Rc::new(Counts::default());
        let me = Outside {
            inner,
            caps,
            refuse,
            counts: counts.clone(),
        };
        (me, counts)
    }
}

type Buf = <CpuBackend as Backend>::Buffer;

impl Backend for Outside {
    type Buffer = Buf;

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn alloc(&self, bytes: u64, kind: BufKind) -> Result<Buf, BackendError> {
        self.counts.allocs.set(self.counts.allocs.get() + 1);
        self.inner.alloc(bytes, kind)
    }

    fn alloc_weights(&self, sizes: &[u64]) -> Result<Vec<Buf>, BackendError> {
        self.counts
            .allocs
            .set(self.counts.allocs.get() + sizes.len());
        self.inner.alloc_weights(sizes)
    }

    fn upload(&self, dst: &Buf, offset: u64, src: &[u8]) -> Result<(), BackendError> {
        self.inner.upload(dst, offset, src)
    }

    fn weight_bytes(&self, ty: GgmlType, cols: usize, rows: usize) -> u64 {
        self.inner.weight_bytes(ty, cols, rows)
    }

    fn upload_weight_rows(
        &self,
        dst: &Buf,
        ty: GgmlType,
        cols: usize,
        first_row: usize,
        src: &[u8],
    ) -> Result<(), BackendError> {
        self.inner.upload_weight_rows(dst, ty, cols, first_row, src)
    }

    fn finish_weight(&self, dst: &Buf, ty: GgmlType, cols: usize) -> Result<(), BackendError> {
        self.inner.finish_weight(dst, ty, cols)
    }

    fn supports(&self, op: &Op) -> bool {
        !(self.refuse)(op) && self.inner.supports(op)
    }

    fn record(&mut self, op: &Op, io: &OpIo<'_, Buf>) -> Result<(), BackendError> {
        if (self.refuse)(op) {
            return Err(BackendError::unsupported_op(&self.caps, op));
        }
        self.counts.records.set(self.counts.records.get() + 1);
        self.inner.record(op, io)
    }

    fn submit(&mut self) -> Result<(), BackendError> {
        self.inner.submit()
    }

    fn download(
        &self,
        src: &Buf,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        self.inner.download(src, range)
    }
}

fn opts() -> LoadOptions {
    LoadOptions::new(KvCacheConfig {
        num_blocks: 8,
        block_size: BLOCK,
        dtype: KvType::F16,
    })
}

/// The logits of a prompt (every row) and of one decode step after it.
fn logits(m: &mut impl ForwardModel) -> Vec<Vec<f32>> {
    let prompt: Vec<u32> = (0..7).map(|i| 5 + (i * 29) % 150).collect();
    let t = table(1, prompt.len() + 1);
    let s = slots(&t, 0, prompt.len() + 1);
    vec![
        seq_step(m, &prompt, 0, (&t, &s), LogitsWanted::All),
        seq_step(m, &[11], prompt.len(), (&t, &s), LogitsWanted::Last),
    ]
}

#[test]
fn a_backend_of_another_crate_runs_the_model_as_the_cpu_does() {
    for name in ["llama-Q4_K_M", "qwen3moe-Q4_0", "gemma3-Q8_0"] {
        let path = synthetic_model(name);
        let mut cpu = load(&path, KvType::F16, false, 2, 8);
        let want = logits(&mut cpu);

        let (model, sources) = open_model(&path).expect("open");
        let (backend, counts) = Outside::new(|_| false);
        let mut done = 0;
        let m = pollster::block_on(load_model(backend, &model, &sources, &opts(), &mut |_| {
            done += 1
        }))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(done > 0, "{name}: loading reported no progress");
        let mut any = AnyModel::new(m);
        assert!(any.downcast_ref::<Outside>().is_some());
        assert!(any.downcast_ref::<CpuBackend>().is_none());
        let got = logits(&mut any);
        assert!(
            counts.records.get() > 0,
            "{name}: the model ran without recording on its backend"
        );
        assert_eq!(
            bits(&got),
            bits(&want),
            "{name}: the outside backend computed other logits than the CPU"
        );
    }
}

#[test]
fn a_refused_op_fails_the_check_before_anything_is_read() {
    let path = synthetic_model("qwen3moe-Q4_0");
    let (model, sources) = open_model(&path).expect("open");
    let refuse: fn(&Op) -> bool = |op| matches!(op, Op::MoeExperts { .. });

    let (backend, _) = Outside::new(refuse);
    let err = check_model(&model, &backend, &opts()).expect_err("check refuses");
    let text = err.to_string();
    assert!(
        text.contains("Outside") && text.contains("mixture-of-experts FFN"),
        "the error names neither the backend nor the op: {text}"
    );

    let (backend, counts) = Outside::new(refuse);
    let mut progress = 0;
    let err = pollster::block_on(load_model(backend, &model, &sources, &opts(), &mut |_| {
        progress += 1
    }))
    .expect_err("load refuses");
    assert_eq!(err.to_string(), text, "load and check disagree");
    assert_eq!(
        progress, 0,
        "tensors were streamed for a model that cannot run"
    );
    assert_eq!(counts.allocs.get(), 0, "buffers were allocated");

    // A dense model needs no MoE op: the same backend loads it.
    let dense = synthetic_model("llama-Q4_0");
    let (model, _) = open_model(&dense).expect("open");
    let (backend, _) = Outside::new(refuse);
    check_model(&model, &backend, &opts()).expect("a dense model needs no MoE op");
}

#[test]
fn a_refused_weight_type_names_the_tensor() {
    let path = synthetic_model("llama-Q4_K_M");
    let (model, _) = open_model(&path).expect("open");
    let refuse: fn(&Op) -> bool = |op| {
        matches!(
            op,
            Op::MatMul {
                ty: GgmlType::Q4_K,
                ..
            } | Op::FusedMatMul { .. }
        )
    };
    let (backend, _) = Outside::new(refuse);
    let text = check_model(&model, &backend, &opts())
        .expect_err("refused")
        .to_string();
    assert!(
        text.contains("Q4_K") && text.contains("Outside") && text.contains("blk."),
        "the error names neither the type, the backend nor the tensor: {text}"
    );
}
