//! Hostile input: valid files built with the writer, then corrupted. Each
//! error variant has a case; every prefix of a small file is an error.

mod gguf_support;

use hearth::gguf::{
    write_gguf, Array, GgufError, GgufFile, MemSource, Metadata, ReadOptions, TensorSpec, Value,
};
use hearth::quant::GgmlType;

use gguf_support::{no_slice, Rng};

/// Names of equal length, so one can be overwritten with another.
const T_A: &str = "tensor.alpha";
const T_B: &str = "tensor.bravo";
const T_C: &str = "tensor.charl";
const K_ONE: &str = "test.key.one";
const K_TWO: &str = "test.key.two";
const K_STR: &str = "test.string";
const K_ARR: &str = "test.array";

/// A small valid file: four metadata pairs, an alignment, three tensors.
fn small_file() -> Vec<u8> {
    let mut m = Metadata::new();
    m.insert("general.architecture".into(), Value::String("llama".into()));
    m.insert("general.alignment".into(), Value::U32(32));
    m.insert(K_ONE.into(), Value::U32(11));
    m.insert(K_TWO.into(), Value::F32(2.5));
    m.insert(K_STR.into(), Value::String("héllo".into()));
    m.insert(K_ARR.into(), Value::Array(Array::I32(vec![1, -2, 3])));
    let mut rng = Rng(0xbad_f11e);
    let a = rng.bytes(8 * 2 * 4);
    let b = rng.bytes(2 * 2 * 18);
    let c = rng.bytes(4 * 2);
    let tensors = [
        (
            TensorSpec {
                name: T_A.into(),
                shape: vec![8, 2],
                ty: GgmlType::F32,
            },
            &a[..],
        ),
        (
            TensorSpec {
                name: T_B.into(),
                shape: vec![64, 2],
                ty: GgmlType::Q4_0,
            },
            &b[..],
        ),
        (
            TensorSpec {
                name: T_C.into(),
                shape: vec![4],
                ty: GgmlType::F16,
            },
            &c[..],
        ),
    ];
    write_gguf(Vec::new(), &m, &tensors).unwrap()
}

fn parse(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let fast = pollster::block_on(GgufFile::read(&MemSource::borrowed(bytes)));
    // The buffered path (tiny reads, so fields straddle reads) must agree.
    let opts = ReadOptions {
        first_chunk: 3,
        max_chunk: 64,
        ..Default::default()
    };
    let slow = pollster::block_on(GgufFile::read_with(&no_slice(bytes.to_vec()), &opts));
    match (&fast, &slow) {
        (Ok(a), Ok(b)) => assert_eq!(a.tensors, b.tensors),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("paths disagree: {fast:?} vs {slow:?}"),
    }
    fast
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{needle:?} not found"))
}

/// Offset just past the key string of `key` (its type tag).
fn after_key(bytes: &[u8], key: &str) -> usize {
    find(bytes, key.as_bytes()) + key.len()
}

