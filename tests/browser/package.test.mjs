// Playwright tests of the npm package in Debian's headless Chromium: it loads
// SmolLM2 from a local server and must reproduce llama.cpp's greedy tokens, in
// a cross-origin isolated page (threaded build) and a plain one (single-thread
// build) on the CPU, and on WebGPU (SwiftShader, --enable-unsafe-webgpu) with
// the weights streamed to the GPU; forcing WebGPU in a browser without it
// fails before any download; an abort stops a generation; concurrent
// generations equal solo ones; a MoE model with its experts beyond
// maxGpuMemory runs through the expert cache on WebGPU and gives the CPU
// path's greedy tokens; a dense model split with gpuLayers (its first block
// on the CPU, the last on WebGPU) gives the CPU path's greedy tokens; a second
// load comes from the cache with the server stopped; a trace started with the
// load (`trace: true`) comes back from `stopTrace()` readable by Perfetto.
//
// Run with `make test-browser` (builds the package first).
// Env: CHROMIUM (default /usr/bin/chromium), HEARTH_MODELS.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, existsSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startServer } from './server.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');
const models = process.env.HEARTH_MODELS ?? path.join(repo, '.cache/models');
const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const fixtures = path.join(repo, 'tests/fixtures/llamacpp/real/smollm2-135m-instruct-q4_1');
// Steps whose llama.cpp top-2 logit gap is below this are close calls a tiny
// numerical difference may flip; ids are compared up to the first one.
const CLOSE_CALL = 0.5;

/** Launch flags from PLATFORM.md (no GPU here; WebGPU via SwiftShader). */
function chromiumArgs(profile) {
  return [
    '--headless', '--no-sandbox', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--disable-quic',
    `--user-data-dir=${profile}`, '--enable-unsafe-webgpu',
  ];
}

let server;
let context;
let profile;

before(async () => {
  assert.ok(existsSync(path.join(models, MODEL)), `${MODEL} is missing from ${models}; run \`make setup\``);
  assert.ok(existsSync(path.join(repo, 'www/package/dist/wasm-st/hearth_wasm_bg.wasm')), 'the package is not built; run `make package`');
  server = await startServer({ models });
  profile = mkdtempSync(path.join(tmpdir(), 'hearth-chromium-'));
  // A persistent context: OPFS survives between pages, as in a real profile.
  context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: chromiumArgs(profile).filter((a) => !a.startsWith('--user-data-dir') && a !== '--headless'),
  });
});

after(async () => {
  await context?.close();
  await server?.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
});

/** A page of the test site; `isolated` false serves it without COOP/COEP. */
async function openPage(isolated, base = server.url) {
  const page = await context.newPage();
  const logs = [];
  page.on('console', (m) => logs.push(`[${m.type()}] ${m.text()}`));
  page.on('pageerror', (e) => logs.push(`[pageerror] ${e.message}`));
  page.logs = logs;
  await page.goto(`${base}${isolated ? '' : '/st'}/tests/browser/pages/index.html`);
  await page.waitForFunction(() => window.hearthReady === true, null, { timeout: 30_000 });
  return page;
}

/** The llama.cpp reference of `name`, and how many steps are safe to compare. */
function reference(name) {
  const ref = JSON.parse(readFileSync(path.join(fixtures, name), 'utf8'));
  const gaps = ref.greedy_steps.map((s) => s.top[0][1] - s.top[1][1]);
  const firstClose = gaps.findIndex((g) => g < CLOSE_CALL);
  return { ref, safe: firstClose < 0 ? gaps.length : firstClose };
}

/** Loads SmolLM2 in `page` (with `options` for Hearth.load) and runs the
 * two reference prompts greedily. */
async function greedyRun(page, modelUrl, options = {}) {
  return page.evaluate(async ({ modelUrl, chat, options }) => {
    const phases = new Set();
    const engine = await window.Hearth.load(modelUrl, { kvType: 'f32', ...options, onProgress: (p) => phases.add(p.phase) });
    const text = await engine.completions.create({
      prompt: 'The capital of France is', temperature: 0, max_tokens: 16, return_token_ids: true,
    });
    const chunks = [];
    const stream = await engine.chat.completions.create({
      messages: chat, temperature: 0, max_tokens: 16, stream: true, return_token_ids: true,
    });
    for await (const c of stream) chunks.push(c);
    const info = engine.info;
    const trace = options.trace ? Array.from(new Uint8Array(await (await engine.stopTrace()).arrayBuffer())) : null;
    await engine.unload();
    return { info, phases: [...phases], text, chunks, trace };
  }, { modelUrl, options, chat: reference('prompt-02-chat.json').ref.chat_messages.map(([role, content]) => ({ role, content })) });
}

