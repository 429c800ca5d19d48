//! What the expert-cache tests of every backend share: the load options,
//! the steps run with and without the cache, and how their logits must
//! agree.

use hearth::graph::{KvCacheConfig, KvType};
use hearth::kv::{BlockId, Slot};
use hearth::model::offload::ExpertOffload;
use hearth::model::{Batch, ForwardModel, LoadOptions, LogitsWanted, SeqInput};

use super::{argmax, row_errors, slots, table, BLOCK};

/// Load options with `experts`, an f16 K/V cache of `num_blocks` blocks.
pub fn cache_options(experts: Option<ExpertOffload>, num_blocks: usize) -> LoadOptions {
    LoadOptions {
        experts,
        ..LoadOptions::new(KvCacheConfig {
            num_blocks,
            block_size: BLOCK,
            dtype: KvType::F16,
        })
    }
}

fn seq<'a>(
    tokens: &'a [u32],
    start: usize,
    block_table: &'a [BlockId],
    slots: &'a [Slot],
    logits: LogitsWanted,
) -> SeqInput<'a> {
    SeqInput {
        tokens,
        start,
        slots: &slots[start..start + tokens.len()],
        block_table,
        logits,
    }
}

/// The logits of: a 9-token prompt (all rows), three decode steps, and a
/// batch of the first sequence's next token beside a second sequence's
/// 5-token prompt (its last row). Needs 12 K/V blocks.
pub fn cache_steps<M: ForwardModel>(m: &mut M) -> Vec<Vec<f32>> {
    let prompt: Vec<u32> = (0..9).map(|i| 3 + (i * 37) % 250).collect();
    let (ta, tb) = (table(1, 16), table(5, 16));
    let (sa, sb) = (slots(&ta, 0, 16), slots(&tb, 0, 16));
    let mut run =
        |seqs: &[SeqInput<'_>]| pollster::block_on(m.forward(&Batch { seqs })).expect("forward");
    let mut out = vec![run(&[seq(&prompt, 0, &ta, &sa, LogitsWanted::All)])];
    for (i, tok) in [17u32, 230, 5].iter().enumerate() {
        let at = prompt.len() + i;
        let one = std::slice::from_ref(tok);
        out.push(run(&[seq(one, at, &ta, &sa, LogitsWanted::Last)]));
    }
    let other: Vec<u32> = (0..5).map(|i| 7 + (i * 53) % 250).collect();
    out.push(run(&[
        seq(&[99], prompt.len() + 3, &ta, &sa, LogitsWanted::Last),
        seq(&other, 0, &tb, &sb, LogitsWanted::Last),
    ]));
    out
}

/// `got` (with the cache) against `want` (without it), rows of `nv`:
/// equal bit for bit where the host computed no expert (`host_experts`),
/// else the median row of every step together within the WebGPU MoE
/// decode's bound against the CPU's (tests/model_webgpu_moe.rs) and the
/// same top token in all rows but one in seven. A token whose router
/// scores nearly tie may take another expert under the host's rounding,
/// which moves its row far (one of a batched step's two rows did on
/// CUDA); a kernel error would move the median.
pub fn assert_cache_agrees(
    label: &str,
    host_experts: u64,
    got: &[Vec<f32>],
    want: &[Vec<f32>],
    nv: usize,
) {
    if host_experts == 0 {
        assert_eq!(
            got, want,
            "{label}: every expert in a slot, yet other logits"
        );
        return;
    }
    let (mut errors, mut rows_all, mut same_all) = (Vec::new(), 0, 0);
    for (g, w) in got.iter().zip(want) {
        let rows = w.len() / nv;
        errors.extend(row_errors(g, w, nv));
        rows_all += rows;
        same_all += (0..rows)
            .filter(|&r| argmax(&g[r * nv..][..nv]) == argmax(&w[r * nv..][..nv]))
            .count();
    }
    errors.sort_by(f64::total_cmp);
    let median = errors[errors.len() / 2];
    assert!(median < 8e-2, "{label}: median row {median:.2e}");
    assert!(
        same_all + rows_all / 7 >= rows_all,
        "{label}: top1 {same_all}/{rows_all}"
    );
}
