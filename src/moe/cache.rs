//! [`ExpertCache`]: the expert cache, the same code in every build.
//!
//! A model whose routed experts do not all fit its device keeps them in
//! host memory, held by the cache's own [`CpuBackend`] (its kernels compute
//! the experts left to the host), and gives each MoE layer either a pool of
//! device slots ([`ExpertPlacement::Slots`]) or none
//! ([`ExpertPlacement::Host`], llama.cpp's `--cpu-moe`). Layers whose
//! experts have the same types and shapes share one pool ([`PoolSpec`]),
//! so a layer with popular experts may hold more slots than another.
//!
//! Each step, after a layer's routing ([`ExpertStore::prepare`]), every
//! routed expert is a hit (its slot is used), or a miss, which is copied
//! into a slot the pool's [`Policy`] gives up, or left to the host when at
//! most [`CacheOptions::host_tokens`] tokens route to it or every slot is
//! in use by this layer step. The device runs the resident experts over
//! the ids rewritten to slots; the host computes the rest while it does
//! ([`ExpertStore::host_part`]) and its share is added to the layer's
//! output. The device's sum over its experts is in route order, as without
//! the cache, so with every expert copied the logits are those of the
//! model without it, bit for bit; an expert the host computes changes them
//! by f32 rounding (its term is added after the device's).

use std::fmt;

use crate::backend::cpu::{CpuBackend, CpuBuffer};
use crate::backend::{Backend, BackendError, BufKind, OpIo};
use crate::graph::plan::{HostWrite, SyncFuture};
use crate::graph::{Activation, Op};
use crate::quant::GgmlType;

use super::policy::{Policy, SlotTable};
use super::store::{ExpertPlacement, ExpertStore, Routes};

/// One pool of device slots: the model's weight buffers that hold `slots`
/// experts' gate, up and down rows, stacked as a layer's experts are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// The weight buffers ([`crate::graph::plan::BufId::Weight`]) of the
    /// slots' gate, up and down rows.
    pub weights: [usize; 3],
    /// Their types.
    pub tys: [GgmlType; 3],
    /// Experts the pool holds.
    pub slots: usize,
}

/// One MoE layer's routed experts in host memory.
#[derive(Debug)]
pub struct HostExperts {
    /// The layer.
    pub layer: usize,
    /// Where the device runs them: [`ExpertPlacement::Slots`] or
    /// [`ExpertPlacement::Host`].
    pub placement: ExpertPlacement,
    /// The pool of a [`ExpertPlacement::Slots`] layer (an index into the
    /// cache's pools).
    pub pool: usize,
    /// Every expert's stacked gate, up and down rows, as the cache's CPU
    /// backend holds them (`[n_expert * n_ff, n_embd]` twice, then
    /// `[n_expert * n_embd, n_ff]`).
    pub weights: [CpuBuffer; 3],
    /// Their types.
    pub tys: [GgmlType; 3],
    /// Experts of the layer.
    pub n_expert: usize,
    /// The layer's router `[n_expert, n_embd]` and its type, when the host
    /// holds it too: the layer before predicts this one's experts with it
    /// ([`CacheOptions::prefetch`]).
    pub router: Option<(CpuBuffer, GgmlType)>,
}

/// The model's shapes and the choices the cache makes by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheOptions {
    /// Which expert a full pool gives up.
    pub policy: Policy,
    /// A missing expert routed to at most this many of a step's tokens is
    /// computed on the host rather than copied (0: copy every miss that
    /// finds a slot).
    pub host_tokens: usize,
    /// Experts per token.
    pub k: usize,
    /// Model width.
    pub n_embd: usize,
    /// Hidden width of one expert.
    pub n_ff: usize,
    /// The experts' activation.
    pub act: Activation,
    /// Exact-f32 products (the model's mode), else ggml's quantized
    /// activations.
    pub exact: bool,
    /// Prefetch: a pooled layer's router applied to the layer before's FFN
    /// input predicts its experts for a step of few tokens, and the ones
    /// not resident are copied into slots once the layer before's experts
    /// are submitted, beside the device's work, instead of at its own
    /// stop. The residual stream changes little from one layer to the
    /// next, which is what makes the guess good.
    pub prefetch: bool,
}

