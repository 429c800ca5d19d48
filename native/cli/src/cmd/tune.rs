//! The tune store natively: a JSON file under the user's cache directory
//! (`--tune-dir DIR`, `HEARTH_TUNE_DIR=off` for none), the probes run at
//! load where the store has no winner, `hearth tune` to run them ahead of
//! time, and `hearth info --tune` to list what is stored.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use hearth::backend::cpu::kernels::Isa;
use hearth::gguf::GgufModel;
use hearth::platform::CpuInfo;
use hearth::tune::cpu::{self, IsaChoice};
use hearth::tune::{Clock, Record, Store, TuneError, TuneKey, TuneStore};

/// The store's file name in its directory.
const FILE: &str = "tune.json";

/// Where measured choices are kept.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TuneArgs {
    /// Directory of the tune store (`tune.json`: per-device kernel choices
    /// measured at load; default `$XDG_CACHE_HOME/hearth`, else
    /// `~/.cache/hearth`). `off` measures nothing and stores nothing.
    #[arg(long, env = "HEARTH_TUNE_DIR", value_name = "DIR")]
    pub tune_dir: Option<String>,
}

impl TuneArgs {
    /// The store's file, `None` when tuning is off or no cache directory
    /// is known.
    pub fn path(&self) -> Option<PathBuf> {
        match self.tune_dir.as_deref().map(str::trim) {
            Some("off") => None,
            Some(dir) if !dir.is_empty() => Some(Path::new(dir).join(FILE)),
            _ => cache_dir().map(|d| d.join("hearth").join(FILE)),
        }
    }
}

/// `$XDG_CACHE_HOME`, else `$HOME/.cache`.
fn cache_dir() -> Option<PathBuf> {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))
}

/// A [`Store`] in one file.
pub struct FileStore {
    path: PathBuf,
}

impl FileStore {
    /// The store in the file at `path` (created on the first save).
    pub fn new(path: PathBuf) -> Self {
        Self { path }
    }

    /// The records it holds (none, with a warning on stderr, where the
    /// file cannot be read as a store).
    pub fn open(&self) -> TuneStore {
        let (store, problem) = TuneStore::load(self);
        if let Some(p) = problem {
            eprintln!("hearth: {p}");
        }
        store
    }

    fn io(&self, action: &'static str, e: std::io::Error) -> TuneError {
        TuneError::Io {
            place: self.path.display().to_string(),
            action,
            detail: e.to_string(),
        }
    }
}

impl Store for FileStore {
    fn load(&self) -> Result<Option<Vec<u8>>, TuneError> {
        match std::fs::read(&self.path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read", e)),
        }
    }

    fn save(&self, bytes: &[u8]) -> Result<(), TuneError> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.io("written", e))?;
        }
        // Written aside and renamed, so a reader never sees half a file.
        let tmp = self.path.with_extension("json.tmp");
        std::fs::write(&tmp, bytes).map_err(|e| self.io("written", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| self.io("written", e))
    }
}

/// The process's monotonic clock.
/// [`Clock`] on `std::time::Instant`, from when it was made.
pub struct InstantClock(pub Instant);

impl InstantClock {
    /// Milliseconds since it was made.
    pub fn elapsed_ms(&self) -> f64 {
        self.0.elapsed().as_secs_f64() * 1e3
    }
}

