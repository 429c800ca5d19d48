//! The ops of an LLM forward pass, as a backend records them.
//!
//! A model builds a [`plan::Plan`] of [`Op`]s over buffers for each shape of
//! step; [`fuse`] replaces runs of ops by the fused variants a backend
//! [`supports`](crate::backend::Backend::supports), and the backend runs
//! the plan ([`Backend::run_plan`](crate::backend::Backend::run_plan)).
//! Shapes are written row-major, `[rows, width]`; `tokens` is the number of
//! input tokens of the step over all sequences. Each variant states its
//! inputs and outputs in the order of [`OpIo`](crate::backend::OpIo).

pub mod fuse;
pub mod plan;
pub mod reference;

use crate::quant::GgmlType;

/// The gated activation of an FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// `silu(gate) * up`.
    Silu,
    /// `gelu_tanh(gate) * up`.
    GeluTanh,
}

/// Element type of the K/V cache (serialized as `"f16"`, `"f32"`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    /// Half precision (the default: half the memory, llama.cpp's default too).
    #[default]
    F16,
    /// Single precision (conformance: llama.cpp's references were made with it).
    F32,
}

impl KvType {
    /// Bytes of one cache element.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }
}

/// Size and type of the paged K/V cache a model allocates, which the
/// K/V ops write and read through slots and block tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvCacheConfig {
    /// Blocks in the pool (block 0 is the null block and is never written).
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Element type.
    pub dtype: KvType,
}

/// ggml's RoPE modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Rotates adjacent pairs `(2i, 2i + 1)` (llama).
    Norm,
    /// Rotates pairs `(i, i + n_rot / 2)` (GPT-NeoX, qwen, gemma).
    Neox,
}

