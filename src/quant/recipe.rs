//! Which type each tensor gets when a model is quantized: llama.cpp's file
//! types (`Q4_K_M`, `Q8_0`, ...) and its per-tensor rules
//! (`llama_tensor_get_type`), so a model quantized by Hearth has the same
//! tensor types, order and bytes as one made by `llama-quantize`.

use std::cmp::Ordering;

use super::GgmlType;

/// A llama.cpp file type (`general.file_type`): a default tensor type plus a
/// recipe for the tensors that get more bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types, missing_docs)] // llama.cpp's names
pub enum FileType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
}

/// `(file type, name, llama_ftype id, default tensor type)`.
const FILE_TYPES: &[(FileType, &str, u32, GgmlType)] = &[
    (FileType::F32, "F32", 0, GgmlType::F32),
    (FileType::F16, "F16", 1, GgmlType::F16),
    (FileType::BF16, "BF16", 32, GgmlType::BF16),
    (FileType::Q4_0, "Q4_0", 2, GgmlType::Q4_0),
    (FileType::Q4_1, "Q4_1", 3, GgmlType::Q4_1),
    (FileType::Q5_0, "Q5_0", 8, GgmlType::Q5_0),
    (FileType::Q5_1, "Q5_1", 9, GgmlType::Q5_1),
    (FileType::Q8_0, "Q8_0", 7, GgmlType::Q8_0),
    (FileType::Q2_K, "Q2_K", 10, GgmlType::Q2_K),
    (FileType::Q3_K_S, "Q3_K_S", 11, GgmlType::Q3_K),
    (FileType::Q3_K_M, "Q3_K_M", 12, GgmlType::Q3_K),
    (FileType::Q3_K_L, "Q3_K_L", 13, GgmlType::Q3_K),
    (FileType::Q4_K_S, "Q4_K_S", 14, GgmlType::Q4_K),
    (FileType::Q4_K_M, "Q4_K_M", 15, GgmlType::Q4_K),
    (FileType::Q5_K_S, "Q5_K_S", 16, GgmlType::Q5_K),
    (FileType::Q5_K_M, "Q5_K_M", 17, GgmlType::Q5_K),
    (FileType::Q6_K, "Q6_K", 18, GgmlType::Q6_K),
    (FileType::IQ4_NL, "IQ4_NL", 25, GgmlType::IQ4_NL),
    (FileType::IQ4_XS, "IQ4_XS", 30, GgmlType::IQ4_XS),
];

impl FileType {
    /// Parses a name as llama-quantize takes it, case-insensitive; `Q3_K`,
    /// `Q4_K` and `Q5_K` mean their `_M` recipes, as there.
    pub fn from_name(name: &str) -> Option<Self> {
        let upper = name.to_ascii_uppercase();
        let name = match upper.as_str() {
            "Q3_K" => "Q3_K_M",
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            other => other,
        };
        FILE_TYPES.iter().find(|r| r.1 == name).map(|r| r.0)
    }

    /// Every name [`FileType::from_name`] accepts, for messages.
    pub fn names() -> Vec<&'static str> {
        FILE_TYPES.iter().map(|r| r.1).collect()
    }

    fn row(self) -> &'static (FileType, &'static str, u32, GgmlType) {
        // FILE_TYPES has a row for every variant (checked by a test).
        FILE_TYPES
            .iter()
            .find(|r| r.0 == self)
            .unwrap_or(&FILE_TYPES[0])
    }

    /// llama.cpp's name.
    pub fn name(self) -> &'static str {
        self.row().1
    }

    /// The value stored in `general.file_type`.
    pub fn id(self) -> u32 {
        self.row().2
    }

    /// The type most tensors get.
    pub fn default_type(self) -> GgmlType {
        self.row().3
    }
}

/// What the recipe needs to know about the model.
#[derive(Debug, Clone, Copy)]
pub struct ModelShape {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Experts per MoE layer (0 or 1 when dense).
    pub n_expert: usize,
    /// Query heads per key/value head.
    pub n_gqa: usize,
}

/// A tensor as the recipe sees it.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    /// Name (`blk.3.attn_v.weight`).
    pub name: &'a str,
    /// ggml shape (`shape[0]` is the row length).
    pub shape: &'a [u64],
    /// Its type in the input file.
    pub ty: GgmlType,
}

/// The order llama-quantize writes tensors in: by layer (non-layer tensors
/// first), then by name. Returns indices into `names`.
pub fn quantize_order(names: &[&str]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| compare_weight_names(names[a], names[b]));
    order
}

fn compare_weight_names(a: &str, b: &str) -> Ordering {
    layer_of(a).cmp(&layer_of(b)).then_with(|| a.cmp(b))
}

