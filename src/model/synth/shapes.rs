//! The shapes of synthetic models: architectures, the real models' published
//! hyper-parameters by name, and the checks a custom shape must pass.

use super::SynthError;

/// An architecture a synthetic model can have (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SynthArch {
    /// Llama 2/3, SmolLM2, Mistral-style dense models.
    Llama,
    /// Qwen2 / Qwen2.5: Llama with Q/K/V biases.
    Qwen2,
    /// Qwen3 dense: Llama with Q/K RMS norms.
    Qwen3,
    /// Gemma 3: Q/K norms, post-attention and post-FFN norms, sliding-window layers.
    Gemma3,
    /// Qwen3 mixture of experts.
    Qwen3Moe,
}

/// Every [`SynthArch`] with its GGUF name.
const ARCHS: [(SynthArch, &str); 5] = [
    (SynthArch::Llama, "llama"),
    (SynthArch::Qwen2, "qwen2"),
    (SynthArch::Qwen3, "qwen3"),
    (SynthArch::Gemma3, "gemma3"),
    (SynthArch::Qwen3Moe, "qwen3moe"),
];

impl SynthArch {
    /// Parses a `general.architecture` name.
    pub fn from_name(name: &str) -> Option<Self> {
        ARCHS.iter().find(|a| a.1 == name).map(|a| a.0)
    }

    /// Every name [`SynthArch::from_name`] accepts.
    pub fn names() -> Vec<&'static str> {
        ARCHS.iter().map(|a| a.1).collect()
    }

    /// The `general.architecture` value.
    pub fn name(self) -> &'static str {
        ARCHS.iter().find(|a| a.0 == self).map_or("llama", |a| a.1)
    }

    /// Whether attention has per-head RMS norms on Q and K.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Self::Qwen3 | Self::Gemma3 | Self::Qwen3Moe)
    }

    /// Whether Q, K and V projections have biases.
    pub fn has_qkv_bias(self) -> bool {
        self == Self::Qwen2
    }

    /// Whether the feed-forward block is a mixture of experts.
    pub fn is_moe(self) -> bool {
        self == Self::Qwen3Moe
    }
}

/// The hyper-parameters of a synthetic model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthShape {
    /// Architecture.
    pub arch: SynthArch,
    /// Width of the residual stream (`embedding_length`).
    pub hidden: u64,
    /// Transformer blocks.
    pub layers: u64,
    /// Query heads.
    pub heads: u64,
    /// Key/value heads.
    pub kv_heads: u64,
    /// Per-head width of queries, keys and values.
    pub head_dim: u64,
    /// Dense feed-forward width (`feed_forward_length`).
    pub ffn: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Whether the output projection reuses `token_embd` (no `output.weight`).
    pub tied: bool,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// Trained context length written to `context_length`.
    pub context: u64,
    /// Experts per MoE layer (0 when dense).
    pub experts: u64,
    /// Experts used per token (0 when dense).
    pub experts_used: u64,
    /// Feed-forward width of one expert (0 when dense).
    pub expert_ffn: u64,
    /// Sliding-window size of local attention layers (Gemma 3), else 0.
    pub sliding_window: u64,
}

/// The smallest vocabulary: `<unk>`, `<s>`, `</s>`, 256 byte tokens and the
/// single characters every text needs before pieces can merge.
pub const MIN_VOCAB: u64 = 384;

/// A named shape: `(name, arch, hidden, layers, heads, kv_heads, head_dim,
/// ffn, vocab, tied, rope_base, rms_eps, context, experts, experts_used,
/// expert_ffn, sliding_window)`, from each model's published config.
type Row = (
    &'static str,
    SynthArch,
    [u64; 7],
    bool,
    f32,
    f32,
    u64,
    [u64; 3],
    u64,
);

