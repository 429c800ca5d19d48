//! Host memory of the CPU backend's buffers: [`HostMem`], a run of zeroed
//! `u32` words that lives either on the heap or in a region of large pages.
//!
//! Decode streams every weight once per token, so its speed is the memory's
//! read bandwidth, and with 4 KiB pages a stream takes a TLB miss every
//! 4 KiB; in a virtual machine each miss walks two page tables. Measured on
//! a 2-core Zen 4 VM whose kernel gives transparent huge pages on request
//! (`/sys/kernel/mm/transparent_hugepage/enabled` = `madvise`): one core
//! summing 512 MiB read 4.9 GB/s from 4 KiB pages and 14.7 GB/s from a
//! region advised `MADV_HUGEPAGE`. So on Linux the weights and the K/V
//! cache go into anonymous mappings aligned to 2 MiB and advised so;
//! elsewhere (and when the kernel declines) they are plain memory.
//!
//! Small buffers share 32 MiB regions (bump allocation, 64-byte aligned),
//! large ones get a region each. A region is returned to the OS when its
//! last buffer is dropped. Pages are only touched when written, so the
//! unused tail of a region costs address space, not memory.

use std::ops::{Deref, DerefMut};

use crate::backend::BackendError;

/// A buffer's words: heap memory, or a slice of a large-page region.
#[derive(Debug)]
pub enum HostMem {
    /// Plain heap memory (small or short-lived buffers, and every buffer
    /// where large pages are not available).
    Heap(Vec<u32>),
    /// Words `start..start + len` of a region no other `HostMem` overlaps.
    #[cfg(target_os = "linux")]
    Pages(pages::Slice),
}

impl Default for HostMem {
    fn default() -> Self {
        HostMem::Heap(Vec::new())
    }
}

impl Clone for HostMem {
    /// A heap copy (clones are scratch copies, never weights).
    fn clone(&self) -> Self {
        HostMem::Heap(self.to_vec())
    }
}

impl Deref for HostMem {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        match self {
            HostMem::Heap(v) => v,
            #[cfg(target_os = "linux")]
            HostMem::Pages(s) => s.words(),
        }
    }
}

impl DerefMut for HostMem {
    fn deref_mut(&mut self) -> &mut [u32] {
        match self {
            HostMem::Heap(v) => v,
            #[cfg(target_os = "linux")]
            HostMem::Pages(s) => s.words_mut(),
        }
    }
}

/// Where a backend's long-lived buffers (weights, K/V cache) come from.
#[derive(Debug)]
pub struct LargePages {
    /// Whether buffers go into advised regions (off: the heap, for
    /// comparisons).
    on: bool,
    #[cfg(target_os = "linux")]
    arena: std::sync::Mutex<pages::Arena>,
}

impl Default for LargePages {
    fn default() -> Self {
        Self::new(true)
    }
}

impl LargePages {
    /// Buffers in large pages where the OS has them (`on`), else on the heap.
    pub fn new(on: bool) -> Self {
        Self {
            on,
            #[cfg(target_os = "linux")]
            arena: std::sync::Mutex::default(),
        }
    }

    /// `words` zeroed words for a long-lived buffer: in large-page memory
    /// where the platform has it, else on the heap.
    ///
    /// Fails with [`BackendError::OutOfMemory`] when the OS refuses the
    /// memory (the heap path aborts on that, as Rust's allocator does).
    pub fn alloc(&self, words: usize, what: &str) -> Result<HostMem, BackendError> {
        #[cfg(target_os = "linux")]
        {
            if self.on {
                let mut arena = match self.arena.lock() {
                    Ok(a) => a,
                    Err(p) => p.into_inner(),
                };
                return arena.alloc(words).map(HostMem::Pages).map_err(|detail| {
                    BackendError::OutOfMemory {
                        bytes: words as u64 * 4,
                        what: what.to_string(),
                        detail,
                    }
                });
            }
        }
        let _ = (what, self.on);
        Ok(HostMem::Heap(vec![0; words]))
    }
}

#[cfg(target_os = "linux")]
mod pages {
    use std::ptr::NonNull;
    use std::sync::Arc;

    /// The large-page size regions are aligned to.
    const HUGE: usize = 2 << 20;
    /// Regions shared by small buffers.
    const SHARED_REGION: usize = 32 << 20;
    /// Buffers this large or larger get a region of their own.
    const OWN_REGION: usize = SHARED_REGION / 2;
    /// Alignment of buffers inside a shared region (a cache line).
    const ALIGN: usize = 64;

    /// An anonymous private mapping, `len` bytes from a 2 MiB-aligned
    /// `ptr`, unmapped on drop.
    #[derive(Debug)]
    pub(super) struct Region {
        base: NonNull<u8>,
        map_len: usize,
        ptr: NonNull<u8>,
        len: usize,
    }

    // SAFETY: the region is plain memory owned by this value; the `Slice`s
    // handed out over it are disjoint, and each is accessed only through
    // its owner's `&`/`&mut`, so sharing the region across threads is as
    // safe as sharing a `Vec`.
    unsafe impl Send for Region {}
    // SAFETY: as above.
    unsafe impl Sync for Region {}

