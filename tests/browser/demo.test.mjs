// The demo page (www/demo) in headless Chromium:
// - with the package's test double (`?engine=fake`): load progress, streamed
//   answer, tokens/s, stop, new chat, the cache list, an error with a hint;
// - with the real package on SmolLM2-135M: a prompt gets an answer and
//   tokens/s; a screenshot is kept as a CI artifact in
//   target/browser-artifacts/demo.png (and demo-test-double.png for the UI).
//
//   node --test tests/browser/demo.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startServer } from './server.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const MODELS = process.env.HEARTH_MODELS || path.join(ROOT, '.cache/models');
const SMOLLM2 = 'SmolLM2-135M-Instruct.Q4_1.gguf';
const DIST = path.join(ROOT, 'www/package/dist');
const ARTIFACTS = path.join(ROOT, 'target/browser-artifacts');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const FLAGS = ['--no-sandbox', '--no-first-run', '--disable-background-networking', '--disable-component-update',
  '--disable-sync', '--disable-quic', '--enable-unsafe-webgpu'];

let srv;
let browser;
let userDir;
before(async () => {
  srv = await startServer({ models: MODELS });
  userDir = fs.mkdtempSync(path.join(os.tmpdir(), 'hearth-demo-'));
  assert.ok(fs.existsSync(CHROMIUM), `no Chromium at ${CHROMIUM}: run \`make setup\``);
});
after(async () => {
  await browser?.close();
  await srv?.close();
  if (userDir) fs.rmSync(userDir, { recursive: true, force: true });
});

async function page(viewport = { width: 1280, height: 800 }) {
  browser ??= await chromium.launch({ executablePath: CHROMIUM, args: FLAGS, headless: true });
  const p = await browser.newPage({ viewport, colorScheme: 'light' });
  const errors = [];
  p.on('pageerror', (e) => errors.push(String(e)));
  return { p, errors };
}

const state = (p, s, timeout = 20000) => p.waitForFunction((s) => document.body.dataset.state === s, s, { timeout });

test('demo page with the test double: progress, streaming, tokens/s, stop, new chat, cache, errors', async () => {
  const { p, errors } = await page();
  await p.goto(`${srv.url}/www/demo/?engine=fake&model=/models/${SMOLLM2}`);
  await p.waitForSelector('[data-testid=progress]:not([hidden])');
  await state(p, 'ready');
  assert.ok(await p.isVisible('#test-double'), 'the test double announces itself');
  assert.equal(await p.textContent('[data-testid=backend]'), 'CPU · 2 threads');

  // A streamed answer: several partial renders, then the final stats.
  await p.fill('[data-testid=prompt]', 'What is the capital of France?');
  await p.keyboard.press('Enter');
  await state(p, 'generating');
  await p.waitForFunction(() => document.querySelector('.msg.assistant .bubble').textContent.length > 0);
  const partial = await p.textContent('.msg.assistant .bubble');
  await state(p, 'ready');
  const full = await p.textContent('.msg.assistant .bubble');
  assert.ok(full.startsWith(partial) && full.length > partial.length, `streamed: "${partial}" then "${full}"`);
  assert.match(full, /capital of France/);
  assert.match(await p.textContent('.msg.assistant [data-testid=stats]'), /prefill 160\.0 tok\/s.*decode 25\.0 tok\/s/);

  // Stop ends the second answer early and says so.
  await p.fill('[data-testid=prompt]', 'Tell me a long story.');
  await p.click('[data-testid=send]');
  await p.waitForFunction(() => document.querySelectorAll('.msg.assistant')[1]?.querySelector('.bubble').textContent.includes('message(s)'));
  await p.click('[data-testid=stop]');
  await state(p, 'ready');
  const second = await p.locator('.msg.assistant').nth(1).locator('.stats').textContent();
  assert.match(second, /stopped/);
  const stopped = await p.locator('.msg.assistant').nth(1).locator('.bubble').textContent();
  assert.ok(stopped.includes('has 3 message(s)') && !stopped.endsWith('And so on. '.repeat(2000)), 'cut short, after the whole history was sent');

  // New chat empties the conversation: the next answer sees one message.
  await p.click('[data-testid=new-chat]');
  assert.equal(await p.locator('.msg').count(), 0);
  await p.fill('[data-testid=prompt]', 'Hello');
  await p.keyboard.press('Enter');
  await state(p, 'ready');
  assert.match(await p.textContent('.msg.assistant .bubble'), /has 1 message/);
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  await p.screenshot({ path: path.join(ARTIFACTS, 'demo-test-double.png') });

  // Cache: the loaded URL is listed with its size; Delete removes an entry.
  const items = p.locator('[data-testid=cache-list] li');
  assert.ok((await items.allTextContents()).some((t) => t.includes(SMOLLM2) && t.includes('80.3 MB')));
  const before = await items.count();
  await items.filter({ hasText: 'fake-cached.gguf' }).getByText('Delete').click();
  await p.waitForFunction((n) => document.querySelectorAll('[data-testid=cache-list] li').length === n - 1, before);

  // A failing download shows what happened and what to do.
  await p.fill('[data-testid=model-url]', `${srv.url}/models/fail.gguf`);
  await p.click('[data-testid=load]');
  await p.waitForSelector('[data-testid=error]:not([hidden])');
  assert.match(await p.textContent('[data-testid=error]'), /download failed.*HTTP 404.*Range/s);
  assert.deepEqual(errors, []);
  await p.close();
});

test('demo page answers a prompt with SmolLM2 on the real package; screenshot kept', async () => {
  assert.ok(fs.existsSync(path.join(MODELS, SMOLLM2)), `${SMOLLM2} missing in ${MODELS}: run \`make setup\``);
  assert.ok(fs.existsSync(path.join(DIST, 'index.js')), `the package is not built (${DIST}): run \`make demo\` or the package build first`);
  const { p, errors } = await page();
  await p.goto(`${srv.url}/www/demo/?model=/models/${SMOLLM2}`);
  await state(p, 'ready', 180000);
  const backend = await p.textContent('[data-testid=backend]');
  assert.match(backend, /^(WebGPU( · .+)?|CPU · \d+ threads|CPU · single thread)$/);
  await p.fill('#temperature', '0');
  await p.fill('#max-tokens', '48');
  // SmolLM2-135M at temperature 0 answers "The capital of France is Paris."
  // (hearth run --chat gives the same).
  await p.fill('[data-testid=prompt]', 'What is the capital of France? Answer in one word.');
  await p.keyboard.press('Enter');
  await state(p, 'generating');
  await state(p, 'ready', 300000);
  const answer = await p.textContent('.msg.assistant .bubble');
  const stats = await p.textContent('.msg.assistant [data-testid=stats]');
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  await p.screenshot({ path: path.join(ARTIFACTS, 'demo.png') });
  assert.ok(answer.trim().length > 0 && !answer.startsWith('('), `an answer appeared: "${answer}"`);
  assert.match(answer, /Paris/, `SmolLM2 at temperature 0 names Paris: "${answer}"`);
  assert.match(stats, /prefill \d+(\.\d)? tok\/s.*decode \d+(\.\d)? tok\/s/, stats);
  assert.ok(await p.isHidden('[data-testid=error]'), await p.textContent('[data-testid=error]'));
  assert.deepEqual(errors, []);
  await p.close();
});
