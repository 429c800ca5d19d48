//! Synthetic models: random weights in the exact shape and tensor types of a
//! real model, with metadata and a tokenizer llama.cpp and Hearth both load.
//! Benchmarks use them (decode speed is bytes over bandwidth, so only shapes
//! and types matter), and tests use tiny ones.
//!
//! A [`SynthModel`] is a plan: metadata, and for every tensor its name, ggml
//! shape, type (llama-quantize's recipe for the file type) and the normal
//! distribution of its values. Values are made one row at a time by
//! [`SynthModel::encode_rows`], from a generator seeded by (seed, tensor
//! name, row) (see [`rng`]), so callers may make rows in any order and on
//! any number of threads and still write the same bytes, without ever
//! holding a whole tensor. Writing the file is the caller's job (this module
//! does no I/O, so it builds for wasm32):
//!
//! ```
//! use hearth::gguf::GgufWriter;
//! use hearth::model::synth::{SynthArch, SynthModel, SynthOptions, SynthShape};
//! use hearth::quant::recipe::FileType;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let shape = SynthShape::custom(SynthArch::Llama, [64, 1, 2, 1, 32, 128, 400]);
//! let model = SynthModel::new(shape, "tiny", &SynthOptions::new(FileType::Q8_0, 7))?;
//! let mut w = GgufWriter::new(Vec::new(), &model.metadata, &model.specs())?;
//! let mut buf = Vec::new();
//! for i in 0..model.tensors.len() {
//!     buf.clear();
//!     model.encode_rows(i, 0..model.tensors[i].n_rows(), &mut buf)?;
//!     w.write_data(&buf)?;
//! }
//! let bytes = w.finish()?;
//! # assert!(bytes.len() > 400 * 64);
//! # Ok(()) }
//! ```

pub mod rng;
pub mod router;
pub mod shapes;
pub mod vocab;

use std::ops::Range;

use thiserror::Error;

use crate::gguf::{Array, Metadata, TensorSpec, Value};
use crate::quant::recipe::{self, FileType, ModelShape, TensorRef};
use crate::quant::{reference, GgmlType, QuantError};

pub use router::SUGGESTED_ROUTER_SKEW;
pub use shapes::{SynthArch, SynthShape, MIN_VOCAB};
pub use vocab::SynthVocab;

pub use crate::model::quantize::QUANTIZATION_VERSION;

/// Errors planning or making a synthetic model.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SynthError {
    /// The requested shape or options cannot make a loadable model.
    #[error("{0}")]
    Invalid(String),
    /// A row could not be encoded in its tensor type.
    #[error("encoding {tensor}: {source}")]
    Encode {
        /// The tensor.
        tensor: String,
        /// What the quantizer said.
        source: QuantError,
    },
}

/// Standard deviations of the weights, chosen like a trained model's so that
/// activations stay O(1) through every layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scales {
    /// Token embeddings (and the untied output projection).
    pub embd: f32,
    /// Attention and feed-forward projections, and the MoE router.
    pub proj: f32,
    /// Q/K/V biases (Qwen2).
    pub bias: f32,
    /// Norm weights are `1 + N(0, norm_noise^2)`.
    pub norm_noise: f32,
}

impl Default for Scales {
    fn default() -> Self {
        Scales {
            embd: 0.02,
            proj: 0.02,
            bias: 0.02,
            norm_noise: 0.02,
        }
    }
}

