// Pure helpers of the demo page (no DOM): sizes, rates, the backend label and
// what an error means for the user. Unit-tested under Node.

/** `1536` -> `1.5 KB`; decimal units, as download sizes are usually given. */
export function bytes(n) {
  if (!Number.isFinite(n) || n < 0) return '?';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
  return `${i === 0 ? n : n.toFixed(n < 10 ? 2 : n < 100 ? 1 : 0)} ${units[i]}`;
}

/** Tokens per second from a count over milliseconds; null without time. */
export function rate(count, ms) {
  return count > 0 && ms > 0 ? (count * 1000) / ms : null;
}

/** Which backend runs, from the package's ModelInfo: `WebGPU · adapter`
 * (`WebGPU` when the browser names none), `CPU · 4 threads`,
 * `CPU · single thread`. */
export function backendLabel(info) {
  if (!info) return '';
  if (info.backend === 'webgpu') return info.adapter ? `WebGPU · ${info.adapter}` : 'WebGPU';
  if (info.build === 'single' || info.threads <= 1) return 'CPU · single thread';
  return `CPU · ${info.threads} threads`;
}

const HINTS = {
  'unsupported-backend': ['This browser cannot run that backend', 'Choose Backend: Auto or CPU in the settings and load again.'],
  'no-acceleration': ['Neither WebGPU nor threads are available', 'Use a browser with WebGPU, or serve the page with COOP/COEP headers (make demo does) for threads.'],
  'unsupported-model': ['This model cannot run here', 'Pick a GGUF of a supported architecture (Llama, Qwen 2/3, Gemma 3, ...) and type (Q4_0, Q4_1, Q8_0, K-quants, F16...).'],
  'quota-exceeded': ['Not enough browser storage for this model', 'Delete cached models in the list on the left, or pick a smaller quantization.'],
  network: ['The download failed', 'Check the URL opens in a new tab, and that the server allows this origin (CORS) and answers Range requests. A partial download resumes when you load again.'],
  'not-cached': ['That model is no longer in the cache', 'Load it from its URL again (you need to be online).'],
  'bad-request': ['The request was refused', 'Check the settings (temperature, max tokens). If the conversation is long, start a New chat: it may not fit the context.'],
  unloaded: ['The model was unloaded', 'Load a model again.'],
  internal: ['The engine failed', 'Reload the page and load the model again; if it happens again, report it with the message above.'],
  'no-template': ['This model has no chat template', 'Chat needs an instruction-tuned model with a template in its GGUF; pick an "-Instruct" or "-it" file.'],
  'no-package': ['The Hearth package is not built', 'Run `make demo` from the repository: it builds the package and serves this page.'],
};

/** A title, the error's own text and what to do next, for an error thrown
 * while `context` ('start' | 'load' | 'generate' | 'cache') was running. */
export function explain(err, context = '') {
  const code = err?.code;
  if (/dynamically imported module.*hearth_wasm|hearth_wasm.*(404|not found)/i.test(err?.message ?? '')) {
    return { title: "The engine's wasm files are missing", text: err.message, hint: 'Build them with `make package` (or run `make demo`, which builds them), then reload.' };
  }
  const [title, hint] = HINTS[code] ?? [
    context === 'load' ? 'The model could not be loaded' : context === 'generate' ? 'The answer failed' : 'Something went wrong',
    context === 'load' ? 'Check the URL or file, then load again.' : 'Try again; if it keeps failing, reload the page.',
  ];
  const text = err?.message ?? (err?.cause ? String(err.cause.message ?? err.cause) : code ? '' : String(err));
  return { title, text, hint };
}
