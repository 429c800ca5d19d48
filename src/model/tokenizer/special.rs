//! Splitting text on special-token strings before tokenization (llama.cpp's
//! `tokenizer_st_partition`).
//!
//! llama.cpp takes the special tokens longest first and, for each, splits every
//! remaining text fragment at all its non-overlapping occurrences, left to right. A
//! longer token therefore wins over a shorter one anywhere in the text, not just at the
//! same position. Doing that literally costs (number of special tokens) x (text length);
//! Gemma 3 has 6,400 special tokens. Instead, every occurrence of every special token is
//! found in one pass with a byte trie, and the occurrences are accepted in llama.cpp's
//! order (token priority, then position) when they do not overlap text already taken:
//! the same fragments, in O(text x longest special token).

use std::ops::Range;

use super::vocab::{attr, Vocab};

/// A piece of the input: text still to tokenize, or a special token's id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Byte range of the input text.
    Text(Range<usize>),
    /// A special token found in the text.
    Token(u32),
}

/// A byte trie over the special token texts; `value` = priority (index in the special cache).
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialTrie {
    /// Per node: sorted `(byte, child)` edges.
    edges: Vec<Vec<(u8, u32)>>,
    /// Per node: the priority of the token ending here, if any.
    value: Vec<Option<u32>>,
}

impl SpecialTrie {
    /// Builds the trie for `vocab.special_cache`.
    pub(crate) fn new(vocab: &Vocab) -> Self {
        let mut trie = SpecialTrie {
            edges: vec![Vec::new()],
            value: vec![None],
        };
        for (prio, &id) in vocab.special_cache.iter().enumerate() {
            let mut node = 0usize;
            for &b in vocab.texts[id as usize].as_bytes() {
                node = match trie.edges[node].binary_search_by_key(&b, |e| e.0) {
                    Ok(i) => trie.edges[node][i].1 as usize,
                    Err(i) => {
                        let child = trie.edges.len() as u32;
                        trie.edges.push(Vec::new());
                        trie.value.push(None);
                        trie.edges[node].insert(i, (b, child));
                        child as usize
                    }
                };
            }
            // Two tokens with the same text: llama.cpp tries the first in cache order first.
            if trie.value[node].is_none() {
                trie.value[node] = Some(prio as u32);
            }
        }
        trie
    }

    fn child(&self, node: usize, b: u8) -> Option<usize> {
        let e = &self.edges[node];
        e.binary_search_by_key(&b, |e| e.0)
            .ok()
            .map(|i| e[i].1 as usize)
    }
}

/// Splits `text` into fragments. With `parse_special` false, control and unknown tokens
/// stay text; user-defined tokens are split out either way (as llama.cpp does).
pub(crate) fn partition(
    vocab: &Vocab,
    trie: &SpecialTrie,
    text: &str,
    parse_special: bool,
) -> Vec<Fragment> {
    let bytes = text.as_bytes();
    if bytes.is_empty() {
        return Vec::new();
    }
    // (priority, start) of every occurrence of an enabled special token.
    let mut hits: Vec<(u32, u32)> = Vec::new();
    for start in 0..bytes.len() {
        let mut node = 0usize;
        for &b in &bytes[start..] {
            let Some(next) = trie.child(node, b) else {
                break;
            };
            node = next;
            if let Some(prio) = trie.value[node] {
                let id = vocab.special_cache[prio as usize];
                let a = vocab.attrs[id as usize];
                if parse_special || a & (attr::CONTROL | attr::UNKNOWN) == 0 {
                    hits.push((prio, start as u32));
                }
            }
        }
    }
    if hits.is_empty() {
        return vec![Fragment::Text(0..bytes.len())];
    }
    hits.sort_unstable();

    // taken[i]: byte i is inside an accepted token or whitespace stripped next to one.
    let mut taken = vec![false; bytes.len()];
    let mut tokens: Vec<(usize, usize, u32)> = Vec::new();
    for (prio, start) in hits {
        let id = vocab.special_cache[prio as usize];
        let (start, len) = (start as usize, vocab.texts[id as usize].len());
        if taken[start..start + len].iter().any(|&t| t) {
            continue;
        }
        taken[start..start + len].iter_mut().for_each(|t| *t = true);
        let a = vocab.attrs[id as usize];
        if a & attr::LSTRIP != 0 {
            let mut i = start;
            while i > 0 && !taken[i - 1] && bytes[i - 1].is_ascii_whitespace_c() {
                i -= 1;
                taken[i] = true;
            }
        }
        if a & attr::RSTRIP != 0 {
            let mut i = start + len;
            while i < bytes.len() && !taken[i] && bytes[i].is_ascii_whitespace_c() {
                taken[i] = true;
                i += 1;
            }
        }
        tokens.push((start, len, id));
    }
    tokens.sort_unstable();
    assemble(&taken, &tokens)
}