/// One op of a forward pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Embedding lookup (ggml `get_rows`) from a table of type `ty`.
    /// in: table `[n_vocab, width]` (`ty`), ids `[tokens]` (u32); out: `[tokens, width]` f32.
    GetRows {
        /// Element type of the table.
        ty: GgmlType,
        /// Row width.
        width: usize,
    },
    /// `y = x · Wᵀ`. in: x `[tokens, k]` f32, W `[n, k]` (`ty`); out: y `[tokens, n]`.
    /// Activations are quantized to `ty`'s `vec_dot_type` unless `exact`.
    MatMul {
        /// Weight type.
        ty: GgmlType,
        /// Input width.
        k: usize,
        /// Output width.
        n: usize,
        /// Exact-f32 mode (dequantized weight rows, f32 activations).
        exact: bool,
    },
    /// RMS norm of each `width`-wide row (per head when `width` is the head
    /// width: QK norm). in: x `[rows, width]`, w `[width]`; out: `[rows, width]`.
    RmsNorm {
        /// Row width.
        width: usize,
        /// Epsilon.
        eps: f32,
    },
    /// Rotary embedding of each head. in: x `[tokens, heads * head_dim]`,
    /// positions `[tokens]` (u32), optionally per-pair frequency divisors
    /// `[n_rot / 2]` (Llama 3.1+ `rope_freqs`); out: same shape as x.
    Rope {
        /// Pair layout.
        mode: RopeMode,
        /// Head width.
        head_dim: usize,
        /// Rotated dims per head (`<= head_dim`).
        n_rot: usize,
        /// Frequency base.
        base: f32,
        /// Position scale (1 = none).
        scale: f32,
    },
    /// `x + y`, same shapes.
    Add,
    /// `x * y` element-wise, same shapes.
    Mul,
    /// `x * s`.
    Scale(f32),
    /// `x + bias` per row. in: x `[rows, width]`, bias `[width]`.
    BiasAdd,
    /// `silu(gate) * up`. in: gate, up `[tokens, n_ff]`; out: `[tokens, n_ff]`.
    SiluMul,
    /// `gelu_tanh(gate) * up` (GELU input rounded to fp16 as ggml's CPU). Shapes as SiluMul.
    GeluTanhMul,
    /// Softmax of each `width`-wide row.
    Softmax {
        /// Row width.
        width: usize,
    },
    /// Writes K/V rows through slots. in: k `[tokens, k_width]`,
    /// v `[tokens, v_width]`, slots `[tokens]` (u32 flat slot index
    /// `block * block_size + offset`); out: the layer's K cache
    /// `[slots, k_width]`, V cache `[slots, v_width]` (`dtype`).
    KvWrite {
        /// Layer.
        layer: usize,
        /// Width of a K row (`n_head_kv * head_dim_k`).
        k_width: usize,
        /// Width of a V row (`n_head_kv * head_dim_v`).
        v_width: usize,
        /// Element type of the cache.
        dtype: KvType,
    },
    /// Paged causal attention. in: q `[tokens, heads * head_dim_k]`, the
    /// layer's K and V caches (as [`Op::KvWrite`] writes them), sequences
    /// `[n_seq, 4]` u32 (first row, tokens, start position, offset of its
    /// block table), block tables (u32 block ids, concatenated);
    /// out: `[tokens, heads * head_dim_v]`.
    PagedAttention {
        /// Layer.
        layer: usize,
        /// Query heads.
        n_head: usize,
        /// K/V heads (GQA / MQA when fewer).
        n_head_kv: usize,
        /// Head width of q and k.
        head_dim_k: usize,
        /// Head width of v.
        head_dim_v: usize,
        /// Score multiplier.
        scale: f32,
        /// Sliding window, when the layer is local.
        window: Option<usize>,
        /// Score softcap, when set.
        softcap: Option<f32>,
        /// Tokens per cache block.
        block_size: usize,
        /// Element type of the cache.
        dtype: KvType,
    },
    /// MoE router: softmax over all experts, top-k, renormalised weights.
    /// in: logits `[tokens, n_expert]`; out: ids `[tokens, k]` u32, weights `[tokens, k]` f32.
    MoeTopK {
        /// Experts.
        n_expert: usize,
        /// Experts used per token.
        k: usize,
    },
    /// The expert FFNs of one MoE layer. in: x `[tokens, n_embd]`, ids and
    /// weights of [`Op::MoeTopK`], stacked gate `[n_expert * n_ff, n_embd]`,
    /// up (same), down `[n_expert * n_embd, n_ff]`; out: `[tokens, n_embd]`.
    /// An id at or past `n_expert` contributes nothing (an expert computed
    /// elsewhere, as an expert cache may); every backend honours this.
    MoeExperts {
        /// Layer.
        layer: usize,
        /// Experts.
        n_expert: usize,
        /// Experts used per token.
        k: usize,
        /// Model width.
        n_embd: usize,
        /// Hidden width of one expert.
        n_ff: usize,
        /// Gated activation.
        act: Activation,
        /// Types of the gate, up and down weights.
        tys: [GgmlType; 3],
        /// Exact-f32 mode, as [`Op::MatMul`].
        exact: bool,
    },
    /// `cap * tanh(x / cap)` on logits.
    LogitSoftcap(f32),
    /// Index of the largest value of each `width`-wide row (ties: the
    /// lowest index), so a greedy step reads back one u32 per sequence;
    /// [`NON_FINITE_ROW`] for a row holding a NaN or an infinity (the host
    /// sampler refuses those rows, and so must the device path).
    /// in: x `[rows, width]` f32; out: `[rows]` u32.
    Argmax {
        /// Row width.
        width: usize,
    },
    /// The `k` largest values of each `width`-wide row with their indices,
    /// best first (ties: the lower index first), as [`reference::top_k_row`] defines
    /// them: what a sampler keeping the `k` most likely tokens needs, so a
    /// sampled step reads back `k` pairs per sequence instead of the logits.
    /// A row holding a NaN or an infinity starts with [`NON_FINITE_ROW`].
    /// in: x `[rows, width]` f32; out: `[rows, k]` pairs `(u32 index, f32 value)`.
    TopK {
        /// Row width.
        width: usize,
        /// Pairs per row (`1 ..= MAX_TOP_K`, at most `width`).
        k: usize,
    },
    /// Fused: matrix products of one input by several weights, the input
    /// first made by a row op ([`Prologue`]). `y_i = x · W_iᵀ` where x is
    /// the prologue's result, which is also written to its output (other
    /// ops may read it). Emitted by [`fuse`] in place of the ops apart,
    /// with the same results where the backend's kernels agree.
    /// in: the prologue's inputs, then `W_1 .. W_n` (`parts[i]`: type and
    /// rows); out: the prologue's outputs, then `y_1 .. y_n` `[rows, n_i]`.
    FusedMatMul {
        /// The row op that makes x.
        pre: Prologue,
        /// Input width.
        k: usize,
        /// Each weight's type and rows (its output's width), in order.
        parts: Vec<(GgmlType, usize)>,
        /// Exact-f32 mode, as [`Op::MatMul`].
        exact: bool,
        /// Token rows of the step.
        rows: usize,
    },
    /// Fused: the [`Op::Rope`] of q and of k at the same positions, then
    /// the [`Op::KvWrite`] of k (rotated) and v. Emitted by [`fuse`].
    /// in: q, k, v, positions, slots, optionally the frequency divisors;
    /// out: q, k (rotated in place), the layer's K cache, V cache.
    RopeKvWrite {
        /// The rope of both (as an [`Op::Rope`]).
        rope: RopeSpec,
        /// Layer.
        layer: usize,
        /// Width of a K row.
        k_width: usize,
        /// Width of a V row.
        v_width: usize,
        /// Element type of the cache.
        dtype: KvType,
        /// Token rows of the step.
        rows: usize,
    },
}