/// Offset of field `field` of tensor `name`'s info: 0 n_dims, 1 first dim,
/// 2 type (for 2-D tensors add 8), 3 offset.
fn tensor_field(bytes: &[u8], name: &str, field: usize) -> usize {
    let base = find(bytes, name.as_bytes()) + name.len();
    let n_dims = u32::from_le_bytes(bytes[base..base + 4].try_into().unwrap()) as usize;
    match field {
        0 => base,
        1 => base + 4,
        2 => base + 4 + 8 * n_dims,
        _ => base + 4 + 8 * n_dims + 4,
    }
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn corrupt(f: impl FnOnce(&mut Vec<u8>)) -> GgufError {
    let mut bytes = small_file();
    f(&mut bytes);
    let e = parse(&bytes).expect_err("corrupted file parsed");
    assert!(!e.to_string().is_empty());
    e
}

#[test]
fn small_file_is_valid() {
    let bytes = small_file();
    let f = parse(&bytes).unwrap();
    assert_eq!(f.tensors.len(), 3);
    assert_eq!(f.metadata.get_u32(K_ONE), Some(11));
    // Version 2 has the same layout and is read too.
    let mut v2 = bytes.clone();
    put_u32(&mut v2, 4, 2);
    assert_eq!(parse(&v2).unwrap().version, 2);
}

#[test]
fn bad_magic() {
    let e = corrupt(|b| b[0] = b'X');
    assert!(matches!(e, GgufError::BadMagic(m) if &m == b"XGUF"), "{e}");
}

#[test]
fn unsupported_versions() {
    let e = corrupt(|b| put_u32(b, 4, 1));
    assert!(matches!(e, GgufError::UnsupportedVersion { version: 1 }));
    assert!(e.to_string().contains("too old"), "{e}");
    let e = corrupt(|b| put_u32(b, 4, 4));
    assert!(
        matches!(e, GgufError::UnsupportedVersion { version: 4 }),
        "{e}"
    );
    let e = corrupt(|b| put_u32(b, 4, 3u32.swap_bytes()));
    assert!(e.to_string().contains("big-endian"), "{e}");
}

#[test]
fn truncated_at_every_prefix() {
    let bytes = small_file();
    let f = parse(&bytes).unwrap();
    let last_end = f.tensors.iter().map(|t| t.end()).max().unwrap() as usize;
    let infos_end = tensor_field(&bytes, T_C, 3) + 8;
    for len in 0..last_end {
        let e = parse(&bytes[..len]).expect_err("a strict prefix parsed");
        if len < infos_end {
            assert!(
                matches!(e, GgufError::Truncated { .. }),
                "prefix {len}: {e}"
            );
        } else {
            assert!(
                matches!(e, GgufError::TensorOutOfBounds { .. }),
                "prefix {len}: {e}"
            );
        }
    }
    // Only the last tensor's padding may be missing.
    for len in last_end..=bytes.len() {
        assert!(parse(&bytes[..len]).is_ok(), "prefix {len}");
    }
    // The message says what was being read and where.
    let at = after_key(&bytes, K_STR) + 4 + 8; // the string's bytes
    let e = parse(&bytes[..at + 2]).unwrap_err();
    let msg = e.to_string();
    let want =
        format!("value of metadata key '{K_STR}' at offset {at} needs 6 bytes but only 2 remain");
    assert!(msg.contains(&want), "{msg}");
    let e = parse(&bytes[..26]).unwrap_err();
    assert!(e.to_string().contains("declares at offset 24"), "{e}");
}

#[test]
fn counts_and_lengths_beyond_the_file() {
    // Tensor and metadata counts larger than the file could hold.
    let e = corrupt(|b| put_u64(b, 8, u64::MAX));
    assert!(
        matches!(&e, GgufError::Truncated { what, .. } if what.contains("tensor infos")),
        "{e}"
    );
    let e = corrupt(|b| put_u64(b, 16, 1 << 40));
    assert!(
        matches!(&e, GgufError::Truncated { what, .. } if what.contains("metadata pairs")),
        "{e}"
    );
    // A string length past the end of the file.
    let e = corrupt(|b| {
        let at = after_key(b, K_STR) + 4;
        put_u64(b, at, 1 << 30)
    });
    assert!(
        matches!(&e, GgufError::Truncated { what, .. } if what.contains(K_STR)),
        "{e}"
    );
    // A string length above the sane limit, in a file long enough to hold it.
    let e = corrupt(|b| {
        let at = after_key(b, K_STR) + 4;
        put_u64(b, at, hearth::gguf::MAX_STRING_LEN + 1);
        b.resize(b.len() + hearth::gguf::MAX_STRING_LEN as usize + 1, 0);
    });
    assert!(matches!(e, GgufError::LimitExceeded { .. }), "{e}");
    // An array count past the end of the file.
    let e = corrupt(|b| {
        let at = after_key(b, K_ARR) + 8;
        put_u64(b, at, u64::MAX / 4)
    });
    assert!(
        matches!(&e, GgufError::Truncated { what, .. } if what.contains(K_ARR)),
        "{e}"
    );
}

#[test]
fn unknown_value_type() {
    let e = corrupt(|b| {
        let at = after_key(b, K_ONE);
        put_u32(b, at, 13)
    });
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, tag: 13, .. } if key == K_ONE),
        "{e}"
    );
    // Inside an array: the element type.
    let e = corrupt(|b| {
        let at = after_key(b, K_ARR) + 4;
        put_u32(b, at, 99)
    });
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, tag: 99, .. } if key == K_ARR),
        "{e}"
    );
}