/// What the cache did so far ([`ExpertCache::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ExpertStats {
    /// Steps (counted at the first layer off the device).
    pub steps: u64,
    /// Tokens of those steps.
    pub tokens: u64,
    /// Routed experts of pooled layers found in a slot (each expert once
    /// per layer step).
    pub hits: u64,
    /// Routed experts of pooled layers not in a slot.
    pub misses: u64,
    /// Misses copied into a slot.
    pub copies: u64,
    /// Bytes copied into slots (as the file stores them).
    pub bytes_copied: u64,
    /// Experts the host computed: misses left to it, and every routed
    /// expert of a [`ExpertPlacement::Host`] layer.
    pub host_experts: u64,
    /// Seconds the device waited on the host: choosing and staging the
    /// copies, computing the host's experts.
    pub host_seconds: f64,
    /// Routed experts of layer steps that had a prediction
    /// ([`CacheOptions::prefetch`]).
    pub predicted: u64,
    /// Of those, the ones the prediction named.
    pub predicted_right: u64,
    /// Experts copied ahead on a prediction.
    pub prefetched: u64,
    /// Hits on experts copied ahead (their first use).
    pub prefetch_hits: u64,
}

impl ExpertStats {
    /// What happened since `earlier` (an earlier reading of the same
    /// cache's stats).
    pub fn since(&self, earlier: &ExpertStats) -> ExpertStats {
        ExpertStats {
            steps: self.steps - earlier.steps.min(self.steps),
            tokens: self.tokens - earlier.tokens.min(self.tokens),
            hits: self.hits - earlier.hits.min(self.hits),
            misses: self.misses - earlier.misses.min(self.misses),
            copies: self.copies - earlier.copies.min(self.copies),
            bytes_copied: self.bytes_copied - earlier.bytes_copied.min(self.bytes_copied),
            host_experts: self.host_experts - earlier.host_experts.min(self.host_experts),
            host_seconds: (self.host_seconds - earlier.host_seconds).max(0.0),
            predicted: self.predicted - earlier.predicted.min(self.predicted),
            predicted_right: self.predicted_right
                - earlier.predicted_right.min(self.predicted_right),
            prefetched: self.prefetched - earlier.prefetched.min(self.prefetched),
            prefetch_hits: self.prefetch_hits - earlier.prefetch_hits.min(self.prefetch_hits),
        }
    }

    /// The share of routed experts the prediction named (1 without one).
    pub fn prediction_accuracy(&self) -> f64 {
        match self.predicted {
            0 => 1.0,
            n => self.predicted_right as f64 / n as f64,
        }
    }

    /// Hits over hits and misses (1 when nothing was routed to a pool).
    pub fn hit_rate(&self) -> f64 {
        let n = self.hits + self.misses;
        if n == 0 {
            1.0
        } else {
            self.hits as f64 / n as f64
        }
    }

    /// Bytes copied per token.
    pub fn bytes_per_token(&self) -> f64 {
        self.bytes_copied as f64 / self.tokens.max(1) as f64
    }

    /// Experts computed on the host per token.
    pub fn host_experts_per_token(&self) -> f64 {
        self.host_experts as f64 / self.tokens.max(1) as f64
    }
}

impl fmt::Display for ExpertStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "expert cache: hit rate {:.1}% ({} of {}), {:.2} MB copied/token, {:.2} host experts/token, host {:.3} s over {} tokens",
            100.0 * self.hit_rate(),
            self.hits,
            self.hits + self.misses,
            self.bytes_per_token() / 1e6,
            self.host_experts_per_token(),
            self.host_seconds,
            self.tokens
        )?;
        if self.predicted > 0 {
            write!(
                f,
                "; prediction {:.1}% right, {} prefetched, {} of them used",
                100.0 * self.prediction_accuracy(),
                self.prefetched,
                self.prefetch_hits
            )?;
        }
        Ok(())
    }
}

/// A layer step's experts left to the host, kept from
/// [`ExpertStore::prepare`] to [`ExpertStore::host_part`].
#[derive(Debug)]
struct Pending {
    /// `[tokens, k]`: the expert for the host, or `n_expert` for one the
    /// device runs. `None`: the device runs every one.
    ids: Option<Vec<u32>>,
    weights: Vec<f32>,
    input: Vec<f32>,
    tokens: usize,
}

/// A pool and its table.
#[derive(Debug)]
struct Pool {
    spec: PoolSpec,
    table: SlotTable,
}

