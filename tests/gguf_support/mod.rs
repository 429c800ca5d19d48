//! Helpers shared by the GGUF integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The crate root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Directory of the synthetic llama.cpp fixtures.
pub fn synthetic_dir() -> PathBuf {
    root().join("tests/fixtures/llamacpp/synthetic")
}

/// Every synthetic model file, sorted by name.
pub fn synthetic_models() -> Vec<PathBuf> {
    let dir = synthetic_dir().join("models");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    out.sort();
    assert!(
        out.len() >= 20,
        "expected the synthetic models in {}",
        dir.display()
    );
    out
}

/// A real test model by file name; a missing model fails the test.
pub fn real_model(name: &str) -> PathBuf {
    let dir = std::env::var_os("HEARTH_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/models"));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "real test model {} is missing: run `make setup` (or set HEARTH_MODELS)",
        path.display()
    );
    path
}

/// Reads a whole file.
pub fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

use std::cell::Cell;

use hearth::gguf::{ByteSource, GgufError, MemSource};

/// A source that hides its slice (like an HTTP or Blob source) and counts reads.
pub struct NoSlice<S> {
    pub inner: S,
    pub reads: Cell<usize>,
    pub max_read: Cell<usize>,
}

impl<S: ByteSource> NoSlice<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            reads: Cell::new(0),
            max_read: Cell::new(0),
        }
    }
}

impl<S: ByteSource> ByteSource for NoSlice<S> {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        self.reads.set(self.reads.get() + 1);
        self.max_read.set(self.max_read.get().max(buf.len()));
        self.inner.read_at(offset, buf).await
    }
}

/// An owned in-memory source hiding its slice.
pub fn no_slice(bytes: Vec<u8>) -> NoSlice<MemSource<'static>> {
    NoSlice::new(MemSource::new(bytes))
}

/// A `Write` that checks every byte against `expected` as it arrives, so
/// large round trips need no second copy of the file.
pub struct CompareWriter<'a> {
    pub expected: &'a [u8],
    pub pos: usize,
}

impl std::io::Write for CompareWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let end = self.pos + buf.len();
        assert!(
            end <= self.expected.len(),
            "wrote past the original's {} bytes",
            self.expected.len()
        );
        if buf != &self.expected[self.pos..end] {
            let i = buf
                .iter()
                .zip(&self.expected[self.pos..end])
                .position(|(a, b)| a != b)
                .unwrap();
            panic!("first differing byte at offset {}", self.pos + i);
        }
        self.pos = end;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A temporary directory unique to this process and `tag`, emptied first.
pub fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hearth-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A small deterministic generator (splitmix64) for test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}
