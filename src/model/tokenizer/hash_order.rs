//! The iteration order of llama.cpp's `std::unordered_map<std::string, llama_token>
//! token_to_id`, as built by GCC's libstdc++.
//!
//! llama.cpp finds some special tokens (EOT, EOM, FIM) by walking that map and taking
//! the first token whose text is on a list. When a vocabulary holds several candidates
//! (SmolLM2 has both `<|im_end|>` and `<|endoftext|>`) the winner is whichever the hash
//! table yields first, so reproducing llama.cpp's choice means replaying libstdc++'s
//! table: `std::hash<std::string>` (`_Hash_bytes`, 64-bit MurmurHash2 variant), the
//! prime rehash policy (max load factor 1) and the node list's insertion rules. Checked
//! against a g++ 12 build on both test vocabularies (see tests/fixtures/tokenizer/README.md).

use std::collections::HashMap;

/// libstdc++'s bucket counts as an `unordered_map` grows one insertion at a time: the
/// table rehashes to the next count when an insertion would exceed the current count.
const BUCKET_COUNTS: [u64; 21] = [
    13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061,
    712697, 1447153, 2938679, 5967347, 12117689, 24607243,
];

const NIL: u32 = u32::MAX;
/// Stands for the list head `_M_before_begin` in a bucket slot.
const HEAD: u32 = u32::MAX - 1;

/// `std::_Hash_bytes(data, len, 0xc70f6907)` on a 64-bit little-endian target.
fn hash_bytes(data: &[u8]) -> u64 {
    const MUL: u64 = (0xc6a4_a793_u64 << 32) + 0x5bd1_e995;
    let shift_mix = |v: u64| v ^ (v >> 47);
    let aligned = data.len() & !7;
    let mut hash = 0xc70f_6907_u64 ^ (data.len() as u64).wrapping_mul(MUL);
    for chunk in data[..aligned].chunks_exact(8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let d = shift_mix(u64::from_le_bytes(word).wrapping_mul(MUL)).wrapping_mul(MUL);
        hash ^= d;
        hash = hash.wrapping_mul(MUL);
    }
    let tail = &data[aligned..];
    if !tail.is_empty() {
        let d = tail
            .iter()
            .rev()
            .fold(0u64, |acc, &b| (acc << 8) + u64::from(b));
        hash ^= d;
        hash = hash.wrapping_mul(MUL);
    }
    hash = shift_mix(hash).wrapping_mul(MUL);
    shift_mix(hash)
}

/// The table: a singly linked node list and, per bucket, the node *before* its first node.
struct Table {
    hashes: Vec<u64>,
    next: Vec<u32>,
    head: u32,
    buckets: Vec<u32>,
}

impl Table {
    fn bucket(&self, node: u32) -> usize {
        (self.hashes[node as usize] % self.buckets.len() as u64) as usize
    }

    fn next_of(&self, before: u32) -> u32 {
        if before == HEAD {
            self.head
        } else {
            self.next[before as usize]
        }
    }

    fn set_next(&mut self, before: u32, node: u32) {
        if before == HEAD {
            self.head = node;
        } else {
            self.next[before as usize] = node;
        }
    }

    /// `_M_insert_bucket_begin`.
    fn insert(&mut self, node: u32) {
        let bkt = self.bucket(node);
        let before = self.buckets[bkt];
        if before != NIL {
            self.next[node as usize] = self.next_of(before);
            self.set_next(before, node);
        } else {
            self.next[node as usize] = self.head;
            self.head = node;
            let after = self.next[node as usize];
            if after != NIL {
                let b = self.bucket(after);
                self.buckets[b] = node;
            }
            self.buckets[bkt] = HEAD;
        }
    }

    /// `_M_rehash_aux` for unique keys.
    fn rehash(&mut self, count: u64) {
        self.buckets = vec![NIL; count as usize];
        let mut p = self.head;
        self.head = NIL;
        let mut bbegin_bkt = 0;
        while p != NIL {
            let next = self.next[p as usize];
            let bkt = self.bucket(p);
            let before = self.buckets[bkt];
            if before == NIL {
                self.next[p as usize] = self.head;
                self.head = p;
                self.buckets[bkt] = HEAD;
                if self.next[p as usize] != NIL {
                    self.buckets[bbegin_bkt] = p;
                }
                bbegin_bkt = bkt;
            } else {
                self.next[p as usize] = self.next_of(before);
                self.set_next(before, p);
            }
            p = next;
        }
    }
}

/// Token ids in the order llama.cpp's `token_to_id` map iterates them, given the texts
/// inserted in id order (`texts`) and the final lookup (`to_id`: duplicates keep the last id).
/// Vocabularies larger than the known bucket table fall back to id order.
pub(crate) fn libstdcxx_iteration_order(
    texts: &[String],
    to_id: impl Fn(&str) -> Option<u32>,
) -> Vec<u32> {
    let mut seen = HashMap::with_capacity(texts.len());
    let mut keys: Vec<&str> = Vec::with_capacity(texts.len());
    for t in texts {
        if seen.insert(t.as_str(), ()).is_none() {
            keys.push(t);
        }
    }
    if keys.len() as u64 > BUCKET_COUNTS[BUCKET_COUNTS.len() - 1] {
        return keys.iter().filter_map(|k| to_id(k)).collect();
    }
    let mut table = Table {
        hashes: keys.iter().map(|k| hash_bytes(k.as_bytes())).collect(),
        next: vec![NIL; keys.len()],
        head: NIL,
        buckets: vec![NIL; 1],
    };
    let mut level = 0;
    let mut capacity = 0u64;
    for node in 0..keys.len() as u32 {
        if u64::from(node) + 1 > capacity {
            capacity = BUCKET_COUNTS[level];
            level += 1;
            table.rehash(capacity);
        }
        table.insert(node);
    }
    let mut order = Vec::with_capacity(keys.len());
    let mut p = table.head;
    while p != NIL {
        if let Some(id) = to_id(keys[p as usize]) {
            order.push(id);
        }
        p = table.next[p as usize];
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_map_order_matches_libstdcxx() {
        // g++ 12: inserting "a".."p" into std::unordered_map<std::string,int> in order and
        // iterating yields this order.
        let texts: Vec<String> = (b'a'..=b'p').map(|c| (c as char).to_string()).collect();
        let to_id: HashMap<String, u32> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let order = libstdcxx_iteration_order(&texts, |t| to_id.get(t).copied());
        assert_eq!(
            order,
            [14, 0, 1, 15, 7, 13, 3, 10, 2, 8, 5, 6, 4, 9, 11, 12]
        );
    }
}
