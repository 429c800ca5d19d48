#!/usr/bin/env node
// make demo: serves the repository (the chat page is www/demo, the built
// package www/package/dist) and the local models (.cache/models at /models/)
// on 127.0.0.1 with the COOP/COEP headers threads need, and prints the page's
// address with SmolLM2 preselected.
//
//   node scripts/demo.mjs [--port 8080] [--model NAME.gguf]
// PORT=0 (or a busy port) picks a free one.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { startServer } from '../tests/browser/server.mjs';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const argv = process.argv.slice(2);
const opt = (name, def) => { const i = argv.indexOf('--' + name); return i < 0 ? def : argv[i + 1]; };
const MODELS = process.env.HEARTH_MODELS || path.join(ROOT, '.cache/models');
const model = opt('model', 'SmolLM2-135M-Instruct.Q4_1.gguf');
const port = Number(opt('port', process.env.PORT ?? 8080));
const dist = path.join(ROOT, 'www/package/dist');

if (!fs.existsSync(path.join(MODELS, model))) console.error(`warning: ${model} is not in ${MODELS}: run \`make setup\``);
if (!fs.existsSync(path.join(dist, 'index.js'))) console.error(`warning: the package is not built (${dist}): run \`make demo\`, which builds it`);

let srv;
try {
  srv = await startServer({ root: ROOT, models: MODELS, port });
} catch (e) {
  if (e.code !== 'EADDRINUSE') throw e;
  srv = await startServer({ root: ROOT, models: MODELS, port: 0 });
}
console.log(`Hearth demo on port ${srv.port}: open ${srv.url}/www/demo/?model=/models/${encodeURIComponent(model)}`);
console.log('(served on 127.0.0.1 only, with COOP/COEP headers for threads; Ctrl+C stops it)');
