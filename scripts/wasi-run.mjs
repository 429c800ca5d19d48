// Runs a wasm32-wasip1 program under Node's WASI (the cargo runner of that
// target): `node scripts/wasi-run.mjs PROGRAM.wasm [ARGS...]`.
// The current directory is preopened as `.`, and each top-level directory
// `/NAME` as itself (a preopened `/` does not resolve absolute paths in
// Node 20), so paths given on the command line or in the environment
// resolve as natively.
import { readdirSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import process from 'node:process';

const [program, ...args] = process.argv.slice(2);
if (!program) {
  console.error('usage: node scripts/wasi-run.mjs PROGRAM.wasm [ARGS...]');
  process.exit(2);
}
const wasi = new WASI({
  version: 'preview1',
  args: [program, ...args],
  env: process.env,
  preopens: preopens(),
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(program));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exitCode = wasi.start(instance);

function preopens() {
  const dirs = { '.': process.cwd() };
  for (const entry of readdirSync('/', { withFileTypes: true })) {
    if (entry.isDirectory()) dirs[`/${entry.name}`] = `/${entry.name}`;
  }
  return dirs;
}
