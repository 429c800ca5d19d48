//! [`Probe`]: validate every candidate against the reference, time the
//! valid ones in interleaved rounds, and pick the winner by median.
//!
//! Rules, each tested with fake timings in `tests.rs`:
//! - a candidate whose output differs from the reference (length, a
//!   value that is not finite, or a normalized mean squared error over the
//!   tolerance) is excluded before timing, and the reason kept;
//! - round `r` runs the valid candidates in their order rotated by `r`, so
//!   none always runs first (caches, clocks ramping up);
//! - each candidate's time is the median of its rounds;
//! - the fastest wins, unless its lead over the default candidate is
//!   under [`Probe::tie`] (3%): then it is a tie and the default wins.

use super::{Measured, Record, TuneError, TuneKey};

/// A monotonic clock in nanoseconds. The core reads no clock: natively
/// the CLI gives `std::time::Instant`, a page `performance.now()`, tests a
/// fake one their candidates advance.
pub trait Clock {
    /// Nanoseconds since any fixed point; never decreases.
    fn now_ns(&self) -> u64;
}

/// The result of one run of a candidate: its output, to compare with the
/// reference, or why it could not run.
pub type RunResult = Result<Vec<f32>, String>;

/// One way of doing the probed work.
pub struct Candidate<'a> {
    /// Its name, as stored (`avx512`).
    pub name: String,
    /// Runs it once and returns its output.
    pub run: Box<dyn FnMut() -> RunResult + 'a>,
}

impl<'a> Candidate<'a> {
    /// A candidate called `name` that runs `run`.
    pub fn new(name: impl Into<String>, run: impl FnMut() -> RunResult + 'a) -> Self {
        Self {
            name: name.into(),
            run: Box::new(run),
        }
    }
}

/// How one choice is measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    /// What is chosen (`cpu.isa`).
    pub name: String,
    /// The shapes and formats measured (`Q4_K 4096x4096`).
    pub shape: String,
    /// The candidate used where nothing is measured, and on a tie.
    pub default: String,
    /// Timed rounds (every valid candidate runs once a round).
    pub rounds: usize,
    /// Largest normalized mean squared error against the reference a
    /// valid candidate may have (`sum((y - ref)^2) / sum(ref^2)`).
    pub tolerance: f64,
    /// A lead over the default smaller than this fraction is a tie.
    pub tie: f64,
}

