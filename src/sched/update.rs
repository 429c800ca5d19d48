//! Applying a step's results: new tokens, stop rules, cancellation, stats.

use std::collections::HashMap;

use super::request::{FinishReason, RequestId, SchedEvent, Status};
use super::scheduler::Scheduler;
use super::SchedError;
use crate::kv::{PrefixCacheStats, SeqId};
use crate::sample::SamplingParams;

/// A snapshot of the scheduler's state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerStats {
    /// Steps scheduled so far.
    pub steps: u64,
    /// Requests running.
    pub num_running: usize,
    /// Requests waiting (new or preempted).
    pub num_waiting: usize,
    /// Free KV blocks (cached free blocks included).
    pub num_free_blocks: usize,
    /// KV blocks in all (the null block excluded).
    pub num_usable_blocks: usize,
    /// Preemptions so far.
    pub num_preemptions: u64,
    /// Prefix-cache counters.
    pub prefix: PrefixCacheStats,
    /// `prefix.hit_rate()`.
    pub prefix_hit_rate: f64,
}

impl Scheduler {
    /// [`update_from_output_with`](Self::update_from_output_with) without a
    /// stop-string check.
    pub fn update_from_output(
        &mut self,
        sampled: &[(RequestId, u32)],
    ) -> Result<Vec<SchedEvent>, SchedError> {
        self.update_from_output_with(sampled, &mut |_, _| false)
    }

    /// Ends the step in flight: every scheduled request's tokens count as
    /// computed (full blocks enter the prefix cache), and each request whose
    /// logits were sampled (`samples` in the output) gets its token from
    /// `sampled`, one per such request. A request then finishes on a stop
    /// token, on `max_tokens`, or when `stop(id, output_tokens)` returns true
    /// (the engine's stop-string check, which keeps the text position); its
    /// blocks are released at once.
    ///
    /// Errors (and nothing changes, the step stays in flight): no step in
    /// flight, a token for a request that did not sample, or a missing token.
    /// Requests cancelled during the step are skipped.
    pub fn update_from_output_with(
        &mut self,
        sampled: &[(RequestId, u32)],
        stop: &mut dyn FnMut(RequestId, &[u32]) -> bool,
    ) -> Result<Vec<SchedEvent>, SchedError> {
        let batch = self.in_flight.take().ok_or(SchedError::NoStepInFlight)?;
        let tokens: HashMap<RequestId, u32> = sampled.iter().copied().collect();
        if let Err(e) = self.check_samples(&batch, sampled, &tokens) {
            self.in_flight = Some(batch);
            return Err(e);
        }
        let mut events = Vec::new();
        for &(id, serial, n, samples) in &batch {
            if self.entries.get(&id).is_none_or(|e| e.serial != serial) {
                continue;
            }
            let e = self.entry_mut(id)?;
            e.num_computed += n;
            let computed = e.num_computed;
            let e = self
                .entries
                .get(&id)
                .ok_or(SchedError::UnknownRequest { id })?;
            self.kv.commit_computed(SeqId(id.0), &e.tokens, computed)?;
            match (samples, tokens.get(&id)) {
                (true, Some(&token)) => self.append_token(id, token, stop, &mut events)?,
                (true, None) => {
                    return Err(SchedError::Internal {
                        detail: format!("{id} lost its checked sample"),
                    })
                }
                (false, _) => {}
            }
        }
        Ok(events)
    }

    /// Every sample must belong to a live request of the batch that samples,
    /// and every such request must have one.
    fn check_samples(
        &self,
        batch: &[(RequestId, u64, usize, bool)],
        sampled: &[(RequestId, u32)],
        tokens: &HashMap<RequestId, u32>,
    ) -> Result<(), SchedError> {
        let live =
            |id: RequestId, serial: u64| self.entries.get(&id).is_some_and(|e| e.serial == serial);
        let wants: HashMap<RequestId, bool> = batch
            .iter()
            .map(|&(id, serial, _, s)| (id, s && live(id, serial)))
            .collect();
        if tokens.len() != sampled.len() {
            return Err(SchedError::BadSamples {
                detail: "a request got more than one token".into(),
            });
        }
        for &(id, _) in sampled {
            if !wants.contains_key(&id) {
                return Err(SchedError::BadSamples {
                    detail: format!("{id} was not sampled in this step"),
                });
            }
        }
        for (&id, &want) in &wants {
            if want && !tokens.contains_key(&id) {
                return Err(SchedError::BadSamples {
                    detail: format!("no token for {id}, whose logits were due for sampling"),
                });
            }
        }
        Ok(())
    }

