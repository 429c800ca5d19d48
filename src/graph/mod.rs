//! The ops of an LLM forward pass, as a backend records them.
//!
//! A model builds, per step, a list of [`Op`]s over buffers; a backend says
//! which it [`supports`](crate::backend::Backend::supports) and executes them.
//! Shapes are written row-major, `[rows, width]`; `tokens` is the number of
//! input tokens of the step over all sequences. Each variant states its
//! inputs and outputs in the order of [`OpIo`](crate::backend::OpIo).

use crate::quant::GgmlType;

/// ggml's RoPE modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// positions `[tokens]`; out: same shape as x.
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
    /// Writes K/V rows through slots. in: k `[tokens, kv_heads * head_dim_k]`,
    /// v `[tokens, kv_heads * head_dim_v]`, slots `[tokens]`; out: the layer's cache.
    KvWrite {
        /// Layer.
        layer: usize,
    },
    /// Paged causal attention. in: q `[tokens, heads * head_dim_k]`, the
    /// layer's cache, block tables; out: `[tokens, heads * head_dim_v]`.
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
    /// weights of [`Op::MoeTopK`]; out: `[tokens, n_embd]`.
    MoeExperts {
        /// Layer.
        layer: usize,
    },
    /// `cap * tanh(x / cap)` on logits.
    LogitSoftcap(f32),
}