/// The `N` of `blk.N.`, or -1 for tensors outside the blocks.
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnQkv,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return TokenEmbd;
    }
    let table = [
        ("attn_qkv.weight", AttnQkv),
        ("attn_kv_b.weight", AttnV),
        ("attn_v.weight", AttnV),
        ("attn_k.weight", AttnK),
        ("attn_q.weight", AttnQ),
        ("attn_output.weight", AttnOutput),
        ("ffn_up", FfnUp),
        ("ffn_gate", FfnGate),
        ("ffn_down", FfnDown),
    ];
    table
        .iter()
        .find(|(pat, _)| name.contains(pat))
        .map_or(Other, |&(_, c)| c)
}

/// llama.cpp's `tensor_allows_quantization` for the architectures Hearth reads.
pub fn allows_quantization(t: &TensorRef<'_>) -> bool {
    let n_dims = t.shape.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    n_dims >= 2
        && t.name.ends_with("weight")
        && !t.name.contains("_norm.weight")
        && !t.name.contains("ffn_gate_inp.weight")
        && !t.name.contains("altup")
        && !t.name.contains("laurel")
        && !t.name.contains("per_layer_model_proj")
        && !t.name.contains("ssm_conv1d")
        && t.name != "position_embd.weight"
        && t.name != "token_types.weight"
}

