//! The vocabulary as llama.cpp's `llama_vocab::impl::load` builds it from GGUF metadata:
//! token texts, scores and attributes, special token ids, flags and their per-model
//! defaults, and the auto-detected end-of-generation and control tokens.

use std::collections::BTreeSet;

use super::fxhash::FxHashMap;
use super::index::TokenIndex;

use super::hash_order::libstdcxx_iteration_order;
use super::pretokenize::SplitStep;
use super::TokenizerError;
use crate::gguf::{Array, Metadata, Value};

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// Which algorithm turns text into ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VocabType {
    /// SentencePiece (`tokenizer.ggml.model = "llama"`).
    Spm,
    /// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
    Bpe,
}

/// Special token ids (`None` = llama.cpp's `LLAMA_TOKEN_NULL`).
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Behaviour flags (llama.cpp's `add_bos`, `clean_spaces`, ...).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Flags {
    pub add_space_prefix: bool,
    pub add_bos: bool,
    pub add_eos: bool,
    pub ignore_merges: bool,
    pub clean_spaces: bool,
}

/// A loaded vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct Vocab {
    pub vtype: VocabType,
    /// `tokenizer.ggml.pre` (BPE; empty when absent).
    pub pre: String,
    /// BPE pre-tokenizer regexes, in order.
    pub split_steps: Vec<SplitStep>,
    pub texts: Vec<String>,
    pub scores: Vec<f32>,
    pub attrs: Vec<u32>,
    pub to_id: TokenIndex,
    pub special: SpecialIds,
    pub flags: Flags,
    pub eog: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the order in which
    /// llama.cpp splits text on them.
    pub special_cache: Vec<u32>,
    /// BPE merges: `"left right"` -> rank (first occurrence wins, like `emplace`).
    pub merges: FxHashMap<String, u32>,
    /// The newline token (`linefeed_id`).
    pub nl: Option<u32>,
}

/// Pre-tokenizer settings for one `tokenizer.ggml.pre` value.
struct PreConfig {
    steps: Vec<SplitStep>,
    clean_spaces: bool,
    ignore_merges: bool,
    add_bos: bool,
}

/// The `tokenizer.ggml.pre` values (BPE pre-tokenizers) Hearth reproduces exactly.
pub const SUPPORTED_PRE: &[&str] = &[
    "default",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "pixtral",
    "dbrx",
    "smaug-bpe",
    "gpt-2",
    "phi-2",
    "mpt",
    "olmo",
    "jais",
    "starcoder",
    "refact",
    "command-r",
    "smollm",
    "codeshell",
    "exaone",
    "qwen2",
    "deepseek-r1-qwen",
    "stablelm2",
    "megrez",
    "falcon",
];

fn pre_config(pre: &str) -> Option<PreConfig> {
    use SplitStep::*;
    let gpt2 = vec![Gpt2];
    let llama3 = vec![Llama3 { digits_max: 3 }];
    let cfg = |steps: Vec<SplitStep>, clean_spaces, ignore_merges, add_bos| PreConfig {
        steps,
        clean_spaces,
        ignore_merges,
        add_bos,
    };
    Some(match pre {
        "" | "default" => cfg(
            vec![
                PunctRuns { backtick: false },
                Gpt2,
                NumberRuns,
                AsciiDigitTriples,
            ],
            true,
            false,
            false,
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
            cfg(llama3, true, true, true)
        }
        "dbrx" | "smaug-bpe" => cfg(llama3, true, false, false),
        "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" => cfg(gpt2, true, false, false),
        "starcoder" | "refact" | "codeshell" | "exaone" => {
            cfg(vec![EachNumber, Gpt2], true, false, false)
        }
        "command-r" | "smollm" => cfg(vec![EachNumber, Gpt2], false, false, false),
        "qwen2" | "deepseek-r1-qwen" => cfg(vec![Llama3 { digits_max: 1 }], false, false, false),
        "stablelm2" | "megrez" => cfg(vec![Llama3 { digits_max: 1 }], true, false, false),
        "falcon" => cfg(
            vec![PunctRuns { backtick: true }, Gpt2, AsciiDigitTriples],
            true,
            false,
            false,
        ),
        _ => return None,
    })
}

/// Accessor of one field of [`SpecialIds`].
type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;

/// Reads an optional string array.
fn str_array<'a>(
    md: &'a Metadata,
    key: &'static str,
) -> Result<Option<&'a [String]>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(v) => match v.as_array() {
            Some(Array::String(s)) => Ok(Some(s)),
            _ => Err(TokenizerError::BadType {
                key,
                expected: "array of strings",
            }),
        },
    }
}