/// What to make besides the shape.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthOptions {
    /// File type: each tensor's type follows llama-quantize's recipe for it.
    pub ftype: FileType,
    /// Give every weight the file type's tensor type (llama-quantize `--pure`).
    pub pure: bool,
    /// Seed of every random value.
    pub seed: u64,
    /// Weight scales.
    pub scales: Scales,
    /// Skew `S >= 0` of the experts' popularity (MoE shapes only). At 0
    /// (the default) every router row has standard deviation
    /// [`Scales::proj`] and every expert wins the same share of tokens; the
    /// file is byte for byte what it was before this option existed. Above
    /// 0, each layer ranks its experts by a seeded random permutation and
    /// draws the router row of the expert of rank `r` with standard
    /// deviation `proj * p(r)^S`, `p(r) = ((1 + r)^-3 + 1e-4) / (1 + 1e-4)`,
    /// so a few experts per layer take most of the top-k hits and the rest
    /// share a thin tail; no other tensor changes. The file records it as
    /// `hearth.synth.router_skew` and in `general.description`.
    /// [`SUGGESTED_ROUTER_SKEW`] (1) gives the top 10% of Qwen3-30B-A3B's
    /// experts about 70% of the hits, near the 80% that no router can exceed
    /// for sign-symmetric hidden states: see [`router`].
    pub router_skew: f32,
}

impl SynthOptions {
    /// Default scales, the mixed recipe, no router skew.
    pub fn new(ftype: FileType, seed: u64) -> Self {
        SynthOptions {
            ftype,
            pure: false,
            seed,
            scales: Scales::default(),
            router_skew: 0.0,
        }
    }
}

/// One tensor of a synthetic model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthTensor {
    /// GGUF name (`blk.3.attn_q.weight`).
    pub name: String,
    /// ggml shape: `shape[0]` is the row length.
    pub shape: Vec<u64>,
    /// Type in the file.
    pub ty: GgmlType,
    /// Mean of the values (1 for norms, else 0).
    pub mean: f32,
    /// Standard deviation of the values.
    pub std: f32,
    /// Factors on `std`, one per row; empty when every row has `std` (all
    /// but the routers of a model with [`SynthOptions::router_skew`]).
    pub row_scales: Vec<f32>,
}

impl SynthTensor {
    fn new(name: String, shape: Vec<u64>, mean: f32, std: f32) -> Self {
        SynthTensor {
            name,
            shape,
            ty: GgmlType::F32,
            mean,
            std,
            row_scales: Vec::new(),
        }
    }

    /// Values per row (`shape[0]`).
    pub fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Number of rows (the product of the other dimensions).
    pub fn n_rows(&self) -> u64 {
        self.shape.iter().skip(1).product()
    }

    /// Bytes of one encoded row.
    pub fn row_bytes(&self) -> u64 {
        // The shape was checked against the type when the plan was made.
        self.ty.bytes_for(self.row_len()).unwrap_or(0)
    }

    /// Bytes of the whole tensor in the file (without alignment padding).
    pub fn data_bytes(&self) -> u64 {
        self.row_bytes() * self.n_rows()
    }

    /// Fills `out` (`row_len` values) with row `row`'s values under `seed`.
    pub fn row_values(&self, seed: u64, row: u64, out: &mut [f32]) {
        let scale = usize::try_from(row)
            .ok()
            .and_then(|r| self.row_scales.get(r));
        let std = match scale {
            Some(&s) => self.std * s,
            None => self.std,
        };
        rng::fill_normal(
            &mut rng::row_rng(seed, &self.name, row),
            self.mean,
            std,
            out,
        );
    }
}

/// A synthetic model: metadata and the tensors in file order.
#[derive(Debug, Clone)]
pub struct SynthModel {
    /// The shape it was made from.
    pub shape: SynthShape,
    /// The options it was made with.
    pub options: SynthOptions,
    /// GGUF metadata, in write order.
    pub metadata: Metadata,
    /// Tensors in llama-quantize's order, with their types.
    pub tensors: Vec<SynthTensor>,
}