/** Checks a greedy run against llama.cpp's ids up to the first close call. */
function checkGreedy(run, label) {
  const capital = reference('prompt-00-capital.json');
  const chat = reference('prompt-02-chat.json');
  const c = run.text.choices[0];
  assert.equal(run.text.usage.prompt_tokens, capital.ref.n_prompt, `${label}: prompt tokens`);
  assert.deepEqual(c.token_ids.slice(0, capital.safe), capital.ref.greedy_ids.slice(0, capital.safe),
    `${label}: completion ids before step ${capital.safe}`);
  assert.ok(capital.safe >= 3, 'too few safe steps to compare');
  const ids = run.chunks.flatMap((k) => k.choices[0].token_ids ?? []);
  const last = run.chunks.at(-1);
  assert.equal(last.usage.prompt_tokens, chat.ref.n_prompt, `${label}: chat prompt tokens (template)`);
  assert.deepEqual(ids.slice(0, chat.safe), chat.ref.greedy_ids.slice(0, chat.safe),
    `${label}: chat ids before step ${chat.safe}`);
  assert.equal(run.chunks[0].choices[0].delta.role, 'assistant');
  assert.ok(['stop', 'length'].includes(last.choices[0].finish_reason));
  assert.ok(last.timings.decode_tokens_per_s > 0, `${label}: decode tokens/s reported`);
  const same = (a, b) => a.findIndex((x, i) => x !== b[i]);
  console.log(`${label}: ${run.info.backend}${run.info.adapter ? ` (${run.info.adapter})` : ''}, build ${run.info.build} x${run.info.threads}, `
    + `${capital.safe}+${chat.safe} steps compared `
    + `(first difference at ${same(c.token_ids, capital.ref.greedy_ids)}, ${same(ids, chat.ref.greedy_ids)}; -1: none), `
    + `decode ${last.timings.decode_tokens_per_s.toFixed(1)} tok/s, prefill ${last.timings.prefill_tokens_per_s.toFixed(1)} tok/s`);
}

test('threaded page: greedy tokens equal llama.cpp', { timeout: 300_000 }, async () => {
  const page = await openPage(true);
  try {
    assert.equal(await page.evaluate(() => crossOriginIsolated), true);
    const run = await greedyRun(page, `${server.url}/models/${MODEL}`);
    assert.equal(run.info.build, 'threaded');
    assert.ok(run.info.threads >= 2, `threads ${run.info.threads}`);
    // Auto passes over SwiftShader, a software adapter: the CPU path is faster.
    assert.equal(run.info.backend, 'cpu');
    assert.equal(run.info.adapter, null);
    assert.equal(run.info.gpuBlocks, 0);
    assert.equal(run.info.hostBlocks, 30, 'SmolLM2 has 30 blocks, all on the CPU');
    assert.ok(run.phases.includes('download') && run.phases.includes('ready'), `phases ${run.phases}`);
    checkGreedy(run, 'threaded');
  } finally {
    if (process.env.HEARTH_TEST_LOGS) console.log(page.logs.join('\n'));
    await page.close();
  }
});

test('single-thread page: greedy tokens equal llama.cpp', { timeout: 300_000 }, async () => {
  const page = await openPage(false);
  try {
    assert.equal(await page.evaluate(() => crossOriginIsolated), false);
    // A different URL path, so this load downloads too (and the cache keeps two entries).
    const run = await greedyRun(page, `${server.url}/st/models/${MODEL}`, { trace: true });
    assert.equal(run.info.build, 'single');
    assert.equal(run.info.threads, 1);
    checkGreedy(run, 'single-thread');
    // The trace the page got, read with Perfetto's own protobuf definitions.
    const file = path.join(profile, 'single-thread.pftrace');
    writeFileSync(file, Buffer.from(run.trace));
    const expect = ['load=load model', 'load=repack + upload', 'engine=step', 'engine=sample',
      'requests/=prefill', 'requests/=decode', 'host=forward', 'host=MatMul'];
    const summary = JSON.parse(execFileSync(path.join(repo, '.cache/pyenv/bin/python'), [
      path.join(repo, 'scripts/trace_summary.py'), file, '--json', '--top', '50',
      ...expect.flatMap((e) => ['--expect', e]),
    ], { encoding: 'utf8' }));
    const steps = summary.tracks.engine.by_name.find((r) => r.name === 'step');
    // Two requests of at least 16 tokens each, one step per token or more.
    assert.ok(steps.count >= 16, `engine steps in the trace: ${steps.count}`);
    console.log(`single-thread trace: ${run.trace.length} bytes, ${summary.tracks.host.spans} host spans, ${steps.count} steps`);
  } finally {
    await page.close();
  }
});

