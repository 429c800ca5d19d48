// TEST DOUBLE of the `@hearth/web` package, for UI tests of the demo page
// without a model (`?engine=fake`). It runs no model: it replays load
// progress, streams a fixed answer word by word with made-up timings, and
// keeps a fake cache in memory. The page shows a banner whenever it is used.

const sleep = (ms, signal) => new Promise((ok, fail) => {
  const t = setTimeout(ok, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); fail(abortError()); }, { once: true });
});
function abortError() { const e = new Error('aborted'); e.code = 'aborted'; e.name = 'AbortError'; return e; }
function hearthError(code, message) { const e = new Error(message); e.code = code; e.name = 'HearthError'; return e; }

const cache = new Map([
  ['http://127.0.0.1/models/fake-cached.gguf', { name: 'fake-cached.gguf', bytes: 80_300_000, totalBytes: 80_300_000, complete: true }],
  ['http://127.0.0.1/models/fake-partial.gguf', { name: 'fake-partial.gguf', bytes: 12_000_000, totalBytes: 291_000_000, complete: false }],
]);

class FakeEngine {
  constructor(name, total) {
    this.info = {
      id: name, name: `${name} (fake)`, architecture: 'llama', sizeBytes: total, tensors: 272,
      trainedContextLength: 8192, contextLength: 4096, vocabSize: 49152, hasChatTemplate: true,
      backend: 'cpu', build: self.crossOriginIsolated ? 'threaded' : 'single',
      threads: self.crossOriginIsolated ? 2 : 1, fromCache: false, loadSeconds: 0.4,
    };
    this.chat = { completions: { create: (req, opts) => this.#create(req, opts) } };
  }

  async unload() {}

  async #create(req, opts = {}) {
    if (!Array.isArray(req.messages) || !req.messages.length) throw hearthError('bad-request', 'messages must be a non-empty array');
    const last = req.messages.at(-1).content;
    let text = `This is the fake engine answering "${String(last).slice(0, 60)}". `
      + `The conversation has ${req.messages.length} message(s). A real model would reply here, token by token.`;
    // "long" in the prompt: an answer of a few minutes, for tests of Stop.
    if (/\blong\b/.test(last)) text += ' And so on.'.repeat(2000);
    const words = text.split(/(?<= )/);
    const limit = Math.min(words.length, req.max_tokens ?? Infinity);
    const signal = opts.signal;
    const id = 'chatcmpl-fake';
    const chunk = (delta, finish, extra = {}) => ({
      id, object: 'chat.completion.chunk', created: 0, model: this.info.name,
      choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }], ...extra,
    });
    async function* run() {
      let n = 0;
      let reason = 'stop';
      try {
        await sleep(150, signal);
        for (; n < limit; n += 1) {
          yield chunk({ content: words[n] }, null);
          await sleep(40, signal);
        }
        if (limit < words.length) reason = 'length';
      } catch (e) {
        if (e.code !== 'aborted') throw e;
        reason = 'abort';
      }
      yield chunk({}, reason, {
        usage: { prompt_tokens: 24, completion_tokens: n, total_tokens: 24 + n, prompt_tokens_details: { cached_tokens: 0 } },
        timings: { queue_s: 0, prefill_s: 0.15, decode_s: n * 0.04, prefill_tokens_per_s: 160, decode_tokens_per_s: 25 },
      });
    }
    return run();
  }
}

/** Same surface as the package's `Hearth` for what the demo uses. */
export const Hearth = {
  async capabilities() {
    return { threads: self.crossOriginIsolated, hardwareConcurrency: navigator.hardwareConcurrency, webgpu: false, webgpuAdapter: null, webgpuFallback: false, webgpuBackend: true, opfs: true, cacheStorage: true };
  },
  async load(source, { onProgress, signal } = {}) {
    const name = typeof source === 'string' ? source.split('/').pop() : source.name ?? 'blob.gguf';
    if (/fail/.test(name)) throw hearthError('network', `GET ${source}: HTTP 404`);
    const total = typeof source === 'string' ? 80_300_000 : source.size;
    for (let i = 1; i <= 10; i += 1) {
      await sleep(30, signal);
      onProgress?.({ phase: 'download', loaded: (total * i) / 10, total });
    }
    for (let i = 1; i <= 4; i += 1) {
      await sleep(30, signal);
      onProgress?.({ phase: 'load', loaded: (total * i) / 4, total, tensorsDone: 68 * i, tensorsTotal: 272 });
    }
    onProgress?.({ phase: 'ready', loaded: total, total });
    if (typeof source === 'string') cache.set(source, { name, bytes: total, totalBytes: total, complete: true });
    return new FakeEngine(name, total);
  },
  cache: {
    async list() {
      return [...cache].map(([id, m]) => ({ id, ...m, files: 1, storage: 'opfs', updated: 0 }));
    },
    async delete(id) { cache.delete(id); },
    async usage() {
      const models = [...cache.values()].reduce((s, m) => s + m.bytes, 0);
      return { models, usage: models, quota: 10_700_000_000, persisted: false };
    },
  },
};
