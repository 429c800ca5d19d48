// Decode speed of the browser builds side by side, in one Chromium run:
// the threaded build on N threads and on one, and the single-thread build,
// interleaved round by round so machine load hits all alike. Prints the
// median decode tokens/s of each and their ratios. Not part of `make test`.
//
//   node tests/browser/bench.mjs [--rounds 3] [--tokens 32] [--threads 2]
//                                [--dist www/package/dist] [--dist-b DIR]
// --dist-b adds the same three variants from a second package build (e.g. a
// copy of dist/ built with another profile), to compare two builds.
// Env: CHROMIUM (default /usr/bin/chromium), HEARTH_MODELS.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';
import { startServer } from './server.mjs';

const { values: opt } = parseArgs({
  options: {
    rounds: { type: 'string', default: '3' },
    tokens: { type: 'string', default: '32' },
    threads: { type: 'string', default: '2' },
    dist: { type: 'string', default: 'www/package/dist' },
    'dist-b': { type: 'string' },
  },
});
const MODEL = 'SmolLM2-135M-Instruct.Q4_1.gguf';

const server = await startServer();
const profile = mkdtempSync(path.join(tmpdir(), 'hearth-bench-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync', '--disable-quic'],
});

/** Decode tokens/s of one greedy completion in a fresh engine. */
async function run(page, base, threads) {
  return page.evaluate(async ({ model, base, threads, tokens }) => {
    const engine = await window.Hearth.load(model, { kvType: 'f32', threads, baseUrl: base });
    const out = await engine.completions.create({
      prompt: 'The capital of France is', temperature: 0, max_tokens: tokens, ignore_eos: true,
    });
    const info = engine.info;
    await engine.unload();
    return { build: info.build, threads: info.threads, tps: out.timings?.decode_tokens_per_s ?? NaN };
  }, { model: `${server.url}/models/${MODEL}`, base, threads, tokens: Number(opt.tokens) });
}

const dists = [['', opt.dist], ...(opt['dist-b'] ? [['b:', opt['dist-b']]] : [])];
const variants = dists.flatMap(([tag, dist]) => [
  { name: `${tag}threaded x${opt.threads}`, isolated: true, dist, threads: Number(opt.threads) },
  { name: `${tag}threaded x1`, isolated: true, dist, threads: 1 },
  { name: `${tag}single-thread`, isolated: false, dist, threads: 1 },
]);
const pages = {};
for (const isolated of [true, false]) {
  const page = await context.newPage();
  await page.goto(`${server.url}${isolated ? '' : '/st'}/tests/browser/pages/index.html`);
  await page.waitForFunction(() => window.hearthReady === true, null, { timeout: 30_000 });
  pages[isolated] = page;
}
const results = Object.fromEntries(variants.map((v) => [v.name, []]));
try {
  for (let r = 0; r < Number(opt.rounds); r++) {
    for (const v of variants) {
      const base = `${server.url}${v.isolated ? '' : '/st'}/${v.dist.replace(/^\/|\/$/g, '')}/`;
      const got = await run(pages[v.isolated], base, v.threads);
      results[v.name].push(got.tps);
      console.log(`round ${r}: ${v.name} (${got.build} x${got.threads}): ${got.tps.toFixed(2)} tok/s`);
    }
  }
} finally {
  await context.close();
  await server.close();
  rmSync(profile, { recursive: true, force: true });
}
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const ref = median(results[variants[2].name]);
for (const v of variants) {
  const m = median(results[v.name]);
  console.log(`${v.name.padEnd(24)} median ${m.toFixed(2)} tok/s  (${(m / ref).toFixed(2)}x ${variants[2].name})`);
}