impl Clock for InstantClock {
    fn now_ns(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}

/// This machine's CPU model name, where the OS tells.
fn cpu_model_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    text.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

/// The key of this machine's CPU backend and this build's CPU kernels.
pub fn cpu_key() -> TuneKey {
    TuneKey::cpu(
        &CpuInfo::detect(),
        cpu_model_name().as_deref(),
        &cpu::kernels_build(),
    )
}

/// Whether `HEARTH_CPU_ISA` names a tier: an explicit tier wins over the store.
fn isa_forced() -> bool {
    std::env::var("HEARTH_CPU_ISA").is_ok_and(|v| !v.trim().is_empty())
}

/// The CPU kernel tier for `model` on `threads` threads: the stored winner,
/// else the winner of a probe now (stored for the next load), and the line
/// to show once the model runs (`tune: probed ...`, `tune: from store ...`).
/// `None` leaves the backend's own choice: tuning off, `HEARTH_CPU_ISA`
/// set, or nothing to choose between. Problems are warnings on stderr,
/// never errors.
pub fn cpu_isa(
    args: &TuneArgs,
    model: &GgufModel,
    threads: usize,
) -> (Option<Isa>, Option<String>) {
    let Some(path) = args.path() else {
        return (None, None);
    };
    let shapes = cpu::model_shapes(&model.tensors);
    if isa_forced() || cpu::candidates().len() < 2 || shapes.is_empty() {
        return (None, None);
    }
    let file = FileStore::new(path);
    let mut store = file.open();
    let clock = InstantClock(Instant::now());
    let key = cpu_key();
    let choice = match cpu::choose_isa(&store, &key, &shapes, threads, &clock, true) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hearth: {e}");
            return (None, None);
        }
    };
    if let Some(m) = &choice.message {
        eprintln!("hearth: {m}");
    }
    let line = report(&choice, &clock);
    if let Some(record) = choice.probed {
        store.insert(record);
        if let Err(e) = store.save(&file) {
            eprintln!("hearth: {e}");
        }
    }
    (Some(choice.isa), line)
}

/// The line [`cpu_isa`] has to show, if any.
fn report(choice: &IsaChoice, clock: &InstantClock) -> Option<String> {
    match &choice.probed {
        Some(r) => Some(format!(
            "tune: probed {} on {} in {:.0} ms: {} ({})",
            r.probe,
            r.shape,
            clock.now_ns() as f64 / 1e6,
            r.winner,
            r.why
        )),
        None if choice.from_store => Some(format!(
            "tune: from store ({} {})",
            cpu::PROBE,
            choice.isa.name()
        )),
        None => None,
    }
}

/// Arguments of `hearth tune`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF model whose shapes and formats are measured.
    #[arg(short, long)]
    model: PathBuf,
    /// The backend to tune (`cpu`; `auto` tunes what `hearth run` would use).
    #[arg(long, default_value = "auto", value_parser = super::backend::parse_backend)]
    backend: String,
    /// Worker threads (0: one per logical core).
    #[arg(short = 't', long, default_value_t = 0)]
    threads: usize,
    /// Where the results are stored.
    #[command(flatten)]
    tune: TuneArgs,
}

/// Runs `hearth tune`: every probe of the backend, measured again, the
/// results stored and printed as a table.
pub fn run(args: Args) -> Result<()> {
    super::backend::check_backend(&args.backend)?;
    let backend = match args.backend.as_str() {
        "auto" => super::platform::defaults_for("auto")
            .backend
            .value
            .name()
            .to_string(),
        b => b.to_string(),
    };
    match backend.as_str() {
        "cpu" => run_cpu(&args),
        "webgpu" => run_webgpu(&args),
        other => anyhow::bail!(
            "hearth tune has probes for the CPU and WebGPU backends so far, not {other}; pass --backend cpu or webgpu"
        ),
    }
}

/// `hearth tune --backend webgpu`: the model loaded on the adapter with a
/// K/V cache of two blocks, and its submit-interval probe.
fn run_webgpu(args: &Args) -> Result<()> {
    use hearth::graph::{KvCacheConfig, KvType};
    use hearth::kv::DEFAULT_BLOCK_SIZE;
    let (gguf, sources) = super::open_model(&args.model)?;
    let opts = hearth::model::LoadOptions::new(KvCacheConfig {
        num_blocks: 2,
        block_size: DEFAULT_BLOCK_SIZE,
        dtype: KvType::F16,
    });
    let mut model = pollster::block_on(super::backend::load_on(
        "webgpu",
        1,
        1,
        None,
        &gguf,
        &sources,
        &opts,
        &mut |_| {},
    ))
    .with_context(|| format!("cannot load {}", args.model.display()))?;
    let Some(record) = super::tune_gpu::probe_for_tune(&mut model)? else {
        anyhow::bail!("the model did not load on WebGPU");
    };
    store_and_print(&args.tune, record)
}

