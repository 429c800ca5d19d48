//! One engine step: schedule → one forward pass → sample → update → events.

use super::constraint::{allows, GrammarEnd};
use super::request::{EngineEvent, FinishReason};
use super::runner::{Engine, Live};
use super::select::Selection;
use super::EngineError;
use crate::kv::{KvManager, SeqId};
use crate::model::tokenizer::Tokenizer;
use crate::model::{Batch, ForwardModel, LogitsWanted, SeqInput};
use crate::sample::Sampled;
use crate::sched::{self, RequestId, SchedEvent, ScheduleKind, SchedulerOutput};
use crate::trace::{self, Track};

impl<M: ForwardModel> Engine<M> {
    /// Runs one step and returns what happened: token events in batch
    /// order, each request's `Finished` right after its last token. Returns
    /// no events when nothing is live.
    ///
    /// On a failed forward pass (or logits of the wrong size) the step is
    /// undone: its requests are recomputed by a later step, and the error
    /// returned. A request whose row cannot be sampled (non-finite logits)
    /// ends alone, with [`FinishReason::Error`]; the others go on.
    pub async fn step(&mut self) -> crate::Result<Vec<EngineEvent>> {
        let mut step = trace::span(Track::Engine, "step");
        let schedule = trace::span(Track::Engine, "schedule");
        let out = self.sched.schedule()?;
        drop(schedule);
        if out.is_empty() {
            self.sched.update_from_output(&[])?;
            return Ok(Vec::new());
        }
        let t0 = self.clock.now();
        self.mark_scheduled(&out, t0);
        let (sampled, failed) = match self.forward_and_sample(&out).await {
            Ok(result) => result,
            Err(e) => {
                self.sched.abort_step()?;
                return Err(e);
            }
        };
        let (prefill, decode) = self.count_tokens(&out);
        if step.is_recording() {
            step.set("requests", out.requests.len());
            step.set("prefill_tokens", prefill);
            step.set("decode_tokens", decode);
        }
        let _update = trace::span(Track::Engine, "update");
        self.counters
            .add_step(prefill, decode, self.clock.now() - t0);
        self.counters.sampled_tokens += sampled.len() as u64;
        let mut failed_events = Vec::with_capacity(failed.len());
        for (id, error) in failed {
            failed_events.push(self.fail(id, error)?);
        }
        let (live, tokenizer) = (&mut self.live, &self.tokenizer);
        let events = self
            .sched
            .update_from_output_with(&sampled, &mut |id, output| {
                live.get_mut(&id).is_some_and(|l| {
                    let text_stop = feed_text(l, tokenizer, output);
                    let grammar_end = l.grammar.as_mut().is_some_and(|g| g.advance(output));
                    text_stop || grammar_end
                })
            })?;
        let mut events = self.events_from(events)?;
        events.extend(failed_events);
        if trace::on() {
            let stats = self.sched.stats();
            trace::counter("running requests", stats.num_running as f64);
            trace::counter("waiting requests", stats.num_waiting as f64);
            let used = stats
                .num_usable_blocks
                .saturating_sub(stats.num_free_blocks);
            trace::counter("kv blocks used", used as f64);
        }
        Ok(events)
    }

    /// Ends `id`, whose logits could not be sampled, during the step in
    /// flight (the scheduler then skips it); returns its `Finished` event.
    fn fail(&mut self, id: RequestId, error: String) -> crate::Result<EngineEvent> {
        let mut live = self
            .live
            .remove(&id)
            .ok_or(EngineError::UnknownRequest { id })?;
        live.usage.generated_tokens = self.sched.output_tokens(id).map_or(0, <[u32]>::len);
        self.sched.cancel(id)?;
        Ok(self.finished_event(id, FinishReason::Error, &live, Some(error)))
    }

    /// Records first admission times and prefix-cache hits.
    fn mark_scheduled(&mut self, out: &SchedulerOutput, now: f64) {
        for r in &out.requests {
            if let Some(l) = self.live.get_mut(&r.id) {
                if r.kind == ScheduleKind::New && l.t_scheduled.is_none() {
                    l.t_scheduled = Some(now);
                    l.usage.cached_prompt_tokens = r.start;
                }
            }
        }
    }

