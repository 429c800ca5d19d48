//! Streamed blocks ([`crate::model::load::LoadOptions::stream_layers`]):
//! every block's matrices stay in host memory and pass through two sets of
//! device buffers, block `il` in set `il % 2`. A step's plan stops before
//! each block to have the host write the next block into the other set,
//! which the block before has finished with (the device's queue keeps the
//! writes after the work recorded before them). The whole model crosses
//! the bus every step, so this is for steps of many tokens (prefill,
//! batches), where a block's compute covers its copy.
//!
//! Norm weights and biases (a few KiB a block) stay on the device.

use std::borrow::Cow;

use crate::backend::{Backend, HostBytes};
use crate::graph::plan::HostWrite;
use crate::model::layout::{Slot, SlotKind};
use crate::model::weights::{FfnWeights, LayerWeights, ModelWeights, WeightInfo};

/// The matrices of a block, in one order for every block.
fn matrices_mut(l: &mut LayerWeights) -> Vec<&mut WeightInfo> {
    let mut v = vec![&mut l.wq, &mut l.wk, &mut l.wv, &mut l.wo];
    match &mut l.ffn {
        FfnWeights::Dense { gate, up, down } => v.extend([gate, up, down]),
        FfnWeights::Moe {
            router,
            gate,
            up,
            down,
            ..
        } => v.extend([router, gate, up, down]),
    }
    v
}

/// One streamed matrix: the file's layout slot it comes from, and the
/// device buffer (of the block's set) it goes into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamedMatrix {
    /// The layout slot of the file's tensor (its bytes stay on the host).
    pub tensor: usize,
    /// The set's buffer ([`crate::graph::plan::BufId::Weight`]).
    pub weight: usize,
    /// Its type in this block.
    pub ty: crate::quant::GgmlType,
    /// Values per row.
    pub cols: usize,
}

/// Where the blocks stream: per block, its matrices; the device bytes of
/// the two sets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamPlan {
    /// Per block, its matrices.
    pub blocks: Vec<Vec<StreamedMatrix>>,
    /// Device bytes of the two sets of buffers.
    pub set_bytes: u64,
    /// Device bytes the blocks' own matrices would have taken.
    pub streamed_bytes: u64,
}

impl StreamPlan {
    /// Whether layout slot `i` streams (stays in host memory).
    pub fn streams(&self, i: usize) -> bool {
        self.blocks.iter().flatten().any(|m| m.tensor == i)
    }
}

/// Plans streamed blocks over `weights`: two sets of buffers appended to
/// `slots` (each matrix role as large as its largest block's), and every
/// block's matrices pointed at its set. `None` when the blocks do not all
/// have the same matrices (no set would fit them all).
pub fn plan_stream<B: Backend>(
    weights: &mut ModelWeights,
    slots: &mut Vec<Slot>,
    backend: &B,
) -> Option<StreamPlan> {
    let roles = matrices_mut(weights.layers.first_mut()?).len();
    // Per role: the largest block's (type, cols, rows) by device bytes.
    let mut largest: Vec<Option<(u64, SlotKind)>> = vec![None; roles];
    let mut plan = StreamPlan::default();
    for l in &mut weights.layers {
        let ms = matrices_mut(l);
        if ms.len() != roles {
            return None;
        }
        for (r, m) in ms.into_iter().enumerate() {
            let bytes = backend.weight_bytes(m.ty, m.cols, m.rows);
            plan.streamed_bytes += bytes;
            let kind = SlotKind::Matrix {
                ty: m.ty,
                cols: m.cols,
                rows: m.rows,
            };
            match largest[r] {
                Some((b, SlotKind::Matrix { cols, rows, .. })) => {
                    if (cols, rows) != (m.cols, m.rows) {
                        return None;
                    }
                    if bytes > b {
                        largest[r] = Some((bytes, kind));
                    }
                }
                _ => largest[r] = Some((bytes, kind)),
            }
        }
    }
    let mut sets = [Vec::with_capacity(roles), Vec::with_capacity(roles)];
    for (s, set) in sets.iter_mut().enumerate() {
        for (r, l) in largest.iter().enumerate() {
            let (bytes, kind) = (*l)?;
            set.push(slots.len());
            slots.push(Slot {
                name: format!("block set {s}.{r}"),
                kind,
                file_bytes: 0,
            });
            plan.set_bytes += bytes;
        }
    }
    for (il, l) in weights.layers.iter_mut().enumerate() {
        let set = &sets[il % 2];
        let block = matrices_mut(l)
            .into_iter()
            .enumerate()
            .map(|(r, m)| {
                let s = StreamedMatrix {
                    tensor: m.id,
                    weight: set[r],
                    ty: m.ty,
                    cols: m.cols,
                };
                m.id = set[r];
                s
            })
            .collect();
        plan.blocks.push(block);
    }
    Some(plan)
}

/// One streamed matrix's bytes in host memory: the file's, or the
/// backend's packing of them at `packed_at` in its buffer
/// ([`Backend::pack_weight_rows`]).
#[derive(Debug)]
pub(crate) struct HostMatrix {
    pub(crate) m: StreamedMatrix,
    pub(crate) packed_at: Option<u64>,
    pub(crate) bytes: Box<dyn HostBytes>,
}

impl HostMatrix {
    /// `file` bytes of `m`, packed once if `backend` repacks.
    pub(crate) fn new<B: Backend>(
        backend: &B,
        m: StreamedMatrix,
        file: Vec<u8>,
    ) -> Result<Self, crate::backend::BackendError> {
        let (packed_at, bytes) = match backend.pack_weight_rows(m.ty, m.cols, 0, &file)? {
            Some((at, packed)) => (Some(at), packed),
            None => (None, file),
        };
        Ok(Self {
            m,
            packed_at,
            bytes: backend.host_bytes(bytes)?,
        })
    }
}

/// The streamed blocks' bytes in host memory and what to write for each.
#[derive(Debug, Default)]
pub struct BlockStream {
    /// Per block: its matrices.
    pub(crate) blocks: Vec<Vec<HostMatrix>>,
    /// Bytes written to the device so far.
    pub(crate) bytes_written: u64,
}

impl BlockStream {
    /// The writes that put blocks `blocks` into their sets.
    pub fn writes(&mut self, blocks: std::ops::Range<usize>) -> Vec<HostWrite<'_>> {
        let end = blocks.end.min(self.blocks.len());
        let start = blocks.start.min(end);
        let mut out = Vec::new();
        for block in &self.blocks[start..end] {
            for h in block {
                let (m, bytes) = (h.m, Cow::Borrowed(h.bytes.bytes()));
                self.bytes_written += bytes.len() as u64;
                out.push(match h.packed_at {
                    Some(offset) => HostWrite::PackedRows {
                        weight: m.weight,
                        ty: m.ty,
                        cols: m.cols,
                        offset,
                        bytes,
                    },
                    None => HostWrite::WeightRows {
                        weight: m.weight,
                        ty: m.ty,
                        cols: m.cols,
                        first_row: 0,
                        bytes,
                    },
                });
            }
        }
        out
    }

    /// Bytes written to the device so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }
}
