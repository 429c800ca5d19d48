//! The GGUF writer: byte-identical round trips and metadata of every type.

mod gguf_support;

use hearth::gguf::{
    open_path, read_tensor_data, write_gguf, Array, GgufError, GgufFile, GgufWriter, MemSource,
    Metadata, TensorSpec, Value,
};
use hearth::quant::GgmlType;

use gguf_support::{real_model, synthetic_models, CompareWriter, Rng};

/// Rewrites `path` from its parsed header and tensor data, in `piece`-byte
/// writes, checking each byte against the original as it is written.
fn round_trip(path: &std::path::Path, piece: usize) {
    let (file, src) = open_path(path).unwrap();
    let bytes = hearth::gguf::ByteSource::as_slice(&src).unwrap();
    let out = CompareWriter {
        expected: bytes,
        pos: 0,
    };
    let mut w = GgufWriter::new(out, &file.metadata, &TensorSpec::all_of(&file)).unwrap();
    assert_eq!(w.written(), file.data_offset, "{}", path.display());
    for t in &file.tensors {
        let data = pollster::block_on(read_tensor_data(&src, t)).unwrap();
        for part in data.chunks(piece) {
            w.write_data(part).unwrap();
        }
    }
    let out = w.finish().unwrap();
    assert_eq!(out.pos, bytes.len(), "{}: written size", path.display());
}

#[test]
fn synthetic_models_round_trip_byte_identical() {
    for (i, path) in synthetic_models().iter().enumerate() {
        round_trip(path, [usize::MAX, 1000, 4096 + 7][i % 3]);
    }
}

#[test]
fn gguf_py_files_round_trip_byte_identical() {
    let dir = gguf_support::root().join("tests/fixtures/gguf");
    round_trip(&dir.join("gguf-py-small.gguf"), 5);
    round_trip(&dir.join("gguf-py-align64.gguf"), 64);
}

#[test]
fn real_models_round_trip_byte_identical() {
    round_trip(&real_model("SmolLM2-135M-Instruct.Q4_1.gguf"), 1 << 20);
    round_trip(&real_model("gemma-3-270m-q4_k_m.gguf"), usize::MAX);
}

/// Metadata with every value type, nested arrays and non-ASCII strings.
pub fn every_type_metadata() -> Metadata {
    let mut m = Metadata::new();
    let pairs = [
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(-1.5e-3)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo wörld ✓ 猫".into())),
        ("t.u64", Value::U64(u64::MAX - 5)),
        ("t.i64", Value::I64(i64::MIN + 7)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("t.arr.u8", Value::Array(Array::U8(vec![1, 2, 255]))),
        ("t.arr.i16", Value::Array(Array::I16(vec![-1, 2, -300]))),
        ("t.arr.f32", Value::Array(Array::F32(vec![0.25, -8.0]))),
        (
            "t.arr.bool",
            Value::Array(Array::Bool(vec![true, false, true])),
        ),
        (
            "t.arr.str",
            Value::Array(Array::String(vec!["a".into(), String::new(), "ü".into()])),
        ),
        ("t.arr.i64", Value::Array(Array::I64(vec![i64::MAX, -1]))),
        ("t.arr.f64", Value::Array(Array::F64(vec![1e300]))),
        ("t.arr.empty", Value::Array(Array::U32(vec![]))),
        (
            "t.arr.nested",
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2, 3]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::I8(vec![-1]), Array::F32(vec![])]),
            ])),
        ),
    ];
    for (k, v) in pairs {
        assert!(m.insert(k.to_string(), v));
    }
    m
}

