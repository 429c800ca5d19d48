//! A synthetic SentencePiece ("llama") vocabulary of any size that llama.cpp
//! and Hearth's tokenizer both accept.
//!
//! Layout, by id: `<unk>` (0), `<s>` (1), `</s>` (2), the 256 byte tokens
//! `<0x00>`..`<0xFF>` (3..=258), then pieces: `▁` (SentencePiece's space),
//! the printable ASCII characters, `▁` + each letter and digit, then every
//! lowercase string of length 2, 3, 4, ... in order, each followed by its
//! `▁`-prefixed form, until the vocabulary is full. Every prefix of a piece
//! is itself a piece, so SentencePiece's bigram merges can build any of them.
//!
//! Scores fall with the id (`-(id - 259)` for pieces), so shorter, earlier
//! pieces merge first. No randomness: the vocabulary depends only on its size.

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub mod token_type {
    /// An ordinary piece.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A control token (`<s>`, `</s>`).
    pub const CONTROL: i32 = 3;
    /// A byte-fallback token (`<0x41>`).
    pub const BYTE: i32 = 6;
}

/// Id of `<unk>`.
pub const UNK_ID: u32 = 0;
/// Id of `<s>` (BOS).
pub const BOS_ID: u32 = 1;
/// Id of `</s>` (EOS).
pub const EOS_ID: u32 = 2;
/// Ids before the first piece: three specials and 256 bytes.
pub const FIRST_PIECE: usize = 3 + 256;

/// SentencePiece's word-boundary marker.
const SPACE: char = '\u{2581}';

/// The token list, scores and token types of a vocabulary of `size` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthVocab {
    /// Token texts, by id.
    pub tokens: Vec<String>,
    /// Scores, by id.
    pub scores: Vec<f32>,
    /// Token types ([`token_type`]), by id.
    pub types: Vec<i32>,
}

impl SynthVocab {
    /// Builds the vocabulary; `size` must be at least
    /// [`MIN_VOCAB`](super::MIN_VOCAB) (checked by the shape) for the
    /// single characters to fit, and a smaller one is simply truncated.
    pub fn new(size: usize) -> Self {
        let mut tokens = Vec::with_capacity(size);
        let mut types = Vec::with_capacity(size);
        for (text, ty) in [
            ("<unk>", token_type::UNKNOWN),
            ("<s>", token_type::CONTROL),
            ("</s>", token_type::CONTROL),
        ] {
            tokens.push(text.to_string());
            types.push(ty);
        }
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(token_type::BYTE);
        }
        let mut pieces = Pieces::default();
        while tokens.len() < size {
            tokens.push(pieces.next_piece());
            types.push(token_type::NORMAL);
        }
        tokens.truncate(size);
        types.truncate(size);
        let scores = (0..tokens.len())
            .map(|id| {
                if id < FIRST_PIECE {
                    0.0
                } else {
                    -((id - FIRST_PIECE) as f32)
                }
            })
            .collect();
        SynthVocab {
            tokens,
            scores,
            types,
        }
    }
}

/// The endless sequence of pieces after the byte tokens.
#[derive(Default)]
struct Pieces {
    /// Index into the fixed single-character pieces, then done.
    fixed: usize,
    /// Length of the lowercase strings now enumerated (from 2).
    len: u32,
    /// Index of the next string of that length.
    index: u64,
    /// Whether the `▁` form of the last string is due.
    spaced_due: Option<String>,
}

impl Pieces {
    fn fixed_pieces() -> impl Iterator<Item = String> {
        let printable = (b'!'..=b'~').map(|c| char::from(c).to_string());
        let spaced = (b'a'..=b'z')
            .chain(b'A'..=b'Z')
            .chain(b'0'..=b'9')
            .map(|c| format!("{SPACE}{}", char::from(c)));
        std::iter::once(SPACE.to_string())
            .chain(printable)
            .chain(spaced)
    }

    fn next_piece(&mut self) -> String {
        if let Some(s) = self.spaced_due.take() {
            return s;
        }
        if let Some(p) = Self::fixed_pieces().nth(self.fixed) {
            self.fixed += 1;
            return p;
        }
        if self.len < 2 {
            self.len = 2;
        }
        if self.index >= 26u64.pow(self.len) {
            self.len += 1;
            self.index = 0;
        }
        let word = lowercase_word(self.index, self.len);
        self.index += 1;
        self.spaced_due = Some(format!("{SPACE}{word}"));
        word
    }
}

/// The `index`-th lowercase string of length `len`, in lexicographic order.
fn lowercase_word(mut index: u64, len: u32) -> String {
    let mut bytes = vec![b'a'; len as usize];
    for slot in bytes.iter_mut().rev() {
        *slot = b'a' + (index % 26) as u8;
        index /= 26;
    }
    bytes.into_iter().map(char::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn layout_and_uniqueness() {
        let v = SynthVocab::new(50_000);
        assert_eq!(v.tokens.len(), 50_000);
        assert_eq!((v.scores.len(), v.types.len()), (50_000, 50_000));
        assert_eq!(&v.tokens[..3], ["<unk>", "<s>", "</s>"]);
        assert_eq!(v.tokens[3], "<0x00>");
        assert_eq!(v.tokens[3 + 0x0A], "<0x0A>");
        assert_eq!(v.tokens[258], "<0xFF>");
        assert_eq!(v.tokens[FIRST_PIECE], "\u{2581}");
        assert_eq!(v.types[0], token_type::UNKNOWN);
        assert_eq!(v.types[1], token_type::CONTROL);
        assert_eq!(v.types[100], token_type::BYTE);
        assert_eq!(v.types[FIRST_PIECE], token_type::NORMAL);
        let unique: HashSet<&String> = v.tokens.iter().collect();
        assert_eq!(unique.len(), v.tokens.len(), "token texts repeat");
        assert!(v.tokens.contains(&"zz".to_string()));
        assert!(v.tokens.contains(&"\u{2581}abc".to_string()));
        // Strictly falling scores over the pieces.
        assert!(v.scores[FIRST_PIECE..].windows(2).all(|w| w[0] > w[1]));
    }

    #[test]
    fn every_piece_prefix_is_a_piece() {
        let v = SynthVocab::new(40_000);
        let set: HashSet<&str> = v.tokens.iter().map(String::as_str).collect();
        for piece in &v.tokens[FIRST_PIECE..] {
            let chars: Vec<char> = piece.chars().collect();
            for n in 1..chars.len() {
                let prefix: String = chars[..n].iter().collect();
                assert!(set.contains(prefix.as_str()), "{piece}: {prefix} missing");
            }
        }
    }

    #[test]
    fn large_vocabularies_fill_up() {
        let v = SynthVocab::new(262_144);
        assert_eq!(v.tokens.len(), 262_144);
        assert!(v.tokens.last().is_some_and(|t| t.chars().count() >= 4));
        assert_eq!(lowercase_word(0, 3), "aaa");
        assert_eq!(lowercase_word(27, 2), "bb");
    }
}
