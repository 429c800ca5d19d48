//! The continuous-batching scheduler (vLLM v1's shape): each step picks, as
//! plain data, which requests run and how many tokens each.
//!
//! Order within a step: one-token decodes of running requests first, then
//! the next prefill chunks of running requests, then waiting requests are
//! admitted first-come first-served while the token budget, the sequence
//! limit and the free blocks allow, skipping the tokens the prefix cache
//! already holds. When a running request needs a block and none is free, the
//! newest running request is preempted by recompute: its blocks are freed
//! and it goes back to the head of the waiting queue with its output kept,
//! to be prefilled again as prompt + output (its own freed blocks often
//! still sit in the prefix cache). Every request alone fits the pool (checked
//! when added), so the oldest running request always progresses: no request
//! starves.

use std::collections::{HashMap, VecDeque};

use super::output::{ScheduleKind, ScheduledRequest, SchedulerOutput};
use super::request::{Entry, Request, RequestId, Status};
use super::SchedError;
use crate::kv::{CachedPrefix, KvManager, SeqId, Slot, DEFAULT_BLOCK_SIZE};

/// Limits of the scheduler and size of the KV pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most tokens computed in one step (the token budget), >= 1.
    pub max_num_batched_tokens: usize,
    /// Most requests running at once, >= 1.
    pub max_num_seqs: usize,
    /// KV blocks in the pool, the null block included.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Reuse cached full blocks across requests.
    pub enable_prefix_caching: bool,
    /// Most prompt tokens a step computes beside each four running decodes
    /// (or fewer; 0: the whole budget). A prompt chunk slows every decode in
    /// its step, so this keeps the prompt share of a step in proportion to
    /// its decodes: the time between tokens stays bounded while new prompts
    /// come in, and more streams (which bring more prompts) get larger
    /// chunks. A step with no decodes takes the whole budget.
    pub prefill_tokens_per_4_decodes: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_num_batched_tokens: 2048,
            max_num_seqs: 64,
            num_blocks: 1024,
            block_size: DEFAULT_BLOCK_SIZE,
            enable_prefix_caching: true,
            prefill_tokens_per_4_decodes: 0,
        }
    }
}

/// The scheduler: requests, their KV blocks, and the step protocol
/// `schedule()` → model → `update_from_output()`, strictly alternating.
#[derive(Debug, Clone)]
pub struct Scheduler {
    pub(crate) config: SchedulerConfig,
    pub(crate) kv: KvManager,
    pub(crate) entries: HashMap<RequestId, Entry>,
    pub(crate) waiting: VecDeque<RequestId>,
    /// Oldest admission first: the newest is preempted first.
    pub(crate) running: Vec<RequestId>,
    /// The step between `schedule` and `update_from_output`:
    /// (request, its serial, tokens computed, samples).
    pub(crate) in_flight: Option<Vec<(RequestId, u64, usize, bool)>>,
    pub(crate) step: u64,
    pub(crate) next_serial: u64,
    pub(crate) num_preemptions: u64,
}

/// What a step is building.
struct StepBuild {
    budget: usize,
    out: Vec<ScheduledRequest>,
    preempted: Vec<RequestId>,
}

