//! Tokenizers built from GGUF metadata, giving the same ids as llama.cpp.
//!
//! Two algorithms, chosen by `tokenizer.ggml.model`:
//! - `"gpt2"`: byte-level BPE. `tokenizer.ggml.pre` picks the pre-tokenizer (the
//!   regexes that split text into words) exactly as llama.cpp's `llama-vocab.cpp` does;
//!   see [`SUPPORTED_PRE`]. Merges come from `tokenizer.ggml.merges`.
//! - `"llama"`: SentencePiece with scores, token types and `<0xXX>` byte fallback
//!   (Llama 2, Gemma 3, ...).
//!
//! With `parse_special` the text is first split on the strings of control, unknown and
//! user-defined tokens (user-defined ones are always split out), as llama.cpp's
//! `tokenizer_st_partition` does; `add_special` adds BOS / EOS as the model's
//! `tokenizer.ggml.add_bos_token` / `add_eos_token` say (llama.cpp's per-model defaults
//! when absent: SPM adds BOS, BPE does not except the Llama 3 family).
//!
//! ```no_run
//! # fn demo(md: &hearth::gguf::Metadata) -> Result<(), hearth::model::tokenizer::TokenizerError> {
//! use hearth::model::tokenizer::{StreamDecoder, Tokenizer};
//! let tok = Tokenizer::from_metadata(md)?;
//! let ids = tok.encode("Hello world", true, true)?;
//! assert_eq!(tok.decode(&ids, true, false), "Hello world");
//! let mut stream = StreamDecoder::new(&tok, false);
//! let text: String = ids.iter().map(|&id| stream.push(id)).collect();
//! # Ok(()) }
//! ```

mod bpe;
mod detok;
mod fxhash;
mod hash_order;
mod index;
mod merge;
mod pretokenize;
mod special;
mod spm;
mod unicode;
mod unicode_data;
mod vocab;

use thiserror::Error;

pub(crate) use detok::take_complete_utf8;
pub use detok::StreamDecoder;
pub use vocab::SUPPORTED_PRE;

use special::{Fragment, SpecialTrie};
use vocab::{attr, Vocab, VocabType};

/// Errors building or running a tokenizer.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required metadata key is missing.
    #[error("tokenizer metadata key {0} is missing; the GGUF file has no usable vocabulary")]
    MissingKey(&'static str),
    /// A metadata key has the wrong type.
    #[error("tokenizer metadata key {key} should be an {expected}; the GGUF file looks damaged")]
    BadType {
        /// The key.
        key: &'static str,
        /// What it should hold.
        expected: &'static str,
    },
    /// A per-token array is shorter than the token list.
    #[error("tokenizer metadata {key} has {len} entries for {n_tokens} tokens; the GGUF file looks damaged")]
    ShortArray {
        /// The key.
        key: &'static str,
        /// Its length.
        len: usize,
        /// Number of tokens.
        n_tokens: usize,
    },
    /// `tokenizer.ggml.model` names an algorithm Hearth does not implement.
    #[error("tokenizer model {0:?} is not supported (supported: \"gpt2\" byte-level BPE, \"llama\" SentencePiece)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a BPE pre-tokenizer Hearth does not implement.
    #[error("BPE pre-tokenizer {pre:?} is not supported; supported: {supported}")]
    UnsupportedPre {
        /// The value in the file.
        pre: String,
        /// The supported values, comma separated.
        supported: String,
    },
    /// The model asks for a special token it does not define.
    #[error("the model adds a {0} token but defines none (tokenizer.ggml.{0}_token_id); encode with add_special = false")]
    MissingSpecial(&'static str),
}

/// Which algorithm a [`Tokenizer`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenizerKind {
    /// Byte-level BPE with the named pre-tokenizer (`tokenizer.ggml.pre`, `""` if absent).
    Bpe {
        /// The pre-tokenizer name.
        pre: String,
    },
    /// SentencePiece.
    Spm,
}

/// A tokenizer built from a model's GGUF metadata. Immutable and cheap to share;
/// encoding allocates only per call.
#[derive(Clone)]
pub struct Tokenizer {
    vocab: Vocab,
    trie: SpecialTrie,
}