test('abort stops a generation and frees its blocks; concurrent equals solo', { timeout: 300_000 }, async () => {
  const page = await openPage(true);
  try {
    const r = await page.evaluate(async (url) => {
      const engine = await window.Hearth.load(url, { kvType: 'f32' });
      const ac = new AbortController();
      const stream = await engine.chat.completions.create({
        messages: [{ role: 'user', content: 'Tell me a long story about a dragon.' }],
        stream: true, max_tokens: 400, ignore_eos: true, temperature: 0,
      }, { signal: ac.signal });
      const chunks = [];
      for await (const c of stream) {
        chunks.push(c);
        if (chunks.length === 3) ac.abort();
      }
      const activeAfterAbort = engine.activeRequests;
      // Two at once, and then one alone: the same greedy text.
      const body = { prompt: 'The capital of France is', temperature: 0, max_tokens: 12, return_token_ids: true };
      const [a, b] = await Promise.all([engine.completions.create(body), engine.completions.create({ ...body, prompt: 'One, two, three,' })]);
      const solo = await engine.completions.create(body);
      let badRequest = null;
      try {
        await engine.completions.create({ prompt: 'x', temperature: 7 });
      } catch (e) {
        badRequest = { name: e.name, code: e.code, message: e.message };
      }
      await engine.unload();
      return { chunks, activeAfterAbort, a, b, solo, badRequest };
    }, `${server.url}/models/${MODEL}`);
    const last = r.chunks.at(-1);
    assert.equal(last.choices[0].finish_reason, 'abort');
    assert.ok(last.usage.completion_tokens < 400, `aborted after ${last.usage.completion_tokens} tokens`);
    assert.ok(r.chunks.length <= 6, `${r.chunks.length} chunks came after the abort`);
    assert.equal(r.activeAfterAbort, 0);
    assert.deepEqual(r.a.choices[0].token_ids, r.solo.choices[0].token_ids, 'batched equals solo');
    assert.equal(r.a.choices[0].text, r.solo.choices[0].text);
    assert.notDeepEqual(r.b.choices[0].token_ids, r.a.choices[0].token_ids);
    assert.equal(r.badRequest?.code, 'bad-request', JSON.stringify(r.badRequest));
  } finally {
    await page.close();
  }
});

test('webgpu page: greedy tokens equal llama.cpp on SwiftShader, weights never in the wasm heap', { timeout: 1_200_000 }, async () => {
  const page = await openPage(true);
  try {
    const caps = await page.evaluate(() => window.Hearth.capabilities());
    assert.ok(caps.webgpu && caps.webgpuBackend, `capabilities ${JSON.stringify(caps)}`);
    assert.equal(caps.webgpuFallback, true, 'SwiftShader is a fallback adapter');
    // The platform, in the shape of `hearth info --platform --json`.
    assert.equal(caps.cpu.arch, 'wasm32', JSON.stringify(caps.cpu));
    assert.ok(caps.cpu.isa_tiers.includes('simd128'), JSON.stringify(caps.cpu));
    assert.equal(caps.gpus.length, 1, JSON.stringify(caps.gpus));
    assert.equal(caps.gpus[0].device_type, 'cpu', 'SwiftShader is a software adapter');
    assert.ok(caps.gpus[0].limits.max_storage_binding_bytes > 0, JSON.stringify(caps.gpus[0]));
    assert.equal(caps.defaults.backend.value, 'cpu', JSON.stringify(caps.defaults));
    // A K/V cache layer beyond the adapter's 1 GiB binding limit: refused from
    // the header by the memory plan, before the tensors are downloaded.
    const tooLarge = await page.evaluate(async (url) => {
      try {
        await window.Hearth.load(url, { backend: 'webgpu', kvType: 'f32', contextLength: 2_000_000 });
        return null;
      } catch (e) {
        const entry = (await window.Hearth.cache.list()).find((m) => m.id === url);
        return { code: e.code, message: e.message, stored: entry?.bytes ?? 0 };
      }
    }, `${server.url}/models/${MODEL}?too-large`);
    assert.equal(tooLarge?.code, 'unsupported-model', JSON.stringify(tooLarge));
    assert.match(tooLarge.message, /K\/V cache.*binding limit.*backend 'cpu'/);
    assert.equal(tooLarge.stored, 0, 'nothing was downloaded');
    // Another URL: downloaded afresh into OPFS, then streamed to the GPU.
    // SwiftShader is slow (minutes for the first steps on 2 cores, most of it
    // compiling pipelines): the capital prompt up to its first close call.
    const capital = reference('prompt-00-capital.json');
    const run = await page.evaluate(async ({ url, n }) => {
      const phases = new Set();
      const engine = await window.Hearth.load(url, { backend: 'webgpu', kvType: 'f32', onProgress: (p) => phases.add(p.phase) });
      const out = await engine.completions.create({
        prompt: 'The capital of France is', temperature: 0, max_tokens: n, ignore_eos: true, return_token_ids: true,
      });
      await engine.unload();
      return { info: engine.info, phases: [...phases], out };
    }, { url: `${server.url}/models/${MODEL}?webgpu`, n: capital.safe });
    assert.equal(run.info.backend, 'webgpu');
    assert.match(run.info.adapter ?? '', /swiftshader/i);
    // No gpuLayers: every block on the GPU.
    assert.equal(run.info.hostBlocks, 0);
    assert.equal(run.info.gpuBlocks, 30);
    assert.ok(run.phases.includes('download') && run.phases.includes('load'), `phases ${run.phases}`);
    assert.equal(run.out.usage.prompt_tokens, capital.ref.n_prompt);
    assert.deepEqual(run.out.choices[0].token_ids, capital.ref.greedy_ids.slice(0, capital.safe), 'webgpu: ids before the first close call');
    // The CPU path's heap holds the weights (~98 MB); on WebGPU it holds a
    // chunk and a row, the tokenizer and the engine.
    assert.ok(run.info.wasmMemoryBytes < run.info.sizeBytes / 2,
      `wasm memory ${run.info.wasmMemoryBytes} bytes for a model of ${run.info.sizeBytes}`);
    console.log(`webgpu (${run.info.adapter}): ${capital.safe} steps equal llama.cpp; wasm memory `
      + `${(run.info.wasmMemoryBytes / 1e6).toFixed(1)} MB for a ${(run.info.sizeBytes / 1e6).toFixed(1)} MB model; `
      + `prefill ${run.out.timings.prefill_tokens_per_s.toFixed(2)} tok/s, decode ${run.out.timings.decode_tokens_per_s.toFixed(2)} tok/s`);
  } finally {
    if (process.env.HEARTH_TEST_LOGS) console.log(page.logs.join('\n'));
    await page.close();
  }
});