#[test]
fn unknown_tensor_type() {
    for id in [4u32, 31, 99, u32::MAX] {
        let e = corrupt(|b| {
            let at = tensor_field(b, T_B, 2);
            put_u32(b, at, id)
        });
        assert!(
            matches!(&e, GgufError::UnknownTensorType { tensor, id: i } if tensor == T_B && *i == id),
            "{e}"
        );
        assert!(e.to_string().contains(T_B) && e.to_string().contains(&id.to_string()));
    }
}

#[test]
fn too_many_dims() {
    let e = corrupt(|b| {
        let at = tensor_field(b, T_A, 0);
        put_u32(b, at, 5)
    });
    assert!(
        matches!(&e, GgufError::TooManyDims { tensor, n_dims: 5 } if tensor == T_A),
        "{e}"
    );
}

#[test]
fn bad_shapes() {
    let e = corrupt(|b| {
        let at = tensor_field(b, T_A, 1) + 8;
        put_u64(b, at, 0)
    });
    assert!(
        matches!(&e, GgufError::BadShape { tensor, shape, .. } if tensor == T_A && shape == &[8, 0]),
        "{e}"
    );
    // Element count overflow.
    let e = corrupt(|b| {
        let at = tensor_field(b, T_A, 1);
        put_u64(b, at, 1 << 32);
        put_u64(b, at + 8, 1 << 32);
    });
    assert!(
        matches!(&e, GgufError::BadShape { reason, .. } if reason.contains("element count")),
        "{e}"
    );
    // Byte size overflow: 2^62 f32 elements fit i64 but 2^64 bytes do not.
    let e = corrupt(|b| {
        let at = tensor_field(b, T_A, 1);
        put_u64(b, at, 1 << 31);
        put_u64(b, at + 8, 1 << 31);
    });
    assert!(
        matches!(&e, GgufError::BadShape { reason, .. } if reason.contains("byte size")),
        "{e}"
    );
}

#[test]
fn row_not_block_multiple() {
    let e = corrupt(|b| {
        let at = tensor_field(b, T_B, 1);
        put_u64(b, at, 48)
    });
    assert!(
        matches!(&e, GgufError::RowNotBlockMultiple { tensor, ty: GgmlType::Q4_0, row_len: 48, block: 32 } if tensor == T_B),
        "{e}"
    );
}

#[test]
fn duplicate_tensor_name() {
    let e = corrupt(|b| {
        let at = find(b, T_C.as_bytes());
        b[at..at + T_A.len()].copy_from_slice(T_A.as_bytes());
    });
    assert!(
        matches!(&e, GgufError::DuplicateTensor(n) if n == T_A),
        "{e}"
    );
}

#[test]
fn duplicate_metadata_key() {
    let e = corrupt(|b| {
        let at = find(b, K_TWO.as_bytes());
        b[at..at + K_ONE.len()].copy_from_slice(K_ONE.as_bytes());
    });
    assert!(
        matches!(&e, GgufError::DuplicateKey(k) if k == K_ONE),
        "{e}"
    );
}

#[test]
fn tensor_data_outside_the_file() {
    let e = corrupt(|b| {
        let at = tensor_field(b, T_C, 3);
        put_u64(b, at, 1 << 20)
    });
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { tensor, .. } if tensor == T_C),
        "{e}"
    );
    // An offset whose end overflows u64.
    let e = corrupt(|b| {
        let at = tensor_field(b, T_C, 3);
        put_u64(b, at, u64::MAX - 31)
    });
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { end: u64::MAX, .. }),
        "{e}"
    );
}

#[test]
fn overlapping_tensors() {
    let e = corrupt(|b| {
        let at = tensor_field(b, T_B, 3);
        put_u64(b, at, 32)
    });
    assert!(
        matches!(&e, GgufError::OverlappingTensors { first, second, .. } if first == T_A && second == T_B),
        "{e}"
    );
}

#[test]
fn misaligned_tensor() {
    let e = corrupt(|b| {
        let at = tensor_field(b, T_B, 3);
        let off = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        put_u64(b, at, off + 4)
    });
    assert!(
        matches!(&e, GgufError::MisalignedTensor { tensor, alignment: 32, .. } if tensor == T_B),
        "{e}"
    );
}