impl std::fmt::Debug for Tokenizer {
    /// A summary; the vocabulary itself is too large to print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos())
            .field("eos", &self.eos())
            .field("eot", &self.eot())
            .field("add_bos_eos", &self.adds_bos_eos())
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the `tokenizer.ggml.*` keys of `md`.
    pub fn from_metadata(md: &crate::gguf::Metadata) -> Result<Self, TokenizerError> {
        let vocab = Vocab::from_metadata(md)?;
        let trie = SpecialTrie::new(&vocab);
        let mut tok = Tokenizer { vocab, trie };
        if tok.vocab.vtype == VocabType::Bpe {
            // llama.cpp takes the newline token from tokenizing "\n".
            let nl = tok.encode("\n", false, false)?.first().copied();
            tok.vocab.nl = nl.or(tok.vocab.special.pad);
        }
        Ok(tok)
    }

    /// Text to ids, as `llama_tokenize(text, add_special, parse_special)`.
    ///
    /// `add_special` adds BOS (and EOS) where the model's flags say so; `parse_special`
    /// turns control-token text such as `<|im_start|>` into its id (otherwise it is
    /// tokenized as plain text). Errors only when the model asks for a BOS/EOS it lacks.
    pub fn encode(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let v = &self.vocab;
        let fragments = special::partition(v, &self.trie, text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.flags.add_bos {
            out.push(v.special.bos.ok_or(TokenizerError::MissingSpecial("bos"))?);
        }
        let mut prev_special = true;
        let mut buf = String::new();
        for frag in fragments {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(r) if v.vtype == VocabType::Spm => {
                    buf.clear();
                    if v.flags.add_space_prefix && prev_special {
                        buf.push('\u{2581}');
                    }
                    for c in text[r].chars() {
                        buf.push(if c == ' ' { '\u{2581}' } else { c });
                    }
                    spm::tokenize(v, &buf, &mut out);
                    prev_special = false;
                }
                Fragment::Text(r) => bpe::tokenize(v, &text[r], &mut out),
            }
        }
        if add_special && v.flags.add_eos {
            out.push(v.special.eos.ok_or(TokenizerError::MissingSpecial("eos"))?);
        }
        Ok(out)
    }

    /// The bytes of token `id`, as `llama_token_to_piece(id, lstrip = 0, special)`.
    /// Control and unknown tokens are empty unless `special`. A piece may be part of a
    /// UTF-8 character; use [`StreamDecoder`] to turn a stream of ids into text.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        detok::token_to_piece(&self.vocab, id, 0, special)
    }

    /// Ids to bytes, as `llama_detokenize(ids, remove_special, unparse_special)`:
    /// `remove_special` drops a leading BOS / trailing EOS the model would have added,
    /// `unparse_special` renders control tokens as their text.
    pub fn decode_bytes(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Vec<u8> {
        detok::detokenize(&self.vocab, ids, remove_special, unparse_special)
    }

    /// [`Tokenizer::decode_bytes`] as a string (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, remove_special, unparse_special))
            .into_owned()
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.texts.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.vocab.special.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.vocab.special.eos
    }

    /// End-of-turn token (`tokenizer.ggml.eot_token_id`, or found by its text as llama.cpp does).
    pub fn eot(&self) -> Option<u32> {
        self.vocab.special.eot
    }

    /// The newline token (llama.cpp's `llama_vocab_nl`).
    pub fn nl(&self) -> Option<u32> {
        self.vocab.nl
    }

    /// Whether `id` ends generation (EOS, EOT, EOM and the end tokens llama.cpp knows by text).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// Whether `id` is a control token (rendered only with `special`).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }

    /// Whether encoding with `add_special` adds BOS / EOS.
    pub fn adds_bos_eos(&self) -> (bool, bool) {
        (self.vocab.flags.add_bos, self.vocab.flags.add_eos)
    }

    /// The stored text of token `id` (`llama_vocab_get_text`), if it exists.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The algorithm and pre-tokenizer.
    pub fn kind(&self) -> TokenizerKind {
        match self.vocab.vtype {
            VocabType::Spm => TokenizerKind::Spm,
            VocabType::Bpe => TokenizerKind::Bpe {
                pre: self.vocab.pre.clone(),
            },
        }
    }
}