/** Bytes of the tensors of the GGUF file `file` whose names match `re`, as
 * the file stores them (each tensor to the next one's offset, padding
 * included). */
function tensorBytes(file, re) {
  const buf = readFileSync(file);
  let at = 0;
  const u32 = () => { at += 4; return buf.readUInt32LE(at - 4); };
  const u64 = () => { at += 8; return Number(buf.readBigUInt64LE(at - 8)); };
  const str = () => { const n = u64(); at += n; return buf.toString('utf8', at - n, at); };
  // GGUF value types 0-12: u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64.
  const width = [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8];
  const value = (ty) => {
    if (ty === 8) return str();
    if (ty === 9) {
      const [elem, n] = [u32(), u64()];
      for (let i = 0; i < n; i++) value(elem);
      return null;
    }
    at += width[ty];
    return ty === 4 ? buf.readUInt32LE(at - 4) : null;
  };
  assert.equal(buf.toString('latin1', 0, 4), 'GGUF', file);
  at = 8;
  const [nTensors, nKv] = [u64(), u64()];
  let alignment = 32;
  for (let i = 0; i < nKv; i++) {
    const key = str();
    const v = value(u32());
    if (key === 'general.alignment') alignment = v;
  }
  const tensors = [];
  for (let i = 0; i < nTensors; i++) {
    const name = str();
    const dims = u32();
    at += 8 * dims + 4; // the dimensions, the type
    tensors.push({ name, offset: u64() });
  }
  const data = Math.ceil(at / alignment) * alignment;
  tensors.sort((a, b) => a.offset - b.offset);
  return tensors.reduce((sum, t, i) => sum + (re.test(t.name)
    ? (tensors[i + 1]?.offset ?? buf.length - data) - t.offset : 0), 0);
}