impl Scheduler {
    /// A scheduler with an empty pool of `config.num_blocks` blocks.
    pub fn new(config: SchedulerConfig) -> Result<Self, SchedError> {
        if config.max_num_batched_tokens == 0 || config.max_num_seqs == 0 {
            return Err(SchedError::BadConfig {
                detail: "max_num_batched_tokens and max_num_seqs must be >= 1".into(),
            });
        }
        let kv = KvManager::new(config.num_blocks, config.block_size)?;
        Ok(Scheduler {
            config,
            kv,
            entries: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_flight: None,
            step: 0,
            next_serial: 0,
            num_preemptions: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// The KV manager (block tables, pool), read-only.
    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    /// Queues `req` at the back of the waiting queue.
    ///
    /// Errors: an id already live, an empty prompt, `max_tokens == 0`, or a
    /// request whose prompt plus output could never fit the pool on its own.
    pub fn add_request(&mut self, req: Request) -> Result<(), SchedError> {
        if self.entries.contains_key(&req.id) {
            return Err(SchedError::DuplicateId { id: req.id });
        }
        if req.prompt_tokens.is_empty() || req.max_tokens == 0 {
            return Err(SchedError::EmptyRequest { id: req.id });
        }
        // The last sampled token is never fed back, so it needs no slot.
        let kv_tokens = req.prompt_tokens.len() + req.max_tokens - 1;
        let blocks = kv_tokens.div_ceil(self.kv.block_size());
        if blocks > self.kv.num_usable_blocks() {
            return Err(SchedError::TooLong {
                id: req.id,
                tokens: kv_tokens,
                blocks,
                usable: self.kv.num_usable_blocks(),
            });
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let tokens = req.prompt_tokens.clone();
        self.waiting.push_back(req.id);
        self.entries.insert(
            req.id,
            Entry {
                req,
                tokens,
                num_computed: 0,
                status: Status::Waiting,
                num_preemptions: 0,
                serial,
            },
        );
        Ok(())
    }

    /// Decides the next step (see the module docs for the order). Error when
    /// the previous step's [`update_from_output`](Self::update_from_output)
    /// has not been called.
    pub fn schedule(&mut self) -> Result<SchedulerOutput, SchedError> {
        if self.in_flight.is_some() {
            return Err(SchedError::StepInFlight);
        }
        let mut b = StepBuild {
            budget: self.config.max_num_batched_tokens,
            out: Vec::new(),
            preempted: Vec::new(),
        };
        self.schedule_running(&mut b, true)?;
        let per4 = self.config.prefill_tokens_per_4_decodes;
        if per4 > 0 && !b.out.is_empty() {
            // Only prefill chunks follow: the cap is their budget.
            b.budget = b.budget.min(per4 * b.out.len().div_ceil(4));
        }
        self.schedule_running(&mut b, false)?;
        if b.preempted.is_empty() {
            self.admit_waiting(&mut b)?;
        }
        let num_batched_tokens = b.out.iter().map(|r| r.num_tokens()).sum();
        debug_assert!(
            num_batched_tokens <= self.config.max_num_batched_tokens,
            "budget overrun"
        );
        debug_assert!(
            self.running.len() <= self.config.max_num_seqs,
            "too many running requests"
        );
        let flight = b
            .out
            .iter()
            .map(|r| Ok((r.id, self.entry(r.id)?.serial, r.num_tokens(), r.samples)))
            .collect::<Result<_, SchedError>>()?;
        self.in_flight = Some(flight);
        let out = SchedulerOutput {
            step: self.step,
            requests: b.out,
            preempted: b.preempted,
            num_batched_tokens,
        };
        self.step += 1;
        Ok(out)
    }

    /// One pass over running requests: decodes (one token left) when
    /// `decodes`, else prefill chunks.
    fn schedule_running(&mut self, b: &mut StepBuild, decodes: bool) -> Result<(), SchedError> {
        let mut i = 0;
        while i < self.running.len() && b.budget > 0 {
            let id = self.running[i];
            let e = self.entry(id)?;
            let left = e.tokens.len() - e.num_computed;
            if (left == 1) != decodes || b.out.iter().any(|r| r.id == id) {
                i += 1;
                continue;
            }
            let n = left.min(b.budget);
            match self.allocate_or_preempt(id, n, b)? {
                Some(slots) => {
                    b.budget -= n;
                    let s = self.scheduled(id, ScheduleKind::Running, slots)?;
                    b.out.push(s);
                    i += 1;
                }
                // It preempted itself: every newer request is preempted too.
                None => break,
            }
        }
        Ok(())
    }

    /// Allocates `n` slots for running `id`, preempting the newest running
    /// requests until it fits; `None` when `id` itself had to go.
    fn allocate_or_preempt(
        &mut self,
        id: RequestId,
        n: usize,
        b: &mut StepBuild,
    ) -> Result<Option<Vec<Slot>>, SchedError> {
        loop {
            let tokens = &self
                .entries
                .get(&id)
                .ok_or(SchedError::UnknownRequest { id })?
                .tokens;
            if let Some(slots) = self.kv.allocate_slots(SeqId(id.0), tokens, None, n)? {
                return Ok(Some(slots));
            }
            let Some(victim) = self.running.pop() else {
                return Err(SchedError::Internal {
                    detail: format!("{id} is running but not in the running list"),
                });
            };
            self.preempt(victim, b)?;
            if victim == id {
                return Ok(None);
            }
        }
    }

    /// Frees `victim`'s blocks and puts it at the head of the waiting queue;
    /// takes it out of this step's batch if it was in it.
    fn preempt(&mut self, victim: RequestId, b: &mut StepBuild) -> Result<(), SchedError> {
        if let Some(pos) = b.out.iter().position(|r| r.id == victim) {
            b.budget += b.out.remove(pos).num_tokens();
        }
        self.requeue(victim)?;
        b.preempted.push(victim);
        Ok(())
    }

    /// Frees the blocks of `id` (already out of the running list) and puts
    /// it at the head of the waiting queue, to be recomputed from token 0
    /// (prefix-cache hits permitting) with its output kept.
    pub(crate) fn requeue(&mut self, id: RequestId) -> Result<(), SchedError> {
        debug_assert!(
            !self.running.contains(&id),
            "{id} is still in the running list"
        );
        if self.kv.contains(SeqId(id.0)) {
            self.kv.free(SeqId(id.0))?;
        }
        let e = self.entry_mut(id)?;
        e.num_computed = 0;
        e.status = Status::Waiting;
        e.num_preemptions += 1;
        self.waiting.push_front(id);
        self.num_preemptions += 1;
        Ok(())
    }

    /// Admits waiting requests in order until one does not fit.
    fn admit_waiting(&mut self, b: &mut StepBuild) -> Result<(), SchedError> {
        while b.budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else {
                break;
            };
            let e = self
                .entries
                .get(&id)
                .ok_or(SchedError::UnknownRequest { id })?;
            let prefix = if self.config.enable_prefix_caching {
                self.kv.find_cached_prefix(&e.tokens)
            } else {
                CachedPrefix::default()
            };
            let n = (e.tokens.len() - prefix.num_cached_tokens).min(b.budget);
            let Some(slots) = self
                .kv
                .allocate_slots(SeqId(id.0), &e.tokens, Some(&prefix), n)?
            else {
                break;
            };
            self.waiting.pop_front();
            self.running.push(id);
            let e = self.entry_mut(id)?;
            e.num_computed = prefix.num_cached_tokens;
            e.status = Status::Running;
            let kind = if e.num_preemptions > 0 {
                ScheduleKind::Resumed
            } else {
                ScheduleKind::New
            };
            b.budget -= n;
            let s = self.scheduled(id, kind, slots)?;
            b.out.push(s);
        }
        Ok(())
    }

    /// The plain-data record of `id` computing `slots.len()` tokens now.
    fn scheduled(
        &self,
        id: RequestId,
        kind: ScheduleKind,
        slots: Vec<Slot>,
    ) -> Result<ScheduledRequest, SchedError> {
        let e = self.entry(id)?;
        let start = e.num_computed;
        let end = start + slots.len();
        debug_assert_eq!(
            self.kv.num_tokens(SeqId(id.0)),
            Some(end),
            "{id}: KV slots and computed tokens disagree"
        );
        Ok(ScheduledRequest {
            id,
            kind,
            start,
            tokens: e.tokens[start..end].to_vec(),
            block_table: self
                .kv
                .block_table(SeqId(id.0))
                .map(<[_]>::to_vec)
                .unwrap_or_default(),
            slots,
            samples: end == e.tokens.len(),
        })
    }

    pub(crate) fn entry(&self, id: RequestId) -> Result<&Entry, SchedError> {
        self.entries
            .get(&id)
            .ok_or(SchedError::UnknownRequest { id })
    }

    pub(crate) fn entry_mut(&mut self, id: RequestId) -> Result<&mut Entry, SchedError> {
        self.entries
            .get_mut(&id)
            .ok_or(SchedError::UnknownRequest { id })
    }
}