#[rustfmt::skip]
const NAMED: &[Row] = &[
    ("llama-3.2-1b", SynthArch::Llama, [2048, 16, 32, 8, 64, 8192, 128_256], true, 500_000.0, 1e-5, 131_072, [0, 0, 0], 0),
    ("llama-3.2-3b", SynthArch::Llama, [3072, 28, 24, 8, 128, 8192, 128_256], true, 500_000.0, 1e-5, 131_072, [0, 0, 0], 0),
    ("llama-3.1-8b", SynthArch::Llama, [4096, 32, 32, 8, 128, 14_336, 128_256], false, 500_000.0, 1e-5, 131_072, [0, 0, 0], 0),
    ("smollm2-135m", SynthArch::Llama, [576, 30, 9, 3, 64, 1536, 49_152], true, 100_000.0, 1e-5, 8192, [0, 0, 0], 0),
    ("smollm2-360m", SynthArch::Llama, [960, 32, 15, 5, 64, 2560, 49_152], true, 100_000.0, 1e-5, 8192, [0, 0, 0], 0),
    ("qwen2.5-0.5b", SynthArch::Qwen2, [896, 24, 14, 2, 64, 4864, 151_936], true, 1_000_000.0, 1e-6, 32_768, [0, 0, 0], 0),
    ("qwen2.5-1.5b", SynthArch::Qwen2, [1536, 28, 12, 2, 128, 8960, 151_936], true, 1_000_000.0, 1e-6, 32_768, [0, 0, 0], 0),
    ("qwen3-0.6b", SynthArch::Qwen3, [1024, 28, 16, 8, 128, 3072, 151_936], true, 1_000_000.0, 1e-6, 40_960, [0, 0, 0], 0),
    ("qwen3-1.7b", SynthArch::Qwen3, [2048, 28, 16, 8, 128, 6144, 151_936], true, 1_000_000.0, 1e-6, 40_960, [0, 0, 0], 0),
    ("qwen3-4b", SynthArch::Qwen3, [2560, 36, 32, 8, 128, 9728, 151_936], true, 1_000_000.0, 1e-6, 40_960, [0, 0, 0], 0),
    ("qwen3-8b", SynthArch::Qwen3, [4096, 36, 32, 8, 128, 12_288, 151_936], false, 1_000_000.0, 1e-6, 40_960, [0, 0, 0], 0),
    ("gemma3-270m", SynthArch::Gemma3, [640, 18, 4, 1, 256, 2048, 262_144], true, 1_000_000.0, 1e-6, 32_768, [0, 0, 0], 512),
    ("gemma3-1b", SynthArch::Gemma3, [1152, 26, 4, 1, 256, 6912, 262_144], true, 1_000_000.0, 1e-6, 32_768, [0, 0, 0], 512),
    ("qwen3-30b-a3b", SynthArch::Qwen3Moe, [2048, 48, 32, 4, 128, 6144, 151_936], false, 1_000_000.0, 1e-6, 40_960, [128, 8, 768], 0),
];

impl SynthShape {
    /// The shape of a real model by name (see [`SynthShape::names`]).
    pub fn named(name: &str) -> Option<Self> {
        let row = NAMED.iter().find(|r| r.0.eq_ignore_ascii_case(name))?;
        let (_, arch, dims, tied, rope_base, rms_eps, context, moe, sliding_window) = *row;
        let [experts, experts_used, expert_ffn] = moe;
        Some(SynthShape {
            tied,
            rope_base,
            rms_eps,
            context,
            experts,
            experts_used,
            expert_ffn,
            sliding_window,
            ..Self::custom(arch, dims)
        })
    }

