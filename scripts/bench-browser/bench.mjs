#!/usr/bin/env node
// make bench-browser: the same prompt through Hearth (www/package) and through
// wllama (npm @wllama/wllama, llama.cpp compiled to wasm) in the same headless
// Chromium, on the same GGUF files, both multi-threaded (cross-origin isolated
// page), at each thread count. Prints prefill and decode tokens/s side by side
// with ratios (Hearth / wllama), then ONE JSON line:
//   {"bench": "browser", "rows": [{model, test, threads, hearth_tps, anchor: "wllama", anchor_tps, ratio}]}
//
//   node bench.mjs [--models A.gguf,B.gguf] [--threads 1,2] [--pp 128] [--tg 64]
//                  [--engines hearth,wllama] [--timeout 900] [--chromium PATH]
//
// Each measurement is a fresh Chromium (fresh profile, one page, one load);
// the engines alternate at each (model, threads) so background load on a
// shared machine hits both alike. The launcher (CDP, so no Playwright flags
// are added) is adapted from the wllama-bench harness of 2026-11-29.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startServer } from '../../tests/browser/server.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, '../..');
const argv = process.argv.slice(2);
const opt = (name, def) => { const i = argv.indexOf('--' + name); return i < 0 ? def : argv[i + 1]; };
const MODELS_DIR = process.env.HEARTH_MODELS || path.join(ROOT, '.cache/models');
const O = {
  models: opt('models', 'SmolLM2-135M-Instruct.Q4_1.gguf,gemma-3-270m-q4_k_m.gguf').split(','),
  threads: opt('threads', '1,2').split(',').map(Number),
  pp: Number(opt('pp', 128)),
  tg: Number(opt('tg', 64)),
  engines: opt('engines', 'hearth,wllama').split(','),
  timeout: Number(opt('timeout', 900)) * 1000,
  chromium: opt('chromium', process.env.CHROMIUM || '/usr/lib/chromium/chromium'),
};

