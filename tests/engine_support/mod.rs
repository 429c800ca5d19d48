//! A fake model for the engine tests: its logits are a deterministic
//! function of each sequence's token history, which it reads back from its
//! own K/V store through the block tables and slots it is given, so a wrong
//! slot, block table or position changes the tokens.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hearth::engine::{Engine, EngineConfig, EngineEvent, FinishReason, GenerateRequest, RequestId};
use hearth::model::chat::ChatTemplate;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::{Batch, ForwardModel, LogitsWanted, ModelConfig};

/// The synthetic SentencePiece model (512 tokens: 1 BOS, 2 EOS, 3..258
/// bytes, 259..509 pieces, 510 `<|im_start|>`, 511 `<|im_end|>`).
pub fn synthetic_model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llamacpp/synthetic/models/llama-Q8_0.gguf")
}

/// Config and tokenizer of the synthetic model.
pub fn synthetic() -> (ModelConfig, Tokenizer) {
    let path = synthetic_model_path();
    let (file, _src) =
        hearth::gguf::open_path(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = ModelConfig::from_metadata(&file.metadata).expect("config");
    let tok = Tokenizer::from_metadata(&file.metadata).expect("tokenizer");
    (config, tok)
}

/// Picks the preferred next token from a sequence's history (positions
/// `0 ..= p`).
pub type Rule = Box<dyn Fn(&[u32]) -> u32>;

/// 64-bit FNV-1a over the history, then a mix: the fake's "weights".
pub fn history_hash(history: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in history {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 29)
}

/// The default rule: a text piece (259..510) chosen by the history's hash.
pub fn hash_rule() -> Rule {
    Box::new(|h| 259 + (history_hash(h) % 251) as u32)
}

/// A rule that emits `script` after a prompt of `prompt_len` tokens, then
/// keeps emitting `filler`.
pub fn script_rule(prompt_len: usize, script: Vec<u32>, filler: u32) -> Rule {
    Box::new(move |h| {
        let i = h.len() - prompt_len;
        script.get(i).copied().unwrap_or(filler)
    })
}

/// The fake model.
pub struct FakeModel {
    pub config: ModelConfig,
    block_size: usize,
    /// Token id written at each flat slot.
    kv: Vec<Option<u32>>,
    rule: Rule,
    /// Tokens per forward pass, one entry per call.
    pub batch_tokens: Vec<usize>,
    /// Sequences per forward pass.
    pub batch_seqs: Vec<usize>,
    /// Fail the next forward pass (after writing its K/V, as a real failure might).
    pub fail_next: bool,
    /// Rows whose history ends with this token come out as NaN.
    pub nan_after: Option<u32>,
    /// Forward passes that asked for the argmax rows only.
    pub argmax_passes: usize,
    /// Forward passes that asked for each row's best candidates only.
    pub top_k_passes: usize,
}

impl FakeModel {
    pub fn new(config: ModelConfig, engine: &EngineConfig, rule: Rule) -> Self {
        let kv = engine.kv_cache_config();
        FakeModel {
            config,
            block_size: kv.block_size,
            kv: vec![None; kv.num_blocks * kv.block_size],
            rule,
            batch_tokens: Vec::new(),
            batch_seqs: Vec::new(),
            fail_next: false,
            nan_after: None,
            argmax_passes: 0,
            top_k_passes: 0,
        }
    }

    /// One logits row for `history`: small hash noise per token, the rule's
    /// token well ahead.
    pub fn row(&self, history: &[u32]) -> Vec<f32> {
        let n = self.config.n_vocab;
        let seed = history_hash(history);
        let mut row: Vec<f32> = (0..n as u64)
            .map(|i| {
                (history_hash(&[seed as u32, (seed >> 32) as u32, i as u32]) % 1000) as f32 / 500.0
            })
            .collect();
        row[(self.rule)(history) as usize] += 8.0;
        if history.last().is_some_and(|t| Some(*t) == self.nan_after) {
            row.fill(f32::NAN);
        }
        row
    }

    fn history(&self, block_table: &[hearth::kv::BlockId], end: usize) -> Vec<u32> {
        (0..end)
            .map(|p| {
                let block = block_table[p / self.block_size].0 as usize;
                assert_ne!(block, 0, "position {p} reads the null block");
                self.kv[block * self.block_size + p % self.block_size]
                    .unwrap_or_else(|| panic!("position {p} was never written"))
            })
            .collect()
    }
}

impl ForwardModel for FakeModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    async fn forward(&mut self, batch: &Batch<'_>) -> hearth::Result<Vec<f32>> {
        self.batch_tokens.push(batch.num_tokens());
        self.batch_seqs.push(batch.seqs.len());
        for seq in batch.seqs {
            assert_eq!(seq.slots.len(), seq.tokens.len());
            for (i, (&t, slot)) in seq.tokens.iter().zip(seq.slots).enumerate() {
                let p = seq.start + i;
                assert_eq!(
                    slot.block,
                    seq.block_table[p / self.block_size],
                    "slot of position {p}"
                );
                assert_eq!(slot.offset as usize, p % self.block_size);
                self.kv[slot.flat(self.block_size)] = Some(t);
            }
        }
        if std::mem::take(&mut self.fail_next) {
            return Err(hearth::engine::EngineError::BadConfig {
                detail: "injected failure".into(),
            }
            .into());
        }
        let mut out = Vec::with_capacity(batch.logits_rows() * self.config.n_vocab);
        for seq in batch.seqs {
            let end = seq.start + seq.tokens.len();
            let rows = match seq.logits {
                LogitsWanted::None => 0..0,
                LogitsWanted::Last => end - 1..end,
                LogitsWanted::All => seq.start..end,
            };
            for p in rows {
                let history = self.history(seq.block_table, p + 1);
                out.extend(self.row(&history));
            }
        }
        Ok(out)
    }

    async fn forward_argmax(&mut self, batch: &Batch<'_>) -> hearth::Result<Vec<u32>> {
        self.argmax_passes += 1;
        let n_vocab = self.config.n_vocab;
        let logits = self.forward(batch).await?;
        Ok(logits
            .chunks(n_vocab)
            .map(hearth::graph::reference::argmax_row)
            .collect())
    }

    async fn forward_top_k(
        &mut self,
        batch: &Batch<'_>,
        k: usize,
    ) -> hearth::Result<Vec<Vec<(u32, f32)>>> {
        self.top_k_passes += 1;
        let n_vocab = self.config.n_vocab;
        let logits = self.forward(batch).await?;
        Ok(logits
            .chunks(n_vocab)
            .map(|row| hearth::graph::reference::top_k_row(row, k))
            .collect())
    }
}