// The expert cache (maxGpuMemory) on SwiftShader: the stored synthetic
// Qwen3-MoE (2 layers of 8 experts, 2 per token, Q4_K) with slots for 30% of
// its experts' bytes, so the slots hold fewer experts than a step routes to:
// misses are copied into slots (the prompt's) or computed by the wasm CPU
// kernels (a decode step's, and those without a free slot). Its 16 greedy
// tokens must be those of the package's CPU path.
//
// The CPU quantizes activations to int8 as ggml does, WebGPU keeps them f32.
// On a random MoE model that now and then flips a token, after which a
// free-running generation differs in every later one: at a near-tie of the
// last two logits, or (the larger jumps, up to ~0.5 in a logprob) presumably
// at one of the router's, where another expert is picked. The prompt is one
// of 300 random ones whose 16 CPU steps had the widest top-2 gaps (0.18 at
// least; the test prints it); of the ten widest, six gave the CPU's 16 tokens
// on WebGPU. Should the tokens differ, the test compares them with the same
// model on WebGPU without the cache, which must agree exactly, and with the
// CPU step by step (its next greedy token after each prefix of the WebGPU
// tokens), which must agree at 15 of the 16 steps at least (another prompt
// gave 15 with a gap of 0.0003 at the 16th).
// Measured: 16 of 16 equal, 18-28 s on 2 cores (the cached WebGPU run most of it).
const MOE_FIXTURE = 'tests/fixtures/llamacpp/synthetic/models/qwen3moe-Q4_K_M.gguf';
test('webgpu expert cache: a MoE model beyond maxGpuMemory gives the greedy tokens of the CPU path', { timeout: 600_000 }, async () => {
  const expertBytes = tensorBytes(path.join(repo, MOE_FIXTURE), /_exps\.weight$/);
  assert.ok(expertBytes > 1e6, `expert bytes ${expertBytes}`);
  const budget = Math.floor(0.3 * expertBytes);
  const page = await openPage(true);
  try {
    const r = await page.evaluate(async ({ url, budget }) => {
      // Token ids are used as they are (no BOS); the vocabulary has 512.
      const prompt = [413, 354, 17, 299, 266, 2, 250, 406, 464];
      const body = { prompt, temperature: 0, max_tokens: 16, ignore_eos: true, return_token_ids: true };
      const load = (options) => window.Hearth.load(url, { kvType: 'f32', cache: false, ...options });
      const run = async (options) => {
        const t0 = performance.now();
        const engine = await load(options);
        const out = await engine.completions.create(body);
        const stats = await engine.stats();
        await engine.unload();
        return { info: engine.info, ids: out.choices[0].token_ids, stats, s: (performance.now() - t0) / 1000 };
      };
      const refused = async (options) => {
        try {
          await load(options);
          return null;
        } catch (e) {
          return { code: e.code, message: e.message };
        }
      };
      const bad = {
        negative: await refused({ backend: 'webgpu', maxGpuMemory: -1 }),
        nan: await refused({ backend: 'webgpu', maxGpuMemory: Number.NaN }),
        policy: await refused({ backend: 'webgpu', maxGpuMemory: budget, moePolicy: 'fifo' }),
      };
      const cached = await run({ backend: 'webgpu', maxGpuMemory: budget, moePolicy: 'lru' });
      // The CPU (maxGpuMemory has no effect there): free-running, with the
      // gap between its two best tokens at each step.
      const engine = await load({ backend: 'cpu', maxGpuMemory: budget });
      const top2 = { logprobs: true, top_logprobs: 2 };
      const gap = (c) => c.top_logprobs[0].logprob - c.top_logprobs[1].logprob;
      const out = (await engine.completions.create({ ...body, ...top2 })).choices[0];
      const cpu = { info: engine.info, stats: await engine.stats(), ids: out.token_ids, gaps: out.logprobs.content.map(gap) };
      const same = cpu.ids.every((t, i) => t === cached.ids[i]);
      if (!same) {
        cpu.steps = [];
        for (let i = 0; i < cached.ids.length; i++) {
          const c = (await engine.completions.create({
            ...body, ...top2, prompt: prompt.concat(cached.ids.slice(0, i)), max_tokens: 1,
          })).choices[0];
          cpu.steps.push({ id: c.token_ids[0], gap: gap(c.logprobs.content[0]) });
        }
      }
      await engine.unload();
      const uncached = same ? null : await run({ backend: 'webgpu' });
      return { bad, cached, cpu, uncached };
    }, { url: `${server.url}/${MOE_FIXTURE}`, budget });
    assert.equal(r.bad.negative?.code, 'bad-request', JSON.stringify(r.bad.negative));
    assert.match(r.bad.negative.message, /maxGpuMemory is -1.*at least 0/);
    assert.equal(r.bad.nan?.code, 'bad-request', JSON.stringify(r.bad.nan));
    assert.match(r.bad.nan.message, /maxGpuMemory is NaN/);
    assert.equal(r.bad.policy?.code, 'bad-request', JSON.stringify(r.bad.policy));
    assert.match(r.bad.policy.message, /moePolicy 'fifo'.*'lru', 'lfu' or 'lrfu'/);
    // The cache ran: fewer slots than experts, misses copied in.
    assert.equal(r.cached.info.backend, 'webgpu');
    const ec = r.cached.info.expertCache;
    assert.ok(ec && ec.policy === 'lru' && ec.slots > 0 && ec.slotBytes <= budget && ec.hostOnlyLayers === 0
      && ec.offloadedBytes > ec.slotBytes, `expertCache ${JSON.stringify(ec)} for ${budget} of ${expertBytes} bytes`);
    const s = r.cached.stats.expertCache;
    assert.ok(s, 'stats of the expert cache');
    assert.ok(s.misses > 0 && s.copies > 0 && s.bytesCopied > 0 && s.hitRate < 1, s.summary);
    assert.equal(s.tokens, 9 + 15, s.summary);
    // The CPU holds every expert: no cache there.
    assert.equal(r.cpu.info.backend, 'cpu');
    assert.equal(r.cpu.info.expertCache, null);
    assert.equal(r.cpu.stats.expertCache, null);
    assert.equal(r.cached.ids.length, 16);
    const equal = r.cached.ids.filter((t, i) => t === r.cpu.ids[i]).length;
    const stepDiffs = (r.cpu.steps ?? []).flatMap((st, i) => (st.id === r.cached.ids[i] ? [] : [i]));
    console.log(`webgpu expert cache (${r.cached.info.adapter}): ${ec.slots} slots, ${ec.slotBytes} of `
      + `${ec.offloadedBytes} expert bytes on the GPU (budget ${budget}); ${s.summary}. `
      + `Greedy tokens: ${equal} of 16 equal the CPU path (smallest CPU top-2 gap ${Math.min(...r.cpu.gaps).toFixed(3)})`
      + (r.uncached ? `; WebGPU without the cache ${r.cached.ids.filter((t, i) => t === r.uncached.ids[i]).length} of 16, `
        + `CPU step by step ${16 - stepDiffs.length} of 16${stepDiffs.map((i) => ` (step ${i}: gap ${r.cpu.steps[i].gap.toFixed(4)})`).join('')}` : '')
      + `; WebGPU run ${r.cached.s.toFixed(1)} s`);
    if (r.uncached) {
      assert.equal(r.uncached.info.expertCache, null);
      assert.deepEqual(r.cached.ids, r.uncached.ids, 'the cache changes no greedy token of the WebGPU path');
      assert.ok(stepDiffs.length <= 1, `CPU steps ${JSON.stringify(r.cpu.steps)} vs WebGPU ${JSON.stringify(r.cached.ids)}`);
    }
  } finally {
    if (process.env.HEARTH_TEST_LOGS) console.log(page.logs.join('\n'));
    await page.close();
  }
});

