//! Byte-level BPE tokenization (llama.cpp's `llm_tokenizer_bpe_session`): the text is
//! split into words by the pre-tokenizer, each word's bytes are mapped to GPT-2's
//! printable characters, and characters are merged by merge rank.

use std::cmp::Reverse;

use super::merge::merge;
use super::pretokenize::split;
use super::unicode::byte_to_unicode;
use super::vocab::Vocab;

/// Tokenizes one text fragment, appending ids.
pub(crate) fn tokenize(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    let mut word = String::new();
    let mut key = String::new();
    for range in split(text, &vocab.split_steps) {
        word.clear();
        word.extend(text[range].bytes().map(byte_to_unicode));
        if vocab.flags.ignore_merges {
            if let Some(id) = vocab.text_to_token(&word) {
                out.push(id);
                continue;
            }
        }
        let symbols = merge(&word, |l, r, left| {
            key.clear();
            key.push_str(l);
            key.push(' ');
            key.push_str(r);
            let rank = *vocab.merges.get(key.as_str())?;
            Some((Reverse(rank), Reverse(left)))
        });
        for s in symbols {
            let piece = &word[s.start..s.start + s.len];
            match vocab.text_to_token(piece) {
                Some(id) => out.push(id),
                None => push_single_bytes(vocab, piece, out),
            }
        }
    }
}

/// llama.cpp's fallback for a piece that is not a token: each byte of the (already
/// byte-encoded) piece looked up as a one-byte text; bytes without a token are dropped.
fn push_single_bytes(vocab: &Vocab, piece: &str, out: &mut Vec<u32>) {
    for &b in piece.as_bytes() {
        if let Ok(s) = std::str::from_utf8(std::slice::from_ref(&b)) {
            if let Some(id) = vocab.text_to_token(s) {
                out.push(id);
            }
        }
    }
}
