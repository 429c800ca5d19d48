//! The seam between the engine and a model: one forward pass over a ragged
//! batch of sequences, K/V written through slot mappings and read through
//! block tables (paged attention).
//!
//! The engine builds a [`Batch`] from the scheduler's output; any model on any
//! backend implements [`ForwardModel`]. Tests drive the engine with a fake
//! model and the models with hand-made batches.

use crate::kv::{BlockId, Slot};
use crate::model::ModelConfig;

/// Which logits rows a sequence wants back from a forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that is not the prompt's last).
    None,
    /// The row of the last input token (decode, or the last prefill chunk).
    Last,
    /// A row for every input token (conformance tools, perplexity).
    All,
}

/// One sequence's part of a batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// Input token ids, at positions `start .. start + tokens.len()`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; positions before it are already in the KV cache.
    pub start: usize,
    /// Where each input token's K/V goes (`slots.len() == tokens.len()`).
    pub slots: &'a [Slot],
    /// The sequence's block table: attention reads positions
    /// `0 .. start + tokens.len()` through it.
    pub block_table: &'a [BlockId],
    /// Which logits rows to return.
    pub logits: LogitsWanted,
}

impl SeqInput<'_> {
    /// Rows of logits this sequence contributes to the output.
    pub fn logits_rows(&self) -> usize {
        match self.logits {
            LogitsWanted::None => 0,
            LogitsWanted::Last => 1,
            LogitsWanted::All => self.tokens.len(),
        }
    }
}

/// A ragged batch: every sequence's tokens go through the model in ONE pass
/// (one matmul per weight for all rows).
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The sequences, in the order their logits rows are returned.
    pub seqs: &'a [SeqInput<'a>],
}

impl Batch<'_> {
    /// Input tokens over all sequences.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// Logits rows the pass returns.
    pub fn logits_rows(&self) -> usize {
        self.seqs.iter().map(SeqInput::logits_rows).sum()
    }
}

/// A model ready to run: weights loaded on a backend, K/V cache allocated.
///
/// The future is not `Send`: browser GPU handles are not.
#[allow(async_fn_in_trait)]
pub trait ForwardModel {
    /// The model's shapes.
    fn config(&self) -> &ModelConfig;

    /// Runs one forward pass and returns the wanted logits rows,
    /// `[batch.logits_rows()][n_vocab]` row-major, in sequence order.
    async fn forward(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<f32>>;

    /// A greedy forward pass: the argmax of each wanted logits row, in
    /// sequence order, as [`crate::graph::reference::argmax_row`] defines it
    /// ([`crate::graph::NON_FINITE_ROW`] for a row with a NaN or an
    /// infinity). Models on a device override this to pick on the device
    /// and read back one u32 per row instead of the logits.
    async fn forward_argmax(&mut self, batch: &Batch<'_>) -> crate::Result<Vec<u32>> {
        let n_vocab = self.config().n_vocab;
        let logits = self.forward(batch).await?;
        Ok(logits
            .chunks(n_vocab.max(1))
            .map(crate::graph::reference::argmax_row)
            .collect())
    }

    /// A sampling forward pass: the `k` best `(token, logit)` pairs of each
    /// wanted logits row (`1 <= k <= crate::graph::MAX_TOP_K`), as
    /// [`crate::graph::reference::top_k_row`] defines them. Models on a device
    /// override this to select on the device and read back `k` pairs per row.
    async fn forward_top_k(
        &mut self,
        batch: &Batch<'_>,
        k: usize,
    ) -> crate::Result<Vec<Vec<(u32, f32)>>> {
        let n_vocab = self.config().n_vocab;
        let logits = self.forward(batch).await?;
        Ok(logits
            .chunks(n_vocab.max(1))
            .map(|row| crate::graph::reference::top_k_row(row, k))
            .collect())
    }
}
