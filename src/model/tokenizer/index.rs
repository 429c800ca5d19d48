//! Text -> id lookup over the token texts without a second copy of them.
//!
//! An open-addressing table (linear probing, at most half full) of `hash tag << 32 | id`
//! keyed by the hash of the token's text; a probe compares the tag first and only then
//! `texts[id]`, so misses (most pair lookups while merging) rarely touch the texts. For
//! Gemma 3's 262,144 tokens this is 4 MB of slots instead of a map owning copies of
//! every text.

use std::hash::Hasher;

use super::fxhash::FxHasher;

const EMPTY: u64 = u64::MAX;

/// The index. Duplicate texts map to the last id, like llama.cpp's `token_to_id[text] = id`.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenIndex {
    slots: Vec<u64>,
}

fn hash(text: &str) -> u64 {
    let mut h = FxHasher::default();
    h.write(text.as_bytes());
    // Fx leaves the low bits weak for short keys; fold the high half in.
    let x = h.finish();
    x ^ (x >> 29)
}

impl TokenIndex {
    /// Indexes `texts` (ids are positions). Precondition: fewer than `u32::MAX` texts.
    pub(crate) fn new(texts: &[String]) -> Self {
        let cap = (texts.len() * 2).max(16).next_power_of_two();
        let mut index = TokenIndex {
            slots: vec![EMPTY; cap],
        };
        for (id, t) in texts.iter().enumerate() {
            let h = hash(t);
            let slot = index.find_slot(texts, t, h);
            index.slots[slot] = (h >> 32) << 32 | id as u64;
        }
        index
    }

    /// The slot holding `text`, or the empty slot where it would go.
    fn find_slot(&self, texts: &[String], text: &str, h: u64) -> usize {
        let mask = self.slots.len() - 1;
        let tag = h >> 32;
        let mut i = h as usize & mask;
        loop {
            let slot = self.slots[i];
            if slot == EMPTY || (slot >> 32 == tag && texts[(slot & 0xFFFF_FFFF) as usize] == text)
            {
                return i;
            }
            i = (i + 1) & mask;
        }
    }

    /// The id of `text`, if it is a token.
    pub(crate) fn get(&self, texts: &[String], text: &str) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let slot = self.slots[self.find_slot(texts, text, hash(text))];
        (slot != EMPTY).then_some((slot & 0xFFFF_FFFF) as u32)
    }

    /// Every distinct text's id (the last id for duplicated texts), in no particular order.
    pub(crate) fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s != EMPTY)
            .map(|&s| (s & 0xFFFF_FFFF) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_text_and_keeps_the_last_duplicate() {
        let texts: Vec<String> = ["a", "b", "ab", "a", "\u{2581}x", ""]
            .map(String::from)
            .to_vec();
        let index = TokenIndex::new(&texts);
        assert_eq!(index.get(&texts, "a"), Some(3));
        assert_eq!(index.get(&texts, "ab"), Some(2));
        assert_eq!(index.get(&texts, "\u{2581}x"), Some(4));
        assert_eq!(index.get(&texts, "abc"), None);
        let mut ids: Vec<u32> = index.ids().collect();
        ids.sort_unstable();
        assert_eq!(ids, [1, 2, 3, 4, 5]);
    }
}
