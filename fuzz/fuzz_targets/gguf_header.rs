//! Feeds arbitrary bytes to the GGUF reader through an in-memory source.
//! Any outcome but a panic, an abort or a huge allocation is a pass.
#![no_main]

use hearth::gguf::{GgufFile, MemSource};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let src = MemSource::borrowed(data);
    if let Ok(file) = pollster::block_on(GgufFile::read(&src)) {
        // A file that parses must describe only bytes inside it.
        for t in &file.tensors {
            assert!(t.offset >= file.data_offset && t.end() <= data.len() as u64);
        }
    }
});