    fn append_token(
        &mut self,
        id: RequestId,
        token: u32,
        stop: &mut dyn FnMut(RequestId, &[u32]) -> bool,
        events: &mut Vec<SchedEvent>,
    ) -> Result<(), SchedError> {
        let e = self.entry_mut(id)?;
        e.tokens.push(token);
        let index = e.output().len() - 1;
        events.push(SchedEvent::Token { id, token, index });
        let reason = if e.req.stop_token_ids.contains(&token) {
            Some(FinishReason::StopToken(token))
        } else if index + 1 >= e.req.max_tokens {
            Some(FinishReason::Length)
        } else if stop(id, e.output()) {
            Some(FinishReason::StopString)
        } else {
            None
        };
        if let Some(reason) = reason {
            events.push(self.finish(id, reason)?);
        }
        Ok(())
    }

    /// Stops `id` now, wherever it is: its blocks are released at once and
    /// the returned event is its `Finished(Cancelled)`. A token sampled for it
    /// in the step in flight is ignored. Error when `id` is not live.
    ///
    /// Cancelling during a step is safe as long as that step's forward pass
    /// ends before the next [`schedule`](Self::schedule): the step writes only
    /// into the request's unshared tail blocks, which no one else holds
    /// until they are allocated again.
    pub fn cancel(&mut self, id: RequestId) -> Result<SchedEvent, SchedError> {
        self.finish(id, FinishReason::Cancelled)
    }

    fn finish(&mut self, id: RequestId, reason: FinishReason) -> Result<SchedEvent, SchedError> {
        let e = self
            .entries
            .remove(&id)
            .ok_or(SchedError::UnknownRequest { id })?;
        match e.status {
            Status::Running => self.running.retain(|&r| r != id),
            Status::Waiting => self.waiting.retain(|&r| r != id),
        }
        if self.kv.contains(SeqId(id.0)) {
            self.kv.free(SeqId(id.0))?;
        }
        let output_tokens = e.output().to_vec();
        Ok(SchedEvent::Finished {
            id,
            reason,
            output_tokens,
        })
    }

    /// Drops the step in flight without counting any of it as computed, for
    /// when the forward pass failed: every live request of the step is
    /// preempted (blocks freed, back at the head of the waiting queue in
    /// admission order) and recomputed later. Returns them, oldest first.
    pub fn abort_step(&mut self) -> Result<Vec<RequestId>, SchedError> {
        let batch = self.in_flight.take().ok_or(SchedError::NoStepInFlight)?;
        let live =
            |id: RequestId, serial: u64| self.entries.get(&id).is_some_and(|e| e.serial == serial);
        let hit: Vec<RequestId> = batch
            .iter()
            .filter(|&&(id, serial, _, _)| live(id, serial))
            .map(|b| b.0)
            .collect();
        let mut newest_first: Vec<RequestId> = self
            .running
            .iter()
            .rev()
            .filter(|id| hit.contains(id))
            .copied()
            .collect();
        self.running.retain(|id| !hit.contains(id));
        for &id in &newest_first {
            self.requeue(id)?;
        }
        newest_first.reverse();
        Ok(newest_first)
    }

    /// Forgets cached free blocks (new weights, or cached K/V that can no
    /// longer be trusted); blocks of live requests are untouched.
    pub fn reset_prefix_cache(&mut self) {
        self.kv.reset_prefix_cache();
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.entries.is_empty()
    }

    /// Prompt followed by the output so far, for a live request (the
    /// penalties' history).
    pub fn all_tokens(&self, id: RequestId) -> Option<&[u32]> {
        self.entries.get(&id).map(|e| e.tokens.as_slice())
    }

    /// Output tokens so far of a live request.
    pub fn output_tokens(&self, id: RequestId) -> Option<&[u32]> {
        self.entries.get(&id).map(|e| e.output())
    }

    /// Sampling parameters of a live request.
    pub fn sampling_params(&self, id: RequestId) -> Option<&SamplingParams> {
        self.entries.get(&id).map(|e| &e.req.sampling)
    }

    /// Counters and queue lengths.
    pub fn stats(&self) -> SchedulerStats {
        let prefix = self.kv.prefix_stats();
        SchedulerStats {
            steps: self.step,
            num_running: self.running.len(),
            num_waiting: self.waiting.len(),
            num_free_blocks: self.kv.num_free_blocks(),
            num_usable_blocks: self.kv.num_usable_blocks(),
            num_preemptions: self.num_preemptions,
            prefix,
            prefix_hit_rate: prefix.hit_rate(),
        }
    }
}
