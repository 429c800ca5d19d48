//! Which expert-cache policy keeps the most hits: records the routes of a
//! prompt and a decode of random tokens through an MoE model on the CPU, then replays them
//! through one pool of device slots per policy ([`SlotTable::place_step`],
//! what the expert cache runs each layer step) at several slot counts.
//!
//! ```text
//! cargo run --release --example expert_policies -- MODEL.gguf [PROMPT_TOKENS] [DECODE_TOKENS]
//! ```
//!
//! `hearth synth --shape qwen3-30b-a3b --router-skew 1` (and `0`, the
//! random routers) writes models to compare; narrower widths (`--hidden
//! 256 --expert-ffn 128 --vocab 4096`) keep the routing shape (48 layers of
//! 128 experts, 8 a token) and run in seconds.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use hearth::backend::cpu::CpuBackend;
use hearth::gguf::open_model;
use hearth::graph::plan::SyncFuture;
use hearth::graph::{KvCacheConfig, KvType};
use hearth::kv::{BlockId, Slot, DEFAULT_BLOCK_SIZE};
use hearth::model::offload::ExpertOffload;
use hearth::model::{load_model, Batch, ForwardModel, LoadOptions, LogitsWanted, SeqInput};
use hearth::moe::policy::SlotTable;
use hearth::moe::{ExpertPlacement, ExpertStore, Policy, Routes};

/// `(layer, tokens routed to each expert)` of each layer step, in order.
type Trace = Arc<Mutex<Vec<(u32, Vec<usize>)>>>;

/// An expert store that records the routes and hands the work on.
struct Recorder {
    inner: Box<dyn ExpertStore>,
    n_expert: usize,
    trace: Trace,
}

impl ExpertStore for Recorder {
    fn placement(&self, layer: usize) -> ExpertPlacement {
        self.inner.placement(layer)
    }

    fn prepare(&mut self, layer: usize, routes: Routes, input: Vec<f32>) -> SyncFuture<'_> {
        let mut counts = vec![0; self.n_expert];
        for &e in &routes.ids {
            if let Some(c) = counts.get_mut(e as usize) {
                *c += 1;
            }
        }
        if let Ok(mut t) = self.trace.lock() {
            t.push((layer as u32, counts));
        }
        self.inner.prepare(layer, routes, input)
    }

    fn host_part(&mut self, layer: usize) -> SyncFuture<'_> {
        self.inner.host_part(layer)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = PathBuf::from(
        args.next()
            .ok_or("usage: expert_policies MODEL.gguf [PROMPT] [DECODE]")?,
    );
    let prompt_len: usize = args.next().map_or(Ok(64), |a| a.parse())?;
    let decode_len: usize = args.next().map_or(Ok(128), |a| a.parse())?;
    let (gguf, sources) = open_model(&path)?;
    let total = prompt_len + decode_len;
    let blocks = total.div_ceil(DEFAULT_BLOCK_SIZE);
    let opts = LoadOptions {
        experts: Some(ExpertOffload {
            host_layers: usize::MAX,
            ..ExpertOffload::with_slot_bytes(0)
        }),
        ..LoadOptions::new(KvCacheConfig {
            num_blocks: blocks + 1,
            block_size: DEFAULT_BLOCK_SIZE,
            dtype: KvType::F16,
        })
    };
    let mut model = pollster::block_on(load_model(
        CpuBackend::new(0),
        &gguf,
        &sources,
        &opts,
        &mut |_| {},
    ))?;
    let cfg = model.config().clone();
    if cfg.n_expert == 0 {
        return Err(format!("{} is not an MoE model", path.display()).into());
    }
    let trace = Trace::default();
    let inner = model
        .take_expert_store()
        .ok_or("the model has no expert store")?;
    model.set_expert_store(Some(Box::new(Recorder {
        inner,
        n_expert: cfg.n_expert,
        trace: trace.clone(),
    })));
    // A prompt of ids spread over the vocabulary, then greedy decode.
    let table: Vec<BlockId> = (1..=blocks as u32).map(BlockId).collect();
    let slots: Vec<Slot> = (0..total)
        .map(|p| Slot {
            block: table[p / DEFAULT_BLOCK_SIZE],
            offset: (p % DEFAULT_BLOCK_SIZE) as u32,
        })
        .collect();
    let mut tokens: Vec<u32> = (0..prompt_len as u32)
        .map(|i| (i * 7919 + 13) % cfg.n_vocab as u32)
        .collect();
    let mut start = 0;
    let mut step = tokens.clone();
    let mut prompt_steps = 0;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..=decode_len {
        let seq = [SeqInput {
            tokens: &step,
            start,
            slots: &slots[start..start + step.len()],
            block_table: &table,
            logits: LogitsWanted::Last,
        }];
        let next = pollster::block_on(model.forward_argmax(&Batch { seqs: &seq }))?;
        if i == 0 {
            prompt_steps = trace.lock().map_or(0, |t| t.len());
        }
        start += step.len();
        if i == decode_len {
            break;
        }
        // A random model's greedy decode soon repeats one token (and its
        // experts); random ids route as varied text does, at worst.
        let _ = next;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let t = (rng % cfg.n_vocab as u64) as u32;
        tokens.push(t);
        step = vec![t];
    }
    let trace = trace.lock().map_err(|_| "trace")?.clone();
    let n_all = cfg.n_layer * cfg.n_expert;
    println!(
        "{}: {} layer steps ({} of the {prompt_len}-token prompt, {decode_len} decode tokens), {} layers x {} experts, {} a token",
        path.display(),
        trace.len(),
        prompt_steps,
        cfg.n_layer,
        cfg.n_expert,
        cfg.n_expert_used
    );
    // How many of each layer's experts the decode used: the locality the
    // replay works with.
    let mut used = vec![vec![false; cfg.n_expert]; cfg.n_layer];
    for (layer, counts) in &trace[prompt_steps..] {
        for (e, &c) in counts.iter().enumerate() {
            if c > 0 {
                used[*layer as usize][e] = true;
            }
        }
    }
    let per_layer: Vec<usize> = used
        .iter()
        .map(|u| u.iter().filter(|&&x| x).count())
        .collect();
    println!("experts the decode used, by layer: {per_layer:?}");
    println!("| slots (share of all experts) | policy | hit rate (decode) | hit rate (all) | copies per decode token |");
    println!("| --- | --- | ---: | ---: | ---: |");
    for share in [0.05, 0.1, 0.2, 0.3, 0.5] {
        let slots = ((n_all as f64 * share) as usize).max(cfg.n_expert_used);
        for policy in Policy::ALL {
            let mut t = SlotTable::new(slots, policy, cfg.n_expert_used);
            let (mut all, mut decode, mut copies) = ([0usize; 2], [0usize; 2], 0);
            for (i, (layer, counts)) in trace.iter().enumerate() {
                let s = t.place_step(*layer, counts, 0);
                all[0] += s.hits;
                all[1] += s.misses;
                if i >= prompt_steps {
                    decode[0] += s.hits;
                    decode[1] += s.misses;
                    copies += s.copied.len();
                }
            }
            let rate = |h: [usize; 2]| 100.0 * h[0] as f64 / (h[0] + h[1]).max(1) as f64;
            println!(
                "| {slots} ({:.0}%) | {policy} | {:.1}% | {:.1}% | {:.1} |",
                100.0 * share,
                rate(decode),
                rate(all),
                copies as f64 / decode_len.max(1) as f64
            );
        }
    }
    Ok(())
}