/// The parameters of an [`Op::Rope`], as the fused ops carry them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// Pair layout.
    pub mode: RopeMode,
    /// Head width.
    pub head_dim: usize,
    /// Rotated dims per head (`<= head_dim`).
    pub n_rot: usize,
    /// Frequency base.
    pub base: f32,
    /// Position scale (1 = none).
    pub scale: f32,
}

impl RopeSpec {
    /// The parameters of `op`, if it is an [`Op::Rope`].
    pub fn of(op: &Op) -> Option<Self> {
        match *op {
            Op::Rope {
                mode,
                head_dim,
                n_rot,
                base,
                scale,
            } => Some(Self {
                mode,
                head_dim,
                n_rot,
                base,
                scale,
            }),
            _ => None,
        }
    }

    /// The [`Op::Rope`] of these parameters.
    pub fn op(self) -> Op {
        Op::Rope {
            mode: self.mode,
            head_dim: self.head_dim,
            n_rot: self.n_rot,
            base: self.base,
            scale: self.scale,
        }
    }
}

/// The row op a [`Op::FusedMatMul`] makes its input with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Prologue {
    /// None: x is read as it is. in: x; out: nothing.
    None,
    /// `x = rms_norm(a) * w` ([`Op::RmsNorm`] over rows of `k`).
    /// in: a, w; out: x.
    RmsNorm {
        /// Epsilon.
        eps: f32,
    },
    /// `s = a + b` ([`Op::Add`]), then `x = rms_norm(s) * w`.
    /// in: a, b, w; out: s, x.
    AddRmsNorm {
        /// Epsilon.
        eps: f32,
    },
    /// `x = act(gate) * up` ([`Op::SiluMul`] or [`Op::GeluTanhMul`]).
    /// in: gate, up; out: x.
    Glu(Activation),
}

impl Prologue {
    /// Inputs and outputs the prologue takes, before the weights' and
    /// the products'.
    pub fn arity(self) -> (usize, usize) {
        match self {
            Prologue::None => (1, 0),
            Prologue::RmsNorm { .. } | Prologue::Glu(_) => (2, 1),
            Prologue::AddRmsNorm { .. } => (3, 2),
        }
    }
}

impl Op {
    /// The variant's name (`MatMul`, `PagedAttention`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Op::GetRows { .. } => "GetRows",
            Op::MatMul { .. } => "MatMul",
            Op::RmsNorm { .. } => "RmsNorm",
            Op::Rope { .. } => "Rope",
            Op::Add => "Add",
            Op::Mul => "Mul",
            Op::Scale(_) => "Scale",
            Op::BiasAdd => "BiasAdd",
            Op::SiluMul => "SiluMul",
            Op::GeluTanhMul => "GeluTanhMul",
            Op::Softmax { .. } => "Softmax",
            Op::KvWrite { .. } => "KvWrite",
            Op::PagedAttention { .. } => "PagedAttention",
            Op::MoeTopK { .. } => "MoeTopK",
            Op::MoeExperts { .. } => "MoeExperts",
            Op::LogitSoftcap(_) => "LogitSoftcap",
            Op::Argmax { .. } => "Argmax",
            Op::TopK { .. } => "TopK",
            Op::FusedMatMul { .. } => "FusedMatMul",
            Op::RopeKvWrite { .. } => "RopeKvWrite",
        }
    }

    /// The op for a person: its name and what it is, with the parameters
    /// that decide whether a backend runs it.
    pub fn describe(&self) -> String {
        match self {
            Op::MatMul { ty, k, n, .. } => format!("a {ty} matrix product ({n} x {k})"),
            Op::GetRows { ty, width } => format!("a {ty} row lookup ({width} wide)"),
            Op::MoeTopK { n_expert, k } => {
                format!("the mixture-of-experts router ({k} of {n_expert} experts)")
            }
            Op::MoeExperts { tys, .. } => format!(
                "the mixture-of-experts FFN ({} / {} / {} experts)",
                tys[0], tys[1], tys[2]
            ),
            Op::PagedAttention {
                head_dim_k, dtype, ..
            } => {
                format!("paged attention (heads of {head_dim_k}, {dtype:?} cache)")
            }
            Op::KvWrite { dtype, .. } => format!("the K/V cache write ({dtype:?} cache)"),
            Op::FusedMatMul { pre, parts, .. } => {
                let tys: Vec<String> = parts.iter().map(|(t, _)| t.to_string()).collect();
                format!(
                    "{pre:?} fused with {} products ({})",
                    parts.len(),
                    tys.join(", ")
                )
            }
            Op::RopeKvWrite { dtype, .. } => {
                format!("RoPE fused with the K/V cache write ({dtype:?} cache)")
            }
            other => other.name().to_string(),
        }
    }
}

/// The largest `k` of [`Op::TopK`] (what its GPU kernel keeps per thread).
pub const MAX_TOP_K: usize = 64;

/// What [`Op::Argmax`] yields for a row holding a NaN or an infinity.
pub const NON_FINITE_ROW: u32 = u32::MAX;
