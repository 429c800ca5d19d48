//! RoPE's angles, computed once per step and shared by its rope ops.
//!
//! Every layer rotates Q and K by the same angles: the step's positions
//! under the same parameters (two sets in Gemma 3, whose local and global
//! layers have their own bases). Computed per op, each of a prompt's rows
//! took `n_rot / 2` cosines and sines per op, which in Gemma-3-270M's
//! pp512 (head width 256, 36 rope ops a pass) was 4-5% of the time at one
//! thread (`HEARTH_PROFILE=1 hearth bench -p 512 -n 0 -r 8`: the rope ops
//! 0.024-0.029 ms a token, 0.008 since). [`RopeAngles`] keeps the last few
//! tables, keyed by everything they depend on, so a step computes each
//! one once.

use std::sync::Arc;

use super::threads::Threads;
use crate::graph::reference::{rope_angles, RopeParams};

/// Tables kept: Gemma 3 alternates between two, and a model that rotates
/// Q and K differently would add as many again.
const KEEP: usize = 4;

/// Positions per task when a table is computed on several threads.
const ROWS_PER_TASK: usize = 16;

/// Everything a table of angles depends on (the rotation's layout, `mode`
/// and `head_dim`, does not change the angles).
#[derive(Debug, PartialEq)]
struct Key {
    n_rot: usize,
    base: u32,
    freq_scale: u32,
    factors: Option<Vec<u32>>,
    pos: Vec<usize>,
}

impl Key {
    fn new(pos: &[usize], p: &RopeParams<'_>) -> Self {
        Key {
            n_rot: p.n_rot,
            base: p.base.to_bits(),
            freq_scale: p.freq_scale.to_bits(),
            factors: p
                .freq_factors
                .map(|f| f.iter().take(p.n_rot / 2).map(|x| x.to_bits()).collect()),
            pos: pos.to_vec(),
        }
    }

    /// Whether this is the key of `pos` under `p` ([`Key::new`] without
    /// building it: every rope op asks, and most find their table kept).
    fn matches(&self, pos: &[usize], p: &RopeParams<'_>) -> bool {
        let factors = |f: &[u32]| {
            p.freq_factors.is_some_and(|g| {
                g.len().min(p.n_rot / 2) == f.len()
                    && g.iter().zip(f).all(|(x, &y)| x.to_bits() == y)
            })
        };
        self.n_rot == p.n_rot
            && self.base == p.base.to_bits()
            && self.freq_scale == p.freq_scale.to_bits()
            && self
                .factors
                .as_deref()
                .map_or(p.freq_factors.is_none(), factors)
            && self.pos == pos
    }
}

/// A table of angles: `n_rot / 2` (cosine, sine) pairs per position.
pub(super) type Angles = Arc<[(f32, f32)]>;

/// The last [`KEEP`] tables of angles ([`rope_angles`]), newest last.
#[derive(Debug, Default)]
pub(super) struct RopeAngles {
    kept: Vec<(Key, Angles)>,
}

impl RopeAngles {
    /// The angles of `pos` under `p`, computed on `threads` unless kept.
    pub(super) fn get(&mut self, threads: &Threads, pos: &[usize], p: &RopeParams<'_>) -> Angles {
        if let Some(at) = self.kept.iter().position(|(k, _)| k.matches(pos, p)) {
            let entry = self.kept.remove(at);
            let angles = Arc::clone(&entry.1);
            self.kept.push(entry);
            return angles;
        }
        let half = p.n_rot / 2;
        let mut angles = vec![(0.0, 0.0); pos.len() * half];
        if pos.len() <= ROWS_PER_TASK || threads.count() == 1 {
            rope_angles(pos, p, &mut angles);
        } else {
            threads.for_chunks(&mut angles, ROWS_PER_TASK * half, |i, out| {
                rope_angles(&pos[i * ROWS_PER_TASK..], p, out);
            });
        }
        let angles: Angles = angles.into();
        if self.kept.len() == KEEP {
            self.kept.remove(0);
        }
        self.kept.push((Key::new(pos, p), Arc::clone(&angles)));
        angles
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::RopeMode;

    fn params(base: f32, factors: Option<&[f32]>) -> RopeParams<'_> {
        RopeParams {
            head_dim: 64,
            n_rot: 64,
            base,
            freq_scale: 1.0,
            freq_factors: factors,
            mode: RopeMode::Neox,
        }
    }

    #[test]
    fn kept_tables_equal_fresh_ones_and_follow_their_key() {
        let threads = Threads::new(2);
        let mut kept = RopeAngles::default();
        let pos: Vec<usize> = (0..100).map(|i| 3 * i + 1).collect();
        let factors = vec![1.5f32; 32];
        let fresh = |pos: &[usize], p: &RopeParams<'_>| {
            let mut v = vec![(0.0, 0.0); pos.len() * 32];
            rope_angles(pos, p, &mut v);
            v
        };
        let cases = [
            (pos.clone(), params(1e4, None)),
            (pos.clone(), params(1e6, None)),
            (pos[..7].to_vec(), params(1e4, None)),
            (pos.clone(), params(1e4, Some(&factors))),
        ];
        for _ in 0..2 {
            for (pos, p) in &cases {
                let got = kept.get(&threads, pos, p);
                let want = fresh(pos, p);
                assert_eq!(got.len(), want.len());
                assert!(got.iter().zip(&want).all(|(a, b)| {
                    a.0.to_bits() == b.0.to_bits() && a.1.to_bits() == b.1.to_bits()
                }));
            }
        }
        // The second round found every table kept.
        assert_eq!(kept.kept.len(), KEEP);
        let first = kept.get(&threads, &cases[0].0, &cases[0].1);
        assert!(Arc::ptr_eq(
            &first,
            &kept.get(&threads, &cases[0].0, &cases[0].1)
        ));
        // A fifth table pushes out the least recently used (case 1).
        let _ = kept.get(&threads, &pos[..3], &params(1e4, None));
        assert!(!kept
            .kept
            .iter()
            .any(|(k, _)| *k == Key::new(&cases[1].0, &cases[1].1)));
    }
}
