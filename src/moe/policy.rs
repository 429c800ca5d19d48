//! Which experts a pool of device slots keeps: the slot table and its
//! eviction policies ([`Policy`]).
//!
//! A pool's slots each hold one expert of one layer. The table maps
//! `(layer, expert)` to its slot, keeps every expert's use history (also
//! while it is not resident: an LFU that forgot an expert's count on
//! eviction would thrash), and names the slot to give up when a new expert
//! needs one, never one the current layer step still uses.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// How a full pool picks the expert it gives up for a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Policy {
    /// Least recently used: the expert whose last use is oldest.
    Lru,
    /// Least frequently used: the expert used least often so far (ties:
    /// the older last use).
    Lfu,
    /// Both at once (LRFU, Lee et al. 2001): each use counts `2^(-age /
    /// half-life)`, so an expert used often long ago ranks with one used
    /// once lately. The half-life is 16 times the time the pool takes to
    /// turn over once (its slots over the experts one layer step uses): on
    /// routes that do not drift (examples/expert_policies.rs) LFU keeps the
    /// most hits and a shorter half-life lost up to 20 points to it; at 16
    /// turnovers LRFU is within one point of LFU and still forgets experts
    /// a drifting workload stops using.
    #[default]
    Lrfu,
}

impl Policy {
    /// Every policy, in the order reports list them.
    pub const ALL: [Policy; 3] = [Policy::Lru, Policy::Lfu, Policy::Lrfu];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::Lrfu => "lrfu",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown expert-cache policy '{s}'; use lru, lfu or lrfu"))
    }
}

/// An expert of a layer: `(layer, expert)`.
pub type ExpertKey = (u32, u32);

/// One expert's use history.
#[derive(Debug, Clone, Copy, Default)]
struct Uses {
    /// Uses so far.
    count: u64,
    /// The clock at the last use.
    last: u64,
    /// Decayed uses at `last` (LRFU's combined recency-frequency).
    crf: f64,
}

/// The slots of one pool and the history its policy reads.
#[derive(Debug)]
pub struct SlotTable {
    policy: Policy,
    owner: Vec<Option<ExpertKey>>,
    at: HashMap<ExpertKey, usize>,
    uses: HashMap<ExpertKey, Uses>,
    /// Layer steps so far (one tick per [`SlotTable::tick`]).
    clock: u64,
    /// LRFU's half-life, in ticks.
    half_life: f64,
}

impl SlotTable {
    /// `slots` empty slots under `policy`; `per_tick`: the experts one
    /// layer step uses at most (LRFU's half-life is 16 times `slots /
    /// per_tick` ticks, the time the pool takes to turn over).
    pub fn new(slots: usize, policy: Policy, per_tick: usize) -> Self {
        Self {
            policy,
            owner: vec![None; slots],
            at: HashMap::new(),
            uses: HashMap::new(),
            clock: 0,
            half_life: (slots as f64 / per_tick.max(1) as f64).max(1.0) * 64.0,
        }
    }

    /// Slots in the pool.
    pub fn len(&self) -> usize {
        self.owner.len()
    }

    /// Whether the pool has no slots.
    pub fn is_empty(&self) -> bool {
        self.owner.is_empty()
    }

    /// Starts a layer step: the uses that follow are one tick later than
    /// the last step's.
    pub fn tick(&mut self) {
        self.clock += 1;
    }

    /// The slot holding `key`, if any.
    pub fn slot_of(&self, key: ExpertKey) -> Option<usize> {
        self.at.get(&key).copied()
    }

    /// Records a use of `key` (resident or not) at this tick.
    pub fn record_use(&mut self, key: ExpertKey) {
        let now = self.clock;
        let half_life = self.half_life;
        let u = self.uses.entry(key).or_default();
        u.crf = decayed(u.crf, now - u.last.min(now), half_life) + 1.0;
        u.count += 1;
        u.last = now;
    }

    /// The slot to fill next, never one `pinned` marks: an empty one first,
    /// else the policy's victim. `None` when every slot is pinned.
    pub fn victim(&self, pinned: &[bool]) -> Option<usize> {
        let free = |s: usize| !pinned.get(s).copied().unwrap_or(false);
        if let Some(s) = (0..self.owner.len()).find(|&s| free(s) && self.owner[s].is_none()) {
            return Some(s);
        }
        let mut best: Option<(usize, (f64, u64))> = None;
        for (s, key) in self.owner.iter().enumerate() {
            let Some(key) = key else { continue };
            if !free(s) {
                continue;
            }
            let rank = self.rank(*key);
            if best.is_none_or(|(_, b)| rank < b) {
                best = Some((s, rank));
            }
        }
        best.map(|(s, _)| s)
    }

