//! The synchronous GGUF header parser over a window of bytes.
//!
//! Parsing works one unit (the preamble, one metadata pair, one tensor info)
//! at a time over a byte window that may end before the file does. When a
//! unit runs past the window but not past the file, the parser stops with
//! [`Stop::More`] and the async driver in `reader.rs` reads more bytes and
//! parses that unit again; past the end of the file it is a real
//! [`GgufError::Truncated`]. So every length is checked against the file
//! size, never only against the window, and nothing is allocated for a count
//! the file cannot hold.

use std::fmt;

use super::value::{Array, Value, ValueType};
use super::GgufError;

/// `GGUF` as stored in the first four bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// ggml's limit on tensor dimensions.
pub const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays accepted (an array of arrays is depth 2).
pub const MAX_ARRAY_DEPTH: u32 = 8;
/// Longest string accepted (keys, tensor names, string values): 64 MiB.
pub const MAX_STRING_LEN: u64 = 64 << 20;
/// Most elements reserved up front for a declared count: a count is only a
/// claim, so larger collections grow as their elements actually parse.
pub(crate) const MAX_PREALLOC: usize = 4096;
/// Largest encoded array accepted in one metadata value: 256 MiB (a 262k-token
/// vocabulary takes a few MB).
pub const MAX_ARRAY_BYTES: u64 = 256 << 20;
/// Smallest possible encoded metadata pair: key length, empty key, type tag, one byte.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest possible encoded tensor info: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Why a parse step did not finish.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The window ends this many bytes too early; read more and retry the unit.
    More(u64),
    /// The file is invalid.
    Fail(GgufError),
}

impl From<GgufError> for Stop {
    fn from(e: GgufError) -> Self {
        Stop::Fail(e)
    }
}

/// Names the field being read, for error messages. Formatting happens only
/// when an error is built.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Field<'a> {
    /// A fixed header field.
    Header(&'static str),
    /// Part of metadata pair number `index` whose key is not known yet.
    KeyIndex(u64, &'static str),
    /// Part of the value of a metadata key.
    Key(&'a str, &'static str),
    /// Part of tensor info number `index` whose name is not known yet.
    TensorIndex(u64, &'static str),
    /// Part of a named tensor's info.
    Tensor(&'a str, &'static str),
}

impl fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Header(what) => write!(f, "the header's {what}"),
            Field::KeyIndex(i, what) => write!(f, "the {what} of metadata pair #{i}"),
            Field::Key(key, what) => write!(f, "the {what} of metadata key '{key}'"),
            Field::TensorIndex(i, what) => write!(f, "the {what} of tensor info #{i}"),
            Field::Tensor(name, what) => write!(f, "the {what} of tensor '{name}'"),
        }
    }
}

/// A cursor over `buf`, which holds the file's bytes from absolute offset `base`.
pub(crate) struct SliceReader<'a> {
    buf: &'a [u8],
    pos: usize,
    base: u64,
    file_size: u64,
}

impl<'a> SliceReader<'a> {
    /// A reader over `buf` = file bytes `[base, base + buf.len())` of a file of `file_size` bytes.
    pub(crate) fn new(buf: &'a [u8], base: u64, file_size: u64) -> Self {
        Self {
            buf,
            pos: 0,
            base,
            file_size,
        }
    }

    /// Bytes consumed so far.
    pub(crate) fn consumed(&self) -> usize {
        self.pos
    }

    /// Absolute file offset of the next byte.
    pub(crate) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Bytes left in the file (not the window) from the current offset.
    pub(crate) fn remaining_in_file(&self) -> u64 {
        self.file_size.saturating_sub(self.offset())
    }

    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: u64, what: Field<'_>) -> Result<&'a [u8], Stop> {
        let available = self.remaining_in_file();
        if n > available {
            return Err(truncated(what, self.offset(), n, available));
        }
        let rest = &self.buf[self.pos..];
        match usize::try_from(n) {
            Ok(n) if n <= rest.len() => {
                self.pos += n;
                Ok(&rest[..n])
            }
            _ => Err(Stop::More(n - rest.len() as u64)),
        }
    }

