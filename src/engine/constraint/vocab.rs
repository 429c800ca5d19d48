//! The vocabulary as llguidance sees it: every token's bytes in a
//! [`TokTrie`], end-of-generation tokens as its EOS set, and the engine's
//! own tokenizer for the text a grammar forces.

use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::model::tokenizer::{Tokenizer, TokenizerKind};

/// A [`TokenizerEnv`] over a Hearth [`Tokenizer`].
pub(super) struct VocabEnv {
    trie: TokTrie,
    /// The tokenizer for forced text, where its output is canonical (BPE:
    /// the ids the model would see for that text). SentencePiece adds a
    /// space prefix at the start of every text it encodes, so its
    /// tokenization of a fragment is not the fragment's tokens; llguidance
    /// then works from byte prefixes instead.
    canonical: Option<Tokenizer>,
}

impl VocabEnv {
    /// The environment of `tokenizer`, with `eog` (not empty) as the tokens
    /// that end a completed grammar.
    pub(super) fn new(tokenizer: &Tokenizer, eog: &[u32]) -> Self {
        let n = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32).map(|id| token_bytes(tokenizer, id)).collect();
        let mut info = TokRxInfo::new(n as u32, eog[0]);
        info.tok_bos = tokenizer.bos();
        info.tok_end_of_turn = tokenizer.eot();
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eog);
        let canonical = match tokenizer.kind() {
            TokenizerKind::Bpe { .. } => Some(tokenizer.clone()),
            TokenizerKind::Spm => None,
        };
        VocabEnv { trie, canonical }
    }
}

/// The bytes llguidance matches token `id` against: its text piece, or
/// `0xFF` and its text for a special token (llguidance's marker, so a
/// grammar can name it as `<|im_end|>` but text never matches it). A piece
/// that starts with `0xFF` (a byte-level token of a byte no UTF-8 text has)
/// is left out, so it cannot pass for a special token.
fn token_bytes(tokenizer: &Tokenizer, id: u32) -> Vec<u8> {
    let piece = tokenizer.token_to_piece(id, false);
    if piece.first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
        return Vec::new();
    }
    if !piece.is_empty() {
        return piece;
    }
    let special = tokenizer.token_to_piece(id, true);
    if special.is_empty() {
        return special;
    }
    let mut marked = Vec::with_capacity(special.len() + 1);
    marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
    marked.extend_from_slice(&special);
    marked
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        let encoded = match (&self.canonical, std::str::from_utf8(s)) {
            (Some(tok), Ok(text)) => tok.encode(text, false, false).ok(),
            _ => None,
        };
        encoded.unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical.is_some()
    }
}
