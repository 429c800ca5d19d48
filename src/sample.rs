//! Picking the next token from a row of logits, with llama.cpp's sampler
//! chain and semantics: penalties → top-k → top-p → min-p → temperature →
//! draw. Temperature 0 is greedy (argmax, ties to the lowest id).
//!
//! Log-probabilities are reported as OpenAI does: those of the distribution
//! the token was actually drawn from (after penalties, filters and
//! temperature; filtered tokens are absent). Greedy decoding draws from no
//! distribution, so it reports the plain softmax of the logits after
//! penalties.
//!
//! A constrained request samples with [`Sampler::sample_allowed`]: the
//! tokens its grammar rules out are dropped before the chain, as if their
//! logits were `-inf`, so they are never drawn nor reported.
//!
//! The random source is [`Pcg32`], a few lines of integer arithmetic seeded
//! per request: identical on every target (wasm32 included) and every run.

use std::collections::HashMap;

use thiserror::Error;

/// Sampling settings of one request. `Default` is llama.cpp's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Divides logits before the draw; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability sum
    /// reaches `top_p`; `>= 1` = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely; `<= 0` = off.
    pub min_p: f32,
    /// Divides positive / multiplies negative logits of tokens seen in the
    /// window; 1 = off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the window.
    pub presence_penalty: f32,
    /// Subtracted `count` times from the logit of a token seen `count` times.
    pub frequency_penalty: f32,
    /// How many of the most recent tokens the penalties look at; 0 = off.
    pub penalty_last_n: usize,
    /// Seed of the request's random stream.
    pub seed: u64,
    /// How many most likely alternatives to report with each token (0 = only
    /// the chosen token's log-probability).
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            top_logprobs: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Self::default()
        }
    }

    /// Checks the values are usable (finite, penalties positive, ...).
    pub fn validate(&self) -> Result<(), SampleError> {
        let bad = |what: &'static str, value: f32| Err(SampleError::BadParam { what, value });
        let floats = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        if let Some(&(what, value)) = floats.iter().find(|(_, v)| !v.is_finite()) {
            return bad(what, value);
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat_penalty", self.repeat_penalty);
        }
        if self.top_p <= 0.0 {
            return bad("top_p", self.top_p);
        }
        if self.min_p > 1.0 {
            return bad("min_p", self.min_p);
        }
        Ok(())
    }
}

/// Errors of the sampler.
#[derive(Debug, Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum SampleError {
    /// A parameter out of its range.
    #[error("sampling parameter {what} = {value} is out of range (see SamplingParams docs)")]
    BadParam {
        /// Which parameter.
        what: &'static str,
        /// Its value.
        value: f32,
    },
    /// An empty logits row.
    #[error("logits row is empty: the model produced no vocabulary scores")]
    EmptyLogits,
    /// A NaN or infinite logit (a numerical problem upstream).
    #[error("logit of token {token} is {value}: the forward pass produced a non-finite value")]
    NonFinite {
        /// The token.
        token: u32,
        /// The value.
        value: f32,
    },
    /// A row the device found non-finite values in
    /// ([`crate::graph::NON_FINITE_ROW`]).
    #[error(
        "the logits row holds a NaN or an infinity: the forward pass produced a non-finite value"
    )]
    NonFiniteRow,
    /// A constraint allowed no token of the row.
    #[error("the constraint allows none of the row's {n_vocab} tokens")]
    NothingAllowed {
        /// The row's width.
        n_vocab: usize,
    },
    /// Candidates that are not the row's best `top_k`, best first.
    #[error("{got} candidates given where the sampler keeps the best {want}")]
    Candidates {
        /// Candidates given.
        got: usize,
        /// The sampler's `top_k`.
        want: usize,
    },
}

/// PCG32 (XSH-RR, O'Neill 2014): a small, fast, statistically good generator
/// with the same output on every target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pcg32 {
    state: u64,
    inc: u64,
}

impl Pcg32 {
    const MUL: u64 = 6_364_136_223_846_793_005;