/// Prints `record` and stores it where the store is on.
fn store_and_print(tune: &TuneArgs, record: Record) -> Result<()> {
    print_record(&record);
    let Some(path) = tune.path() else {
        println!("not stored (HEARTH_TUNE_DIR=off)");
        return Ok(());
    };
    let file = FileStore::new(path.clone());
    let mut store = file.open();
    store.insert(record);
    store
        .save(&file)
        .with_context(|| "cannot store the results".to_string())?;
    println!("stored in {}", path.display());
    Ok(())
}

/// `hearth tune --backend cpu`: the kernel-tier probe.
fn run_cpu(args: &Args) -> Result<()> {
    let (model, _sources) = super::open_model(&args.model)?;
    let shapes = cpu::model_shapes(&model.tensors);
    if shapes.is_empty() {
        anyhow::bail!(
            "{} has no weight matrices the CPU kernels run; pass a model with quantized or float weights",
            args.model.display()
        );
    }
    let threads = match args.threads {
        0 => super::platform::defaults_for("cpu").threads.value,
        n => n,
    };
    let clock = InstantClock(Instant::now());
    let record = cpu::probe_isa(&cpu_key(), &shapes, threads, &clock)?;
    store_and_print(&args.tune, record)
}

/// One record as a table: candidate, median, and the winner marked.
fn print_record(r: &Record) {
    println!("{} on {}", r.probe, r.shape);
    println!("  {:<10} {:>12}  ", "candidate", "median");
    for m in &r.candidates {
        let median = match (m.median_ns, &m.rejected) {
            (Some(ns), _) => format!("{:.3} ms", ns as f64 / 1e6),
            (None, Some(why)) => format!("rejected: {why}"),
            (None, None) => "-".to_string(),
        };
        let mark = if m.name == r.winner { "  winner" } else { "" };
        println!("  {:<10} {:>12}{mark}", m.name, median);
    }
    println!("  winner: {} ({})", r.winner, r.why);
}

/// `hearth info --tune`: the records stored for this machine and build,
/// and how many others the store holds and ignores.
pub fn print_stored(args: &TuneArgs) -> Result<()> {
    let Some(path) = args.path() else {
        println!("tune store: off (HEARTH_TUNE_DIR=off)");
        return Ok(());
    };
    let store = FileStore::new(path.clone()).open();
    // This machine's devices: the CPU, and the WebGPU adapter a load
    // would take (where there is one).
    let mut keys = vec![cpu_key()];
    if let Ok(ctx) = pollster::block_on(hearth::backend::webgpu::GpuContext::new(
        &super::backend::gpu_options(),
    )) {
        keys.push(super::tune_gpu::key(&ctx));
    }
    println!("tune store: {}", path.display());
    let mut listed = 0;
    for key in &keys {
        let (mine, _) = store.for_key(key);
        println!("this machine: {}", key.label());
        if mine.is_empty() {
            println!("  no records for this device and build (`hearth tune -m MODEL` measures)");
        }
        for r in &mine {
            print_record(r);
        }
        listed += mine.len();
    }
    let ignored = store.records.len() - listed;
    println!("{ignored} record(s) for other devices or builds, ignored");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hearth::tune::MemoryStore;

    fn args(dir: Option<&str>) -> TuneArgs {
        TuneArgs {
            tune_dir: dir.map(str::to_string),
        }
    }

    #[test]
    fn the_store_is_off_in_a_dir_or_under_the_cache() {
        assert_eq!(args(Some("off")).path(), None);
        assert_eq!(
            args(Some("/x/y")).path(),
            Some(PathBuf::from("/x/y/tune.json"))
        );
        if let Some(p) = args(None).path() {
            assert!(p.ends_with("hearth/tune.json"), "{}", p.display());
        }
    }

    #[test]
    fn a_file_store_round_trips_and_a_missing_file_is_empty() {
        let dir = std::env::temp_dir().join(format!("hearth-filestore-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let file = FileStore::new(dir.join("sub").join(FILE));
        assert_eq!(file.load().ok(), Some(None));
        file.save(b"{}").expect("save");
        assert_eq!(file.load().ok(), Some(Some(b"{}".to_vec())));
        let mem = MemoryStore::with_bytes(b"{}".to_vec());
        assert_eq!(mem.load().ok(), file.load().ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
