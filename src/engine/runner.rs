//! The engine's state and request lifecycle: adding, cancelling, reading.

use std::collections::HashMap;

use super::clock::Clock;
use super::config::EngineConfig;
use super::constraint::{Constraint, Grammar, GrammarEnv};
use super::prompt::tokenize_prompt;
use super::request::{EngineEvent, FinishReason, GenerateRequest, Prompt, RequestTimings, Usage};
use super::stats::{Counters, EngineStats};
use super::text::TextStream;
use super::EngineError;
use crate::model::chat::ChatTemplate;
use crate::model::tokenizer::Tokenizer;
use crate::model::ForwardModel;
use crate::sample::{Sampled, Sampler};
use crate::sched::{Request, RequestId, Scheduler};
use crate::trace::{self, Track};

/// The engine: a model, its tokenizer and chat template, the scheduler and
/// one sampler per live request. See the [module docs](super) for the loop.
#[derive(Debug)]
pub struct Engine<M: ForwardModel> {
    pub(crate) model: M,
    pub(crate) tokenizer: Tokenizer,
    pub(crate) chat_template: Option<ChatTemplate>,
    pub(crate) config: EngineConfig,
    pub(crate) sched: Scheduler,
    pub(crate) live: HashMap<RequestId, Live>,
    pub(crate) next_id: u64,
    pub(crate) counters: Counters,
    pub(crate) clock: Clock,
    /// End-of-generation token ids of the vocabulary.
    pub(crate) eog: Vec<u32>,
    /// The grammar compiler, built on the first constrained request.
    pub(crate) grammar_env: Option<GrammarEnv>,
}

/// The engine's record of a live request.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) sampler: Sampler,
    /// The request's constraint, if it has one.
    pub(crate) grammar: Option<Grammar>,
    pub(crate) text: TextStream,
    pub(crate) logprobs: bool,
    /// The token sampled for it this step, with its log-probabilities.
    pub(crate) sampled: Option<Sampled>,
    /// Output tokens whose text went through `text`.
    pub(crate) tokens_seen: usize,
    pub(crate) usage: Usage,
    pub(crate) t_added: f64,
    pub(crate) t_scheduled: Option<f64>,
    pub(crate) t_first_token: Option<f64>,
}

impl<M: ForwardModel> Engine<M> {
    /// An engine over `model`, which must have been loaded with
    /// `config.kv_cache_config()`. `chat_template` serves
    /// [`Prompt::Chat`] requests (none: they are refused).
    pub fn new(
        model: M,
        tokenizer: Tokenizer,
        chat_template: Option<ChatTemplate>,
        config: EngineConfig,
    ) -> crate::Result<Self> {
        config.validate()?;
        let sched = Scheduler::new(config.scheduler_config())?;
        let eog = (0..tokenizer.vocab_size() as u32)
            .filter(|&t| tokenizer.is_eog(t))
            .collect();
        Ok(Engine {
            model,
            tokenizer,
            chat_template,
            config,
            sched,
            live: HashMap::new(),
            next_id: 0,
            counters: Counters::default(),
            clock: Clock::default_for_target(),
            eog,
            grammar_env: None,
        })
    }

    /// Replaces the clock timings are read from.
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// The prompt's token ids, as [`add_request`](Self::add_request) would
    /// feed them.
    pub fn tokenize_prompt(&self, prompt: &Prompt) -> crate::Result<Vec<u32>> {
        let n_vocab = self.model.config().n_vocab;
        tokenize_prompt(
            prompt,
            &self.tokenizer,
            self.chat_template.as_ref(),
            n_vocab,
        )
    }

    /// Queues a request; it runs from the next [`step`](Self::step).
    ///
    /// Errors: an empty prompt, a prompt of `n_ctx` tokens or more
    /// ([`EngineError::PromptTooLong`]), `max_tokens == Some(0)`, a chat
    /// prompt without a template, bad sampling parameters, token ids outside
    /// the vocabulary, a constraint that does not compile
    /// ([`EngineError::BadGrammar`]). A refused request leaves the engine
    /// as it was.
    ///
    /// The first constrained request also indexes the vocabulary for the
    /// grammar engine (once per engine; see [`Engine::prepare_constraints`]
    /// to do it ahead).
    pub fn add_request(&mut self, req: GenerateRequest) -> crate::Result<RequestId> {
        let prompt = self.tokenize_prompt(&req.prompt)?;
        let n_ctx = self.config.n_ctx;
        if prompt.len() >= n_ctx {
            let tokens = prompt.len();
            return Err(EngineError::PromptTooLong { tokens, n_ctx }.into());
        }
        let room = n_ctx - prompt.len();
        let max_tokens = match req.max_tokens {
            Some(0) => return Err(EngineError::ZeroMaxTokens.into()),
            Some(n) => n.min(room),
            None => room,
        };
        let mut sampling = req.sampling.clone();
        if let Some(n) = req.logprobs {
            sampling.top_logprobs = n;
        }
        let sampler = Sampler::new(sampling.clone())?;
        let grammar = match &req.constraint {
            Some(c) => Some(self.compile_constraint(c)?),
            None => None,
        };
        let id = RequestId(self.next_id);
        let prompt_tokens = prompt.len();
        self.sched.add_request(Request {
            id,
            prompt_tokens: prompt,
            max_tokens,
            stop_token_ids: if req.ignore_eos {
                Vec::new()
            } else {
                self.eog.clone()
            },
            sampling,
        })?;
        self.next_id += 1;
        let live = Live {
            sampler,
            grammar,
            text: TextStream::new(&req.stop),
            logprobs: req.logprobs.is_some(),
            sampled: None,
            tokens_seen: 0,
            usage: Usage {
                prompt_tokens,
                ..Usage::default()
            },
            t_added: self.clock.now(),
            t_scheduled: None,
            t_first_token: None,
        };
        self.live.insert(id, live);
        Ok(id)
    }