const FLAGS = ['--headless', '--no-sandbox', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--disable-quic', '--enable-unsafe-webgpu'];

async function launch() {
  const userDir = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-bench-chr-'));
  const args = [...FLAGS, `--user-data-dir=${userDir}`, '--remote-debugging-port=0', 'about:blank'];
  const proc = spawn(O.chromium, args, { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
  let stderr = '';
  const ws = await new Promise((ok, fail) => {
    const to = setTimeout(() => fail(new Error('Chromium printed no DevTools endpoint in 60 s:\n' + stderr)), 60000);
    proc.stderr.on('data', (d) => {
      stderr += d;
      const m = /DevTools listening on (ws:\/\/\S+)/.exec(stderr);
      if (m) { clearTimeout(to); ok(m[1]); }
    });
    proc.once('error', (e) => { clearTimeout(to); fail(new Error(`cannot start ${O.chromium} (${e.message}): run \`make setup\``)); });
    proc.once('exit', (c) => { clearTimeout(to); fail(new Error('Chromium exited ' + c + ':\n' + stderr)); });
  });
  const browser = await chromium.connectOverCDP(ws);
  const close = async () => {
    try { const s = await browser.newBrowserCDPSession(); await s.send('Browser.close'); } catch { /* already gone */ }
    const exited = await new Promise((r) => {
      if (proc.exitCode !== null) { r(true); return; }
      const t = setTimeout(() => r(false), 5000);
      proc.once('exit', () => { clearTimeout(t); r(true); });
    });
    if (!exited) { try { process.kill(-proc.pid, 'SIGKILL'); } catch { /* gone */ } } // our own process group only
    fs.rmSync(userDir, { recursive: true, force: true });
  };
  return { browser, close };
}

async function measure(base, engine, model, threads) {
  const { browser, close } = await launch();
  const consoleLines = [];
  let r;
  try {
    const ctx = browser.contexts()[0];
    const page = ctx.pages()[0] || (await ctx.newPage());
    page.on('console', (m) => consoleLines.push(m.type() + ': ' + m.text()));
    page.on('pageerror', (e) => consoleLines.push('pageerror: ' + e));
    const qs = new URLSearchParams({ engine, threads, model: '/models/' + model, pp: O.pp, tg: O.tg });
    await page.goto(`${base}/scripts/bench-browser/page/?${qs}`);
    await page.waitForFunction(() => window.__result !== undefined, null, { timeout: O.timeout, polling: 500 });
    r = await page.evaluate(() => window.__result);
  } catch (e) {
    r = { error: String(e.message || e) };
  }
  await close();
  if (r.error) r.console = consoleLines.slice(-20);
  return r;
}

const fmt = (x) => (x == null ? 'n/a' : x.toFixed(1));
const ratio = (h, a) => (h != null && a != null && a > 0 ? h / a : null);

async function main() {
  for (const m of O.models) {
    if (!fs.existsSync(path.join(MODELS_DIR, m))) throw new Error(`model ${m} not in ${MODELS_DIR}: run \`make setup\``);
  }
  const wllamaDir = path.join(HERE, 'node_modules/@wllama/wllama/esm');
  if (O.engines.includes('wllama') && !fs.existsSync(wllamaDir)) throw new Error('wllama is not installed: run `make setup`');
  if (O.engines.includes('hearth') && !fs.existsSync(path.join(ROOT, 'www/package/dist/index.js'))) {
    throw new Error('the Hearth package is not built (www/package/dist): run `make package` first');
  }
  const srv = await startServer({ root: ROOT, models: MODELS_DIR });
  const url = srv.url;
  const load0 = os.loadavg()[0];
  const results = [];
  for (const model of O.models) {
    for (const threads of O.threads) {
      for (const engine of O.engines) {
        process.stderr.write(`[bench-browser] ${engine} ${model} t${threads} (load avg ${os.loadavg()[0].toFixed(2)}) ... `);
        const r = await measure(url, engine, model, threads);
        results.push({ model, threads, engine, r });
        process.stderr.write(r.error ? `ERROR ${r.error.split('\n')[0]}\n`
          : `load ${(r.load_ms / 1000).toFixed(1)} s, pp${r.prompt_n} ${fmt(r.pp_tps)} tok/s, tg${r.predicted_n} ${fmt(r.tg_tps)} tok/s, threads ${r.threads}${r.multithread ? ' (threaded)' : ''}\n`);
        if (r.error && r.console?.length) process.stderr.write(r.console.map((l) => '    ' + l).join('\n') + '\n');
      }
    }
  }
  await srv.close();

  const get = (model, threads, engine) => results.find((x) => x.model === model && x.threads === threads && x.engine === engine)?.r;
  const rows = [];
  for (const model of O.models) {
    for (const threads of O.threads) {
      const h = get(model, threads, 'hearth'); const w = get(model, threads, 'wllama');
      for (const [test, key] of [[`pp${O.pp}`, 'pp_tps'], [`tg${O.tg}`, 'tg_tps']]) {
        const ht = h && !h.error ? h[key] ?? null : null;
        const at = w && !w.error ? w[key] ?? null : null;
        rows.push({ model: model.replace(/\.gguf$/, ''), test, threads, hearth_tps: ht, anchor: 'wllama', anchor_tps: at, ratio: ratio(ht, at) });
      }
    }
  }
  console.log(`\nHeadless Chromium, both engines threaded (COOP/COEP page), tokens/s, one run, ratio = Hearth / wllama`
    + ` (load average ${load0.toFixed(1)} at the start, ${os.loadavg()[0].toFixed(1)} at the end, ${os.cpus().length} CPUs)`);
  console.log('| model | test | threads | Hearth tok/s | wllama tok/s | ratio |');
  console.log('|---|---|---|---|---|---|');
  for (const r of rows) {
    console.log(`| ${r.model} | ${r.test} | ${r.threads} | ${fmt(r.hearth_tps)} | ${fmt(r.anchor_tps)} | ${r.ratio == null ? 'n/a' : r.ratio.toFixed(2) + 'x'} |`);
  }
  const round = (x) => (x == null ? null : Math.round(x * 100) / 100);
  console.log(JSON.stringify({ bench: 'browser', rows: rows.map((r) => ({ ...r, hearth_tps: round(r.hearth_tps), anchor_tps: round(r.anchor_tps), ratio: round(r.ratio) })) }));
  if (results.some((x) => x.r.error)) process.exitCode = 1;
}

main().catch((e) => { console.error('bench-browser: ' + (e.message || e)); process.exit(1); });
