//! Tensor streaming, buffered header reads over slow sources, and split models.

mod gguf_support;

use hearth::gguf::{
    open_model, open_path, read_tensor, split_path, stream_tensors, ByteSource, GgufError,
    GgufFile, GgufModel, GgufWriter, MemSource, Metadata, ReadOptions, TensorSpec, TensorStream,
    Value,
};

use gguf_support::{no_slice, real_model, synthetic_models, temp_dir};

/// Streams `file` from `src` in `chunk`-byte pieces and checks every property
/// of the stream against whole-tensor reads.
fn check_stream<S: ByteSource>(file: &GgufFile, src: &S, whole: &[u8], chunk: usize) {
    let mut order: Vec<_> = file.tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    let mut cur: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    let mut last_progress = Default::default();
    let progress = pollster::block_on(stream_tensors::<_, GgufError, _>(file, src, chunk, |c| {
        assert!(
            !c.data.is_empty() && c.data.len() <= chunk,
            "chunk of {} bytes",
            c.data.len()
        );
        assert_eq!(c.tensor.name, order[seen].name, "file order");
        assert_eq!(c.offset, cur.len() as u64, "contiguous offsets");
        cur.extend_from_slice(c.data);
        assert!(c.progress.bytes_done > last_progress_bytes(&last_progress));
        last_progress = c.progress;
        if c.last {
            let t = c.tensor;
            assert_eq!(
                cur.as_slice(),
                &whole[t.offset as usize..t.end() as usize],
                "{}",
                t.name
            );
            cur.clear();
            seen += 1;
            assert_eq!(c.progress.tensors_done, seen);
        }
        Ok(())
    }))
    .unwrap();
    assert_eq!(seen, file.tensors.len());
    assert_eq!(progress.bytes_done, file.tensor_bytes());
    assert_eq!(progress.bytes_total, file.tensor_bytes());
    assert_eq!(progress.tensors_total, file.tensors.len());
    assert_eq!(progress, last_progress);
}

fn last_progress_bytes(p: &hearth::gguf::Progress) -> u64 {
    p.bytes_done
}

#[test]
fn streams_every_synthetic_model_in_bounded_chunks() {
    for (i, path) in synthetic_models().iter().enumerate() {
        let whole = gguf_support::read(path);
        let (file, mmap) = open_path(path).unwrap();
        let chunk = [1000, 4096, 1 << 20][i % 3];
        check_stream(&file, &mmap, &whole, chunk);
        // The copying path (no slice) gives the same chunks.
        let slow = no_slice(whole.clone());
        check_stream(&file, &slow, &whole, chunk);
        assert!(slow.max_read.get() <= chunk, "a read larger than one chunk");
        // Reads cover whole chunks of the file, not one tensor each.
        let span = file.file_size - file.data_offset;
        let max_reads = 2 * span.div_ceil(chunk as u64) as usize;
        assert!(
            slow.reads.get() <= max_reads,
            "{} reads, {} tensors",
            slow.reads.get(),
            file.tensors.len()
        );
        if chunk == 1 << 20 {
            assert!(
                slow.reads.get() <= 3,
                "{}: {} reads",
                path.display(),
                slow.reads.get()
            );
        }
    }
}

#[test]
fn stream_stops_on_callback_error_and_rejects_zero_chunks() {
    let path = &synthetic_models()[0];
    let (file, src) = open_path(path).unwrap();
    let mut calls = 0;
    let r = pollster::block_on(stream_tensors(&file, &src, 512, |_| {
        calls += 1;
        if calls == 3 {
            Err(GgufError::Source("upload failed".into()))
        } else {
            Ok(())
        }
    }));
    assert!(matches!(r, Err(GgufError::Source(_))));
    assert_eq!(calls, 3);
    let r = TensorStream::new(&file, &src, 0);
    assert!(matches!(r.err(), Some(GgufError::InvalidArgument(_))));
}

#[test]
fn read_tensor_by_name() {
    let path = synthetic_models()
        .into_iter()
        .find(|p| p.ends_with("llama-Q8_0.gguf"))
        .unwrap();
    let whole = gguf_support::read(&path);
    let (file, src) = open_path(&path).unwrap();
    let t = file.tensor("blk.1.attn_k.weight").unwrap();
    let data = pollster::block_on(read_tensor(&file, &src, &t.name)).unwrap();
    assert_eq!(data, &whole[t.offset as usize..t.end() as usize]);
    assert_eq!(data.len() as u64, 256 * 128 / 32 * 34);
    let r = pollster::block_on(read_tensor(&file, &src, "no.such.tensor"));
    assert!(matches!(r, Err(GgufError::TensorNotFound(n)) if n == "no.such.tensor"));
}

