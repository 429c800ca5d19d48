//! Where a step's tokens are picked: on the model's device when the rows'
//! samplers allow it, so a GPU step reads back one u32 (greedy) or `k`
//! `(token, logit)` pairs (a top-k draw) per row instead of the logits.
//!
//! The picks are exactly the host samplers' ([`Sampler::sample`] on the
//! whole row): the device selects with the samplers' own order (value
//! descending, then token id), and the draw, with its random stream, stays
//! on the host over those candidates.
//!
//! [`Sampler::sample`]: crate::sample::Sampler::sample

use super::runner::Engine;
use super::EngineError;
use crate::graph::NON_FINITE_ROW;
use crate::model::{Batch, ForwardModel};
use crate::sched::{RequestId, SchedulerOutput};
use crate::trace::{self, Track};

/// How the rows of one step get their tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Selection {
    /// Every row is plain greedy: the device returns each row's argmax.
    Argmax,
    /// Every row is greedy or a top-k draw with `top_k <= k`: the device
    /// returns each row's `k` best candidates.
    TopK(usize),
    /// Some row needs the whole logits row (penalties, no top-k, greedy
    /// log-probabilities, a constraint).
    Logits,
}

/// Sampled tokens, and the requests whose row could not be sampled with why.
pub(super) type Picks = (Vec<(RequestId, u32)>, Vec<(RequestId, String)>);

/// Why a row the device marked non-finite failed.
const NON_FINITE: &str = "the logits row holds a NaN or an infinity: the forward pass \
                          produced a non-finite value";

impl<M: ForwardModel> Engine<M> {
    /// How the step's sampling rows can be picked.
    pub(super) fn selection(&self, out: &SchedulerOutput) -> Selection {
        let n_vocab = self.model.config().n_vocab;
        let mut k = 0;
        for r in out.sampling_requests() {
            let Some(live) = self.live.get(&r.id) else {
                return Selection::Logits;
            };
            // A grammar's mask must see the whole row: the device's argmax
            // or best candidates may all be tokens it rules out.
            if live.grammar.is_some() {
                return Selection::Logits;
            }
            if !live.logprobs && live.sampler.is_plain_greedy() {
                continue;
            }
            match live.sampler.device_top_k() {
                Some(rk) if rk <= n_vocab => k = k.max(rk),
                _ => return Selection::Logits,
            }
        }
        if k == 0 {
            Selection::Argmax
        } else {
            Selection::TopK(k)
        }
    }

    /// The step of [`Selection::Argmax`].
    pub(super) async fn forward_argmax(
        &mut self,
        out: &SchedulerOutput,
        batch: &Batch<'_>,
    ) -> crate::Result<Picks> {
        let rows = batch.logits_rows();
        let model = trace::span(Track::Engine, "model");
        let picks = self.model.forward_argmax(batch).await?;
        drop(model);
        let _sample = trace::span(Track::Engine, "sample");
        self.check_rows(picks.len(), rows)?;
        let mut sampled = Vec::with_capacity(rows);
        let mut failed = Vec::new();
        for (r, &token) in out.sampling_requests().zip(&picks) {
            if token == NON_FINITE_ROW {
                failed.push((r.id, NON_FINITE.to_string()));
            } else {
                sampled.push((r.id, token));
            }
        }
        Ok((sampled, failed))
    }

    /// The step of [`Selection::TopK`]: greedy rows take the best candidate,
    /// the others draw from theirs.
    pub(super) async fn forward_top_k(
        &mut self,
        out: &SchedulerOutput,
        batch: &Batch<'_>,
        k: usize,
    ) -> crate::Result<Picks> {
        let rows = batch.logits_rows();
        let model = trace::span(Track::Engine, "model");
        let tops = self.model.forward_top_k(batch, k).await?;
        drop(model);
        let _sample = trace::span(Track::Engine, "sample");
        self.check_rows(tops.len(), rows)?;
        let mut sampled = Vec::with_capacity(rows);
        let mut failed = Vec::new();
        for (r, top) in out.sampling_requests().zip(&tops) {
            let live = self
                .live
                .get_mut(&r.id)
                .ok_or(EngineError::UnknownRequest { id: r.id })?;
            let best = top.first().map_or(NON_FINITE_ROW, |c| c.0);
            if live.sampler.is_plain_greedy() && !live.logprobs {
                if best == NON_FINITE_ROW {
                    failed.push((r.id, NON_FINITE.to_string()));
                } else {
                    sampled.push((r.id, best));
                }
                continue;
            }
            match live.sampler.sample_top_k(top) {
                Ok(s) => {
                    sampled.push((r.id, s.token));
                    live.sampled = Some(s);
                }
                Err(e) => failed.push((r.id, e.to_string())),
            }
        }
        Ok((sampled, failed))
    }

    /// Errors unless the model returned one pick per wanted row.
    fn check_rows(&self, got: usize, rows: usize) -> crate::Result<()> {
        if got == rows {
            return Ok(());
        }
        let n_vocab = self.model.config().n_vocab;
        let got = got * n_vocab;
        Err(EngineError::LogitsShape { got, rows, n_vocab }.into())
    }
}
