//! [`ActPool`]: the activation buffers of a step, kept from one step to the
//! next. Plan buffer `i` of every step gets the same device buffer (grown
//! when a step needs more), so steps create no buffers and the recorder's
//! bind groups over them stay valid.

use super::buffer::{usages, GpuBuffer};
use super::context::GpuContext;
use super::counters::{Counters, Event};
use super::GpuError;
use crate::backend::BufKind;

/// Smallest pooled buffer (bytes): small inputs that grow by a few words
/// per step (block tables) then rarely need a new one.
const MIN_BYTES: u64 = 256;

/// One device buffer per plan activation index.
#[derive(Debug, Default)]
pub struct ActPool {
    slots: Vec<wgpu::Buffer>,
}

impl ActPool {
    /// Buffers of `sizes[i]` bytes each (contents left from earlier steps:
    /// a plan writes every activation before reading it).
    pub fn take(
        &mut self,
        ctx: &GpuContext,
        counters: &Counters,
        sizes: &[u64],
    ) -> Result<Vec<GpuBuffer>, GpuError> {
        let max = ctx.caps.max_buffer;
        let mut out = Vec::with_capacity(sizes.len());
        for (i, &bytes) in sizes.iter().enumerate() {
            let need = bytes.div_ceil(4).max(1) * 4;
            if need > max {
                return Err(GpuError::TooLarge {
                    bytes,
                    max,
                    adapter: ctx.caps.adapter_name.clone(),
                });
            }
            if self.slots.get(i).is_none_or(|b| b.size() < need) {
                let size = need.next_power_of_two().max(MIN_BYTES).min(max.max(need));
                let raw = ctx.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("activation"),
                    size,
                    usage: usages(BufKind::Activations),
                    mapped_at_creation: false,
                });
                counters.add(Event::Buffer);
                if i < self.slots.len() {
                    self.slots[i] = raw;
                } else {
                    self.slots.push(raw);
                }
            }
            out.push(GpuBuffer {
                raw: self.slots[i].clone(),
                offset: 0,
                len: bytes,
                kind: BufKind::Activations,
            });
        }
        Ok(out)
    }
}
