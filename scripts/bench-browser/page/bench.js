// One measurement in one fresh page: load the model with the engine named in
// the query, warm up, then a prompt of exactly `pp` tokens ("the cat sat on
// ...": one token per word in the SmolLM2 and Gemma 3 vocabularies) followed
// by `tg` greedy tokens with end-of-generation ignored. Rates are the engines'
// own timings: llama-server's prompt/predicted timings for wllama, Hearth's
// `timings` for Hearth. The result goes to window.__result. The wllama part
// (load from a Blob, warm-up that calibrates the prompt length, timings) is
// adapted from the wllama-bench harness's page/bench.js of 2026-11-29.
const q = new URLSearchParams(location.search);
const P = {
  engine: q.get('engine') ?? 'hearth',
  threads: Number(q.get('threads') ?? 1),
  model: q.get('model') ?? '/models/model.gguf',
  pp: Number(q.get('pp') ?? 128),
  tg: Number(q.get('tg') ?? 64),
};
const logEl = document.getElementById('log');
const logs = (window.__logs = []);
const say = (s) => { logs.push(s); logEl.textContent += '\n' + s; };

const words = (n) => Array.from({ length: n }, (_, i) => ['the', 'cat', 'sat', 'on'][i % 4]).join(' ');
const rate = (n, ms) => (ms > 0 ? (n * 1000) / ms : null);

async function fetchBlob(url) {
  const resp = await fetch(url);
  if (!resp.ok) throw new Error(`model fetch ${url}: HTTP ${resp.status}`);
  return resp.blob();
}

async function runWllama() {
  const { Wllama, LogLevel } = await import('../node_modules/@wllama/wllama/esm/index.js');
  const logger = { debug() {}, log() {}, warn: (...a) => say('W ' + a.join(' ')), error: (...a) => say('E ' + a.join(' ')) };
  const t0 = performance.now();
  const blob = await fetchBlob(P.model);
  const w = new Wllama({ default: new URL('../node_modules/@wllama/wllama/esm/wasm/wllama.wasm', import.meta.url).href }, { logger });
  w.setCompat(null); // never the CDN: everything is served locally
  await w.loadModel([blob], { n_threads: P.threads, n_gpu_layers: 0, n_ctx: 1024, n_parallel: 1, log_level: LogLevel.WARN });
  const loadMs = performance.now() - t0;
  const base = { temperature: 0, ignore_eos: true, cache_prompt: false, stream: false };
  // The warm-up also measures what the engine adds to a prompt (BOS), so
  // that the measured prompt has exactly `pp` tokens.
  const warm = await w.createCompletion({ ...base, prompt: words(8), max_tokens: 4 });
  const overhead = (warm?.timings?.prompt_n ?? 8) - 8;
  const r = await w.createCompletion({ ...base, prompt: words(P.pp - overhead), max_tokens: P.tg });
  const T = r?.timings ?? {};
  const out = {
    engine: 'wllama', threads: w.getNumThreads(), multithread: w.isMultithread(), load_ms: loadMs,
    prompt_n: T.prompt_n, pp_tps: rate(T.prompt_n, T.prompt_ms),
    predicted_n: T.predicted_n, tg_tps: rate(T.predicted_n, T.predicted_ms),
  };
  await w.exit();
  return out;
}

async function runHearth() {
  const { Hearth } = await import('../../../www/package/dist/index.js');
  const t0 = performance.now();
  const engine = await Hearth.load(new URL(P.model, location.href).href, { backend: 'cpu', threads: P.threads, cache: false, contextLength: 1024 });
  const loadMs = performance.now() - t0;
  const base = { temperature: 0, ignore_eos: true, stream: false };
  const warm = await engine.completions.create({ ...base, prompt: words(8), max_tokens: 4 });
  const overhead = (warm?.usage?.prompt_tokens ?? 8) - 8;
  const r = await engine.completions.create({ ...base, prompt: words(P.pp - overhead), max_tokens: P.tg });
  const info = engine.info ?? {};
  const out = {
    engine: 'hearth', threads: info.threads ?? P.threads, multithread: info.build === 'threaded', load_ms: loadMs,
    backend: info.backend, build: info.build,
    prompt_n: r.usage?.prompt_tokens, pp_tps: r.timings?.prefill_tokens_per_s,
    predicted_n: r.usage?.completion_tokens, tg_tps: r.timings?.decode_tokens_per_s,
  };
  if (typeof engine.unload === 'function') await engine.unload();
  return out;
}

const env = { crossOriginIsolated: self.crossOriginIsolated, hardwareConcurrency: navigator.hardwareConcurrency };
(P.engine === 'wllama' ? runWllama() : runHearth())
  .then((r) => { window.__result = { params: P, env, ...r }; say('DONE ' + JSON.stringify(window.__result)); })
  .catch((e) => { window.__result = { params: P, env, error: String(e?.stack || e) }; say('ERROR ' + (e?.stack || e)); });
