//! Prefill and decode speed of a GGUF model on one thread, the file read
//! through `std::fs` as the loader asks (as a browser streams a download:
//! memory holds the weights, not the file too): the same program natively
//! and as wasm32-wasip1 under Node (`make bench-wasm` runs both,
//! interleaved).
//!
//! `decode_speed MODEL [PROMPT] [N_TOKENS] [REPEATS]` prints one JSON line per
//! repeat: `{"target", "isa", "prompt_tokens", "prefill_tps", "decode_tokens",
//! "decode_tps"}` (greedy decoding, end of text ignored).

use std::cell::RefCell;
use std::error::Error;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::time::Instant;

use hearth::backend::cpu::kernels::KernelTable;
use hearth::backend::cpu::{CpuBackend, CpuOptions};
use hearth::engine::{Clock, Engine, EngineConfig, GenerateRequest, Prompt};
use hearth::gguf::source::ByteSource;
use hearth::gguf::{GgufError, GgufModel};
use hearth::model::tokenizer::Tokenizer;
use hearth::model::{load_model, LoadOptions, ModelConfig};
use hearth::sample::SamplingParams;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        return Err("usage: decode_speed MODEL.gguf [PROMPT] [N_TOKENS] [REPEATS]".into());
    };
    let prompt = args
        .get(2)
        .map_or("The capital of France is", String::as_str);
    let n: usize = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let repeats: usize = args.get(4).map_or(Ok(1), |s| s.parse())?;
    let sources = [FileSource::open(path)?];
    let model = pollster::block_on(GgufModel::read(&sources))?;
    let md = model.metadata();
    let mc = ModelConfig::from_metadata_supported(md)?;
    let tokenizer = Tokenizer::from_metadata(md)?;
    let config = EngineConfig {
        n_ctx: mc.n_ctx_train.min(1024),
        max_num_seqs: 1,
        ..EngineConfig::default()
    };
    let opts = LoadOptions::new(config.kv_cache_config());
    let (cpu_opts, warnings) = CpuOptions::from_settings(1, |k| std::env::var(k).ok());
    warnings.iter().for_each(|w| eprintln!("{w}"));
    let isa = KernelTable::for_isa_or_best(cpu_opts.isa).isa();
    let backend = CpuBackend::with_options(&cpu_opts);
    let cpu = pollster::block_on(load_model(backend, &model, &sources, &opts, &mut |_| {}))?;
    let mut engine = Engine::new(cpu, tokenizer, None, config)?;
    let start = Instant::now();
    engine.set_clock(Clock::from_fn(move || start.elapsed().as_secs_f64()));
    let target = if cfg!(target_arch = "wasm32") {
        "wasm32"
    } else {
        "native"
    };
    for _ in 0..repeats {
        let before = engine.stats();
        let mut req = GenerateRequest::new(Prompt::Text(prompt.to_string()));
        req.max_tokens = Some(n);
        req.sampling = SamplingParams::greedy();
        req.ignore_eos = true;
        engine.add_request(req)?;
        while engine.has_unfinished() {
            pollster::block_on(engine.step())?;
        }
        let s = engine.stats();
        let (pt, ps) = (
            s.prefill_tokens - before.prefill_tokens,
            s.prefill_s - before.prefill_s,
        );
        let (dt, ds) = (
            s.decode_tokens - before.decode_tokens,
            s.decode_s - before.decode_s,
        );
        println!(
            "{{\"target\": \"{target}\", \"isa\": \"{isa}\", \"prompt_tokens\": {pt}, \"prefill_tps\": {:.2}, \"decode_tokens\": {dt}, \"decode_tps\": {:.2}}}",
            pt as f64 / ps.max(1e-9),
            dt as f64 / ds.max(1e-9)
        );
    }
    Ok(())
}

/// A GGUF file read by `std::fs` (also under WASI), one read per request.
struct FileSource {
    file: RefCell<File>,
    len: u64,
}

impl FileSource {
    fn open(path: &str) -> Result<Self, String> {
        let file = File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
        let len = file
            .metadata()
            .map_err(|e| format!("cannot read {path}: {e}"))?
            .len();
        Ok(Self {
            file: RefCell::new(file),
            len,
        })
    }
}

impl ByteSource for FileSource {
    fn len(&self) -> u64 {
        self.len
    }

    async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), GgufError> {
        let mut file = self.file.borrow_mut();
        file.seek(SeekFrom::Start(offset))
            .and_then(|_| file.read_exact(buf))
            .map_err(|e| GgufError::Source(format!("{} bytes at {offset}: {e}", buf.len())))
    }
}