    /// `(prefill, decode)` tokens of a step: a decode feeds back one
    /// generated token of a running request; everything else is prefill.
    fn count_tokens(&self, out: &SchedulerOutput) -> (usize, usize) {
        let mut counts = (0, 0);
        for r in &out.requests {
            let prompt = self.live.get(&r.id).map_or(0, |l| l.usage.prompt_tokens);
            let is_decode =
                r.num_tokens() == 1 && r.kind == ScheduleKind::Running && r.start >= prompt;
            if is_decode {
                counts.1 += 1;
            } else {
                counts.0 += r.num_tokens();
            }
        }
        counts
    }

    /// One forward pass over the whole batch, then one sample per request
    /// whose logits are due: `(sampled tokens, requests whose row could not
    /// be sampled with why)`.
    async fn forward_and_sample(
        &mut self,
        out: &SchedulerOutput,
    ) -> crate::Result<(Vec<(RequestId, u32)>, Vec<(RequestId, String)>)> {
        let seqs: Vec<SeqInput<'_>> = out
            .requests
            .iter()
            .map(|r| SeqInput {
                tokens: &r.tokens,
                start: r.start,
                slots: &r.slots,
                block_table: &r.block_table,
                logits: if r.samples {
                    LogitsWanted::Last
                } else {
                    LogitsWanted::None
                },
            })
            .collect();
        let batch = Batch { seqs: &seqs };
        match self.selection(out) {
            Selection::Argmax => return self.forward_argmax(out, &batch).await,
            Selection::TopK(k) => return self.forward_top_k(out, &batch, k).await,
            Selection::Logits => {}
        }
        let rows = batch.logits_rows();
        let model = trace::span(Track::Engine, "model");
        let logits = self.model.forward(&batch).await?;
        drop(model);
        let _sample = trace::span(Track::Engine, "sample");
        let n_vocab = self.model.config().n_vocab;
        if logits.len() != rows * n_vocab {
            let got = logits.len();
            return Err(EngineError::LogitsShape { got, rows, n_vocab }.into());
        }
        let mut sampled = Vec::with_capacity(rows);
        let mut failed = Vec::new();
        for (r, row) in out.sampling_requests().zip(logits.chunks_exact(n_vocab)) {
            let history = self.sched.all_tokens(r.id).unwrap_or(&[]);
            let live = self
                .live
                .get_mut(&r.id)
                .ok_or(EngineError::UnknownRequest { id: r.id })?;
            match sample_row(live, row, history) {
                Ok(s) => {
                    sampled.push((r.id, s.token));
                    live.sampled = Some(s);
                }
                Err(e) => failed.push((r.id, e)),
            }
        }
        Ok((sampled, failed))
    }

    /// Turns the scheduler's events into the engine's.
    fn events_from(&mut self, events: Vec<SchedEvent>) -> crate::Result<Vec<EngineEvent>> {
        let now = self.clock.now();
        let mut out = Vec::with_capacity(events.len());
        for event in events {
            match event {
                SchedEvent::Token { id, token, index } => {
                    let live = self
                        .live
                        .get_mut(&id)
                        .ok_or(EngineError::UnknownRequest { id })?;
                    if live.tokens_seen <= index {
                        live.text.push(&self.tokenizer.token_to_piece(token, false));
                        live.tokens_seen = index + 1;
                    }
                    live.usage.generated_tokens = index + 1;
                    live.t_first_token.get_or_insert(now);
                    let sampled = live.sampled.take().filter(|_| live.logprobs);
                    out.push(EngineEvent::Token {
                        request: id,
                        token,
                        text: live.text.take_ready(),
                        logprob: sampled.as_ref().map(|s| s.logprob),
                        top_logprobs: sampled.map(|s| s.top_logprobs).unwrap_or_default(),
                    });
                }
                SchedEvent::Finished {
                    id,
                    reason,
                    output_tokens,
                } => {
                    let mut live = self
                        .live
                        .remove(&id)
                        .ok_or(EngineError::UnknownRequest { id })?;
                    let (reason, error) = finish_reason(reason, &mut live, &output_tokens);
                    let tail = live.text.finish();
                    append_to_last_token(&mut out, id, &tail);
                    out.push(self.finished_event(id, reason, &live, error));
                }
            }
        }
        Ok(out)
    }

