//! The weights a model holds on its backend, by buffer: what the layout
//! ([`super::layout`]) finds in a GGUF file and the plans refer to.

use crate::quant::GgmlType;

/// One weight the model holds on its backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightInfo {
    /// Index of its buffer ([`crate::graph::plan::BufId::Weight`]).
    pub id: usize,
    /// Element type (norm weights and biases are F32).
    pub ty: GgmlType,
    /// Elements per row.
    pub cols: usize,
    /// Rows (product of the other dimensions).
    pub rows: usize,
}

/// The feed-forward weights of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnWeights {
    /// `down(act(gate x) * up x)`.
    Dense {
        /// `[n_ff, n_embd]`.
        gate: WeightInfo,
        /// `[n_ff, n_embd]`.
        up: WeightInfo,
        /// `[n_embd, n_ff]`.
        down: WeightInfo,
    },
    /// Router and stacked experts.
    Moe {
        /// `[n_expert, n_embd]`.
        router: WeightInfo,
        /// `[n_expert * n_ff, n_embd]`.
        gate: WeightInfo,
        /// `[n_expert * n_ff, n_embd]`.
        up: WeightInfo,
        /// `[n_expert * n_embd, n_ff]`.
        down: WeightInfo,
        /// Hidden width of one expert.
        n_ff: usize,
    },
}

/// One transformer block's weights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerWeights {
    /// Attention input norm.
    pub attn_norm: WeightInfo,
    /// Query projection.
    pub wq: WeightInfo,
    /// Key projection.
    pub wk: WeightInfo,
    /// Value projection.
    pub wv: WeightInfo,
    /// Output projection.
    pub wo: WeightInfo,
    /// q/k/v biases (qwen2).
    pub bias: Option<[WeightInfo; 3]>,
    /// q/k head norms (qwen3, gemma3).
    pub qk_norm: Option<[WeightInfo; 2]>,
    /// Norm of the attention output (gemma3).
    pub post_attn_norm: Option<WeightInfo>,
    /// FFN input norm.
    pub ffn_norm: WeightInfo,
    /// The FFN.
    pub ffn: FfnWeights,
    /// Norm of the FFN output (gemma3).
    pub post_ffn_norm: Option<WeightInfo>,
}

/// Every weight of a model, by buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelWeights {
    /// Token embeddings `[n_vocab, n_embd]`.
    pub tok_embd: WeightInfo,
    /// Final norm.
    pub output_norm: WeightInfo,
    /// Output projection; `None`: tied to `tok_embd`.
    pub output: Option<WeightInfo>,
    /// Llama 3.1+ per-pair RoPE divisors, when present.
    pub rope_freqs: Option<WeightInfo>,
    /// The blocks.
    pub layers: Vec<LayerWeights>,
}

impl LayerWeights {
    /// The buffers of every weight of the block.
    pub fn ids(&self) -> Vec<usize> {
        let mut v = vec![
            self.attn_norm.id,
            self.wq.id,
            self.wk.id,
            self.wv.id,
            self.wo.id,
            self.ffn_norm.id,
        ];
        v.extend(self.bias.iter().flatten().map(|w| w.id));
        v.extend(self.qk_norm.iter().flatten().map(|w| w.id));
        v.extend(self.post_attn_norm.map(|w| w.id));
        v.extend(self.post_ffn_norm.map(|w| w.id));
        match &self.ffn {
            FfnWeights::Dense { gate, up, down } => v.extend([gate.id, up.id, down.id]),
            FfnWeights::Moe {
                router,
                gate,
                up,
                down,
                ..
            } => v.extend([router.id, gate.id, up.id, down.id]),
        }
        v
    }
}