/// Reads an optional numeric array of at least `n` elements as `f32` (scores) or `i64` (types).
fn num_array(
    md: &Metadata,
    key: &'static str,
    n: usize,
) -> Result<Option<Vec<f64>>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let vals: Vec<f64> = match v.as_array() {
        Some(Array::F32(a)) => a.iter().map(|&x| f64::from(x)).collect(),
        Some(a) => match a.to_i64_vec() {
            Some(ints) => ints.into_iter().map(|x| x as f64).collect(),
            None => {
                return Err(TokenizerError::BadType {
                    key,
                    expected: "numeric array",
                })
            }
        },
        None => {
            return Err(TokenizerError::BadType {
                key,
                expected: "numeric array",
            })
        }
    };
    if vals.len() < n {
        return Err(TokenizerError::ShortArray {
            key,
            len: vals.len(),
            n_tokens: n,
        });
    }
    Ok(Some(vals))
}

/// llama.cpp's token type -> attribute mapping.
fn type_to_attr(t: i64) -> u32 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0,
    }
}

impl Vocab {
    /// Builds the vocabulary from GGUF metadata (`llama_vocab::impl::load`).
    pub(crate) fn from_metadata(md: &Metadata) -> Result<Self, TokenizerError> {
        let model = md
            .get_str("tokenizer.ggml.model")
            .ok_or(TokenizerError::MissingKey("tokenizer.ggml.model"))?;
        let pre = md.get_str("tokenizer.ggml.pre").unwrap_or("").to_string();
        let (vtype, mut special, mut flags, split_steps) = model_defaults(model, &pre)?;
        if let Some(v) = md.get_bool("tokenizer.ggml.add_space_prefix") {
            flags.add_space_prefix = v;
        }
        let merges = match vtype {
            VocabType::Bpe => read_merges(md)?,
            VocabType::Spm => FxHashMap::default(),
        };
        let TokenTable {
            texts,
            index: to_id,
            scores,
            attrs,
        } = read_tokens(md)?;
        let n = texts.len();
        let mut vocab = Vocab {
            vtype,
            pre,
            split_steps,
            texts,
            scores,
            attrs,
            to_id,
            special: SpecialIds::default(),
            flags,
            eog: BTreeSet::new(),
            special_cache: Vec::new(),
            merges,
            nl: None,
        };
        vocab.nl = vocab.find_newline();
        read_special_ids(md, n, &mut special);
        vocab.special = special;
        if let Some(v) = md.get_bool("tokenizer.ggml.add_bos_token") {
            vocab.flags.add_bos = v;
        }
        if let Some(v) = md.get_bool("tokenizer.ggml.add_eos_token") {
            vocab.flags.add_eos = v;
        }
        vocab.detect_special_tokens();
        vocab.build_special_cache();
        vocab.apply_model_attrs(md.get_str("general.name").unwrap_or(""));
        Ok(vocab)
    }

    /// The id of exactly `text`, if it is a token.
    pub(crate) fn text_to_token(&self, text: &str) -> Option<u32> {
        self.to_id.get(&self.texts, text)
    }