/// Chooses the type of every tensor, in the order given (which must be
/// [`quantize_order`]'s: the recipe counts attention-V and FFN-down tensors
/// as it goes, as llama.cpp does).
pub fn plan(
    ftype: FileType,
    pure: bool,
    model: ModelShape,
    tensors: &[TensorRef<'_>],
) -> Vec<GgmlType> {
    let mut state = RecipeState {
        ftype,
        model,
        n_attention_wv: tensors
            .iter()
            .filter(|t| matches!(category(t.name), Category::AttnV | Category::AttnQkv))
            .count(),
        has_tied_embeddings: !tensors.iter().any(|t| t.name == "output.weight"),
        i_attention_wv: 0,
        i_ffn_down: 0,
    };
    tensors.iter().map(|t| state.tensor_type(t, pure)).collect()
}

struct RecipeState {
    ftype: FileType,
    model: ModelShape,
    n_attention_wv: usize,
    has_tied_embeddings: bool,
    i_attention_wv: usize,
    i_ffn_down: usize,
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third between.
fn use_more_bits(i: usize, n: usize) -> bool {
    let (i, n) = (i as i64, n as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

impl RecipeState {
    fn tensor_type(&mut self, t: &TensorRef<'_>, pure: bool) -> GgmlType {
        if !allows_quantization(t) {
            return t.ty;
        }
        let default = self.ftype.default_type();
        if !default.is_quantized() {
            return default;
        }
        let chosen = if pure {
            default
        } else {
            self.mixture_type(t, default)
        };
        fallback(t.shape[0], chosen)
    }

    /// `llama_tensor_get_type_impl` for the file types of [`FileType`].
    fn mixture_type(&mut self, t: &TensorRef<'_>, default: GgmlType) -> GgmlType {
        use FileType as F;
        use GgmlType as G;
        let cat = category(t.name);
        let ft = self.ftype;
        let n_expert = self.model.n_expert;
        if cat == Category::Output || (self.has_tied_embeddings && cat == Category::TokenEmbd) {
            let nx = t.shape[0] as usize;
            return if !nx.is_multiple_of(default.block_elems()) {
                G::Q8_0
            } else if default != G::Q8_0 {
                G::Q6_K
            } else {
                default
            };
        }
        match cat {
            // llama.cpp sends fused QKV down the attention-V branch too.
            Category::AttnV | Category::AttnQkv => {
                let gqa4 = self.model.n_gqa >= 4;
                let i = self.i_attention_wv;
                let mut ty = match ft {
                    F::Q2_K if gqa4 => G::Q4_K,
                    F::Q2_K => G::Q3_K,
                    F::Q3_K_M if i < 2 => G::Q5_K,
                    F::Q3_K_M => G::Q4_K,
                    F::Q3_K_L => G::Q5_K,
                    F::IQ4_NL | F::IQ4_XS if gqa4 => G::Q5_K,
                    F::Q4_K_M | F::Q5_K_M if use_more_bits(i, self.n_attention_wv) => G::Q6_K,
                    F::Q4_K_S if i < 4 => G::Q5_K,
                    _ => default,
                };
                if n_expert == 8 {
                    ty = G::Q8_0;
                }
                self.i_attention_wv += 1;
                ty
            }
            Category::AttnK if n_expert == 8 => G::Q8_0,
            Category::FfnDown => {
                let ty = self.ffn_down_type(t.name, default);
                self.i_ffn_down += 1;
                ty
            }
            Category::AttnOutput if n_expert == 8 => match ft {
                F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::IQ4_NL | F::Q4_K_S | F::Q4_K_M | F::IQ4_XS => {
                    G::Q5_K
                }
                _ => default,
            },
            Category::AttnOutput => match ft {
                F::Q2_K => G::Q3_K,
                F::Q3_K_M => G::Q4_K,
                F::Q3_K_L => G::Q5_K,
                _ => default,
            },
            _ => default,
        }
    }

    fn ffn_down_type(&self, name: &str, default: GgmlType) -> GgmlType {
        use FileType as F;
        use GgmlType as G;
        let n = self.model.n_layer;
        // MoE expert tensors are not consecutive: take the layer from the name.
        let i = if self.model.n_expert > 1 {
            usize::try_from(layer_of(name)).unwrap_or(self.i_ffn_down)
        } else {
            self.i_ffn_down
        };
        match self.ftype {
            F::Q2_K => G::Q3_K,
            F::Q3_K_M if i < n / 16 => G::Q5_K,
            F::Q3_K_M => G::Q4_K,
            F::Q3_K_L => G::Q5_K,
            F::Q4_K_M if use_more_bits(i, n) => G::Q6_K,
            F::IQ4_NL | F::IQ4_XS if i < n / 8 => G::Q5_K,
            F::Q5_K_M if use_more_bits(i, n) => G::Q6_K,
            F::Q4_K_S if i < n / 8 => G::Q5_K,
            _ => default,
        }
    }
}

/// llama.cpp's `tensor_type_fallback`: a type whose block does not divide the
/// row length is replaced by a 32-element one, or F16 when none fits.
fn fallback(ncols: u64, ty: GgmlType) -> GgmlType {
    use GgmlType as G;
    if ncols.is_multiple_of(ty.block_elems() as u64) {
        return ty;
    }
    let replacement = match ty {
        G::IQ4_XS => G::IQ4_NL,
        G::Q2_K | G::Q3_K => G::Q4_0,
        G::Q4_K => G::Q5_0,
        G::Q5_K => G::Q5_1,
        G::Q6_K => G::Q8_0,
        other => other,
    };
    if ncols.is_multiple_of(replacement.block_elems() as u64) {
        replacement
    } else {
        G::F16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &(ft, name, _, _) in FILE_TYPES {
            assert_eq!(FileType::from_name(name), Some(ft));
            assert_eq!(FileType::from_name(&name.to_lowercase()), Some(ft));
            assert_eq!(ft.name(), name);
        }
        assert_eq!(FileType::from_name("q4_k"), Some(FileType::Q4_K_M));
        assert_eq!(FileType::from_name("Q9_9"), None);
    }

    #[test]
    fn order_is_by_layer_then_name() {
        let names = [
            "output.weight",
            "blk.10.a",
            "blk.2.b",
            "blk.2.a",
            "token_embd.weight",
        ];
        let order: Vec<&str> = quantize_order(&names)
            .into_iter()
            .map(|i| names[i])
            .collect();
        assert_eq!(
            order,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
    }

    #[test]
    fn fallback_follows_llama_cpp() {
        assert_eq!(fallback(576, GgmlType::Q4_K), GgmlType::Q5_0);
        assert_eq!(fallback(576, GgmlType::Q6_K), GgmlType::Q8_0);
        assert_eq!(fallback(576, GgmlType::IQ4_XS), GgmlType::IQ4_NL);
        assert_eq!(fallback(512, GgmlType::Q4_K), GgmlType::Q4_K);
        assert_eq!(fallback(100, GgmlType::Q4_K), GgmlType::F16);
    }

    #[test]
    fn q4_k_m_gives_more_bits_where_llama_cpp_does() {
        let shape = [256u64, 256];
        let names = [
            "token_embd.weight",
            "blk.0.attn_v.weight",
            "blk.0.ffn_down.weight",
            "blk.0.attn_norm.weight",
            "blk.1.attn_v.weight",
            "blk.1.ffn_down.weight",
        ];
        let tensors: Vec<TensorRef<'_>> = names
            .iter()
            .map(|name| TensorRef {
                name,
                shape: if name.contains("norm") {
                    &shape[..1]
                } else {
                    &shape
                },
                ty: GgmlType::F32,
            })
            .collect();
        let model = ModelShape {
            n_layer: 2,
            n_expert: 0,
            n_gqa: 2,
        };
        let types = plan(FileType::Q4_K_M, false, model, &tensors);
        use GgmlType::*;
        // Tied embeddings take the output's Q6_K; of 2 layers only the last "uses more bits".
        assert_eq!(types, [Q6_K, Q4_K, Q4_K, F32, Q6_K, Q6_K]);
        let pure = plan(FileType::Q4_K_M, true, model, &tensors);
        assert_eq!(pure, [Q4_K, Q4_K, Q4_K, F32, Q4_K, Q4_K]);
    }
}
