//! Where an MoE model's routed experts go when they are kept off the device
//! ([`ExpertOffload`]): which layers keep theirs on the host only, which
//! share a pool of device slots, and how many slots a memory budget buys.

use crate::backend::Backend;
use crate::model::layout::{Slot, SlotKind};
use crate::model::weights::{FfnWeights, ModelWeights, WeightInfo};
use crate::moe::{ExpertPlacement, Policy, PoolSpec};
use crate::quant::GgmlType;

/// Routed experts kept in host memory, with a budget of device memory for
/// the slots that hold the ones in use ([`crate::model::load::LoadOptions::experts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertOffload {
    /// Device bytes for the slots, all pools together. A layer group whose
    /// experts all fit keeps them on the device, as without offload.
    pub slot_bytes: u64,
    /// The device memory the whole model may use (`--gpu-mem`): when set,
    /// the slots get what the rest of the model (its other weights, the
    /// K/V cache, activations) leaves of it, instead of `slot_bytes`.
    pub device_bytes: Option<u64>,
    /// The first `host_layers` MoE layers keep their experts on the host
    /// only (llama.cpp's `--n-cpu-moe N`; `usize::MAX`: every layer, its
    /// `--cpu-moe`).
    pub host_layers: usize,
    /// Which expert a full pool gives up.
    pub policy: Policy,
    /// A missing expert routed to at most this many of a step's tokens is
    /// computed on the host rather than copied.
    pub host_tokens: usize,
    /// Predict each pooled layer's experts from the layer before and copy
    /// them ahead ([`crate::moe::CacheOptions::prefetch`]). Off by default:
    /// on CUDA its copies still stage through pageable memory, which stalls
    /// the host behind the device (decode 97 against 255 tokens/s without
    /// it, docs/perf.md).
    pub prefetch: bool,
}

impl ExpertOffload {
    /// Offload with `slot_bytes` of slots, the default policy, one-token
    /// misses computed on the host (faster than copying them in every test
    /// measured), no layer on the host only.
    pub fn with_slot_bytes(slot_bytes: u64) -> Self {
        Self {
            slot_bytes,
            device_bytes: None,
            host_layers: 0,
            policy: Policy::default(),
            host_tokens: 1,
            prefetch: false,
        }
    }
}

/// One MoE layer's part in an [`OffloadPlan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadedLayer {
    /// The layer.
    pub layer: usize,
    /// [`ExpertPlacement::Slots`] or [`ExpertPlacement::Host`].
    pub placement: ExpertPlacement,
    /// Its pool (for [`ExpertPlacement::Slots`]).
    pub pool: usize,
    /// The layout slots of its gate, up and down tensors, which stream to
    /// host memory instead of the device.
    pub tensors: [usize; 3],
    /// Their types.
    pub tys: [GgmlType; 3],
    /// Experts of the layer.
    pub n_expert: usize,
}

/// Where the experts go: the layers off the device and the pools, whose
/// buffers are layout slots appended after the file's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OffloadPlan {
    /// Layers whose experts are off the device.
    pub layers: Vec<OffloadedLayer>,
    /// Pools of device slots.
    pub pools: Vec<PoolSpec>,
    /// Device bytes of the pools.
    pub pool_bytes: u64,
    /// Device bytes the layers' own expert tensors would have taken.
    pub offloaded_bytes: u64,
}

impl OffloadPlan {
    /// Whether the slot `i` of the layout streams to host memory.
    pub fn on_host(&self, i: usize) -> bool {
        self.layers.iter().any(|l| l.tensors.contains(&i))
    }
}

/// Device bytes of the routed experts of the MoE layers of `weights` from
/// block `first` on (those before run on the host: a layer split), as the
/// layout `slots` give them.
pub fn expert_bytes<B: Backend>(
    weights: &ModelWeights,
    slots: &[Slot],
    first: usize,
    backend: &B,
) -> u64 {
    weights
        .layers
        .iter()
        .skip(first)
        .filter_map(|l| match l.ffn {
            FfnWeights::Moe { gate, up, down, .. } => Some([gate.id, up.id, down.id]),
            FfnWeights::Dense { .. } => None,
        })
        .flatten()
        .filter_map(|i| match slots.get(i)?.kind {
            SlotKind::Matrix { ty, cols, rows } => Some(backend.weight_bytes(ty, cols, rows)),
            SlotKind::Vector { .. } => None,
        })
        .sum()
}