// The layer split (gpuLayers) on SwiftShader: the stored synthetic Qwen3
// (dense, 2 blocks, Q4_K) with gpuLayers 1, so block 0 runs on the wasm CPU
// path and block 1 and the output head on WebGPU, the hidden state crossing
// once per step. Its 16 greedy tokens must be those of the package's CPU path
// (where gpuLayers has no effect: every block on the CPU).
//
// The CPU quantizes activations to int8 as ggml does, WebGPU keeps them f32,
// so the split's logprobs differ from the CPU's by a few hundredths (up to
// 0.07 natively, CPU against the split on lavapipe) and a near-tie may flip a
// token, after which a free-running generation differs in every later one.
// The prompt is the one of 1500 random ones whose 16 CPU steps had the
// widest top-2 gap (0.29 natively; the test prints the browser's); natively
// the split gave the CPU's 16 tokens for each of the 8 widest. Should the
// tokens differ, the test compares the split with the CPU step by step (its
// next greedy token after each prefix of the split's tokens), which must
// agree at 15 of the 16 steps at least, as the expert cache's test does.
// Measured: 16 of 16 equal.
const SPLIT_FIXTURE = 'tests/fixtures/llamacpp/synthetic/models/qwen3-Q4_K_M.gguf';
test('webgpu layer split: gpuLayers 1 gives the greedy tokens of the CPU path', { timeout: 600_000 }, async () => {
  const page = await openPage(true);
  try {
    const r = await page.evaluate(async ({ url }) => {
      // Token ids are used as they are (no BOS); the vocabulary has 512.
      const prompt = [42, 24, 377, 36, 91, 344, 109, 355, 50];
      const body = { prompt, temperature: 0, max_tokens: 16, ignore_eos: true, return_token_ids: true };
      const load = (options) => window.Hearth.load(url, { kvType: 'f32', cache: false, ...options });
      const refused = async (options) => {
        try {
          await load(options);
          return null;
        } catch (e) {
          return { code: e.code, message: e.message };
        }
      };
      const bad = {
        negative: await refused({ backend: 'webgpu', gpuLayers: -1 }),
        fraction: await refused({ backend: 'webgpu', gpuLayers: 1.5 }),
        nan: await refused({ backend: 'cpu', gpuLayers: Number.NaN }),
      };
      const t0 = performance.now();
      const gpu = await load({ backend: 'webgpu', gpuLayers: 1 });
      const splitOut = (await gpu.completions.create(body)).choices[0];
      await gpu.unload();
      const split = { info: gpu.info, ids: splitOut.token_ids, s: (performance.now() - t0) / 1000 };
      const engine = await load({ backend: 'cpu', gpuLayers: 1 });
      const top2 = { logprobs: true, top_logprobs: 2 };
      const gap = (c) => c.top_logprobs[0].logprob - c.top_logprobs[1].logprob;
      const out = (await engine.completions.create({ ...body, ...top2 })).choices[0];
      const cpu = { info: engine.info, ids: out.token_ids, gaps: out.logprobs.content.map(gap) };
      if (!cpu.ids.every((t, i) => t === split.ids[i])) {
        cpu.steps = [];
        for (let i = 0; i < split.ids.length; i++) {
          const c = (await engine.completions.create({
            ...body, ...top2, prompt: prompt.concat(split.ids.slice(0, i)), max_tokens: 1,
          })).choices[0];
          cpu.steps.push({ id: c.token_ids[0], gap: gap(c.logprobs.content[0]) });
        }
      }
      await engine.unload();
      return { bad, split, cpu };
    }, { url: `${server.url}/${SPLIT_FIXTURE}` });
    assert.equal(r.bad.negative?.code, 'bad-request', JSON.stringify(r.bad.negative));
    assert.match(r.bad.negative.message, /gpuLayers is -1.*integer of at least 0/);
    assert.equal(r.bad.fraction?.code, 'bad-request', JSON.stringify(r.bad.fraction));
    assert.match(r.bad.fraction.message, /gpuLayers is 1\.5/);
    assert.equal(r.bad.nan?.code, 'bad-request', JSON.stringify(r.bad.nan));
    assert.match(r.bad.nan.message, /gpuLayers is NaN/);
    // The split: the first block on the CPU, the last one on the GPU.
    assert.equal(r.split.info.backend, 'webgpu');
    assert.equal(r.split.info.hostBlocks, 1, `hostBlocks ${r.split.info.hostBlocks}`);
    assert.equal(r.split.info.gpuBlocks, 1, `gpuBlocks ${r.split.info.gpuBlocks}`);
    assert.equal(r.split.info.expertCache, null);
    // The CPU runs every block, gpuLayers or not.
    assert.equal(r.cpu.info.backend, 'cpu');
    assert.equal(r.cpu.info.hostBlocks, 2);
    assert.equal(r.cpu.info.gpuBlocks, 0);
    assert.equal(r.split.ids.length, 16);
    const equal = r.split.ids.filter((t, i) => t === r.cpu.ids[i]).length;
    const stepDiffs = (r.cpu.steps ?? []).flatMap((st, i) => (st.id === r.split.ids[i] ? [] : [i]));
    console.log(`webgpu layer split (${r.split.info.adapter}): ${r.split.info.hostBlocks} block on the CPU, `
      + `${r.split.info.gpuBlocks} and the head on the GPU. Greedy tokens: ${equal} of 16 equal the CPU path `
      + `(smallest CPU top-2 gap ${Math.min(...r.cpu.gaps).toFixed(3)})`
      + (r.cpu.steps ? `; CPU step by step ${16 - stepDiffs.length} of 16`
        + stepDiffs.map((i) => ` (step ${i}: gap ${r.cpu.steps[i].gap.toFixed(4)})`).join('') : '')
      + `; WebGPU run ${r.split.s.toFixed(1)} s`);
    if (r.cpu.steps) {
      assert.ok(stepDiffs.length <= 1, `CPU steps ${JSON.stringify(r.cpu.steps)} vs the split ${JSON.stringify(r.split.ids)}`);
    }
  } finally {
    if (process.env.HEARTH_TEST_LOGS) console.log(page.logs.join('\n'));
    await page.close();
  }
});