impl Probe {
    /// A probe of `name` on `shape` with default candidate `default`:
    /// 7 rounds, tolerance 1e-3, ties under 3%.
    pub fn new(
        name: impl Into<String>,
        shape: impl Into<String>,
        default: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            shape: shape.into(),
            default: default.into(),
            rounds: 7,
            tolerance: 1e-3,
            tie: 0.03,
        }
    }

    /// Validates each of `candidates` against `reference`, times the valid
    /// ones with `clock`, and returns the [`Record`] for `key`. Fails when
    /// no candidate is valid.
    pub fn run(
        &self,
        key: &TuneKey,
        candidates: &mut [Candidate<'_>],
        reference: &[f32],
        clock: &dyn Clock,
    ) -> Result<Record, TuneError> {
        let _span = crate::trace::span(crate::trace::Track::Load, format!("probe {}", self.name))
            .arg("shape", self.shape.as_str())
            .arg("candidates", candidates.len());
        // The validation run is also each candidate's warm-up.
        let rejected: Vec<Option<String>> = candidates
            .iter_mut()
            .map(|c| match (c.run)() {
                Ok(out) => self.check(&out, reference).err(),
                Err(e) => Some(format!("failed: {e}")),
            })
            .collect();
        let valid: Vec<usize> = (0..candidates.len())
            .filter(|&i| rejected[i].is_none())
            .collect();
        if valid.is_empty() {
            let reasons: Vec<String> = candidates
                .iter()
                .zip(&rejected)
                .map(|(c, r)| format!("{}: {}", c.name, r.as_deref().unwrap_or("?")))
                .collect();
            return Err(TuneError::NoValidCandidate {
                probe: self.name.clone(),
                reasons: reasons.join("; "),
            });
        }
        let mut times: Vec<Vec<u64>> = vec![Vec::new(); candidates.len()];
        for round in 0..self.rounds.max(1) {
            for k in 0..valid.len() {
                let i = valid[(k + round) % valid.len()];
                let t0 = clock.now_ns();
                // Validated above; a run failing now is not timed again.
                let ok = (candidates[i].run)().is_ok();
                let t1 = clock.now_ns();
                if ok {
                    times[i].push(t1.saturating_sub(t0));
                }
            }
        }
        let medians: Vec<Option<u64>> = times.iter_mut().map(|t| median(t)).collect();
        let (winner, why) = self.pick(candidates, &medians);
        let measured = candidates
            .iter()
            .zip(rejected)
            .zip(&medians)
            .map(|((c, rejected), m)| Measured {
                name: c.name.clone(),
                median_ns: *m,
                rejected,
            })
            .collect();
        Ok(Record {
            key: key.clone(),
            probe: self.name.clone(),
            shape: self.shape.clone(),
            default: self.default.clone(),
            winner,
            why,
            candidates: measured,
        })
    }

    /// `Ok` when `out` matches `reference` within the tolerance, else why not.
    fn check(&self, out: &[f32], reference: &[f32]) -> Result<(), String> {
        if out.len() != reference.len() {
            return Err(format!(
                "{} values where the reference has {}",
                out.len(),
                reference.len()
            ));
        }
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            return Err(format!("value {i} is {}", out[i]));
        }
        let (mut err, mut norm) = (0.0f64, 0.0f64);
        for (&y, &r) in out.iter().zip(reference) {
            err += (f64::from(y) - f64::from(r)).powi(2);
            norm += f64::from(r).powi(2);
        }
        let nmse = if norm > 0.0 { err / norm } else { err };
        if nmse > self.tolerance {
            return Err(format!(
                "normalized squared error {nmse:.2e} > {:.0e} against the reference",
                self.tolerance
            ));
        }
        Ok(())
    }

    /// The winner among the timed candidates and why.
    fn pick(&self, candidates: &[Candidate<'_>], medians: &[Option<u64>]) -> (String, String) {
        let timed = || {
            candidates
                .iter()
                .zip(medians)
                .filter_map(|(c, m)| m.map(|m| (c.name.as_str(), m)))
        };
        // First of the fastest: ties in the median go to the earlier candidate.
        let Some((fastest, best)) =
            timed().fold(None, |acc: Option<(&str, u64)>, (n, m)| match acc {
                Some((_, b)) if b <= m => acc,
                _ => Some((n, m)),
            })
        else {
            return (
                self.default.clone(),
                "nothing could be timed: default".into(),
            );
        };
        let Some((_, default_ns)) = timed().find(|(n, _)| *n == self.default) else {
            return (
                fastest.to_string(),
                format!("fastest; the default `{}` was not valid", self.default),
            );
        };
        if fastest == self.default {
            return (fastest.to_string(), "fastest, and the default".into());
        }
        let lead = (default_ns as f64 - best as f64) / (default_ns.max(1) as f64);
        if lead < self.tie {
            let why = format!(
                "tie: `{fastest}` leads by {:.1}% < {:.0}%, the default kept",
                lead * 100.0,
                self.tie * 100.0
            );
            return (self.default.clone(), why);
        }
        (
            fastest.to_string(),
            format!("fastest, {:.1}% ahead of the default", lead * 100.0),
        )
    }
}

/// The median of `t` (the lower middle of an even count), `None` when empty.
fn median(t: &mut [u64]) -> Option<u64> {
    if t.is_empty() {
        return None;
    }
    t.sort_unstable();
    Some(t[(t.len() - 1) / 2])
}
