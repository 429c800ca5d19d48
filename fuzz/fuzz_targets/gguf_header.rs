//! Feeds arbitrary bytes to the GGUF reader through an in-memory source.
//! Any outcome but a panic, an abort or a huge allocation is a pass.
//!
//! It also reads the same bytes through a source without a slice, in reads
//! as small as a few bytes (so every field can straddle a read), and checks
//! that both paths agree; and streams the tensors of files that parse.
#![no_main]

use hearth::gguf::{stream_tensors, ByteSource, GgufError, GgufFile, MemSource, ReadOptions};
use libfuzzer_sys::fuzz_target;

/// A source that hides its slice, like an HTTP or Blob source.
struct NoSlice<'a>(MemSource<'a>);

impl ByteSource for NoSlice<'_> {
    fn len(&self) -> u64 {
        self.0.len()
    }

    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        self.0.read_at(offset, buf).await
    }
}

fuzz_target!(|data: &[u8]| {
    let src = MemSource::borrowed(data);
    let fast = pollster::block_on(GgufFile::read(&src));
    let first_chunk = 1 + data.last().copied().unwrap_or(0) as u64 % 64;
    let opts = ReadOptions {
        first_chunk,
        max_chunk: 256,
        ..Default::default()
    };
    let slow = pollster::block_on(GgufFile::read_with(
        &NoSlice(MemSource::borrowed(data)),
        &opts,
    ));
    match (&fast, &slow) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a.tensors, b.tensors);
            assert_eq!(a.metadata.len(), b.metadata.len());
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("slice and buffered reads disagree: {fast:?} / {slow:?}"),
    }
    if let Ok(file) = fast {
        // A file that parses describes only bytes inside it, and streams.
        for t in &file.tensors {
            assert!(t.offset >= file.data_offset && t.end() <= data.len() as u64);
        }
        // Stream in place and through the read-ahead buffer: same chunks.
        let chunk = 1 + first_chunk as usize * 37;
        let mut chunks = Vec::new();
        let done = pollster::block_on(stream_tensors::<_, GgufError, _>(&file, &src, chunk, |c| {
            assert!(!c.data.is_empty() && c.data.len() <= chunk);
            chunks.push((c.tensor.offset + c.offset, c.data.to_vec()));
            Ok(())
        }));
        let total: u64 = chunks.iter().map(|(_, d)| d.len() as u64).sum();
        assert_eq!(done.map(|p| p.bytes_done).ok(), Some(total));
        assert_eq!(total, file.tensor_bytes());
        let slow_src = NoSlice(MemSource::borrowed(data));
        let mut i = 0;
        let done = pollster::block_on(stream_tensors::<_, GgufError, _>(
            &file,
            &slow_src,
            chunk,
            |c| {
                assert_eq!(
                    (c.tensor.offset + c.offset, c.data),
                    (chunks[i].0, &chunks[i].1[..])
                );
                i += 1;
                Ok(())
            },
        ));
        assert!(done.is_ok() && i == chunks.len());
    }
});
