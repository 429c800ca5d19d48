//! [`TuneStore`]: the measured winners, as one JSON document, and the
//! [`Store`] its bytes are kept in (a file natively, given by the front end;
//! [`MemoryStore`] in tests).

use std::cell::RefCell;

use serde::{Deserialize, Serialize};

use super::{TuneError, TuneKey};

/// The document's format; a store of another format is ignored whole.
pub const STORE_FORMAT: u32 = 1;

/// One candidate of a probe, as measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// The candidate's name (`avx512`, `wg256`).
    pub name: String,
    /// Median time of one run in nanoseconds (`None`: it was not timed,
    /// see [`Measured::rejected`]).
    pub median_ns: Option<u64>,
    /// Why the candidate was excluded before timing (its output differed
    /// from the reference), `None` when it was valid.
    pub rejected: Option<String>,
}

/// One probe's result: which candidate won for one shape on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The device and kernel build it was measured on.
    pub key: TuneKey,
    /// What was chosen (`cpu.isa`, `webgpu.matvec_rows`).
    pub probe: String,
    /// The shapes and formats it was measured on (`Q4_K 4096x4096`).
    pub shape: String,
    /// The candidate used where nothing is measured.
    pub default: String,
    /// The candidate to use.
    pub winner: String,
    /// Why it won, for people (`fastest by 12%`, `tie (lead 1.4% < 3%): default`).
    pub why: String,
    /// Every candidate, in the order given.
    pub candidates: Vec<Measured>,
}

/// What a lookup of a stored winner found ([`TuneStore::choose`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// A record for this device and build names a current candidate.
    Winner(String),
    /// A record names a candidate that no longer exists: use `default`,
    /// and show `message`.
    Fallback {
        /// The default candidate, to use instead.
        default: String,
        /// What happened, for people.
        message: String,
    },
    /// No record for this device, build, probe and shape: probe, or use
    /// the default.
    Missing,
}

/// Every stored record, of every device and build it has seen; lookups
/// believe only the records of the current [`TuneKey`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneStore {
    /// The document's format ([`STORE_FORMAT`]).
    pub format: u32,
    /// The records, newest last.
    pub records: Vec<Record>,
}

impl Default for TuneStore {
    fn default() -> Self {
        Self {
            format: STORE_FORMAT,
            records: Vec::new(),
        }
    }
}

impl TuneStore {
    /// The store in `bytes` (JSON). Fails on bytes that are not a store
    /// of [`STORE_FORMAT`]; callers start an empty store then, and say so.
    pub fn from_json(bytes: &[u8]) -> Result<Self, TuneError> {
        let store: TuneStore =
            serde_json::from_slice(bytes).map_err(|e| TuneError::Corrupt(e.to_string()))?;
        if store.format != STORE_FORMAT {
            return Err(TuneError::Corrupt(format!(
                "format {} (this build reads {STORE_FORMAT})",
                store.format
            )));
        }
        Ok(store)
    }

    /// The store as pretty JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings, numbers and options: serializing cannot fail.
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// The store in `store`, empty where it holds nothing. Unreadable
    /// bytes give an empty store and the reason, for the caller to show.
    pub fn load(store: &dyn Store) -> (Self, Option<String>) {
        match store.load() {
            Ok(None) => (Self::default(), None),
            Ok(Some(bytes)) => match Self::from_json(&bytes) {
                Ok(s) => (s, None),
                Err(e) => (Self::default(), Some(format!("{e}; starting afresh"))),
            },
            Err(e) => (Self::default(), Some(e.to_string())),
        }
    }

    /// Writes the store to `store`.
    pub fn save(&self, store: &dyn Store) -> Result<(), TuneError> {
        store.save(&self.to_json())
    }

    /// The record of `probe` on `shape` for exactly `key` (device and
    /// build); records of other devices or builds are ignored.
    pub fn lookup(&self, key: &TuneKey, probe: &str, shape: &str) -> Option<&Record> {
        self.records
            .iter()
            .rev()
            .find(|r| &r.key == key && r.probe == probe && r.shape == shape)
    }

    /// The stored winner of `probe` on `shape` for `key`, checked against
    /// the `candidates` that exist now: a winner that is no longer among
    /// them falls back to `default`, with a message.
    pub fn choose(
        &self,
        key: &TuneKey,
        probe: &str,
        shape: &str,
        candidates: &[&str],
        default: &str,
    ) -> Stored {
        let Some(r) = self.lookup(key, probe, shape) else {
            return Stored::Missing;
        };
        if candidates.contains(&r.winner.as_str()) {
            return Stored::Winner(r.winner.clone());
        }
        Stored::Fallback {
            default: default.to_string(),
            message: format!(
                "tune: stored {probe} winner `{}` for {shape} is not a candidate of this build ({}); using `{default}` (run `hearth tune` to measure again)",
                r.winner,
                candidates.join(", ")
            ),
        }
    }

    /// Adds `record`, replacing one of the same key, probe and shape.
    pub fn insert(&mut self, record: Record) {
        self.records.retain(|r| {
            !(r.key == record.key && r.probe == record.probe && r.shape == record.shape)
        });
        self.records.push(record);
    }

    /// The records of `key`, and how many others (other devices or
    /// builds) the store holds and ignores.
    pub fn for_key(&self, key: &TuneKey) -> (Vec<&Record>, usize) {
        let mine: Vec<&Record> = self.records.iter().filter(|r| &r.key == key).collect();
        let others = self.records.len() - mine.len();
        (mine, others)
    }
}

/// Where a [`TuneStore`]'s bytes are kept. The core owns no files: the
/// CLI gives a file under the user's cache directory, tests a
/// [`MemoryStore`]. Calls are synchronous: a browser front end reads its
/// IndexedDB entry before loading and writes it afterwards.
pub trait Store {
    /// The stored bytes, `None` when nothing was stored yet.
    fn load(&self) -> Result<Option<Vec<u8>>, TuneError>;
    /// Replaces the stored bytes with `bytes`.
    fn save(&self, bytes: &[u8]) -> Result<(), TuneError>;
}

/// A [`Store`] in memory (tests; a front end without storage).
#[derive(Debug, Default)]
pub struct MemoryStore {
    bytes: RefCell<Option<Vec<u8>>>,
    saves: RefCell<usize>,
}

impl MemoryStore {
    /// A store holding `bytes`.
    pub fn with_bytes(bytes: Vec<u8>) -> Self {
        Self {
            bytes: RefCell::new(Some(bytes)),
            saves: RefCell::new(0),
        }
    }

    /// The bytes held now.
    pub fn bytes(&self) -> Option<Vec<u8>> {
        self.bytes.borrow().clone()
    }

    /// How many times [`Store::save`] was called.
    pub fn saves(&self) -> usize {
        *self.saves.borrow()
    }
}

impl Store for MemoryStore {
    fn load(&self) -> Result<Option<Vec<u8>>, TuneError> {
        Ok(self.bytes.borrow().clone())
    }

    fn save(&self, bytes: &[u8]) -> Result<(), TuneError> {
        *self.bytes.borrow_mut() = Some(bytes.to_vec());
        *self.saves.borrow_mut() += 1;
        Ok(())
    }
}