    /// Builds the grammar engine's index of the vocabulary now rather than
    /// on the first constrained request (a server can do it at start-up, so
    /// no request waits for it). Errors as
    /// [`EngineError::ConstraintUnsupported`] when the model cannot be
    /// constrained.
    pub fn prepare_constraints(&mut self) -> crate::Result<()> {
        self.grammar_env()?;
        Ok(())
    }

    /// The grammar compiler, built on first use.
    fn grammar_env(&mut self) -> Result<&GrammarEnv, EngineError> {
        let env = match self.grammar_env.take() {
            Some(env) => env,
            None => GrammarEnv::new(&self.tokenizer, &self.eog)?,
        };
        Ok(self.grammar_env.insert(env))
    }

    /// `constraint` compiled into a matcher at the start of the output.
    fn compile_constraint(&mut self, constraint: &Constraint) -> crate::Result<Grammar> {
        Ok(self.grammar_env()?.compile(constraint)?)
    }

    /// Ends `id` now and frees its K/V blocks; returns its `Finished`
    /// event (reason `Cancelled`). Text it held back is dropped.
    pub fn cancel(&mut self, id: RequestId) -> crate::Result<EngineEvent> {
        let Some(mut live) = self.live.remove(&id) else {
            return Err(EngineError::UnknownRequest { id }.into());
        };
        let generated = self.sched.output_tokens(id).map_or(0, <[u32]>::len);
        self.sched.cancel(id)?;
        live.usage.generated_tokens = generated;
        Ok(self.finished_event(id, FinishReason::Cancelled, &live, None))
    }

    /// The `Finished` event of `live`, timed now, with `error` for
    /// [`FinishReason::Error`].
    pub(crate) fn finished_event(
        &self,
        id: RequestId,
        reason: FinishReason,
        live: &Live,
        error: Option<String>,
    ) -> EngineEvent {
        let now = self.clock.now();
        let scheduled = live.t_scheduled.unwrap_or(now);
        let first = live.t_first_token.unwrap_or(now);
        trace_request(id, reason, live, [live.t_added, scheduled, first, now]);
        EngineEvent::Finished {
            request: id,
            reason,
            usage: live.usage,
            timings: RequestTimings {
                queue_s: scheduled - live.t_added,
                prefill_s: first - scheduled,
                decode_s: now - first,
            },
            error,
        }
    }

    /// Whether any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        self.sched.has_unfinished()
    }

    /// Live requests (waiting or running).
    pub fn num_unfinished(&self) -> usize {
        self.live.len()
    }

    /// Throughput counters and the scheduler's state.
    pub fn stats(&self) -> EngineStats {
        self.counters.snapshot(self.sched.stats())
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat template, if any.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The model, mutably (between steps only: a forward pass in flight
    /// must not see its state change).
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The scheduler (queues, block tables, pool), read-only.
    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }
}

/// Puts a finished request's phases on its own trace track: queued,
/// prefill (to its first token), decode, then its finish. `times` are on
/// the engine's clock; the trace's may differ by an offset.
fn trace_request(id: RequestId, reason: FinishReason, live: &Live, times: [f64; 4]) {
    let Some(trace_now) = trace::now() else {
        return;
    };
    let shift = trace_now - times[3];
    let track = Track::Request(id.0);
    let usage = live.usage;
    let phases = [
        ("queued", times[0], times[1], Vec::new()),
        (
            "prefill",
            times[1],
            times[2],
            vec![
                ("prompt_tokens", usage.prompt_tokens.into()),
                ("cached_tokens", usage.cached_prompt_tokens.into()),
            ],
        ),
        (
            "decode",
            times[2],
            times[3],
            vec![("generated_tokens", usage.generated_tokens.into())],
        ),
    ];
    for (name, start, end, args) in phases {
        trace::complete(track, name, start + shift, end + shift, args);
    }
    trace::instant(
        track,
        "finish",
        vec![("reason", format!("{reason:?}").into())],
    );
}