// Each WebGPU page compiles every pipeline again on SwiftShader (minutes on 2
// cores): this second one runs with HEARTH_BROWSER_SLOW=1 (`make
// test-browser BROWSER_SLOW=1`); the page above covers WebGPU in `make test`.
const slow = process.env.HEARTH_BROWSER_SLOW === '1';
test('webgpu without the cache: single-thread build, weights from the download stream to the GPU', {
  timeout: 900_000,
  skip: slow ? false : 'a second SwiftShader page: set HEARTH_BROWSER_SLOW=1 (make test-browser BROWSER_SLOW=1)',
}, async () => {
  const page = await openPage(false);
  try {
    const r = await page.evaluate(async (url) => {
      const phases = new Set();
      const engine = await window.Hearth.load(url, {
        backend: 'webgpu', kvType: 'f32', cache: false, onProgress: (p) => phases.add(p.phase),
      });
      const out = await engine.completions.create({
        prompt: 'The capital of France is', temperature: 0, max_tokens: 2, ignore_eos: true, return_token_ids: true,
      });
      await engine.unload();
      const cached = (await window.Hearth.cache.list()).map((m) => m.id);
      return { info: engine.info, ids: out.choices[0].token_ids, phases: [...phases], cached };
    }, `${server.url}/st/models/${MODEL}?stream`);
    const capital = reference('prompt-00-capital.json');
    assert.equal(r.info.backend, 'webgpu');
    assert.equal(r.info.build, 'single');
    assert.deepEqual(r.ids, capital.ref.greedy_ids.slice(0, 2));
    assert.ok(r.phases.includes('download') && r.phases.includes('load'), `phases ${r.phases}`);
    assert.ok(!r.cached.some((id) => id.endsWith('?stream')), `cached: ${r.cached}`);
    assert.ok(r.info.wasmMemoryBytes < r.info.sizeBytes / 2, `wasm memory ${r.info.wasmMemoryBytes}`);
  } finally {
    await page.close();
  }
});

