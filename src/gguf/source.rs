//! [`ByteSource`]: where GGUF bytes come from.
//!
//! Every read of a GGUF file goes through this trait so one reader serves a
//! memory-mapped file natively and, in the browser, a `Blob` or an HTTP URL
//! read with `Range` requests. Reads are async because the browser cannot
//! block; sources that hold all bytes in memory also expose them as a slice
//! so the reader can skip copies.

use std::borrow::Cow;

use super::GgufError;

/// A random-access, read-only sequence of bytes of known length.
///
/// Implementations need not be `Send`: browser handles are not.
#[allow(async_fn_in_trait)]
pub trait ByteSource {
    /// Total length in bytes.
    fn len(&self) -> u64;

    /// True when the source has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fills `buf` with the bytes at `offset..offset + buf.len()`.
    ///
    /// The read is exact: a range that reaches past [`len`](Self::len) is an
    /// error ([`GgufError::OutOfRange`]) and `buf` is then unspecified.
    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError>;

    /// All the bytes, when the source holds them in memory (a memory map, a
    /// buffer). The reader then parses and streams without copying.
    fn as_slice(&self) -> Option<&[u8]> {
        None
    }
}

impl<S: ByteSource + ?Sized> ByteSource for &S {
    fn len(&self) -> u64 {
        (**self).len()
    }

    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        (**self).read_at(offset, buf).await
    }

    fn as_slice(&self) -> Option<&[u8]> {
        (**self).as_slice()
    }
}

/// Copies `buf.len()` bytes at `offset` out of `bytes`, or reports the range as
/// out of bounds. Shared by the in-memory sources.
pub(crate) fn copy_range(bytes: &[u8], offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
    let out_of_range = || GgufError::OutOfRange {
        offset,
        len: buf.len() as u64,
        source_len: bytes.len() as u64,
    };
    let start = usize::try_from(offset).map_err(|_| out_of_range())?;
    let end = start.checked_add(buf.len()).ok_or_else(out_of_range)?;
    let src = bytes.get(start..end).ok_or_else(out_of_range)?;
    buf.copy_from_slice(src);
    Ok(())
}

/// Bytes held in memory, owned or borrowed.
#[derive(Debug, Clone)]
pub struct MemSource<'a> {
    bytes: Cow<'a, [u8]>,
}

impl MemSource<'static> {
    /// A source that owns `bytes`.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self {
            bytes: Cow::Owned(bytes),
        }
    }
}

impl<'a> MemSource<'a> {
    /// A source that borrows `bytes`.
    pub fn borrowed(bytes: &'a [u8]) -> Self {
        Self {
            bytes: Cow::Borrowed(bytes),
        }
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl ByteSource for MemSource<'_> {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        copy_range(&self.bytes, offset, buf)
    }

    fn as_slice(&self) -> Option<&[u8]> {
        Some(&self.bytes)
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use native::MmapSource;

#[cfg(not(target_arch = "wasm32"))]
mod native {
    use std::fs::File;
    use std::path::{Path, PathBuf};

    use super::{copy_range, ByteSource};
    use crate::gguf::GgufError;

    /// A file mapped into memory (native targets only).
    #[derive(Debug)]
    pub struct MmapSource {
        map: memmap2::Mmap,
        path: PathBuf,
    }

    impl MmapSource {
        /// Maps the file at `path` read-only. Errors name the path.
        pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
            let path = path.as_ref();
            let io_err = |what: &str, source| GgufError::Io {
                context: format!("{what} {}", path.display()),
                source,
            };
            let file = File::open(path).map_err(|e| io_err("cannot open", e))?;
            // SAFETY: the mapping is read-only and private to this process. It
            // stays valid while `map` lives; if another process truncates or
            // rewrites the file meanwhile, reads may see the new bytes or fault,
            // which is the accepted contract of every mmap-based model loader
            // (llama.cpp included). Model files are not modified while served.
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_err("cannot map", e))?;
            Ok(Self {
                map,
                path: path.to_path_buf(),
            })
        }

        /// The path the file was opened from.
        pub fn path(&self) -> &Path {
            &self.path
        }
    }

    impl ByteSource for MmapSource {
        fn len(&self) -> u64 {
            self.map.len() as u64
        }

        async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
            copy_range(&self.map, offset, buf)
        }

        fn as_slice(&self) -> Option<&[u8]> {
            Some(&self.map)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_source_reads_exactly() {
        let src = MemSource::new((1u8..=10).collect());
        let mut buf = [0u8; 3];
        pollster::block_on(src.read_at(7, &mut buf)).unwrap();
        assert_eq!(buf, [8, 9, 10]);
        let err = pollster::block_on(src.read_at(8, &mut buf)).unwrap_err();
        assert!(matches!(
            err,
            GgufError::OutOfRange {
                offset: 8,
                len: 3,
                source_len: 10
            }
        ));
        let err = pollster::block_on(src.read_at(u64::MAX, &mut buf)).unwrap_err();
        assert!(matches!(err, GgufError::OutOfRange { .. }));
        assert_eq!(src.as_slice().map(|s| s.len()), Some(10));
    }
}