    /// The logits of every position of `tokens`, run as ONE forward pass
    /// from position 0: `[tokens.len()][n_vocab]` row-major (conformance
    /// tools, perplexity). Needs an idle engine; the prefix cache is reset
    /// afterwards, since the pass overwrites free blocks.
    pub async fn all_logits(&mut self, tokens: &[u32]) -> crate::Result<Vec<f32>> {
        if self.has_unfinished() {
            let live = self.live.len();
            let op = "all_logits";
            return Err(EngineError::Busy { op, live }.into());
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt.into());
        }
        let n_ctx = self.config.n_ctx;
        if tokens.len() > n_ctx {
            let tokens = tokens.len();
            return Err(EngineError::PromptTooLong { tokens, n_ctx }.into());
        }
        let n_vocab = self.model.config().n_vocab;
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::TokenOutOfVocab { token, n_vocab }.into());
        }
        let mut kv = KvManager::new(self.config.num_blocks(), self.config.block_size)?;
        let seq = SeqId(u64::MAX);
        let slots =
            kv.allocate_slots(seq, tokens, None, tokens.len())?
                .ok_or(EngineError::BadConfig {
                    detail: "the K/V pool is smaller than n_ctx".into(),
                })?;
        let block_table = kv.block_table(seq).unwrap_or(&[]);
        let seqs = [SeqInput {
            tokens,
            start: 0,
            slots: &slots,
            block_table,
            logits: LogitsWanted::All,
        }];
        self.sched.reset_prefix_cache();
        let t0 = self.clock.now();
        let logits = self.model.forward(&Batch { seqs: &seqs }).await;
        self.counters
            .add_step(tokens.len(), 0, self.clock.now() - t0);
        let logits = logits?;
        if logits.len() != tokens.len() * n_vocab {
            let (got, rows) = (logits.len(), tokens.len());
            return Err(EngineError::LogitsShape { got, rows, n_vocab }.into());
        }
        Ok(logits)
    }
}

/// The engine's reason (and error) for the scheduler's `reason` to end
/// `live`, whose output is `output`: a stop string wins; the scheduler's
/// stop callback ends a request whose grammar ended too; an output whose
/// grammar is complete ends with `Stop` even at `max_tokens`.
fn finish_reason(
    reason: sched::FinishReason,
    live: &mut Live,
    output: &[u32],
) -> (FinishReason, Option<String>) {
    if let (sched::FinishReason::Length, Some(g)) = (reason, live.grammar.as_mut()) {
        // The stop callback does not run on the token that reaches
        // `max_tokens`; the grammar sees it here.
        g.advance(output);
    }
    let grammar_end = live.grammar.as_ref().and_then(|g| g.end());
    match (reason, grammar_end) {
        _ if live.text.stopped() => (FinishReason::StopString, None),
        (sched::FinishReason::StopToken(_), _) => (FinishReason::Stop, None),
        (
            sched::FinishReason::StopString | sched::FinishReason::Length,
            Some(GrammarEnd::Complete),
        ) => (FinishReason::Stop, None),
        (sched::FinishReason::StopString, Some(GrammarEnd::Failed(e))) => {
            (FinishReason::Error, Some(e.clone()))
        }
        (sched::FinishReason::StopString, None) => (FinishReason::StopString, None),
        (sched::FinishReason::Length, _) => (FinishReason::Length, None),
        (sched::FinishReason::Cancelled, _) => (FinishReason::Cancelled, None),
    }
}

/// Samples `live`'s row of `logits`, through its grammar's mask when it
/// has one; `Err` says why the row cannot be sampled.
fn sample_row(live: &mut Live, logits: &[f32], history: &[u32]) -> Result<Sampled, String> {
    let Some(grammar) = live.grammar.as_mut() else {
        return live
            .sampler
            .sample(logits, history)
            .map_err(|e| e.to_string());
    };
    let mask = grammar.mask()?;
    live.sampler
        .sample_allowed(logits, history, &|t| allows(&mask, t))
        .map_err(|e| e.to_string())
}

/// Runs the output tokens of `live` not yet seen through its text stream;
/// returns whether a stop string matched.
fn feed_text(live: &mut Live, tokenizer: &Tokenizer, output: &[u32]) -> bool {
    for &token in output.iter().skip(live.tokens_seen) {
        live.text.push(&tokenizer.token_to_piece(token, false));
    }
    live.tokens_seen = live.tokens_seen.max(output.len());
    live.text.stopped()
}

/// Adds `tail` (text released at the end) to the request's last token event.
fn append_to_last_token(events: &mut [EngineEvent], id: RequestId, tail: &str) {
    if tail.is_empty() {
        return;
    }
    let last = events.iter_mut().rev().find_map(|e| match e {
        EngineEvent::Token { request, text, .. } if *request == id => Some(text),
        _ => None,
    });
    if let Some(text) = last {
        text.push_str(tail);
    }
}