/// The expert cache: an [`ExpertStore`] over host memory and pools of
/// device slots (see the module's documentation).
#[derive(Debug)]
pub struct ExpertCache {
    cpu: CpuBackend,
    pools: Vec<Pool>,
    /// By layer: its experts, when they are off the device.
    layers: Vec<Option<HostExperts>>,
    pending: Vec<Option<Pending>>,
    opts: CacheOptions,
    /// The first layer off the device (where a step is counted).
    first: usize,
    stats: ExpertStats,
    /// By layer: the experts predicted for its coming step, most wanted
    /// first.
    predicted: Vec<Option<Vec<usize>>>,
    /// Experts copied ahead and not used since.
    prefetched: std::collections::HashSet<(usize, usize)>,
}

impl ExpertCache {
    /// A cache computing on `cpu`, with `pools` of device slots (empty at
    /// first) and the host `layers` (each names its pool).
    pub fn new(
        cpu: CpuBackend,
        pools: Vec<PoolSpec>,
        layers: Vec<HostExperts>,
        opts: CacheOptions,
    ) -> Result<Self, BackendError> {
        let n_layer = layers.iter().map(|l| l.layer + 1).max().unwrap_or(0);
        let first = layers.iter().map(|l| l.layer).min().unwrap_or(0);
        let mut by_layer: Vec<Option<HostExperts>> = (0..n_layer).map(|_| None).collect();
        for l in layers {
            if l.placement == ExpertPlacement::Slots && l.pool >= pools.len() {
                return Err(BackendError::Shape(format!(
                    "layer {} uses expert pool {} of {}",
                    l.layer,
                    l.pool,
                    pools.len()
                )));
            }
            let at = l.layer;
            by_layer[at] = Some(l);
        }
        let pools = pools
            .into_iter()
            .map(|spec| Pool {
                table: SlotTable::new(spec.slots, opts.policy, opts.k),
                spec,
            })
            .collect();
        Ok(Self {
            cpu,
            pools,
            pending: (0..n_layer).map(|_| None).collect(),
            layers: by_layer,
            opts,
            first,
            stats: ExpertStats::default(),
            predicted: (0..n_layer).map(|_| None).collect(),
            prefetched: Default::default(),
        })
    }

    /// What the cache did so far.
    pub fn stats(&self) -> ExpertStats {
        self.stats
    }

    /// The writes that place `layer`'s routed experts for a step, and
    /// what is left to the host.
    fn place(&mut self, layer: usize, routes: Routes, input: Vec<f32>) -> PlaceResult {
        let tokens = routes.tokens();
        if layer == self.first {
            self.stats.steps += 1;
            self.stats.tokens += tokens as u64;
        }
        let Some(l) = self.layers.get(layer).and_then(Option::as_ref) else {
            return Err(BackendError::Shape(format!(
                "the expert cache holds no experts of layer {layer}"
            )));
        };
        let n_expert = l.n_expert;
        if let Some(&e) = routes.ids.iter().find(|&&e| e as usize >= n_expert) {
            return Err(BackendError::Shape(format!(
                "layer {layer} routes to expert {e} of {n_expert}"
            )));
        }
        let mut counts = vec![0usize; n_expert];
        for &e in &routes.ids {
            counts[e as usize] += 1;
        }
        if let Some(guess) = self.predicted.get_mut(layer).and_then(Option::take) {
            let used = (0..n_expert).filter(|&e| counts[e] > 0);
            let right = used.clone().filter(|e| guess.contains(e)).count();
            self.stats.predicted += used.count() as u64;
            self.stats.predicted_right += right as u64;
        }
        if l.placement == ExpertPlacement::Host {
            self.stats.host_experts += counts.iter().filter(|&&c| c > 0).count() as u64;
            let pending = Pending {
                ids: Some(routes.ids),
                weights: routes.weights,
                input,
                tokens,
            };
            return Ok((Vec::new(), pending));
        }
        let pool = &mut self.pools[l.pool];
        let slots = pool.spec.slots;
        let step = pool
            .table
            .place_step(layer as u32, &counts, self.opts.host_tokens);
        self.stats.hits += step.hits as u64;
        self.stats.misses += step.misses as u64;
        self.stats.copies += step.copied.len() as u64;
        for e in (0..n_expert).filter(|&e| counts[e] > 0) {
            let copied = step.copied.iter().any(|&(c, _)| c == e);
            if self.prefetched.remove(&(layer, e)) && !copied && step.slot_of[e].is_some() {
                self.stats.prefetch_hits += 1;
            }
        }
        let mut writes = Vec::new();
        for &(e, s) in &step.copied {
            writes.extend(slot_fill(
                &self.cpu,
                l,
                &pool.spec,
                &self.opts,
                (e, s),
                &mut self.stats,
            )?);
        }
        let slot_of = step.slot_of;
        let used = counts.iter().filter(|&&c| c > 0).count();
        let device: Vec<u32> = routes
            .ids
            .iter()
            .map(|&e| slot_of[e as usize].map_or(slots as u32, |s| s as u32))
            .collect();
        let host_left = used - slot_of.iter().filter(|s| s.is_some()).count();
        self.stats.host_experts += host_left as u64;
        let ids = (host_left > 0).then(|| {
            routes
                .ids
                .iter()
                .map(|&e| match slot_of[e as usize] {
                    Some(_) => n_expert as u32,
                    None => e,
                })
                .collect()
        });
        writes.insert(
            0,
            HostWrite::Act {
                index: 0,
                bytes: bytemuck::cast_slice(&device).to_vec().into(),
            },
        );
        let pending = Pending {
            ids,
            weights: routes.weights,
            input,
            tokens,
        };
        Ok((writes, pending))
    }