/// Text fragments are the maximal runs of untaken bytes; tokens sit at their starts.
fn assemble(taken: &[bool], tokens: &[(usize, usize, u32)]) -> Vec<Fragment> {
    let mut out = Vec::with_capacity(2 * tokens.len() + 1);
    let mut pos = 0;
    let push_text = |out: &mut Vec<Fragment>, from: usize, to: usize| {
        let mut i = from;
        while i < to {
            if taken[i] {
                i += 1;
                continue;
            }
            let s = i;
            while i < to && !taken[i] {
                i += 1;
            }
            out.push(Fragment::Text(s..i));
        }
    };
    for &(start, len, id) in tokens {
        push_text(&mut out, pos, start);
        out.push(Fragment::Token(id));
        pos = start + len;
    }
    push_text(&mut out, pos, taken.len());
    out
}

/// C's `isspace` in the "C" locale.
trait CSpace {
    fn is_ascii_whitespace_c(&self) -> bool;
}

impl CSpace for u8 {
    fn is_ascii_whitespace_c(&self) -> bool {
        matches!(*self, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Array, Metadata, Value};

    /// A tiny SPM vocabulary: (text, token type).
    fn vocab(name: &str, tokens: &[(&str, i32)]) -> Vocab {
        let mut md = Metadata::new();
        md.set("general.name", Value::String(name.into()));
        md.set("tokenizer.ggml.model", Value::String("llama".into()));
        let texts = tokens.iter().map(|t| t.0.to_string()).collect();
        md.set("tokenizer.ggml.tokens", Value::Array(Array::String(texts)));
        let types = tokens.iter().map(|t| t.1).collect();
        md.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
        match Vocab::from_metadata(&md) {
            Ok(v) => v,
            Err(e) => panic!("vocab: {e}"),
        }
    }

    fn split(v: &Vocab, text: &str, parse_special: bool) -> Vec<String> {
        let trie = SpecialTrie::new(v);
        partition(v, &trie, text, parse_special)
            .into_iter()
            .map(|f| match f {
                Fragment::Text(r) => text[r].to_string(),
                Fragment::Token(id) => format!("#{id}"),
            })
            .collect()
    }

    const TOKENS: &[(&str, i32)] = &[
        ("<unk>", 2),
        ("<s>", 3),
        ("</s>", 3),
        ("<|user|>", 3),
        ("<|endoftext|>", 3),
        ("ab", 4),
        ("bcd", 4),
        ("[MASK]", 3),
        ("x", 1),
    ];

    #[test]
    fn longer_tokens_win_anywhere_in_the_text() {
        let v = vocab("test", TOKENS);
        // "bcd" (3 bytes) is taken before "ab" even though "ab" starts earlier.
        assert_eq!(split(&v, "xabcd", true), ["xa", "#6"]);
        assert_eq!(split(&v, "abab x", true), ["#5", "#5", " x"]);
        // Control tokens stay text without parse_special; user-defined ones never do.
        assert_eq!(split(&v, "<s>ab", false), ["<s>", "#5"]);
        assert_eq!(split(&v, "<s>ab", true), ["#1", "#5"]);
    }

    #[test]
    fn phi3_strips_whitespace_after_special_tokens() {
        let v = vocab("Phi-3 mini", TOKENS);
        assert_eq!(split(&v, "<|user|> \n x", true), ["#3", "x"]);
        assert_eq!(split(&v, "</s>  x", true), ["#2", "x"]);
        // llama.cpp exempts these three.
        assert_eq!(split(&v, "<s>  x", true), ["#1", "  x"]);
        let plain = vocab("test", TOKENS);
        assert_eq!(split(&plain, "<|user|> x", true), ["#3", " x"]);
    }

    #[test]
    fn modern_bert_strips_whitespace_before_mask() {
        let v = vocab("modern-bert base", TOKENS);
        assert_eq!(split(&v, "x  [MASK] x", true), ["x", "#7", " x"]);
        assert_eq!(split(&v, "  [MASK]", true), ["#7"]);
    }
}