    /// Puts `key` in `slot` (giving up whoever held it): the expert it
    /// evicted, if any.
    pub fn assign(&mut self, slot: usize, key: ExpertKey) -> Option<ExpertKey> {
        let old = self.owner.get_mut(slot)?.replace(key);
        if let Some(old) = old {
            self.at.remove(&old);
        }
        self.at.insert(key, slot);
        old
    }

    /// Places one layer step's routed experts (`counts[e]`: tokens routed
    /// to expert `e` of `layer`), as the expert cache does: experts most
    /// tokens need first, each a hit, or a miss copied into the slot the
    /// policy gives up (never one this step uses), or left to the host
    /// when at most `host_tokens` tokens route to it and no slot is empty,
    /// no slot is free, or (LFU, LRFU) the expert in that slot ranks at
    /// least as high.
    pub fn place_step(
        &mut self,
        layer: u32,
        counts: &[usize],
        host_tokens: usize,
    ) -> StepPlacement {
        self.tick();
        let mut used: Vec<usize> = (0..counts.len()).filter(|&e| counts[e] > 0).collect();
        used.sort_by_key(|&e| std::cmp::Reverse(counts[e]));
        let mut out = StepPlacement {
            slot_of: vec![None; counts.len()],
            ..StepPlacement::default()
        };
        let mut pinned = vec![false; self.len()];
        for e in used {
            let key = (layer, e as u32);
            self.record_use(key);
            if let Some(s) = self.slot_of(key) {
                out.hits += 1;
                pinned[s] = true;
                out.slot_of[e] = Some(s);
                continue;
            }
            out.misses += 1;
            // A miss few tokens need runs on the host, unless a slot is
            // empty (a copy there evicts nothing: the pool fills up).
            let empty = self.owner.iter().any(Option::is_none);
            if counts[e] <= host_tokens && !empty {
                continue;
            }
            let Some(s) = self.victim(&pinned) else {
                continue;
            };
            if !self.admits(key, s) {
                continue;
            }
            self.assign(s, key);
            pinned[s] = true;
            out.slot_of[e] = Some(s);
            out.copied.push((e, s));
        }
        out
    }

    /// Copies experts of `layer` predicted for its coming step into slots
    /// ahead of it (`experts`: most wanted first; at most `limit` copies):
    /// each not resident takes the slot the policy gives up, as a miss
    /// would (under LFU and LRFU not one whose expert ranks at least as
    /// high), never one this prefetch filled. Records no use: a wrong
    /// guess leaves the history as it was. Returns the `(expert, slot)`
    /// copied.
    pub fn prefetch(&mut self, layer: u32, experts: &[usize], limit: usize) -> Vec<(usize, usize)> {
        let mut pinned = vec![false; self.len()];
        let mut out = Vec::new();
        for &e in experts {
            if out.len() >= limit {
                break;
            }
            let key = (layer, e as u32);
            if let Some(s) = self.slot_of(key) {
                pinned[s] = true;
                continue;
            }
            let Some(s) = self.victim(&pinned) else {
                break;
            };
            if !self.admits(key, s) {
                continue;
            }
            self.assign(s, key);
            pinned[s] = true;
            out.push((e, s));
        }
        out
    }

    /// Admission: under LFU and LRFU `key` does not displace the expert in
    /// `slot` when the policy ranks that one at least as high (a miss runs
    /// where it lives instead), so one-off experts do not flush the ones in
    /// steady use. LRU admits every one.
    fn admits(&self, key: ExpertKey, slot: usize) -> bool {
        let displaces = self
            .owner
            .get(slot)
            .copied()
            .flatten()
            .map(|old| self.rank(old));
        self.policy == Policy::Lru || displaces.is_none_or(|r| self.rank(key) > r)
    }

    /// How `key` ranks for keeping (smaller: evicted first).
    fn rank(&self, key: ExpertKey) -> (f64, u64) {
        let u = self.uses.get(&key).copied().unwrap_or_default();
        match self.policy {
            Policy::Lru => (u.last as f64, 0),
            Policy::Lfu => (u.count as f64, u.last),
            Policy::Lrfu => (
                decayed(u.crf, self.clock - u.last.min(self.clock), self.half_life),
                u.last,
            ),
        }
    }
}