impl SynthModel {
    /// Plans a model of `shape`; `label` becomes `general.name` as
    /// `"synthetic {label}"`.
    pub fn new(shape: SynthShape, label: &str, options: &SynthOptions) -> Result<Self, SynthError> {
        shape.validate()?;
        for s in [
            options.scales.embd,
            options.scales.proj,
            options.scales.bias,
            options.scales.norm_noise,
        ] {
            if !(s.is_finite() && s >= 0.0) {
                return Err(SynthError::Invalid(format!(
                    "weight scale {s} must be a finite number >= 0"
                )));
            }
        }
        let skew = options.router_skew;
        if !(skew.is_finite() && skew >= 0.0) {
            return Err(SynthError::Invalid(format!(
                "--router-skew {skew} must be a finite number >= 0"
            )));
        }
        if skew > 0.0 && !shape.arch.is_moe() {
            return Err(SynthError::Invalid(format!(
                "--router-skew needs a mixture-of-experts architecture (qwen3moe); {} has no router",
                shape.arch.name()
            )));
        }
        let tensors = plan_tensors(&shape, options)?;
        let metadata = build_metadata(&shape, label, options);
        Ok(SynthModel {
            shape,
            options: options.clone(),
            metadata,
            tensors,
        })
    }

    /// What [`GgufWriter::new`](crate::gguf::GgufWriter::new) needs.
    pub fn specs(&self) -> Vec<TensorSpec> {
        self.tensors
            .iter()
            .map(|t| TensorSpec {
                name: t.name.clone(),
                shape: t.shape.clone(),
                ty: t.ty,
            })
            .collect()
    }

    /// Bytes of tensor data (without alignment padding).
    pub fn data_bytes(&self) -> u64 {
        self.tensors.iter().map(SynthTensor::data_bytes).sum()
    }

    /// Number of weights.
    pub fn n_params(&self) -> u64 {
        self.tensors.iter().map(|t| t.row_len() * t.n_rows()).sum()
    }

    /// Makes rows `rows` of tensor `index` and appends them, encoded in the
    /// tensor's type, to `out`. The bytes depend only on the seed, the tensor
    /// and the rows, so ranges may be made in parallel and concatenated.
    pub fn encode_rows(
        &self,
        index: usize,
        rows: Range<u64>,
        out: &mut Vec<u8>,
    ) -> Result<(), SynthError> {
        let Some(t) = self.tensors.get(index) else {
            return Err(SynthError::Invalid(format!(
                "tensor {index} does not exist; the model has {}",
                self.tensors.len()
            )));
        };
        if rows.end > t.n_rows() {
            return Err(SynthError::Invalid(format!(
                "{} has {} rows, not {}",
                t.name,
                t.n_rows(),
                rows.end
            )));
        }
        let mut values = vec![0.0f32; t.row_len() as usize];
        out.reserve((t.row_bytes() * (rows.end - rows.start)) as usize);
        for row in rows {
            t.row_values(self.options.seed, row, &mut values);
            reference::quantize(t.ty, &values, out).map_err(|source| SynthError::Encode {
                tensor: t.name.clone(),
                source,
            })?;
        }
        Ok(())
    }
}

/// Every tensor, in llama-quantize's order, typed by the recipe.
fn plan_tensors(
    shape: &SynthShape,
    options: &SynthOptions,
) -> Result<Vec<SynthTensor>, SynthError> {
    let mut tensors = global_tensors(shape, &options.scales);
    for layer in 0..shape.layers {
        tensors.extend(attention_tensors(shape, &options.scales, layer));
        tensors.extend(ffn_tensors(shape, options, layer));
    }
    let names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let order = recipe::quantize_order(&names);
    let mut tensors: Vec<SynthTensor> = order.into_iter().map(|i| tensors[i].clone()).collect();
    let refs: Vec<TensorRef<'_>> = tensors
        .iter()
        .map(|t| TensorRef {
            name: &t.name,
            shape: &t.shape,
            ty: GgmlType::F32,
        })
        .collect();
    let model = ModelShape {
        n_layer: shape.layers as usize,
        n_expert: shape.experts as usize,
        n_gqa: (shape.heads / shape.kv_heads) as usize,
    };
    let types = recipe::plan(options.ftype, options.pure, model, &refs);
    for (t, ty) in tensors.iter_mut().zip(types) {
        if ty.bytes_for(t.row_len()).is_none() || !reference::SUPPORTED.contains(&ty) {
            return Err(SynthError::Invalid(format!(
                "{}: rows of {} cannot be stored as {ty}; pick another --type",
                t.name,
                t.row_len()
            )));
        }
        t.ty = ty;
    }
    Ok(tensors)
}