    /// Predicts the experts of the layer after `layer` for a step of
    /// `tokens` (the FFN input `input` of `layer`) with its router, when
    /// it is pooled and the step routes to few experts: the slots could
    /// not hold a big step's guesses, which route to most experts anyway.
    async fn predict_next(
        &mut self,
        layer: usize,
        input: &[f32],
        tokens: usize,
    ) -> Result<(), BackendError> {
        let next = layer + 1;
        let o = self.opts;
        let Some(nl) = self.layers.get(next).and_then(Option::as_ref) else {
            return Ok(());
        };
        let (Some((router, ty)), ExpertPlacement::Slots) = (&nl.router, nl.placement) else {
            return Ok(());
        };
        if !o.prefetch || tokens * o.k * 2 > self.pools[nl.pool].spec.slots {
            return Ok(());
        }
        let ne = nl.n_expert;
        let cpu = &mut self.cpu;
        let x = cpu.alloc((input.len() * 4) as u64, BufKind::Activations)?;
        cpu.upload(&x, 0, bytemuck::cast_slice(input))?;
        let len = (tokens * ne * 4) as u64;
        let out = cpu.alloc(len, BufKind::Activations)?;
        let op = Op::MatMul {
            ty: *ty,
            k: o.n_embd,
            n: ne,
            exact: o.exact,
        };
        cpu.record(
            &op,
            &OpIo {
                inputs: &[&x, router],
                outputs: &[&out],
            },
        )?;
        let logits: Vec<f32> = bytemuck::pod_collect_to_vec(&cpu.download(&out, 0..len).await?);
        let mut votes = vec![0usize; ne];
        for row in logits.chunks_exact(ne) {
            for (e, _) in crate::graph::reference::top_k_row(row, o.k) {
                votes[e as usize] += 1;
            }
        }
        let mut guess: Vec<usize> = (0..ne).filter(|&e| votes[e] > 0).collect();
        guess.sort_by_key(|&e| std::cmp::Reverse(votes[e]));
        self.predicted[next] = Some(guess);
        Ok(())
    }

    /// The copies of the experts predicted for the layer after `layer`
    /// that are not resident, into the slots its pool gives up.
    fn prefetch_writes(&mut self, layer: usize) -> Result<Vec<HostWrite<'static>>, BackendError> {
        let next = layer + 1;
        let Some(guess) = self.predicted.get(next).and_then(Option::as_ref) else {
            return Ok(Vec::new());
        };
        let Some(nl) = self.layers.get(next).and_then(Option::as_ref) else {
            return Ok(Vec::new());
        };
        let pool = &mut self.pools[nl.pool];
        let copies = pool.table.prefetch(next as u32, guess, guess.len());
        let mut writes = Vec::new();
        for (e, s) in copies {
            writes.extend(slot_fill(
                &self.cpu,
                nl,
                &pool.spec,
                &self.opts,
                (e, s),
                &mut self.stats,
            )?);
            self.stats.prefetched += 1;
            self.prefetched.insert((next, e));
        }
        Ok(writes)
    }

    /// The host's share of `layer`'s output for its pending step.
    async fn host_output(&mut self, layer: usize) -> Result<Vec<u8>, BackendError> {
        let p = self
            .pending
            .get_mut(layer)
            .and_then(Option::take)
            .ok_or_else(|| {
                BackendError::Shape(format!(
                    "layer {layer}'s host experts are asked for before its routes"
                ))
            })?;
        let width = self.opts.n_embd;
        let Some(ids) = p.ids else {
            return Ok(vec![0u8; p.tokens * width * 4]);
        };
        let Some(l) = self.layers.get(layer).and_then(Option::as_ref) else {
            return Err(BackendError::Shape(format!(
                "the expert cache holds no experts of layer {layer}"
            )));
        };
        let o = &self.opts;
        let op = Op::MoeExperts {
            layer,
            n_expert: l.n_expert,
            k: o.k,
            n_embd: o.n_embd,
            n_ff: o.n_ff,
            act: o.act,
            tys: l.tys,
            exact: o.exact,
        };
        let cpu = &mut self.cpu;
        let buf = |cpu: &CpuBackend, bytes: &[u8]| -> Result<CpuBuffer, BackendError> {
            let b = cpu.alloc(bytes.len() as u64, BufKind::Activations)?;
            cpu.upload(&b, 0, bytes)?;
            Ok(b)
        };
        let x = buf(cpu, bytemuck::cast_slice(&p.input))?;
        let ids = buf(cpu, bytemuck::cast_slice(&ids))?;
        let wts = buf(cpu, bytemuck::cast_slice(&p.weights))?;
        let len = (p.tokens * width * 4) as u64;
        let out = cpu.alloc(len, BufKind::Activations)?;
        let [g, u, d] = &l.weights;
        cpu.record(
            &op,
            &OpIo {
                inputs: &[&x, &ids, &wts, g, u, d],
                outputs: &[&out],
            },
        )?;
        cpu.download(&out, 0..len).await
    }
}

