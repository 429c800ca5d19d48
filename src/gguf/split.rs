//! Split GGUF models (`NAME-00001-of-0000N.gguf`) presented as one model.
//!
//! llama.cpp's `gguf-split` writes each split as a complete GGUF file with its
//! own header, tensor infos and data. The first split holds all the model's
//! metadata; every split has `split.no` (0-based, `u16`), `split.count`
//! (`u16`) and `split.tensors.count` (`i32`, the model's total). A tensor
//! lives wholly in one split; [`TensorInfo::split`] says which.

use std::collections::HashSet;

use super::{ByteSource, GgufError, GgufFile, Metadata, TensorInfo};

/// Key of the 0-based index of a split.
pub const SPLIT_NO_KEY: &str = "split.no";
/// Key of the number of splits.
pub const SPLIT_COUNT_KEY: &str = "split.count";
/// Key of the total number of tensors over all splits.
pub const SPLIT_TENSORS_COUNT_KEY: &str = "split.tensors.count";

/// A model made of one or more GGUF files.
#[derive(Debug, Clone)]
pub struct GgufModel {
    /// The files, in split order (one entry for an unsplit model).
    pub splits: Vec<GgufFile>,
    /// Every tensor of every split, in split order then header order; each
    /// one's [`TensorInfo::split`] indexes [`splits`](Self::splits) and its
    /// offset is within that split's file.
    pub tensors: Vec<TensorInfo>,
}

/// The split keys of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitInfo {
    /// 0-based index of this split.
    pub no: u64,
    /// Number of splits.
    pub count: u64,
    /// Total tensors of the model, when the key is present.
    pub tensors_count: Option<u64>,
}

impl SplitInfo {
    /// The split keys of `metadata`, or `None` when it has no `split.count`.
    pub fn of(metadata: &Metadata) -> Result<Option<Self>, GgufError> {
        let Some(count) = metadata.get(SPLIT_COUNT_KEY) else {
            return Ok(None);
        };
        let int = |key: &str, v: Option<&super::Value>| {
            v.map(|v| {
                v.as_u64().ok_or_else(|| {
                    GgufError::Split(format!("{key} is {v}, not a non-negative integer"))
                })
            })
            .transpose()
        };
        let count = int(SPLIT_COUNT_KEY, Some(count))?.unwrap_or(0);
        let no = int(SPLIT_NO_KEY, metadata.get(SPLIT_NO_KEY))?.unwrap_or(0);
        let tensors_count = int(
            SPLIT_TENSORS_COUNT_KEY,
            metadata.get(SPLIT_TENSORS_COUNT_KEY),
        )?;
        Ok(Some(Self {
            no,
            count,
            tensors_count,
        }))
    }
}

impl GgufModel {
    /// Joins parsed files into one model. `files[i]` must be split `i` of
    /// `files.len()`; a single file without split keys is a model of its own.
    pub fn from_files(mut files: Vec<GgufFile>) -> Result<Self, GgufError> {
        let n = files.len() as u64;
        if n == 0 {
            return Err(GgufError::Split("no files given".into()));
        }
        let total: u64 = files.iter().map(|f| f.tensors.len() as u64).sum();
        for (i, file) in files.iter_mut().enumerate() {
            check_split(file, i as u64, n, total)?;
            for t in &mut file.tensors {
                t.split = i;
            }
        }
        let tensors: Vec<TensorInfo> = files
            .iter()
            .flat_map(|f| f.tensors.iter().cloned())
            .collect();
        let mut names = HashSet::with_capacity(tensors.len());
        for t in &tensors {
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::DuplicateTensor(t.name.clone()));
            }
        }
        Ok(Self {
            splits: files,
            tensors,
        })
    }

    /// Reads every split's header; `sources[i]` is split `i`.
    pub async fn read<S: ByteSource>(sources: &[S]) -> Result<Self, GgufError> {
        let mut files = Vec::with_capacity(sources.len());
        for (i, src) in sources.iter().enumerate() {
            files.push(GgufFile::read_split(src, i).await?);
        }
        Self::from_files(files)
    }

    /// The model's metadata: the first split's (which holds all of it).
    pub fn metadata(&self) -> &Metadata {
        // `from_files` rejects an empty list, so splits[0] exists; the fallback
        // only serves a value built by hand.
        self.splits
            .first()
            .map(|f| &f.metadata)
            .unwrap_or(&EMPTY_METADATA)
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Total bytes of tensor data over all splits.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size).sum()
    }
}