    /// The attribute bits of `id` (0 for ids outside the vocabulary).
    pub(crate) fn attr(&self, id: u32) -> u32 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// SPM byte fallback token for `b` (`byte_to_token`): `<0xXX>`, else the byte as text.
    pub(crate) fn byte_to_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        self.text_to_token(&hex).or_else(|| {
            std::str::from_utf8(&[b])
                .ok()
                .and_then(|s| self.text_to_token(s))
        })
    }

    fn find_newline(&self) -> Option<u32> {
        match self.vtype {
            VocabType::Spm => self.byte_to_token(b'\n').or(self.special.pad),
            // llama.cpp tokenizes "\n" with the BPE tokenizer: byte-encoded it is U+010A.
            VocabType::Bpe => self.text_to_token("\u{10A}").or(self.special.pad),
        }
    }

    /// Auto-detection of EOT/EOM/FIM and end-of-generation tokens by their text, unused
    /// control tokens, and the attribute overrides that come with them.
    fn detect_special_tokens(&mut self) {
        let roles: [(&[&str], Slot); 8] = [
            (EOT_TEXTS, |s| &mut s.eot),
            (&["<|eom_id|>"], |s| &mut s.eom),
            (FIM_PRE_TEXTS, |s| &mut s.fim_pre),
            (FIM_SUF_TEXTS, |s| &mut s.fim_suf),
            (FIM_MID_TEXTS, |s| &mut s.fim_mid),
            (FIM_PAD_TEXTS, |s| &mut s.fim_pad),
            (FIM_REP_TEXTS, |s| &mut s.fim_rep),
            (&["<|file_sep|>"], |s| &mut s.fim_sep),
        ];
        let mut order: Option<Vec<u32>> = None;
        for (texts, slot) in roles {
            if slot(&mut self.special).is_some() {
                continue;
            }
            let ids: Vec<u32> = texts.iter().filter_map(|t| self.text_to_token(t)).collect();
            let chosen = match ids.len() {
                0 => continue,
                1 => ids[0],
                // Several candidates: llama.cpp takes the first in its hash map's iteration order.
                _ => {
                    let order = order.get_or_insert_with(|| {
                        libstdcxx_iteration_order(&self.texts, |t| self.text_to_token(t))
                    });
                    match order.iter().find(|id| ids.contains(id)) {
                        Some(&id) => id,
                        None => ids[0],
                    }
                }
            };
            *slot(&mut self.special) = Some(chosen);
            self.attrs[chosen as usize] |= attr::CONTROL;
        }
        for id in self.to_id.ids() {
            let a = &mut self.attrs[id as usize];
            if *a & attr::CONTROL != 0 && self.texts[id as usize].contains("unused") {
                *a |= attr::UNUSED;
            }
        }
        self.collect_eog();
    }

    fn collect_eog(&mut self) {
        let s = &self.special;
        let mut eog: BTreeSet<u32> = [s.fim_pad, s.fim_rep, s.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for text in EOG_TEXTS {
            if let Some(id) = self.text_to_token(text) {
                eog.insert(id);
                self.attrs[id as usize] |= attr::CONTROL;
            }
        }
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.text_to_token(text) {
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        let s = &self.special;
        eog.extend([s.eos, s.eot, s.eom].into_iter().flatten());
        let find = |eog: &BTreeSet<u32>, t: &str| {
            eog.iter().copied().find(|&id| self.texts[id as usize] == t)
        };
        let has = |eog: &BTreeSet<u32>, t: &str| find(eog, t).is_some();
        let mut reset: Vec<(u32, u32)> = Vec::new();
        if let Some(end) = find(&eog, "<|end|>") {
            let call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
            if call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>")) {
                eog.remove(&end);
                reset.push((end, attr::USER_DEFINED));
            }
        }
        if let Some(s_id) = find(&eog, "</s>") {
            if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
                eog.remove(&s_id);
                reset.push((s_id, attr::NORMAL));
            }
        }
        for (id, a) in reset {
            self.attrs[id as usize] = a;
        }
        self.eog = eog;
    }

    fn build_special_cache(&mut self) {
        let mask = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut cache: Vec<u32> = (0..self.texts.len() as u32)
            .filter(|&id| self.attrs[id as usize] & mask != 0)
            .collect();
        // Longest text first; llama.cpp's sort is not stable, ties keep id order here.
        cache.sort_by_key(|&id| std::cmp::Reverse(self.texts[id as usize].len()));
        self.special_cache = cache;
    }

    /// Per-model strip attributes llama.cpp sets by model name: Phi-3 strips whitespace
    /// after its special tokens, ModernBERT before `[MASK]`. (llama.cpp fails to load
    /// such a model when one of the named tokens is missing; here it is skipped.)
    fn apply_model_attrs(&mut self, general_name: &str) {
        let name = general_name.to_ascii_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &self.special_cache {
                self.attrs[id as usize] |= attr::RSTRIP;
            }
            self.set_attr("</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                self.set_attr(t, attr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            self.set_attr("[MASK]", attr::LSTRIP, true);
        }
    }

    fn set_attr(&mut self, text: &str, bit: u32, on: bool) {
        if let Some(id) = self.text_to_token(text) {
            let a = &mut self.attrs[id as usize];
            *a = if on { *a | bit } else { *a & !bit };
        }
    }
}

/// Per-model-type defaults: (type, special ids, flags, pre-tokenizer steps).
fn model_defaults(
    model: &str,
    pre: &str,
) -> Result<(VocabType, SpecialIds, Flags, Vec<SplitStep>), TokenizerError> {
    match model {
        "llama" => {
            let special = SpecialIds {
                bos: Some(1),
                eos: Some(2),
                unk: Some(0),
                ..Default::default()
            };
            let flags = Flags {
                add_space_prefix: true,
                add_bos: true,
                ..Default::default()
            };
            Ok((VocabType::Spm, special, flags, Vec::new()))
        }
        "gpt2" => {
            let cfg = pre_config(pre).ok_or_else(|| TokenizerError::UnsupportedPre {
                pre: pre.to_string(),
                supported: SUPPORTED_PRE.join(", "),
            })?;
            let special = SpecialIds {
                bos: Some(11),
                eos: Some(11),
                ..Default::default()
            };
            let flags = Flags {
                add_bos: cfg.add_bos,
                ignore_merges: cfg.ignore_merges,
                clean_spaces: cfg.clean_spaces,
                ..Default::default()
            };
            Ok((VocabType::Bpe, special, flags, cfg.steps))
        }
        other => Err(TokenizerError::UnsupportedModel(other.to_string())),
    }
}