fn global_tensors(s: &SynthShape, sc: &Scales) -> Vec<SynthTensor> {
    let mut v = vec![
        SynthTensor::new(
            "token_embd.weight".into(),
            vec![s.hidden, s.vocab],
            0.0,
            sc.embd,
        ),
        SynthTensor::new(
            "output_norm.weight".into(),
            vec![s.hidden],
            1.0,
            sc.norm_noise,
        ),
    ];
    if !s.tied {
        v.push(SynthTensor::new(
            "output.weight".into(),
            vec![s.hidden, s.vocab],
            0.0,
            sc.embd,
        ));
    }
    v
}

fn attention_tensors(s: &SynthShape, sc: &Scales, layer: u64) -> Vec<SynthTensor> {
    let name = |t: &str| format!("blk.{layer}.{t}");
    let norm = |t: &str, n: u64| SynthTensor::new(name(t), vec![n], 1.0, sc.norm_noise);
    let proj = |t: &str, shape: Vec<u64>| SynthTensor::new(name(t), shape, 0.0, sc.proj);
    let mut v = vec![
        norm("attn_norm.weight", s.hidden),
        proj("attn_q.weight", vec![s.hidden, s.q_dim()]),
        proj("attn_k.weight", vec![s.hidden, s.kv_dim()]),
        proj("attn_v.weight", vec![s.hidden, s.kv_dim()]),
        proj("attn_output.weight", vec![s.q_dim(), s.hidden]),
    ];
    if s.arch.has_qkv_bias() {
        for (t, n) in [("q", s.q_dim()), ("k", s.kv_dim()), ("v", s.kv_dim())] {
            v.push(SynthTensor::new(
                name(&format!("attn_{t}.bias")),
                vec![n],
                0.0,
                sc.bias,
            ));
        }
    }
    if s.arch.has_qk_norm() {
        v.push(norm("attn_q_norm.weight", s.head_dim));
        v.push(norm("attn_k_norm.weight", s.head_dim));
    }
    if s.arch == SynthArch::Gemma3 {
        v.push(norm("post_attention_norm.weight", s.hidden));
    }
    v
}

fn ffn_tensors(s: &SynthShape, options: &SynthOptions, layer: u64) -> Vec<SynthTensor> {
    let sc = &options.scales;
    let name = |t: &str| format!("blk.{layer}.{t}");
    let proj = |t: &str, shape: Vec<u64>| SynthTensor::new(name(t), shape, 0.0, sc.proj);
    let mut v = vec![SynthTensor::new(
        name("ffn_norm.weight"),
        vec![s.hidden],
        1.0,
        sc.norm_noise,
    )];
    if s.arch.is_moe() {
        let (e, f) = (s.experts, s.expert_ffn);
        let mut router = proj("ffn_gate_inp.weight", vec![s.hidden, e]);
        router.row_scales = router::router_row_scales(options.seed, layer, e, options.router_skew);
        v.push(router);
        v.push(proj("ffn_gate_exps.weight", vec![s.hidden, f, e]));
        v.push(proj("ffn_up_exps.weight", vec![s.hidden, f, e]));
        v.push(proj("ffn_down_exps.weight", vec![f, s.hidden, e]));
    } else {
        v.push(proj("ffn_gate.weight", vec![s.hidden, s.ffn]));
        v.push(proj("ffn_up.weight", vec![s.hidden, s.ffn]));
        v.push(proj("ffn_down.weight", vec![s.ffn, s.hidden]));
    }
    if s.arch == SynthArch::Gemma3 {
        v.push(SynthTensor::new(
            name("post_ffw_norm.weight"),
            vec![s.hidden],
            1.0,
            sc.norm_noise,
        ));
    }
    v
}