/// Over a source without a slice the header comes in few, large reads, and
/// every chunk size (down to one byte, which makes every field cross a read
/// boundary) parses to the same result.
#[test]
fn header_reads_are_buffered_and_chunk_independent() {
    let path = real_model("gemma-3-270m-q4_k_m.gguf");
    let (reference, mmap) = open_path(&path).unwrap();
    let slow = gguf_support::NoSlice::new(&mmap);
    let f = pollster::block_on(GgufFile::read(&slow)).unwrap();
    assert_eq!(f.tensors, reference.tensors);
    assert_eq!(f.metadata.len(), reference.metadata.len());
    // 6.5 MB of header: 1 + 2 + 4 MiB reads, never one per field.
    assert!(
        slow.reads.get() <= 4,
        "{} reads for the header",
        slow.reads.get()
    );

    for path in synthetic_models().iter().step_by(5) {
        let whole = gguf_support::read(path);
        let reference = pollster::block_on(GgufFile::read(&MemSource::borrowed(&whole))).unwrap();
        for first_chunk in [1, 7, 100, 4096] {
            let slow = no_slice(whole.clone());
            let opts = ReadOptions {
                first_chunk,
                max_chunk: 64 << 10,
                ..Default::default()
            };
            let f = pollster::block_on(GgufFile::read_with(&slow, &opts)).unwrap();
            assert_eq!(
                f.tensors,
                reference.tensors,
                "{} chunk {first_chunk}",
                path.display()
            );
            assert_eq!(f.data_offset, reference.data_offset);
            let a: Vec<_> = f.metadata.iter().collect();
            let b: Vec<_> = reference.metadata.iter().collect();
            assert_eq!(a, b);
        }
    }
}

/// Splits `file` into `n` files the way llama.cpp's gguf-split does: the first
/// holds all metadata, every split has the split keys, tensors in order.
fn write_splits(file: &GgufFile, src: &impl ByteSource, prefix: &str, n: usize) -> Vec<String> {
    let specs = TensorSpec::all_of(file);
    let per = specs.len().div_ceil(n);
    let mut paths = Vec::new();
    for (i, group) in specs.chunks(per).enumerate() {
        let mut meta = if i == 0 {
            file.metadata.clone()
        } else {
            Metadata::new()
        };
        meta.set("split.no", Value::U16(i as u16));
        meta.set("split.count", Value::U16(n as u16));
        meta.set("split.tensors.count", Value::I32(specs.len() as i32));
        let path = split_path(prefix, i, n);
        let out = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let mut w = GgufWriter::new(out, &meta, group).unwrap();
        for spec in group {
            w.write_data(&pollster::block_on(read_tensor(file, src, &spec.name)).unwrap())
                .unwrap();
        }
        w.finish().unwrap();
        paths.push(path);
    }
    assert_eq!(paths.len(), n);
    paths
}

