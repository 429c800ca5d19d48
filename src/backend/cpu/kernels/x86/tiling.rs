//! What the tiled kernels share: the shape check of a
//! [`GemmFn`](crate::backend::cpu::kernels::GemmFn) call, the prefetch of
//! the next group of rows, and cache-line-aligned scratch ([`Lines`]).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use bytemuck::{Pod, Zeroable};

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
