//! What the tiled kernels share: the shape check of a
//! [`GemmFn`](crate::backend::cpu::kernels::GemmFn) call, the prefetch of
//! the next group of rows, and cache-line-aligned scratch ([`Lines`]).

use std::arch::x86_64::*;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use bytemuck::{Pod, Zeroable};

use crate::backend::cpu::kernels::Out;

/// The shape of one [`crate::backend::cpu::kernels::GemmFn`] call over
/// weight blocks `W` and activation blocks `A`: `(blocks per row, weight
/// rows, activation rows)`, `None` where the call breaks the contract
/// (rows not whole blocks, activation rows of another length, `out` too
/// short), and then computes nothing.
pub(super) fn gemm_shape<W: Pod, A: Pod>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    act_bytes: usize,
    out: &Out<'_>,
) -> Option<(usize, usize, usize)> {
    let (sw, sa) = (size_of::<W>(), size_of::<A>());
    if row_bytes == 0
        || act_bytes == 0
        || !row_bytes.is_multiple_of(sw)
        || !act_bytes.is_multiple_of(sa)
    {
        return None;
    }
    let nb = row_bytes / sw;
    let (rows, toks) = (w.len() / row_bytes, a.len() / act_bytes);
    (act_bytes / sa == nb && out.fits(rows, toks)).then_some((nb, rows, toks))
}

/// Prefetches step `step`'s share (`bytes` bytes, from `step * bytes`) of
/// the memory at `next` into L1, a cache line at a time. A one-token kernel
/// that reads a group of rows block by block calls this once per block
/// with the group after its own, so the next group arrives as one
/// sequential stream: the rows read side by side are several slow streams
/// that the hardware prefetchers do not keep ahead of (measured from DRAM,
/// one thread: Q8_0 10 -> 29 GB/s, Q4_0 5.6 -> 14.5). A prefetch never
/// faults, so `next` may lie past the weights: it is never dereferenced.
#[inline(always)]
pub(super) unsafe fn prefetch_share(next: *const i8, bytes: usize, step: usize) {
    for line in (step * bytes / 64)..((step + 1) * bytes).div_ceil(64) {
        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(64 * line));
    }
}

/// One cache line of words.
#[repr(C, align(64))]
#[derive(Clone, Copy, Zeroable, Pod)]
struct Line([u32; 16]);

/// A run of 4-byte values (`u32`, `i32`, `f32`) that starts a cache line:
/// the tiles' scratch (packed activations, their sums and scales), which
/// they load 32 or 64 bytes at a time. A plain `Vec` starts wherever the
/// allocator puts it, and every such load then straddles two lines: a
/// prompt's speed then depends on where the heap put the scratch (see
/// `docs/perf.md`, "Tile scratch alignment").
pub(super) struct Lines<T> {
    lines: Vec<Line>,
    len: usize,
    of: PhantomData<T>,
}

impl<T> Default for Lines<T> {
    fn default() -> Self {
        Lines {
            lines: Vec::new(),
            len: 0,
            of: PhantomData,
        }
    }
}

impl<T: Pod> Lines<T> {
    /// Makes these `n` zero values.
    pub(super) fn zeroed(&mut self, n: usize) {
        self.lines.clear();
        self.lines.resize(
            (n * size_of::<T>()).div_ceil(size_of::<Line>()),
            Line([0; 16]),
        );
        self.len = n;
    }
}

impl<T: Pod> Deref for Lines<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl<T: Pod> DerefMut for Lines<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}