#[test]
fn every_value_type_round_trips() {
    let mut rng = Rng(0x5eed_0001);
    println!("seed 0x5eed_0001");
    let meta = every_type_metadata();
    let a = rng.bytes(4 * 64 * 3);
    let b = rng.bytes(18 * 4);
    let tensors = [
        (
            TensorSpec {
                name: "a".into(),
                shape: vec![64, 3],
                ty: GgmlType::F32,
            },
            &a[..],
        ),
        (
            TensorSpec {
                name: "b".into(),
                shape: vec![64, 1, 2, 1],
                ty: GgmlType::Q4_0,
            },
            &b[..],
        ),
    ];
    let bytes = write_gguf(Vec::new(), &meta, &tensors).unwrap();
    let f = pollster::block_on(GgufFile::read(&MemSource::borrowed(&bytes))).unwrap();
    assert_eq!(f.version, 3);
    let got: Vec<_> = f.metadata.iter().collect();
    let want: Vec<_> = meta.iter().collect();
    assert_eq!(got, want);
    assert_eq!(f.tensors.len(), 2);
    assert_eq!(f.tensors[1].shape, vec![64, 1, 2, 1]);
    assert_eq!(f.tensors[1].offset, f.data_offset + 768);
    assert_eq!(f.tensors[1].size, 72);
    assert_eq!(
        bytes.len() as u64,
        f.data_offset + 768 + 96,
        "last tensor padded to 32"
    );
    let src = MemSource::borrowed(&bytes);
    assert_eq!(
        pollster::block_on(read_tensor_data(&src, &f.tensors[0])).unwrap(),
        a
    );
    assert_eq!(
        pollster::block_on(read_tensor_data(&src, &f.tensors[1])).unwrap(),
        b
    );
    // Writing the parsed file again gives the same bytes.
    let again = write_gguf(Vec::new(), &f.metadata, &tensors).unwrap();
    assert_eq!(again, bytes);
}

#[test]
fn custom_alignment_is_used() {
    let mut meta = Metadata::new();
    meta.insert("general.alignment".into(), Value::U32(256));
    let data = [7u8; 6];
    let tensors = [
        (
            TensorSpec {
                name: "x".into(),
                shape: vec![3],
                ty: GgmlType::F16,
            },
            &data[..],
        ),
        (
            TensorSpec {
                name: "y".into(),
                shape: vec![3],
                ty: GgmlType::F16,
            },
            &data[..],
        ),
    ];
    let bytes = write_gguf(Vec::new(), &meta, &tensors).unwrap();
    let f = pollster::block_on(GgufFile::read(&MemSource::borrowed(&bytes))).unwrap();
    assert_eq!(f.alignment, 256);
    assert_eq!(f.data_offset % 256, 0);
    assert_eq!(f.tensors[1].offset - f.tensors[0].offset, 256);
    assert_eq!(bytes.len() as u64, f.data_offset + 512);
}

#[test]
fn writer_rejects_invalid_input() {
    let meta = Metadata::new();
    let spec = |name: &str, shape: Vec<u64>, ty| TensorSpec {
        name: name.into(),
        shape,
        ty,
    };
    let err = |specs: &[TensorSpec]| GgufWriter::new(Vec::new(), &meta, specs).err().unwrap();
    assert!(matches!(
        err(&[spec("a", vec![4], GgmlType::F32), spec("a", vec![4], GgmlType::F32)]),
        GgufError::DuplicateTensor(n) if n == "a"
    ));
    assert!(matches!(
        err(&[spec("a", vec![1; 5], GgmlType::F32)]),
        GgufError::TooManyDims { n_dims: 5, .. }
    ));
    assert!(matches!(
        err(&[spec("a", vec![48], GgmlType::Q4_K)]),
        GgufError::RowNotBlockMultiple { .. }
    ));
    assert!(matches!(
        err(&[spec("a", vec![0, 3], GgmlType::F32)]),
        GgufError::BadShape { .. }
    ));
    let mut bad = Metadata::new();
    bad.insert("general.alignment".into(), Value::U32(24));
    assert!(matches!(
        GgufWriter::new(Vec::new(), &bad, &[]).err(),
        Some(GgufError::BadAlignment(_))
    ));

    // Data of the wrong size.
    let short = [0u8; 15];
    let e = write_gguf(
        Vec::new(),
        &meta,
        &[(spec("a", vec![4], GgmlType::F32), &short[..])],
    );
    assert!(matches!(e, Err(GgufError::InvalidWrite(_))));
    // Unfinished and overlong data.
    let mut w = GgufWriter::new(Vec::new(), &meta, &[spec("a", vec![4], GgmlType::F32)]).unwrap();
    w.write_data(&[1; 8]).unwrap();
    let e = w.finish().err().unwrap();
    assert!(e.to_string().contains("'a' has 8 of its 16 bytes"), "{e}");
    let mut w = GgufWriter::new(Vec::new(), &meta, &[spec("a", vec![4], GgmlType::F32)]).unwrap();
    assert!(matches!(
        w.write_data(&[1; 17]),
        Err(GgufError::InvalidWrite(_))
    ));
}
