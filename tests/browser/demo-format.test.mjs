// Pure helpers of the demo page (www/demo/format.js), under Node.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { bytes, rate, backendLabel, explain } from '../../www/demo/format.js';

test('sizes in decimal units with 3 significant digits', () => {
  assert.equal(bytes(0), '0 B');
  assert.equal(bytes(999), '999 B');
  assert.equal(bytes(1536), '1.54 KB');
  assert.equal(bytes(80_300_000), '80.3 MB');
  assert.equal(bytes(291_000_000), '291 MB');
  assert.equal(bytes(10_700_000_000), '10.7 GB');
  assert.equal(bytes(-1), '?');
  assert.equal(bytes(NaN), '?');
});

test('rates need a count and some time', () => {
  assert.equal(rate(10, 500), 20);
  assert.equal(rate(0, 500), null);
  assert.equal(rate(5, 0), null);
});

test('backend labels say WebGPU, CPU threads or single thread', () => {
  assert.equal(backendLabel({ backend: 'webgpu', build: 'threaded', threads: 2 }), 'WebGPU');
  assert.equal(backendLabel({ backend: 'webgpu', adapter: 'SwiftShader Device', build: 'single', threads: 1 }),
    'WebGPU · SwiftShader Device');
  assert.equal(backendLabel({ backend: 'cpu', build: 'threaded', threads: 4 }), 'CPU · 4 threads');
  assert.equal(backendLabel({ backend: 'cpu', build: 'threaded', threads: 1 }), 'CPU · single thread');
  assert.equal(backendLabel({ backend: 'cpu', build: 'single', threads: 1 }), 'CPU · single thread');
  assert.equal(backendLabel(null), '');
});

test('errors carry their text and what to do next', () => {
  const quota = explain(Object.assign(new Error('needs 2.1 GB, 1.0 GB free'), { code: 'quota-exceeded' }), 'load');
  assert.equal(quota.text, 'needs 2.1 GB, 1.0 GB free');
  assert.match(quota.hint, /Delete cached models/);
  const unknown = explain(new Error('boom'), 'load');
  assert.equal(unknown.title, 'The model could not be loaded');
  assert.equal(unknown.text, 'boom');
  assert.match(unknown.hint, /load again/);
  assert.match(explain({ code: 'no-package', cause: new Error('404') }, 'start').hint, /make demo/);
  assert.equal(explain('plain string').text, 'plain string');
  const noWasm = explain({ code: 'internal', message: 'Failed to fetch dynamically imported module: http://x/www/package/dist/wasm-mt/hearth_wasm.js' }, 'load');
  assert.match(noWasm.hint, /make package/);
});