/// `general.*`, the architecture's keys, the tokenizer, then the two keys
/// llama-quantize appends last.
fn build_metadata(s: &SynthShape, label: &str, options: &SynthOptions) -> Metadata {
    let mut md = Metadata::new();
    let arch = s.arch.name();
    let text = |v: &str| Value::String(v.to_string());
    md.set("general.architecture", text(arch));
    md.set("general.type", text("model"));
    md.set("general.name", text(&format!("synthetic {label}")));
    // Skew 0 writes exactly the keys of the files made before the option.
    let skew = options.router_skew;
    let skew_note = if skew > 0.0 {
        format!(", router skew {skew}")
    } else {
        String::new()
    };
    md.set(
        "general.description",
        text(&format!(
            "random weights (hearth synth, seed {}{skew_note}): for benchmarks, not for text",
            options.seed
        )),
    );
    if skew > 0.0 {
        md.set("hearth.synth.router_skew", Value::F32(skew));
    }
    let u32_of = |v: u64| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    let key = |k: &str| format!("{arch}.{k}");
    for (k, v) in [
        ("vocab_size", s.vocab),
        ("context_length", s.context),
        ("embedding_length", s.hidden),
        ("block_count", s.layers),
        ("feed_forward_length", s.ffn),
        ("attention.head_count", s.heads),
        ("attention.head_count_kv", s.kv_heads),
        ("attention.key_length", s.head_dim),
        ("attention.value_length", s.head_dim),
        ("rope.dimension_count", s.head_dim),
    ] {
        md.set(&key(k), u32_of(v));
    }
    md.set(&key("rope.freq_base"), Value::F32(s.rope_base));
    md.set(
        &key("attention.layer_norm_rms_epsilon"),
        Value::F32(s.rms_eps),
    );
    if s.arch == SynthArch::Gemma3 {
        md.set(&key("attention.sliding_window"), u32_of(s.sliding_window));
    }
    if s.arch.is_moe() {
        md.set(&key("expert_count"), u32_of(s.experts));
        md.set(&key("expert_used_count"), u32_of(s.experts_used));
        md.set(&key("expert_feed_forward_length"), u32_of(s.expert_ffn));
    }
    add_tokenizer(&mut md, s);
    md.set(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    md.set("general.file_type", Value::U32(options.ftype.id()));
    md
}

fn add_tokenizer(md: &mut Metadata, s: &SynthShape) {
    let vocab = SynthVocab::new(s.vocab as usize);
    md.set("tokenizer.ggml.model", Value::String("llama".into()));
    md.set("tokenizer.ggml.pre", Value::String("default".into()));
    md.set(
        "tokenizer.ggml.tokens",
        Value::Array(Array::String(vocab.tokens)),
    );
    md.set(
        "tokenizer.ggml.scores",
        Value::Array(Array::F32(vocab.scores)),
    );
    md.set(
        "tokenizer.ggml.token_type",
        Value::Array(Array::I32(vocab.types)),
    );
    md.set("tokenizer.ggml.bos_token_id", Value::U32(vocab::BOS_ID));
    md.set("tokenizer.ggml.eos_token_id", Value::U32(vocab::EOS_ID));
    md.set("tokenizer.ggml.unknown_token_id", Value::U32(vocab::UNK_ID));
    md.set("tokenizer.ggml.add_bos_token", Value::Bool(true));
    md.set("tokenizer.ggml.add_eos_token", Value::Bool(false));
    // Gemma's SentencePiece adds no leading space; the others' do.
    md.set(
        "tokenizer.ggml.add_space_prefix",
        Value::Bool(s.arch != SynthArch::Gemma3),
    );
}

#[cfg(test)]
mod tests;