/// The writes that copy expert `e` of the host layer `l` into slot `s`
/// of `pool` (its gate, up and down rows), counted in `stats`.
fn slot_fill(
    cpu: &CpuBackend,
    l: &HostExperts,
    pool: &PoolSpec,
    o: &CacheOptions,
    (e, s): (usize, usize),
    stats: &mut ExpertStats,
) -> Result<Vec<HostWrite<'static>>, BackendError> {
    let shapes = [(o.n_ff, o.n_embd), (o.n_ff, o.n_embd), (o.n_embd, o.n_ff)];
    let mut writes = Vec::with_capacity(3);
    for (i, &(rows, cols)) in shapes.iter().enumerate() {
        let bytes = cpu.weight_rows(&l.weights[i], l.tys[i], cols, e * rows..(e + 1) * rows)?;
        stats.bytes_copied += bytes.len() as u64;
        writes.push(HostWrite::WeightRows {
            weight: pool.weights[i],
            ty: pool.tys[i],
            cols,
            first_row: s * rows,
            bytes: bytes.into(),
        });
    }
    Ok(writes)
}

/// [`ExpertCache::place`]'s result: the writes, and the step's pending
/// host work.
type PlaceResult = Result<(Vec<HostWrite<'static>>, Pending), BackendError>;

impl ExpertStore for ExpertCache {
    fn placement(&self, layer: usize) -> ExpertPlacement {
        self.layers
            .get(layer)
            .and_then(Option::as_ref)
            .map_or(ExpertPlacement::Device, |l| l.placement)
    }

    fn prepare(&mut self, layer: usize, routes: Routes, input: Vec<f32>) -> SyncFuture<'_> {
        let t = Clock::now();
        let placed = self.place(layer, routes, input);
        Box::pin(async move {
            let (writes, pending) = placed?;
            self.predict_next(layer, &pending.input, pending.tokens)
                .await?;
            if let Some(p) = self.pending.get_mut(layer) {
                *p = Some(pending);
            }
            self.stats.host_seconds += t.seconds();
            Ok(writes)
        })
    }

    fn host_part(&mut self, layer: usize) -> SyncFuture<'_> {
        Box::pin(async move {
            let t = Clock::now();
            let bytes = self.host_output(layer).await?;
            let mut writes = vec![HostWrite::Act {
                index: 0,
                bytes: bytes.into(),
            }];
            // The device has this layer's experts: the next layer's guesses
            // copy beside them.
            writes.extend(self.prefetch_writes(layer)?);
            self.stats.host_seconds += t.seconds();
            Ok(writes)
        })
    }

    fn stats(&self) -> Option<ExpertStats> {
        Some(self.stats)
    }
}

/// A start time natively and in the browser (where `std::time::Instant`
/// panics).
struct Clock(
    #[cfg(not(target_arch = "wasm32"))] std::time::Instant,
    #[cfg(target_arch = "wasm32")] instant::Instant,
);

impl Clock {
    fn now() -> Self {
        #[cfg(not(target_arch = "wasm32"))]
        return Clock(std::time::Instant::now());
        #[cfg(target_arch = "wasm32")]
        return Clock(instant::Instant::now());
    }

    fn seconds(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}