#[test]
fn split_model_reads_as_one() {
    let path = synthetic_models()
        .into_iter()
        .find(|p| p.ends_with("qwen3moe-Q4_K_M.gguf"))
        .unwrap();
    let whole = gguf_support::read(&path);
    let (file, src) = open_path(&path).unwrap();
    let dir = temp_dir("split");
    let prefix = dir.join("qwen3moe").to_str().unwrap().to_string();
    let paths = write_splits(&file, &src, &prefix, 3);

    for open_with in [&paths[0], &paths[2]] {
        let (model, sources) = open_model(open_with.as_ref()).unwrap();
        assert_eq!(model.splits.len(), 3);
        assert_eq!(sources.len(), 3);
        assert_eq!(model.tensors.len(), file.tensors.len());
        assert_eq!(model.metadata().architecture(), Some("qwen3moe"));
        assert_eq!(model.metadata().get_u32("qwen3moe.expert_count"), Some(8));
        assert_eq!(model.tensor_bytes(), file.tensor_bytes());
        let mut per_split = [0usize; 3];
        for t in &model.tensors {
            per_split[t.split] += 1;
            let orig = file.tensor(&t.name).unwrap();
            assert_eq!((&t.shape, t.ty, t.size), (&orig.shape, orig.ty, orig.size));
            let bytes = sources[t.split].as_slice().unwrap();
            assert_eq!(
                &bytes[t.offset as usize..t.end() as usize],
                &whole[orig.offset as usize..orig.end() as usize],
                "{}",
                t.name
            );
        }
        assert!(per_split.iter().all(|&n| n > 0), "{per_split:?}");
    }

    // Streaming a split model gives every tensor once, split by split.
    let (model, sources) = open_model(paths[1].as_ref()).unwrap();
    let mut stream = TensorStream::for_model(&model, &sources, 3000).unwrap();
    let mut names = Vec::new();
    let mut last_split = 0;
    while let Some(c) = pollster::block_on(stream.next()).unwrap() {
        assert!(c.tensor.split >= last_split);
        last_split = c.tensor.split;
        if c.last {
            names.push(c.tensor.name.clone());
        }
    }
    assert_eq!(names.len(), file.tensors.len());
    assert_eq!(stream.progress().bytes_done, file.tensor_bytes());

    // The same over sources without a slice: identical bytes, chunk-sized reads.
    let slow: Vec<_> = paths
        .iter()
        .map(|p| no_slice(gguf_support::read(p.as_ref())))
        .collect();
    let mut a = TensorStream::for_model(&model, &sources, 3000).unwrap();
    let mut b = TensorStream::for_model(&model, &slow, 3000).unwrap();
    loop {
        let x = pollster::block_on(a.next())
            .unwrap()
            .map(|c| (c.tensor.name.clone(), c.offset, c.data.to_vec()));
        let y = pollster::block_on(b.next())
            .unwrap()
            .map(|c| (c.tensor.name.clone(), c.offset, c.data.to_vec()));
        assert_eq!(x, y);
        if x.is_none() {
            break;
        }
    }
    assert!(slow.iter().all(|s| s.max_read.get() <= 3000));

    // Async reading from in-memory sources agrees.
    let mems: Vec<_> = paths
        .iter()
        .map(|p| MemSource::new(gguf_support::read(p.as_ref())))
        .collect();
    let m2 = pollster::block_on(GgufModel::read(&mems)).unwrap();
    assert_eq!(m2.tensors, model.tensors);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn split_errors() {
    let path = synthetic_models()
        .into_iter()
        .find(|p| p.ends_with("llama-Q4_0.gguf"))
        .unwrap();
    let (file, src) = open_path(&path).unwrap();
    let dir = temp_dir("split-errors");
    let prefix = dir.join("m").to_str().unwrap().to_string();
    let paths = write_splits(&file, &src, &prefix, 3);
    let read = |p: &String| {
        pollster::block_on(GgufFile::read(&MemSource::new(gguf_support::read(
            p.as_ref(),
        ))))
        .unwrap()
    };
    let files: Vec<GgufFile> = paths.iter().map(read).collect();

    // Out of order, missing one, and one alone.
    let e = GgufModel::from_files(vec![files[1].clone(), files[0].clone(), files[2].clone()])
        .unwrap_err();
    assert!(e.to_string().contains("in order"), "{e}");
    let e = GgufModel::from_files(vec![files[0].clone(), files[1].clone()]).unwrap_err();
    assert!(e.to_string().contains("3"), "{e}");
    assert!(matches!(
        GgufModel::from_files(vec![]),
        Err(GgufError::Split(_))
    ));

    // A missing file names its path.
    std::fs::remove_file(&paths[1]).unwrap();
    let e = open_model(paths[0].as_ref()).unwrap_err();
    assert!(
        matches!(&e, GgufError::Io { .. }) && e.to_string().contains("m-00002-of-00003.gguf"),
        "{e}"
    );

    // A split renamed so its name hides that it is one.
    let renamed = dir.join("renamed.gguf");
    std::fs::rename(&paths[2], &renamed).unwrap();
    let e = open_model(&renamed).unwrap_err();
    assert!(e.to_string().contains("split 3 of 3"), "{e}");

    // An unsplit model opens as a one-split model.
    let (model, sources) = open_model(&path).unwrap();
    assert_eq!((model.splits.len(), sources.len()), (1, 1));
    assert!(model.tensors.iter().all(|t| t.split == 0));
    let _ = std::fs::remove_dir_all(dir);
}

/// A source whose third read fails once, like a dropped HTTP request.
struct Flaky {
    inner: MemSource<'static>,
    reads: std::cell::Cell<usize>,
}

impl ByteSource for Flaky {
    fn len(&self) -> u64 {
        self.inner.len()
    }

    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        self.reads.set(self.reads.get() + 1);
        if self.reads.get() == 3 {
            return Err(GgufError::Source("connection reset".into()));
        }
        self.inner.read_at(offset, buf).await
    }
}

#[test]
fn a_failed_read_can_be_retried() {
    let path = &synthetic_models()[3];
    let whole = gguf_support::read(path);
    let (file, _) = open_path(path).unwrap();
    let src = Flaky {
        inner: MemSource::new(whole.clone()),
        reads: Default::default(),
    };
    let mut stream = TensorStream::new(&file, &src, 5000).unwrap();
    let mut got: Vec<(String, u64, Vec<u8>)> = Vec::new();
    let mut failures = 0;
    loop {
        match pollster::block_on(stream.next()) {
            Ok(Some(c)) => got.push((c.tensor.name.clone(), c.offset, c.data.to_vec())),
            Ok(None) => break,
            Err(e) => {
                assert!(matches!(e, GgufError::Source(_)));
                failures += 1;
            }
        }
    }
    assert_eq!(failures, 1);
    let mut rebuilt: std::collections::HashMap<String, Vec<u8>> = Default::default();
    for (name, offset, data) in got {
        let v = rebuilt.entry(name).or_default();
        assert_eq!(v.len() as u64, offset, "no chunk lost or repeated");
        v.extend(data);
    }
    for t in &file.tensors {
        assert_eq!(
            rebuilt[&t.name],
            &whole[t.offset as usize..t.end() as usize]
        );
    }
}
