//! SentencePiece tokenization (llama.cpp's `llm_tokenizer_spm_session`): characters
//! merged by the score of the piece they form, then unknown characters as bytes.

use std::cmp::{Ordering, Reverse};

use super::merge::merge;
use super::vocab::Vocab;

/// An `f32` score ordered totally, so it can key a heap.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Score(f32);
impl Eq for Score {}
impl PartialOrd for Score {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Score {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Tokenizes one text fragment (whitespace already escaped to `▁`), appending ids.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut joined = String::new();
    let symbols = merge(text, |l, r, left| {
        joined.clear();
        joined.push_str(l);
        joined.push_str(r);
        let id = vocab.text_to_token(&joined)?;
        Some((Score(vocab.scores[id as usize]), Reverse(left)))
    });
    for s in symbols {
        let piece = &text[s.start..s.start + s.len];
        match vocab.text_to_token(piece) {
            Some(id) => out.push(id),
            // Merged pieces are always tokens; only single characters fall back to bytes.
            None => {
                for &b in piece.as_bytes() {
                    // llama.cpp throws when a byte has no token; the unknown token is the
                    // closest graceful equivalent.
                    if let Some(id) = vocab.byte_to_token(b).or(vocab.special.unk) {
                        out.push(id);
                    }
                }
            }
        }
    }
}
