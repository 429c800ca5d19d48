//! Inputs found by fuzzing `fuzz/fuzz_targets/gguf_header.rs` (see
//! `tests/fixtures/gguf/README.md`): every one must give Ok or Err, never a
//! panic, and the slice and buffered read paths must agree on it.

mod gguf_support;

use std::path::{Path, PathBuf};

use hearth::gguf::{stream_tensors, GgufError, GgufFile, MemSource, ReadOptions};

use gguf_support::no_slice;

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_none_or(|x| x != "md"))
        .collect();
    out.sort();
    out
}

/// Reads `data` both ways and streams it when it parses; returns the outcome.
fn run(data: &[u8]) -> Result<GgufFile, GgufError> {
    let src = MemSource::borrowed(data);
    let fast = pollster::block_on(GgufFile::read(&src));
    let opts = ReadOptions {
        first_chunk: 5,
        max_chunk: 256,
        ..Default::default()
    };
    let slow = pollster::block_on(GgufFile::read_with(&no_slice(data.to_vec()), &opts));
    match (&fast, &slow) {
        (Ok(a), Ok(b)) => assert_eq!(a.tensors, b.tensors),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("slice and buffered reads disagree: {fast:?} / {slow:?}"),
    }
    if let Ok(file) = &fast {
        let p = pollster::block_on(stream_tensors::<_, GgufError, _>(file, &src, 777, |_| {
            Ok(())
        }));
        assert_eq!(p.unwrap().bytes_done, file.tensor_bytes());
    }
    fast
}

fn variant(e: &GgufError) -> String {
    let dbg = format!("{e:?}");
    dbg.split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn fuzz_regressions_do_not_panic() {
    let dir = gguf_support::root().join("tests/fixtures/gguf/fuzz-regressions");
    let files = inputs(&dir);
    assert!(
        files.len() >= 5,
        "expected the regression inputs in {}",
        dir.display()
    );
    let mut errors = 0;
    for path in &files {
        let data = gguf_support::read(path);
        let outcome = std::panic::catch_unwind(|| run(&data));
        match outcome {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                errors += 1;
                println!("{}: {}: {e}", path.display(), variant(&e));
            }
            Err(_) => panic!("{} panicked", path.display()),
        }
    }
    assert!(
        errors > 0,
        "the regression inputs should include invalid files"
    );
}

/// Prints the outcome of every file of `$HEARTH_FUZZ_DIR` (a fuzz corpus), to
/// pick regression inputs: `HEARTH_FUZZ_DIR=fuzz/corpus/gguf_header cargo test
/// --test gguf_fuzz_regressions -- --ignored --nocapture`.
#[test]
#[ignore = "a tool for choosing regression inputs, not a check"]
fn classify_corpus() {
    let Some(dir) = std::env::var_os("HEARTH_FUZZ_DIR") else {
        panic!("set HEARTH_FUZZ_DIR to a corpus directory");
    };
    for path in inputs(Path::new(&dir)) {
        let data = gguf_support::read(&path);
        let what = match run(&data) {
            Ok(f) => format!("Ok({} tensors)", f.tensors.len()),
            Err(e) => variant(&e),
        };
        println!("CLASSIFY\t{}\t{}\t{what}", data.len(), path.display());
    }
}
