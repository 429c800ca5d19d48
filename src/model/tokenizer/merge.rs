//! The pair-merging loop shared by the SentencePiece and BPE tokenizers (llama.cpp's
//! `llm_symbol` list with a priority queue of bigrams).
//!
//! The text starts as one symbol per UTF-8 character. Every adjacent pair that the
//! model knows is queued with a priority; the best pair is merged, and the pairs it
//! forms with its neighbours are queued. Entries made stale by earlier merges are
//! recognised by their byte size: a pair's left symbol only ever grows by absorbing its
//! right neighbour, so while both symbols are alive and adjacent the pair's text is the
//! same iff its length is. O(n log n) in the number of characters.

use std::collections::BinaryHeap;

/// One symbol: a byte range of the text in a doubly linked list.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Symbol {
    pub start: usize,
    /// Byte length; 0 once merged into its left neighbour.
    pub len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Bigram<K: Ord> {
    /// Higher merges first; ties go to the leftmost pair (the key includes that).
    key: K,
    left: usize,
    right: usize,
    size: usize,
}

/// Merges the characters of `text` while `priority(left, right)` names a pair, best
/// (greatest) key first; `key` must order ties by ascending left index. Returns the
/// surviving symbols in text order.
pub(crate) fn merge<K, F>(text: &str, mut priority: F) -> Vec<Symbol>
where
    K: Ord,
    F: FnMut(&str, &str, usize) -> Option<K>,
{
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    for (k, &s) in starts.iter().enumerate() {
        let end = starts.get(k + 1).copied().unwrap_or(text.len());
        symbols.push(Symbol {
            start: s,
            len: end - s,
            prev: k.checked_sub(1),
            next: if k + 1 < starts.len() {
                Some(k + 1)
            } else {
                None
            },
        });
    }
    let mut queue = BinaryHeap::new();
    let mut try_add = |symbols: &[Symbol],
                       queue: &mut BinaryHeap<Bigram<K>>,
                       left: Option<usize>,
                       right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (ls, rs) = (&symbols[l], &symbols[r]);
        let lt = &text[ls.start..ls.start + ls.len];
        let rt = &text[rs.start..rs.start + rs.len];
        if let Some(key) = priority(lt, rt, l) {
            queue.push(Bigram {
                key,
                left: l,
                right: r,
                size: ls.len + rs.len,
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&symbols, &mut queue, Some(i - 1), Some(i));
    }
    while let Some(b) = queue.pop() {
        let (l, r) = (symbols[b.left], symbols[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
            continue;
        }
        symbols[b.left].len += r.len;
        symbols[b.right].len = 0;
        symbols[b.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(b.left);
        }
        let prev = symbols[b.left].prev;
        let next = symbols[b.left].next;
        try_add(&symbols, &mut queue, prev, Some(b.left));
        try_add(&symbols, &mut queue, Some(b.left), next);
    }
    symbols.retain(|s| s.len > 0);
    symbols
}