test('backend webgpu in a browser without WebGPU fails clearly, before any download', { timeout: 120_000 }, async () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'hearth-chromium-nogpu-'));
  // The same flags without --enable-unsafe-webgpu: with no GPU, Chromium has
  // navigator.gpu but gives no adapter.
  const browser = await chromium.launchPersistentContext(dir, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: chromiumArgs(dir).filter((a) => !a.startsWith('--user-data-dir') && a !== '--headless'
      && a !== '--enable-unsafe-webgpu'),
  });
  const requests = [];
  try {
    const page = await browser.newPage();
    page.on('request', (r) => requests.push(r.url()));
    await page.goto(`${server.url}/tests/browser/pages/index.html`);
    await page.waitForFunction(() => window.hearthReady === true, null, { timeout: 30_000 });
    const r = await page.evaluate(async (url) => {
      const caps = await window.Hearth.capabilities();
      let forced = null;
      try {
        await window.Hearth.load(url, { backend: 'webgpu' });
      } catch (e) {
        forced = { code: e.code, message: e.message };
      }
      return { caps, forced };
    }, `${server.url}/models/${MODEL}?nogpu`);
    assert.equal(r.caps.webgpu, false, `capabilities ${JSON.stringify(r.caps)}`);
    assert.ok(r.caps.cpu && typeof r.caps.cpu.logical_cores === 'number', JSON.stringify(r.caps));
    assert.deepEqual(r.caps.gpus, [], JSON.stringify(r.caps));
    assert.equal(r.caps.defaults.backend.why, 'no WebGPU adapter');
    assert.equal(r.forced?.code, 'unsupported-backend', JSON.stringify(r.forced));
    assert.match(r.forced.message, /no WebGPU adapter.*backend 'cpu'/);
    assert.ok(!requests.some((u) => u.includes('?nogpu')), `the model was requested: ${requests}`);
  } finally {
    await browser.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('cache: listed, and a second load works with the server stopped', { timeout: 300_000 }, async () => {
  const page = await openPage(true);
  const modelUrl = `${server.url}/models/${MODEL}`;
  try {
    const listed = await page.evaluate(async () => ({
      list: await window.Hearth.cache.list(), usage: await window.Hearth.cache.usage(),
    }));
    const entry = listed.list.find((m) => m.id === modelUrl);
    assert.ok(entry?.complete, `cached: ${JSON.stringify(listed.list)}`);
    assert.ok(['opfs', 'cache-storage'].includes(entry.storage));
    assert.ok(listed.usage.quota > 0 && listed.usage.models >= entry.bytes);
    await server.close();
    const r = await page.evaluate(async (url) => {
      const phases = [];
      const engine = await window.Hearth.load(url, { onProgress: (p) => phases.push(p.phase) });
      const out = await engine.completions.create({ prompt: 'The capital of France is', temperature: 0, max_tokens: 4 });
      await engine.unload();
      let offline = null;
      try {
        await window.Hearth.load(url.replace('SmolLM2', 'NotThere'));
      } catch (e) {
        offline = e.code;
      }
      const deleted = await window.Hearth.cache.delete(url);
      const after = (await window.Hearth.cache.list()).map((m) => m.id);
      return { info: engine.info, phases, text: out.choices[0].text, offline, deleted, after };
    }, modelUrl);
    assert.equal(r.info.fromCache, true);
    assert.ok(r.phases.includes('cache') && !r.phases.includes('download'), `phases ${r.phases}`);
    assert.ok(r.text.length > 0);
    assert.equal(r.offline, 'network');
    assert.equal(r.deleted, true);
    assert.ok(!r.after.includes(modelUrl));
  } finally {
    await page.close();
  }
});
