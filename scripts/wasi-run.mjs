// Runs a wasm32-wasip1 program under Node's WASI (the cargo runner of that
// target): `node scripts/wasi-run.mjs PROGRAM.wasm [ARGS...]`.
// The current directory is preopened as `.`, and `/` as `/`, so paths
// given on the command line or in the environment resolve as natively.
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
  preopens: { '/': '/', '.': process.cwd() },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(program));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exitCode = wasi.start(instance);