/// The per-token arrays of the metadata.
struct TokenTable {
    /// Texts; empty ones renamed `[EMPTY_i]` as llama.cpp does.
    texts: Vec<String>,
    /// Text -> id (duplicates keep the last id).
    index: TokenIndex,
    scores: Vec<f32>,
    attrs: Vec<u32>,
}

fn read_tokens(md: &Metadata) -> Result<TokenTable, TokenizerError> {
    let tokens = str_array(md, "tokenizer.ggml.tokens")?
        .ok_or(TokenizerError::MissingKey("tokenizer.ggml.tokens"))?;
    let n = tokens.len();
    let texts: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if w.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                w.clone()
            }
        })
        .collect();
    let scores = match md.get("tokenizer.ggml.scores") {
        Some(Value::Array(Array::F32(s))) if s.len() >= n => s[..n].to_vec(),
        Some(_) => num_array(md, "tokenizer.ggml.scores", n)?
            .map(|v| v.into_iter().take(n).map(|x| x as f32).collect())
            .unwrap_or_default(),
        None => vec![0.0; n],
    };
    let attrs = match md.get("tokenizer.ggml.token_type") {
        Some(Value::Array(Array::I32(t))) if t.len() >= n => {
            t[..n].iter().map(|&x| type_to_attr(i64::from(x))).collect()
        }
        Some(_) => num_array(md, "tokenizer.ggml.token_type", n)?
            .map(|v| {
                v.into_iter()
                    .take(n)
                    .map(|x| type_to_attr(x as i64))
                    .collect()
            })
            .unwrap_or_default(),
        None => vec![attr::NORMAL; n],
    };
    let index = TokenIndex::new(&texts);
    Ok(TokenTable {
        texts,
        index,
        scores,
        attrs,
    })
}

fn read_merges(md: &Metadata) -> Result<FxHashMap<String, u32>, TokenizerError> {
    let list = str_array(md, "tokenizer.ggml.merges")?
        .ok_or(TokenizerError::MissingKey("tokenizer.ggml.merges"))?;
    let mut merges = FxHashMap::with_capacity_and_hasher(list.len(), Default::default());
    for (i, m) in list.iter().enumerate() {
        merges.entry(m.clone()).or_insert(i as u32);
    }
    Ok(merges)
}

/// Overrides the default special ids with those in the metadata; ids outside the
/// vocabulary are ignored (defaults outside it are disabled), as llama.cpp does.
fn read_special_ids(md: &Metadata, n: usize, s: &mut SpecialIds) {
    let keys: [(&str, Slot); 17] = [
        ("bos_token_id", |s| &mut s.bos),
        ("eos_token_id", |s| &mut s.eos),
        ("eot_token_id", |s| &mut s.eot),
        ("eom_token_id", |s| &mut s.eom),
        ("unknown_token_id", |s| &mut s.unk),
        ("seperator_token_id", |s| &mut s.sep),
        ("padding_token_id", |s| &mut s.pad),
        ("mask_token_id", |s| &mut s.mask),
        ("fim_pre_token_id", |s| &mut s.fim_pre),
        ("fim_suf_token_id", |s| &mut s.fim_suf),
        ("fim_mid_token_id", |s| &mut s.fim_mid),
        ("fim_pad_token_id", |s| &mut s.fim_pad),
        ("fim_rep_token_id", |s| &mut s.fim_rep),
        ("fim_sep_token_id", |s| &mut s.fim_sep),
        ("prefix_token_id", |s| &mut s.fim_pre),
        ("suffix_token_id", |s| &mut s.fim_suf),
        ("middle_token_id", |s| &mut s.fim_mid),
    ];
    for (key, slot) in keys {
        let slot = slot(s);
        if slot.is_some_and(|id| id as usize >= n) {
            *slot = None;
        }
        if let Some(id) = md.get_u32(&format!("tokenizer.ggml.{key}")) {
            if (id as usize) < n {
                *slot = Some(id);
            }
        }
    }
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