static EMPTY_METADATA: std::sync::LazyLock<Metadata> = std::sync::LazyLock::new(Metadata::new);

/// Checks split `no` of `count` against its keys; `total` is the model's tensor count.
fn check_split(file: &GgufFile, no: u64, count: u64, total: u64) -> Result<(), GgufError> {
    let info = match SplitInfo::of(&file.metadata)? {
        Some(info) => info,
        None if count == 1 => return Ok(()),
        None => {
            return Err(GgufError::Split(format!(
                "split {} of {count} has no {SPLIT_COUNT_KEY} key",
                no + 1
            )))
        }
    };
    if info.count != count {
        return Err(GgufError::Split(format!(
            "{SPLIT_COUNT_KEY} of split {} is {}, but {count} files were given; open all the splits together",
            no + 1,
            info.count
        )));
    }
    if info.no != no {
        return Err(GgufError::Split(format!(
            "file {} of the split list has {SPLIT_NO_KEY} = {} (expected {no}); give the splits in order",
            no + 1,
            info.no
        )));
    }
    match info.tensors_count {
        Some(t) if t != total => Err(GgufError::Split(format!(
            "{SPLIT_TENSORS_COUNT_KEY} of split {} is {t}, but the splits hold {total} tensors; a split is missing or corrupt",
            no + 1
        ))),
        _ => Ok(()),
    }
}

/// The file name of split `no` (0-based) of `count`: `{prefix}-{no+1:05}-of-{count:05}.gguf`.
pub fn split_path(prefix: &str, no: usize, count: usize) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", no + 1)
}

/// Splits a split file name into `(prefix, no, count)` (`no` 0-based), or
/// `None` when it does not follow [`split_path`]'s pattern.
pub fn parse_split_path(path: &str) -> Option<(&str, usize, usize)> {
    let stem = path.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let five_digits = |s: &str| s.len() >= 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !five_digits(no) || !five_digits(count) || prefix.is_empty() {
        return None;
    }
    let (no, count): (usize, usize) = (no.parse().ok()?, count.parse().ok()?);
    (no >= 1 && no <= count).then(|| (prefix, no - 1, count))
}

/// Opens a model natively: every split when `path` names one split of a
/// split model (any of them), else the one file. Returns the model and one
/// memory-mapped source per split.
#[cfg(not(target_arch = "wasm32"))]
pub fn open_model(
    path: &std::path::Path,
) -> Result<(GgufModel, Vec<super::MmapSource>), GgufError> {
    let paths: Vec<std::path::PathBuf> = match path.to_str().and_then(parse_split_path) {
        Some((prefix, _, count)) => (0..count)
            .map(|i| split_path(prefix, i, count).into())
            .collect(),
        None => vec![path.to_path_buf()],
    };
    let mut sources = Vec::with_capacity(paths.len());
    let mut files = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        let src = super::MmapSource::open(p)?;
        files.push(pollster::block_on(GgufFile::read_split(&src, i))?);
        sources.push(src);
    }
    if let [only] = files.as_slice() {
        if let Some(info) = SplitInfo::of(&only.metadata)?.filter(|i| i.count > 1) {
            return Err(GgufError::Split(format!(
                "{} is split {} of {}, but its name does not end in -{:05}-of-{:05}.gguf; \
                 keep the names gguf-split gave the files",
                path.display(),
                info.no + 1,
                info.count,
                info.no + 1,
                info.count
            )));
        }
    }
    Ok((GgufModel::from_files(files)?, sources))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_names_round_trip() {
        assert_eq!(
            split_path("dir/model", 0, 3),
            "dir/model-00001-of-00003.gguf"
        );
        assert_eq!(
            parse_split_path("dir/model-00002-of-00003.gguf"),
            Some(("dir/model", 1, 3))
        );
        assert_eq!(
            parse_split_path("a-b-00010-of-00010.gguf"),
            Some(("a-b", 9, 10))
        );
        assert_eq!(parse_split_path("model.gguf"), None);
        assert_eq!(parse_split_path("model-00000-of-00003.gguf"), None);
        assert_eq!(parse_split_path("model-00004-of-00003.gguf"), None);
        assert_eq!(parse_split_path("model-1-of-3.gguf"), None);
        assert_eq!(parse_split_path("-00001-of-00003.gguf"), None);
    }
}