    /// The name of every built-in shape.
    pub fn names() -> Vec<&'static str> {
        NAMED.iter().map(|r| r.0).collect()
    }

    /// A custom shape with the usual constants of `arch` (tied embeddings,
    /// RoPE base 1e6 and epsilon 1e-6 for Qwen and Gemma, 1e4 and 1e-5 for
    /// Llama; a 512-token window for Gemma 3; 4096 tokens of context).
    pub fn custom(arch: SynthArch, dims: [u64; 7]) -> Self {
        let [hidden, layers, heads, kv_heads, head_dim, ffn, vocab] = dims;
        let llama = arch == SynthArch::Llama;
        SynthShape {
            arch,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            ffn,
            vocab,
            tied: true,
            rope_base: if llama { 10_000.0 } else { 1_000_000.0 },
            rms_eps: if llama { 1e-5 } else { 1e-6 },
            context: 4096,
            experts: 0,
            experts_used: 0,
            expert_ffn: 0,
            sliding_window: if arch == SynthArch::Gemma3 { 512 } else { 0 },
        }
    }

    /// Query width: `heads * head_dim`.
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Key (and value) width: `kv_heads * head_dim`.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Checks that llama.cpp and Hearth can build this model, with a message
    /// naming the option to change.
    pub fn validate(&self) -> Result<(), SynthError> {
        let bad = |msg: String| Err(SynthError::Invalid(msg));
        for (name, v) in [
            ("--hidden", self.hidden),
            ("--layers", self.layers),
            ("--heads", self.heads),
            ("--kv-heads", self.kv_heads),
            ("--head-dim", self.head_dim),
            ("--ffn", self.ffn),
            ("--ctx", self.context),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "--heads {} is not a multiple of --kv-heads {}",
                self.heads, self.kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "--head-dim {} is odd; RoPE rotates pairs, so it must be even",
                self.head_dim
            ));
        }
        if self.vocab < MIN_VOCAB {
            return bad(format!(
                "--vocab {} is too small; the synthetic tokenizer needs at least {MIN_VOCAB}",
                self.vocab
            ));
        }
        if self.vocab > i32::MAX as u64 {
            return bad(format!("--vocab {} does not fit token ids", self.vocab));
        }
        if self.arch == SynthArch::Qwen2 && self.q_dim() != self.hidden {
            return bad(format!(
                "qwen2 needs --heads x --head-dim = --hidden ({} x {} != {})",
                self.heads, self.head_dim, self.hidden
            ));
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return bad(format!("--rope-base {} must be positive", self.rope_base));
        }
        if self.arch == SynthArch::Gemma3 && self.sliding_window == 0 {
            return bad("gemma3 needs a sliding window of at least 1 token".into());
        }
        self.validate_moe()?;
        self.validate_size()
    }

    fn validate_moe(&self) -> Result<(), SynthError> {
        let bad = |msg: String| Err(SynthError::Invalid(msg));
        if !self.arch.is_moe() {
            if self.experts != 0 || self.experts_used != 0 || self.expert_ffn != 0 {
                return bad(format!(
                    "--experts, --experts-used and --expert-ffn need --arch qwen3moe, not {}",
                    self.arch.name()
                ));
            }
            return Ok(());
        }
        if self.experts < 2 {
            return bad("qwen3moe needs --experts of at least 2".into());
        }
        if self.experts_used == 0 || self.experts_used > self.experts {
            return bad(format!(
                "--experts-used must be between 1 and --experts ({})",
                self.experts
            ));
        }
        if self.expert_ffn == 0 {
            return bad("qwen3moe needs --expert-ffn (each expert's feed-forward width)".into());
        }
        Ok(())
    }

    /// Rejects shapes whose tensors overflow 64-bit sizes (ggml's limit).
    fn validate_size(&self) -> Result<(), SynthError> {
        let biggest = [
            self.hidden.checked_mul(self.vocab),
            self.hidden.checked_mul(self.q_dim()),
            self.hidden.checked_mul(self.ffn),
            self.hidden
                .checked_mul(self.expert_ffn)
                .and_then(|x| x.checked_mul(self.experts)),
        ];
        let limit = 1u64 << 48;
        if biggest.iter().any(|n| n.is_none_or(|n| n > limit)) {
            return Err(SynthError::Invalid(format!(
                "a tensor of this shape would hold more than 2^48 values; check --hidden {} --vocab {} --ffn {}",
                self.hidden, self.vocab, self.ffn
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_shape_is_valid() {
        for name in SynthShape::names() {
            let shape = SynthShape::named(name).expect("listed");
            shape.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert_eq!(
            SynthShape::named("LLAMA-3.2-1B").map(|s| s.hidden),
            Some(2048)
        );
        assert!(SynthShape::named("llama-9").is_none());
    }

    #[test]
    fn named_shapes_match_the_published_configs() {
        let s = SynthShape::named("qwen3-0.6b").expect("shape");
        assert_eq!(
            (s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.ffn, s.vocab),
            (1024, 28, 16, 8, 128, 3072, 151_936)
        );
        assert!(s.tied && s.arch.has_qk_norm());
        let s = SynthShape::named("llama-3.1-8b").expect("shape");
        assert!(!s.tied);
        assert_eq!(
            (s.q_dim(), s.kv_dim(), s.rope_base),
            (4096, 1024, 500_000.0)
        );
        let s = SynthShape::named("gemma3-270m").expect("shape");
        assert_eq!((s.hidden, s.head_dim, s.sliding_window), (640, 256, 512));
    }

    #[test]
    fn bad_shapes_say_which_option_to_change() {
        let ok = SynthShape::custom(SynthArch::Llama, [256, 2, 4, 2, 64, 512, 512]);
        ok.validate().expect("valid");
        let cases: Vec<(SynthShape, &str)> = vec![
            (
                SynthShape {
                    kv_heads: 3,
                    ..ok.clone()
                },
                "--kv-heads",
            ),
            (
                SynthShape {
                    layers: 0,
                    ..ok.clone()
                },
                "--layers",
            ),
            (
                SynthShape {
                    head_dim: 63,
                    ..ok.clone()
                },
                "--head-dim",
            ),
            (
                SynthShape {
                    vocab: 100,
                    ..ok.clone()
                },
                "--vocab",
            ),
            (
                SynthShape {
                    experts: 8,
                    ..ok.clone()
                },
                "qwen3moe",
            ),
            (
                SynthShape {
                    arch: SynthArch::Qwen2,
                    heads: 2,
                    kv_heads: 2,
                    ..ok.clone()
                },
                "--hidden",
            ),
            (
                SynthShape {
                    arch: SynthArch::Qwen3Moe,
                    experts: 8,
                    experts_used: 9,
                    expert_ffn: 64,
                    ..ok.clone()
                },
                "--experts-used",
            ),
            (
                SynthShape {
                    hidden: 1 << 40,
                    ..ok.clone()
                },
                "2^48",
            ),
        ];
        for (shape, needle) in cases {
            let err = shape.validate().expect_err(needle).to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle}");
        }
    }

    #[test]
    fn arch_names_round_trip() {
        for name in SynthArch::names() {
            assert_eq!(SynthArch::from_name(name).map(SynthArch::name), Some(name));
        }
        assert_eq!(SynthArch::from_name("mamba"), None);
    }
}