    fn array_n<const N: usize>(&mut self, what: Field<'_>) -> Result<[u8; N], Stop> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// A little-endian `u32`.
    pub(crate) fn u32(&mut self, what: Field<'_>) -> Result<u32, Stop> {
        self.array_n(what).map(u32::from_le_bytes)
    }

    /// A little-endian `u64`.
    pub(crate) fn u64(&mut self, what: Field<'_>) -> Result<u64, Stop> {
        self.array_n(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: `u64` length, then UTF-8 bytes.
    pub(crate) fn string(&mut self, what: Field<'_>) -> Result<String, Stop> {
        let len = self.u64(what)?;
        let offset = self.offset();
        if len > self.remaining_in_file() {
            return Err(truncated(what, offset, len, self.remaining_in_file()));
        }
        if len > MAX_STRING_LEN {
            return Err(limit(format!("the length of {what}"), len, MAX_STRING_LEN));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| {
            Stop::Fail(GgufError::InvalidUtf8 {
                what: what.to_string(),
                offset,
            })
        })
    }

    /// A value type tag; `key` names the pair for the error.
    fn value_type(&mut self, key: &str) -> Result<ValueType, Stop> {
        let offset = self.offset();
        let tag = self.u32(Field::Key(key, "type tag"))?;
        ValueType::from_u32(tag).ok_or_else(|| {
            Stop::Fail(GgufError::UnknownValueType {
                key: key.to_string(),
                tag,
                offset,
            })
        })
    }

    /// One value of type `ty`; `depth` is the array nesting so far.
    pub(crate) fn value(&mut self, ty: ValueType, key: &str, depth: u32) -> Result<Value, Stop> {
        let what = Field::Key(key, "value");
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array_n(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array_n(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array_n(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array_n(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array_n(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array_n(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array_n(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array_n(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array_n(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array_n(what)?)),
            ValueType::Bool => Value::Bool(self.bool(what)?),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array(key, depth + 1)?),
        })
    }

    /// A bool byte: 0 or 1 (anything else is read as true, as gguf-py does).
    fn bool(&mut self, what: Field<'_>) -> Result<bool, Stop> {
        Ok(self.array_n::<1>(what)?[0] != 0)
    }

    /// An array (element type, count, elements) at nesting `depth` (1 = top level).
    fn array(&mut self, key: &str, depth: u32) -> Result<Array, Stop> {
        if depth > MAX_ARRAY_DEPTH {
            let what = format!("the array nesting depth of metadata key '{key}'");
            return Err(limit(what, depth as u64, MAX_ARRAY_DEPTH as u64));
        }
        let elem = self.value_type(key)?;
        let count = self.u64(Field::Key(key, "array length"))?;
        // Each element takes at least this many bytes; a count the rest of the
        // file cannot hold is rejected before anything is allocated.
        let min_elem = match elem {
            ValueType::String => 8,
            ValueType::Array => 12,
            other => other.scalar_size().unwrap_or(1) as u64,
        };
        let min_bytes = count.saturating_mul(min_elem);
        if min_bytes > self.remaining_in_file() {
            let what = Field::Key(key, "array elements");
            return Err(truncated(
                what,
                self.offset(),
                min_bytes,
                self.remaining_in_file(),
            ));
        }
        if min_bytes > MAX_ARRAY_BYTES {
            let what = format!("the encoded size of the array of metadata key '{key}'");
            return Err(limit(what, min_bytes, MAX_ARRAY_BYTES));
        }
        // `count * min_elem <= 256 MiB`, so `count` fits usize on every target.
        let n = usize::try_from(count).map_err(|_| {
            limit(
                format!("the array length of metadata key '{key}'"),
                count,
                usize::MAX as u64,
            )
        })?;
        self.array_elems(elem, n, key, depth)
    }

    fn array_elems(
        &mut self,
        elem: ValueType,
        n: usize,
        key: &str,
        depth: u32,
    ) -> Result<Array, Stop> {
        let what = Field::Key(key, "array elements");
        let size = elem.scalar_size().unwrap_or(0) as u64;
        macro_rules! scalars {
            ($variant:ident, $t:ty) => {{
                let bytes = self.take(n as u64 * size, what)?;
                Array::$variant(
                    bytes
                        .chunks_exact(size as usize)
                        .map(|c| {
                            let mut a = [0u8; std::mem::size_of::<$t>()];
                            a.copy_from_slice(c);
                            <$t>::from_le_bytes(a)
                        })
                        .collect(),
                )
            }};
        }
        Ok(match elem {
            ValueType::U8 => Array::U8(self.take(n as u64, what)?.to_vec()),
            ValueType::I8 => scalars!(I8, i8),
            ValueType::U16 => scalars!(U16, u16),
            ValueType::I16 => scalars!(I16, i16),
            ValueType::U32 => scalars!(U32, u32),
            ValueType::I32 => scalars!(I32, i32),
            ValueType::F32 => scalars!(F32, f32),
            ValueType::U64 => scalars!(U64, u64),
            ValueType::I64 => scalars!(I64, i64),
            ValueType::F64 => scalars!(F64, f64),
            ValueType::Bool => {
                Array::Bool(self.take(n as u64, what)?.iter().map(|&b| b != 0).collect())
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n.min(MAX_PREALLOC));
                for _ in 0..n {
                    v.push(self.string(what)?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n.min(MAX_PREALLOC));
                for _ in 0..n {
                    v.push(self.array(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }
}

/// A `Truncated` stop.
fn truncated(what: Field<'_>, offset: u64, needed: u64, available: u64) -> Stop {
    Stop::Fail(GgufError::Truncated {
        what: what.to_string(),
        offset,
        needed,
        available,
    })
}

/// A `LimitExceeded` stop.
fn limit(what: String, value: u64, limit: u64) -> Stop {
    Stop::Fail(GgufError::LimitExceeded { what, value, limit })
}

/// The fixed fields at the start of a GGUF file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Preamble {
    pub version: u32,
    pub n_tensors: u64,
    pub n_kv: u64,
}

/// Magic, version (2 or 3), tensor count and metadata count, with the counts
/// checked against what the rest of the file could hold.
pub(crate) fn parse_preamble(r: &mut SliceReader<'_>) -> Result<Preamble, Stop> {
    let magic: [u8; 4] = r.array_n(Field::Header("magic"))?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic(magic).into());
    }
    let version = r.u32(Field::Header("version"))?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version }.into());
    }
    let n_tensors = r.u64(Field::Header("tensor count"))?;
    let n_kv = r.u64(Field::Header("metadata count"))?;
    // Counts the rest of the file cannot hold are rejected before anything
    // is sized by them.
    let rest = r.remaining_in_file();
    let needed = n_tensors
        .saturating_mul(MIN_TENSOR_INFO_BYTES)
        .saturating_add(n_kv.saturating_mul(MIN_KV_BYTES));
    if needed > rest {
        let what =
            format!("the {n_kv} metadata pairs and {n_tensors} tensor infos the header declares");
        return Err(Stop::Fail(GgufError::Truncated {
            what,
            offset: r.offset(),
            needed,
            available: rest,
        }));
    }
    Ok(Preamble {
        version,
        n_tensors,
        n_kv,
    })
}

/// Metadata pair number `index`: key, type tag, value.
pub(crate) fn parse_kv(r: &mut SliceReader<'_>, index: u64) -> Result<(String, Value), Stop> {
    let key = r.string(Field::KeyIndex(index, "key"))?;
    let ty = r.value_type(&key)?;
    let value = r.value(ty, &key, 0)?;
    Ok((key, value))
}

/// A tensor info as stored, before validation against the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawTensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    /// Offset relative to the start of the data section.
    pub offset: u64,
}

/// Tensor info number `index`: name, n_dims, dims, type id, offset.
pub(crate) fn parse_tensor_info(
    r: &mut SliceReader<'_>,
    index: u64,
) -> Result<RawTensorInfo, Stop> {
    let name = r.string(Field::TensorIndex(index, "name"))?;
    let n_dims = r.u32(Field::Tensor(&name, "dimension count"))?;
    if n_dims > MAX_DIMS {
        return Err(GgufError::TooManyDims {
            tensor: name,
            n_dims,
        }
        .into());
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(r.u64(Field::Tensor(&name, "dimensions"))?);
    }
    let type_id = r.u32(Field::Tensor(&name, "type"))?;
    let offset = r.u64(Field::Tensor(&name, "data offset"))?;
    Ok(RawTensorInfo {
        name,
        dims,
        type_id,
        offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv_bytes(key: &str, tag: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = (key.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(key.as_bytes());
        b.extend_from_slice(&tag.to_le_bytes());
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn window_shorter_than_file_asks_for_more() {
        let bytes = kv_bytes("a.b", 4, &7u32.to_le_bytes());
        // The window holds all but the last 2 bytes of a file that has them all.
        let mut r = SliceReader::new(&bytes[..bytes.len() - 2], 0, bytes.len() as u64);
        assert!(matches!(parse_kv(&mut r, 0), Err(Stop::More(2))));
        let mut r = SliceReader::new(&bytes, 0, bytes.len() as u64);
        let (k, v) = parse_kv(&mut r, 0).unwrap();
        assert_eq!((k.as_str(), v), ("a.b", Value::U32(7)));
        assert_eq!(r.consumed(), bytes.len());
    }

    #[test]
    fn huge_array_count_is_rejected_before_allocation() {
        let mut payload = 6u32.to_le_bytes().to_vec(); // f32 elements
        payload.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        let bytes = kv_bytes("x", 9, &payload);
        let mut r = SliceReader::new(&bytes, 0, bytes.len() as u64);
        let err = parse_kv(&mut r, 0).unwrap_err();
        assert!(
            matches!(err, Stop::Fail(GgufError::Truncated { .. })),
            "{err:?}"
        );
    }

    #[test]
    fn nested_arrays_parse_and_depth_is_limited() {
        // [[1u8, 2u8], []] as an array of arrays.
        let mut payload = 9u32.to_le_bytes().to_vec();
        payload.extend_from_slice(&2u64.to_le_bytes());
        payload.extend_from_slice(&0u32.to_le_bytes());
        payload.extend_from_slice(&2u64.to_le_bytes());
        payload.extend_from_slice(&[1, 2]);
        payload.extend_from_slice(&8u32.to_le_bytes());
        payload.extend_from_slice(&0u64.to_le_bytes());
        let bytes = kv_bytes("n", 9, &payload);
        let mut r = SliceReader::new(&bytes, 0, bytes.len() as u64);
        let (_, v) = parse_kv(&mut r, 0).unwrap();
        let expect = Array::Array(vec![Array::U8(vec![1, 2]), Array::String(vec![])]);
        assert_eq!(v, Value::Array(expect));

        let mut deep = Vec::new();
        for _ in 0..MAX_ARRAY_DEPTH + 1 {
            deep.extend_from_slice(&9u32.to_le_bytes());
            deep.extend_from_slice(&1u64.to_le_bytes());
        }
        deep.extend_from_slice(&[0u8; 64]);
        let bytes = kv_bytes("deep", 9, &deep);
        let mut r = SliceReader::new(&bytes, 0, bytes.len() as u64);
        let err = parse_kv(&mut r, 0).unwrap_err();
        assert!(
            matches!(err, Stop::Fail(GgufError::LimitExceeded { .. })),
            "{err:?}"
        );
    }
}