#[test]
fn bad_alignment() {
    for value in [0u32, 48, 3] {
        let e = corrupt(|b| {
            let at = after_key(b, "general.alignment") + 4;
            put_u32(b, at, value)
        });
        assert!(matches!(e, GgufError::BadAlignment(_)), "{e}");
    }
    // A signed type is not accepted either.
    let e = corrupt(|b| {
        let at = after_key(b, "general.alignment");
        put_u32(b, at, 5)
    });
    assert!(matches!(e, GgufError::BadAlignment(_)), "{e}");
}

#[test]
fn invalid_utf8() {
    let e = corrupt(|b| {
        let at = find(b, "héllo".as_bytes());
        b[at + 1] = 0xff;
    });
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { what, .. } if what.contains(K_STR)),
        "{e}"
    );
    let e = corrupt(|b| {
        let at = find(b, T_B.as_bytes());
        b[at] = 0xc0;
    });
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { what, .. } if what.contains("tensor info #1")),
        "{e}"
    );
}

#[test]
fn nesting_depth_is_limited() {
    // Turn the i32 array into an array of arrays whose first element claims
    // to be an array again, and so on: the depth limit stops it, not the stack.
    let mut bytes = small_file();
    let at = after_key(&bytes, K_ARR) + 4;
    let mut nested = Vec::new();
    for _ in 0..100 {
        nested.extend_from_slice(&9u32.to_le_bytes());
        nested.extend_from_slice(&1u64.to_le_bytes());
    }
    bytes.splice(at..at, nested);
    let e = parse(&bytes).unwrap_err();
    assert!(
        matches!(&e, GgufError::LimitExceeded { what, .. } if what.contains("nesting")),
        "{e}"
    );
}

/// Random byte flips in the header of a valid file: always Ok or Err, and the
/// two read paths agree (checked by `parse`).
#[test]
fn random_header_corruption_never_panics() {
    let seed = 0x1234_5678;
    println!("seed {seed:#x}");
    let mut rng = Rng(seed);
    let bytes = small_file();
    let header = pollster::block_on(GgufFile::read(&MemSource::borrowed(&bytes)))
        .unwrap()
        .data_offset as usize;
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + rng.next_u64() % 4 {
            let at = (rng.next_u64() % header as u64) as usize;
            b[at] = rng.next_u64() as u8;
        }
        let _ = parse(&b);
    }
}

/// A remote-like source that claims 1 TiB: a real prefix, then zeros. Counts
/// that such a file could hold must not be trusted for allocation.
struct Huge(Vec<u8>);

impl hearth::gguf::ByteSource for Huge {
    fn len(&self) -> u64 {
        1 << 40
    }

    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = self.0.get(offset as usize + i).copied().unwrap_or(0);
        }
        Ok(())
    }
}

#[test]
fn declared_counts_are_not_preallocated() {
    let header = |n_tensors: u64, n_kv: u64| {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&n_tensors.to_le_bytes());
        b.extend_from_slice(&n_kv.to_le_bytes());
        b
    };
    // 2^35 tensor infos fit in 1 TiB by size; the first one is invalid.
    let mut b = header(1 << 35, 0);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'x');
    b.extend_from_slice(&9u32.to_le_bytes());
    let e = pollster::block_on(GgufFile::read(&Huge(b))).unwrap_err();
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 9, .. }), "{e}");

    // An array of 2^34 strings: above the array size limit.
    let mut b = header(0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 34).to_le_bytes());
    let e = pollster::block_on(GgufFile::read(&Huge(b))).unwrap_err();
    assert!(matches!(e, GgufError::LimitExceeded { .. }), "{e}");

    // 2^24 strings fit the limit; the first has invalid UTF-8 and nothing
    // was reserved for the rest.
    let mut b = header(0, 1);
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(b'k');
    b.extend_from_slice(&9u32.to_le_bytes());
    b.extend_from_slice(&8u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 24).to_le_bytes());
    b.extend_from_slice(&1u64.to_le_bytes());
    b.push(0xff);
    let e = pollster::block_on(GgufFile::read(&Huge(b))).unwrap_err();
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e}");
}