/// A small engine configuration.
pub fn small_config(n_ctx: usize, budget: usize) -> EngineConfig {
    EngineConfig {
        n_ctx,
        kv_tokens: 4 * n_ctx,
        max_num_seqs: 8,
        max_num_batched_tokens: budget,
        block_size: 16,
        ..EngineConfig::default()
    }
}

/// An engine over a fake model with `rule`, with the chatml template.
pub fn engine(config: EngineConfig, rule: Rule) -> Engine<FakeModel> {
    let (mc, tok) = synthetic();
    let model = FakeModel::new(mc, &config, rule);
    let chatml = ChatTemplate::builtin("chatml").expect("chatml");
    Engine::new(model, tok, Some(chatml), config).expect("engine")
}

/// What one request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    pub texts: Vec<String>,
    pub logprobs: Vec<Option<f32>>,
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    pub reason: Option<FinishReason>,
    pub usage: Option<hearth::engine::Usage>,
    pub error: Option<String>,
}

impl Outcome {
    pub fn text(&self) -> String {
        self.texts.concat()
    }
}

/// Files `events` under their requests.
pub fn collect(
    events: Vec<EngineEvent>,
    outcomes: &mut std::collections::BTreeMap<RequestId, Outcome>,
) {
    let blank = || Outcome {
        tokens: vec![],
        texts: vec![],
        logprobs: vec![],
        top_logprobs: vec![],
        reason: None,
        usage: None,
        error: None,
    };
    for e in events {
        match e {
            EngineEvent::Token {
                request,
                token,
                text,
                logprob,
                top_logprobs,
            } => {
                let o = outcomes.entry(request).or_insert_with(blank);
                assert!(o.reason.is_none(), "{request}: token after Finished");
                o.tokens.push(token);
                o.texts.push(text);
                o.logprobs.push(logprob);
                o.top_logprobs.push(top_logprobs);
            }
            EngineEvent::Finished {
                request,
                reason,
                usage,
                error,
                ..
            } => {
                let o = outcomes.entry(request).or_insert_with(blank);
                assert!(o.reason.is_none(), "{request}: finished twice");
                o.reason = Some(reason);
                o.usage = Some(usage);
                o.error = error;
            }
        }
    }
}

/// Steps until nothing is live; returns each request's outcome.
pub fn run_all(engine: &mut Engine<FakeModel>) -> std::collections::BTreeMap<RequestId, Outcome> {
    let mut outcomes = std::collections::BTreeMap::new();
    for _ in 0..100_000 {
        if !engine.has_unfinished() {
            return outcomes;
        }
        let events = pollster::block_on(engine.step()).expect("step");
        collect(events, &mut outcomes);
    }
    panic!("engine did not finish: {:?}", engine.stats());
}

/// Runs one request alone in a fresh engine.
pub fn run_alone(config: EngineConfig, rule: Rule, req: GenerateRequest) -> Outcome {
    let mut e = engine(config, rule);
    let id = e.add_request(req).expect("add");
    let mut all = run_all(&mut e);
    all.remove(&id).expect("outcome")
}

/// Asserts the pool is back to full.
pub fn assert_pool_full(engine: &Engine<FakeModel>) {
    let s = engine.stats().sched;
    assert_eq!(
        s.num_free_blocks, s.num_usable_blocks,
        "blocks still held: {s:?}"
    );
}