/// Where one layer step's routed experts go ([`SlotTable::place_step`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlacement {
    /// Per expert of the layer: its slot, or `None` (not routed, or left
    /// to the host).
    pub slot_of: Vec<Option<usize>>,
    /// The misses copied: `(expert, slot)`.
    pub copied: Vec<(usize, usize)>,
    /// Routed experts found in a slot.
    pub hits: usize,
    /// Routed experts not in a slot (copied or left to the host).
    pub misses: usize,
}

/// `v` after `age` ticks of a `half_life`-tick half-life.
fn decayed(v: f64, age: u64, half_life: f64) -> f64 {
    v * (-(age as f64) / half_life).exp2()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills a table of `slots` with the `uses` given (one tick each) and
    /// returns the victim after them.
    fn victim_after(policy: Policy, slots: usize, uses: &[u32]) -> Option<ExpertKey> {
        let mut t = SlotTable::new(slots, policy, 1);
        for &e in uses {
            t.tick();
            let key = (0, e);
            t.record_use(key);
            if t.slot_of(key).is_none() {
                let s = t.victim(&[]).expect("a slot");
                t.assign(s, key);
            }
        }
        t.victim(&[]).and_then(|s| t.owner[s])
    }

    #[test]
    fn each_policy_gives_up_its_own_victim() {
        // Expert 1 used three times long ago, 2 and 3 once each lately.
        let uses = [1, 1, 1, 2, 3];
        assert_eq!(victim_after(Policy::Lru, 3, &uses), Some((0, 1)));
        assert_eq!(victim_after(Policy::Lfu, 3, &uses), Some((0, 2)));
        // Half-life 48 ticks: expert 1's three uses (ages 2..4) weigh 2.87,
        // expert 2's one use (age 1) 0.99.
        assert_eq!(victim_after(Policy::Lrfu, 3, &uses), Some((0, 2)));
        // Long after, the old uses have faded below newer ones.
        let uses: Vec<u32> = [1, 1, 1, 2, 3]
            .into_iter()
            .chain([2, 3].repeat(100))
            .collect();
        assert_eq!(victim_after(Policy::Lrfu, 3, &uses), Some((0, 1)));
        // While LFU still counts them.
        let uses = [1, 1, 1, 1, 2, 3, 2, 3];
        assert_eq!(victim_after(Policy::Lfu, 3, &uses), Some((0, 2)));
    }

    #[test]
    fn a_prefetch_fills_free_slots_admits_as_a_miss_and_keeps_its_own() {
        // Three slots: expert 1 of layer 0 used three times, one slot free.
        let mut t = SlotTable::new(3, Policy::Lfu, 1);
        for _ in 0..3 {
            t.tick();
            t.record_use((0, 1));
        }
        t.assign(0, (0, 1));
        t.tick();
        t.record_use((0, 2));
        t.assign(1, (0, 2));
        // Layer 1's guesses 5, 6, 7: 5 takes the free slot; 6 would
        // displace expert 2 (used once) but ranks lower (never used):
        // LFU's admission keeps 2; 7 likewise.
        let copied = t.prefetch(1, &[5, 6, 7], 3);
        assert_eq!(copied, vec![(5, 2)]);
        assert_eq!(t.slot_of((1, 5)), Some(2));
        assert_eq!(t.slot_of((0, 2)), Some(1));
        // No use is recorded: the guess does not count for the policy.
        assert_eq!(t.rank((1, 5)), (0.0, 0));
        // LRU admits every guess, but never gives up a slot the same
        // prefetch filled, and stops at the limit.
        let mut t = SlotTable::new(2, Policy::Lru, 1);
        let copied = t.prefetch(0, &[1, 2, 3, 4], 3);
        assert_eq!(copied, vec![(1, 0), (2, 1)]);
        let copied = t.prefetch(0, &[3, 1], 1);
        assert_eq!(copied, vec![(3, 0)]);
        assert_eq!(t.slot_of((0, 1)), None);
    }

    #[test]
    fn free_slots_go_first_and_pinned_ones_never() {
        let mut t = SlotTable::new(3, Policy::Lru, 1);
        t.record_use((0, 5));
        assert_eq!(t.victim(&[true, false, false]), Some(1));
        t.assign(0, (0, 5));
        t.assign(1, (1, 5));
        t.assign(2, (2, 5));
        assert_eq!(t.victim(&[true, true, true]), None);
        assert_eq!(t.assign(1, (3, 7)), Some((1, 5)));
        assert_eq!(t.slot_of((1, 5)), None);
        assert_eq!(t.slot_of((3, 7)), Some(1));
    }

    #[test]
    fn policies_parse_by_name() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
        }
        assert!("mru".parse::<Policy>().is_err());
    }
}