/// The experts of the MoE layers of `weights` from block `first` on under
/// `offload` (the blocks before run on the host: a layer split): pools
/// appended to `slots` (and the pooled layers' expert weights pointed at
/// them), the offloaded layers' tensors marked for host memory.
pub fn plan_offload<B: Backend>(
    weights: &mut ModelWeights,
    slots: &mut Vec<Slot>,
    n_expert: usize,
    first: usize,
    offload: &ExpertOffload,
    backend: &B,
) -> OffloadPlan {
    let mut plan = OffloadPlan::default();
    // (types, layers) of each group of pooled layers.
    let mut groups: Vec<([GgmlType; 3], Vec<usize>)> = Vec::new();
    let mut moe_seen = 0;
    let mut n_ff = 0;
    let n_embd = weights.tok_embd.cols;
    for (il, l) in weights.layers.iter().enumerate().skip(first) {
        let FfnWeights::Moe {
            gate,
            up,
            down,
            n_ff: ff,
            ..
        } = l.ffn
        else {
            continue;
        };
        n_ff = ff;
        let tys = [gate.ty, up.ty, down.ty];
        let host = moe_seen < offload.host_layers;
        moe_seen += 1;
        plan.layers.push(OffloadedLayer {
            layer: il,
            placement: if host {
                ExpertPlacement::Host
            } else {
                ExpertPlacement::Slots
            },
            pool: 0,
            tensors: [gate.id, up.id, down.id],
            tys,
            n_expert,
        });
        if !host {
            match groups.iter_mut().find(|g| g.0 == tys) {
                Some(g) => g.1.push(il),
                None => groups.push((tys, vec![il])),
            }
        }
    }
    // Device bytes of one expert of each group, and the budget's share of
    // each (in proportion to what the group would take whole).
    let per_expert = |tys: &[GgmlType; 3]| -> u64 {
        backend.weight_bytes(tys[0], n_embd, n_ff)
            + backend.weight_bytes(tys[1], n_embd, n_ff)
            + backend.weight_bytes(tys[2], n_ff, n_embd)
    };
    let whole: u64 = groups
        .iter()
        .map(|(tys, ls)| per_expert(tys) * (ls.len() * n_expert) as u64)
        .sum();
    let mut resident: Vec<usize> = Vec::new();
    for (tys, ls) in &groups {
        let eb = per_expert(tys).max(1);
        let all = ls.len() * n_expert;
        let share = (offload.slot_bytes as u128 * (eb as u128 * all as u128)
            / (whole.max(1) as u128)) as u64;
        let n = ((share / eb) as usize).min(all);
        if n >= all {
            // The group fits: its experts stay on the device.
            resident.extend(ls);
            continue;
        }
        if n == 0 {
            // Not one expert's slot: the group's layers run on the host.
            for l in plan.layers.iter_mut().filter(|l| ls.contains(&l.layer)) {
                l.placement = ExpertPlacement::Host;
            }
            continue;
        }
        let pool = plan.pools.len();
        let rows = [n_ff, n_ff, n_embd];
        let cols = [n_embd, n_embd, n_ff];
        let mut ids = [0usize; 3];
        for i in 0..3 {
            ids[i] = slots.len();
            slots.push(Slot {
                name: format!("expert slots {pool}.{}", ["gate", "up", "down"][i]),
                kind: SlotKind::Matrix {
                    ty: tys[i],
                    cols: cols[i],
                    rows: n * rows[i],
                },
                file_bytes: 0,
            });
            plan.pool_bytes += backend.weight_bytes(tys[i], cols[i], n * rows[i]);
        }
        plan.pools.push(PoolSpec {
            weights: ids,
            tys: *tys,
            slots: n,
        });
        for &il in ls {
            if let Some(l) = plan.layers.iter_mut().find(|l| l.layer == il) {
                l.pool = pool;
            }
            if let FfnWeights::Moe { gate, up, down, .. } = &mut weights.layers[il].ffn {
                let point = |w: &mut WeightInfo, i: usize| {
                    w.id = ids[i];
                    w.rows = n * rows[i];
                };
                point(gate, 0);
                point(up, 1);
                point(down, 2);
            }
        }
    }
    plan.layers.retain(|l| !resident.contains(&l.layer));
    for l in &plan.layers {
        for (i, &t) in l.tensors.iter().enumerate() {
            if let SlotKind::Matrix { ty, cols, rows } = slots[t].kind {
                debug_assert_eq!(ty, l.tys[i]);
                plan.offloaded_bytes += backend.weight_bytes(ty, cols, rows);
            }
        }
    }
    plan
}