    impl Region {
        /// Maps `len` bytes (rounded up to pages), zero-filled by the OS,
        /// and advises the kernel to back them with large pages.
        fn map(len: usize) -> Result<Region, String> {
            let len = len.max(1).next_multiple_of(4096);
            let map_len = len.checked_add(HUGE).ok_or("size overflows")?;
            // SAFETY: an anonymous private mapping with no address hint
            // touches no existing memory; the result is checked below.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    map_len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error().to_string());
            }
            let base = NonNull::new(base.cast::<u8>()).ok_or("mmap returned null")?;
            let skip = base.as_ptr().align_offset(HUGE);
            // SAFETY: `skip < HUGE` and the mapping is `len + HUGE` bytes,
            // so `base + skip .. + len` lies inside it.
            let ptr = unsafe { base.add(skip) };
            // The advice covers whole large pages only: a partial one at
            // the end would make the kernel fault 2 MiB for a few bytes.
            let advised = len / HUGE * HUGE;
            if advised > 0 {
                // SAFETY: `ptr..ptr + advised` lies in the mapping. The
                // advice is a hint: a kernel without THP refuses it, and the
                // memory then simply stays in 4 KiB pages.
                unsafe { libc::madvise(ptr.as_ptr().cast(), advised, libc::MADV_HUGEPAGE) };
            }
            Ok(Region {
                base,
                map_len,
                ptr,
                len,
            })
        }
    }

    impl Drop for Region {
        fn drop(&mut self) {
            // SAFETY: `base..base + map_len` is exactly the mapping made in
            // `map`, and no slice of it outlives the region (each holds an
            // `Arc` to it).
            unsafe { libc::munmap(self.base.as_ptr().cast(), self.map_len) };
        }
    }

    /// Words `start..start + len` of a region, owned exclusively.
    #[derive(Debug)]
    pub struct Slice {
        region: Arc<Region>,
        start: usize,
        len: usize,
    }

    impl Slice {
        pub(super) fn words(&self) -> &[u32] {
            // SAFETY: `start..start + len` words lie inside the region (the
            // arena checked it), are 4-byte aligned (64-byte offsets from a
            // 2 MiB-aligned start), zero-initialised by the OS, and no other
            // slice overlaps them; the `Arc` keeps the mapping alive.
            unsafe {
                std::slice::from_raw_parts(
                    self.region.ptr.as_ptr().cast::<u32>().add(self.start),
                    self.len,
                )
            }
        }

        pub(super) fn words_mut(&mut self) -> &mut [u32] {
            // SAFETY: as in `words`; `&mut self` is the only access to these
            // words, since no other slice overlaps them.
            unsafe {
                std::slice::from_raw_parts_mut(
                    self.region.ptr.as_ptr().cast::<u32>().add(self.start),
                    self.len,
                )
            }
        }
    }

    /// Bump allocation of slices from shared regions.
    #[derive(Debug, Default)]
    pub(super) struct Arena {
        /// The shared region being filled and the bytes used in it.
        current: Option<(Arc<Region>, usize)>,
    }

    impl Arena {
        pub(super) fn alloc(&mut self, words: usize) -> Result<Slice, String> {
            let bytes = words.checked_mul(4).ok_or("size overflows")?;
            if bytes >= OWN_REGION {
                return Ok(Slice {
                    region: Arc::new(Region::map(bytes)?),
                    start: 0,
                    len: words,
                });
            }
            let fits = |used: usize| used.next_multiple_of(ALIGN) + bytes <= SHARED_REGION;
            let used = match &self.current {
                Some((_, used)) if fits(*used) => *used,
                _ => {
                    self.current = Some((Arc::new(Region::map(SHARED_REGION)?), 0));
                    0
                }
            };
            let at = used.next_multiple_of(ALIGN);
            let Some((region, used)) = &mut self.current else {
                return Err("no region".into());
            };
            debug_assert!(at + bytes <= region.len);
            *used = at + bytes;
            Ok(Slice {
                region: region.clone(),
                start: at / 4,
                len: words,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_disjoint_and_outlive_the_arena() {
        let pages = LargePages::default();
        // Shared-region sizes, an odd size, and one with its own region.
        let sizes = [1usize, 15, 1000, 4096 * 3 + 5, 9 << 20];
        let mut bufs: Vec<HostMem> = sizes
            .iter()
            .map(|&w| pages.alloc(w, "test"))
            .collect::<Result<_, _>>()
            .unwrap();
        for (b, &w) in bufs.iter().zip(&sizes) {
            assert_eq!(b.len(), w);
            assert!(b.iter().all(|&x| x == 0), "fresh memory is zero");
        }
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as u32 + 1);
        }
        drop(pages);
        for (i, b) in bufs.iter().enumerate() {
            assert!(
                b.iter().all(|&x| x == i as u32 + 1),
                "buffer {i} was overwritten"
            );
        }
        let copy = bufs[2].clone();
        assert_eq!(&copy[..], &bufs[2][..]);
    }
}