    /// A generator for `seed` on stream `stream`.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Pcg32 {
            state: 0,
            inc: (stream << 1) | 1,
        };
        rng.next_u32();
        rng.state = rng.state.wrapping_add(seed);
        rng.next_u32();
        rng
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(Self::MUL).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        xorshifted.rotate_right((old >> 59) as u32)
    }

    /// Uniform in `[0, 1)`, with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        let bits = (u64::from(self.next_u32()) << 32) | u64::from(self.next_u32());
        (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// The sampler's choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The chosen token.
    pub token: u32,
    /// Its natural-log probability (see the module docs for which distribution).
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens of that distribution, most likely
    /// first (ties: lowest id first); fewer when filters left fewer.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// One candidate token.
#[derive(Debug, Clone, Copy)]
struct Cand {
    id: u32,
    logit: f32,
}

/// The sampler of one request: its parameters, its random stream and
/// scratch buffers reused across calls.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Pcg32,
    cand: Vec<Cand>,
    counts: HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler for `params` (validated).
    pub fn new(params: SamplingParams) -> Result<Self, SampleError> {
        params.validate()?;
        let rng = Pcg32::new(params.seed, 0x4f1b_be5d_0c7a_3e21);
        Ok(Sampler {
            params,
            rng,
            cand: Vec::new(),
            counts: HashMap::new(),
        })
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The `k` of [`Sampler::sample_top_k`] when this sampler can work from
    /// the row's `k` best candidates alone (a random draw keeping the
    /// `top_k <= MAX_TOP_K` most likely tokens, no penalty in effect), so the
    /// device need not hand over the whole row; `None` otherwise.
    pub fn device_top_k(&self) -> Option<usize> {
        let k = self.params.top_k;
        let fits = (1..=crate::graph::MAX_TOP_K).contains(&k);
        (self.params.temperature > 0.0 && fits && !self.penalties_on()).then_some(k)
    }

    /// [`Sampler::sample`] of a row given only its best candidates
    /// (`top`: at least [`Sampler::device_top_k`] `(token, logit)` pairs of
    /// the row, best first as [`crate::graph::reference::top_k_row`] orders them):
    /// the same pick, log-probabilities and random stream as `sample` on
    /// the whole row.
    pub fn sample_top_k(&mut self, top: &[(u32, f32)]) -> Result<Sampled, SampleError> {
        let want = self.params.top_k;
        let Some(k) = self.device_top_k().filter(|&k| top.len() >= k) else {
            return Err(SampleError::Candidates {
                got: top.len(),
                want,
            });
        };
        if top
            .first()
            .is_some_and(|c| c.0 == crate::graph::NON_FINITE_ROW)
        {
            return Err(SampleError::NonFiniteRow);
        }
        self.cand.clear();
        self.cand
            .extend(top[..k].iter().map(|&(id, logit)| Cand { id, logit }));
        Ok(self.filter_and_draw(true))
    }

    /// Whether a penalty changes logits.
    fn penalties_on(&self) -> bool {
        let p = &self.params;
        let neutral =
            p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0;
        p.penalty_last_n != 0 && !neutral
    }

    /// Whether [`Sampler::sample`] would return the row's argmax whatever
    /// the history (greedy, no penalty in effect): the token can then be
    /// picked where the logits are, without reading them back. The
    /// log-probabilities of such a pick still need the row.
    pub fn is_plain_greedy(&self) -> bool {
        self.params.temperature <= 0.0 && !self.penalties_on()
    }

    /// Picks a token from `logits` (`[vocab]`, one row), given `history`, the
    /// tokens the penalties look at (prompt and output so far; only the last
    /// `penalty_last_n` count). Ids in `history` outside the vocabulary are
    /// ignored. Errors on an empty row or a non-finite logit.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<Sampled, SampleError> {
        self.sample_filtered(logits, history, None)
    }

    /// [`Sampler::sample`] over the tokens `allowed` accepts (a grammar's
    /// mask): the others are dropped before the chain, as logits of `-inf`
    /// would be, so they are neither drawn nor in the log-probabilities,
    /// which are those of the allowed tokens alone. Errors as `sample`
    /// does, and when no token of the row is allowed.
    pub fn sample_allowed(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: &dyn Fn(u32) -> bool,
    ) -> Result<Sampled, SampleError> {
        self.sample_filtered(logits, history, Some(allowed))
    }

    /// The body of [`Sampler::sample`] and [`Sampler::sample_allowed`].
    fn sample_filtered(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: Option<&dyn Fn(u32) -> bool>,
    ) -> Result<Sampled, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::EmptyLogits);
        }
        if let Some((i, &v)) = logits.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(SampleError::NonFinite {
                token: i as u32,
                value: v,
            });
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &logit)| Cand {
                id: i as u32,
                logit,
            }));
        self.apply_penalties(history);
        if let Some(allowed) = allowed {
            self.cand.retain(|c| allowed(c.id));
            if self.cand.is_empty() {
                let n_vocab = logits.len();
                return Err(SampleError::NothingAllowed { n_vocab });
            }
        }
        if self.params.temperature <= 0.0 {
            return Ok(self.greedy());
        }
        let sorted = top_k(&mut self.cand, self.params.top_k);
        Ok(self.filter_and_draw(sorted))
    }

    /// The stages after top-k: top-p, min-p, temperature, the draw.
    fn filter_and_draw(&mut self, mut sorted: bool) -> Sampled {
        top_p(&mut self.cand, self.params.top_p, &mut sorted);
        min_p(&mut self.cand, self.params.min_p);
        let t = self.params.temperature;
        self.cand.iter_mut().for_each(|c| c.logit /= t);
        self.draw()
    }

    /// llama.cpp's penalties: `cand` is still indexed by token id here.
    fn apply_penalties(&mut self, history: &[u32]) {
        if !self.penalties_on() {
            return;
        }
        let p = &self.params;
        self.counts.clear();
        let window = &history[history.len().saturating_sub(p.penalty_last_n)..];
        for &t in window {
            *self.counts.entry(t).or_insert(0) += 1;
        }
        for (&t, &count) in &self.counts {
            let Some(c) = self.cand.get_mut(t as usize) else {
                continue;
            };
            debug_assert_eq!(c.id, t, "candidates must be in id order before penalties");
            if c.logit <= 0.0 {
                c.logit *= p.repeat_penalty;
            } else {
                c.logit /= p.repeat_penalty;
            }
            c.logit -= count as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Argmax (first, i.e. lowest id, on ties).
    fn greedy(&mut self) -> Sampled {
        let mut best = self.cand[0];
        for &c in &self.cand[1..] {
            if c.logit > best.logit {
                best = c;
            }
        }
        self.report(best)
    }

    /// Draws from the softmax of the remaining candidates.
    fn draw(&mut self) -> Sampled {
        let lse = log_sum_exp(&self.cand);
        let u = self.rng.next_f64();
        let mut acc = 0.0f64;
        let mut pick = self.cand[self.cand.len() - 1];
        for &c in &self.cand {
            acc += (f64::from(c.logit) - lse).exp();
            if u < acc {
                pick = c;
                break;
            }
        }
        self.report(pick)
    }

    /// `pick` with its log-probability and the top alternatives, all from
    /// the softmax of the current candidates.
    fn report(&mut self, pick: Cand) -> Sampled {
        let lse = log_sum_exp(&self.cand);
        let logprob = (f64::from(pick.logit) - lse) as f32;
        let top_logprobs = self.top_logprobs(lse);
        Sampled {
            token: pick.id,
            logprob,
            top_logprobs,
        }
    }

    fn top_logprobs(&mut self, lse: f64) -> Vec<(u32, f32)> {
        let n = self.params.top_logprobs.min(self.cand.len());
        if n == 0 {
            return Vec::new();
        }
        sort_prefix(&mut self.cand, n);
        self.cand[..n]
            .iter()
            .map(|c| (c.id, (f64::from(c.logit) - lse) as f32))
            .collect()
    }
}

/// Most likely first; ties broken by lowest id, so results never depend on
/// the sort algorithm.
fn by_logit_desc(a: &Cand, b: &Cand) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Sorts so that `cand[..n]` are the `n` best, in order. O(V + n log n).
fn sort_prefix(cand: &mut [Cand], n: usize) {
    if n < cand.len() {
        cand.select_nth_unstable_by(n, by_logit_desc);
    }
    cand[..n].sort_unstable_by(by_logit_desc);
}

/// `ln Σ exp(logit)` over the candidates, in f64.
fn log_sum_exp(cand: &[Cand]) -> f64 {
    let max = cand
        .iter()
        .fold(f64::NEG_INFINITY, |m, c| m.max(f64::from(c.logit)));
    let sum: f64 = cand.iter().map(|c| (f64::from(c.logit) - max).exp()).sum();
    max + sum.ln()
}

/// Keeps the `k` best (sorted); returns whether `cand` is now sorted.
fn top_k(cand: &mut Vec<Cand>, k: usize) -> bool {
    if k == 0 {
        return false;
    }
    let k = k.min(cand.len());
    sort_prefix(cand, k);
    cand.truncate(k);
    true
}

/// Keeps the smallest most-likely prefix with probability mass `>= p` (at
/// least one token), as llama.cpp does (softmax at temperature 1).
fn top_p(cand: &mut Vec<Cand>, p: f32, sorted: &mut bool) {
    if p >= 1.0 {
        return;
    }
    if !*sorted {
        cand.sort_unstable_by(by_logit_desc);
        *sorted = true;
    }
    let lse = log_sum_exp(cand);
    let mut cum = 0.0f64;
    let mut keep = cand.len();
    for (i, c) in cand.iter().enumerate() {
        cum += (f64::from(c.logit) - lse).exp();
        if cum >= f64::from(p) {
            keep = i + 1;
            break;
        }
    }
    cand.truncate(keep);
}

/// Drops tokens with `prob < min_p * max_prob`, i.e.
/// `logit < max_logit + ln(min_p)`; the most likely token always stays.
fn min_p(cand: &mut Vec<Cand>, p: f32) {
    if p <= 0.0 || cand.is_empty() {
        return;
    }
    let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
    let floor = max + p.ln();
    cand.retain(|c| c.logit >= floor);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Vec<Cand> {
        logits
            .iter()
            .enumerate()
            .map(|(i, &logit)| Cand {
                id: i as u32,
                logit,
            })
            .collect()
    }

    #[test]
    fn sort_prefix_orders_ties_by_id() {
        let mut c = cands(&[1.0, 2.0, 2.0, 0.5, 2.0]);
        sort_prefix(&mut c, 3);
        assert_eq!(
            c[..3].iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![1, 2, 4]
        );
    }

    #[test]
    fn top_p_counts_the_token_that_crosses_p() {
        // Probabilities 0.5, 0.25, 0.25: p = 0.5 keeps one token, p = 0.51 two.
        let l = [0.5f32.ln(), 0.25f32.ln(), 0.25f32.ln()];
        for (p, keep) in [(0.5, 1), (0.51, 2), (0.99, 3)] {
            let mut c = cands(&l);
            let mut sorted = false;
            top_p(&mut c, p, &mut sorted);
            assert_eq!(c.len(), keep, "top_p {p}");
        }
    }

    #[test]
    fn min_p_threshold_is_relative_to_the_best() {
        let mut c = cands(&[0.0, -1.0, -3.0]);
        // e^-1 = 0.37 >= 0.3, e^-3 = 0.05 < 0.3.
        min_p(&mut c, 0.3);
        assert_eq!(c.iter().map(|c| c.id).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn pcg_uniform_stays_in_range() {
        let mut r = Pcg32::new(3, 5);
        let xs: Vec<f64> = (0..1000).map(|_| r.next_f64()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f64>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
    }

    #[test]
    fn sample_top_k_matches_sample_on_the_whole_row() {
        let mut rng = Pcg32::new(0x70_9c, 3);
        for case in 0..40u64 {
            let n = 50 + (rng.next_u32() % 400) as usize;
            let mut logits: Vec<f32> = (0..n)
                .map(|_| (rng.next_f64() * 12.0 - 6.0) as f32)
                .collect();
            logits[n / 3] = logits[n / 2]; // a tie
            let params = SamplingParams {
                temperature: 0.3 + (case % 5) as f32 * 0.6,
                top_k: 1 + (case as usize * 7) % crate::graph::MAX_TOP_K,
                top_p: [1.0, 0.95, 0.5][case as usize % 3],
                min_p: [0.0, 0.05][case as usize % 2],
                seed: case,
                top_logprobs: case as usize % 4,
                ..SamplingParams::default()
            };
            let mut whole = Sampler::new(params.clone()).expect("params");
            let mut top = Sampler::new(params.clone()).expect("params");
            let k = top.device_top_k().expect("a top-k draw");
            let cands = crate::graph::reference::top_k_row(&logits, k + (case as usize % 3));
            for _ in 0..5 {
                let a = whole.sample(&logits, &[]).expect("sample");
                let b = top.sample_top_k(&cands).expect("sample_top_k");
                assert_eq!(a, b, "case {case}: {params:?}");
            }
        }
    }

    #[test]
    fn sample_allowed_never_draws_nor_reports_a_masked_token() {
        let mut rng = Pcg32::new(0x3a5c, 9);
        let logits: Vec<f32> = (0..300).map(|_| (rng.next_f64() * 8.0) as f32).collect();
        let best = crate::graph::reference::argmax_row(&logits);
        // Every third token, never the row's best.
        let allowed = |t: u32| t % 3 == (best + 1) % 3;
        for (case, params) in [SamplingParams::greedy(), SamplingParams::default()]
            .into_iter()
            .enumerate()
        {
            let params = SamplingParams {
                top_logprobs: 5,
                repeat_penalty: 1.3,
                seed: case as u64,
                ..params
            };
            let mut s = Sampler::new(params).expect("params");
            for _ in 0..20 {
                let got = s
                    .sample_allowed(&logits, &[best, 7], &allowed)
                    .expect("sample");
                assert!(allowed(got.token), "case {case}: drew {}", got.token);
                assert_eq!(got.top_logprobs.len(), 5);
                assert!(got.top_logprobs.iter().all(|&(t, _)| allowed(t)));
            }
        }
        // Greedy log-probabilities are the softmax over the allowed tokens.
        let mut g = Sampler::new(SamplingParams::greedy()).expect("params");
        let two = |t: u32| t == 4 || t == 9;
        let got = g.sample_allowed(&logits, &[], &two).expect("sample");
        let (a, b) = (f64::from(logits[4]), f64::from(logits[9]));
        let want = a.max(b) - (a.exp() + b.exp()).ln();
        assert!((f64::from(got.logprob) - want).abs() < 1e-5);
        assert!(matches!(
            g.sample_allowed(&logits, &[], &|_| false),
            Err(SampleError::NothingAllowed { n_vocab: 300 })
        ));
    }

    #[test]
    fn device_top_k_only_where_candidates_suffice() {
        let greedy = Sampler::new(SamplingParams::greedy()).expect("params");
        assert!(greedy.is_plain_greedy());
        assert_eq!(greedy.device_top_k(), None);
        let default = Sampler::new(SamplingParams::default()).expect("params");
        assert_eq!(default.device_top_k(), Some(40));
        let wide = SamplingParams {
            top_k: crate::graph::MAX_TOP_K + 1,
            ..SamplingParams::default()
        };
        assert_eq!(Sampler::new(wide).expect("params").device_top_k(), None);
        let penalised = SamplingParams {
            repeat_penalty: 1.1,
            ..SamplingParams::default()
        };
        let mut p = Sampler::new(penalised).expect("params");
        assert_eq!(p.device_top_k(), None);
        assert!(matches!(
            p.sample_top_k(&[(0, 1.0)]),
            Err(SampleError::Candidates { .. })
        ));
        let mut d = Sampler::new(SamplingParams::default()).expect("params");
        let bad = vec![(crate::graph::NON_FINITE_ROW, f32::NAN); 40];
        assert!(matches!(
            d.sample_top_k(&bad),
            Err(SampleError::NonFiniteRow)
        ));
    }
}
