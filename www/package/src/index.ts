// Hearth in the browser: load a GGUF model into a Web Worker and talk to it
// with OpenAI-shaped chat and text completions.
//
//   import { Hearth } from '@hearth/web';
//   const engine = await Hearth.load('https://example.org/SmolLM2-135M-Instruct.Q4_1.gguf', {
//     onProgress: (p) => console.log(p.phase, p.loaded, p.total),
//   });
//   const stream = await engine.chat.completions.create({
//     messages: [{ role: 'user', content: 'Name three colours.' }], stream: true,
//   });
//   for await (const chunk of stream) console.log(chunk.choices[0]?.delta.content ?? '');

import { HearthError } from './errors.js';
import { capabilities, MAX_THREADS } from './platform.js';
import { cacheApi, type CacheApi } from './cache.js';
import { ChatApi, CompletionsApi, Generator } from './generate.js';
import type { FromWorker, SourceSpec, ToWorker, WorkerLoadOptions } from './protocol.js';
import type { Backend, Capabilities, EngineStats, LoadOptions, ModelInfo, ModelSource, MoePolicy } from './types.js';

export * from './types.js';
export { HearthError } from './errors.js';
export type { CacheApi } from './cache.js';

/** What the worker is asked to use for `backend`: `webgpu` (an error
 * without an adapter), `auto` (WebGPU when the model fits, else the CPU) for
 * a hardware adapter, else `cpu`. Throws `unsupported-backend` before any
 * download when WebGPU is forced and the browser has none. */
function resolveBackend(backend: Backend, caps: Capabilities): 'cpu' | 'webgpu' | 'auto' {
  if (backend === 'webgpu') {
    if (!caps.webgpu) {
      throw new HearthError(
        'unsupported-backend',
        "this browser gives no WebGPU adapter; use backend 'cpu' or 'auto', or a browser with WebGPU enabled "
          + '(Chrome/Edge 113+ with a supported GPU)',
      );
    }
    return 'webgpu';
  }
  if (backend === 'auto' && caps.webgpu && !caps.webgpuFallback) return 'auto';
  return 'cpu';
}

const MOE_POLICIES: readonly MoePolicy[] = ['lru', 'lfu', 'lrfu'];

/** `maxGpuMemory` and `moePolicy` checked (code `bad-request`), as the
 * worker takes them. */
function expertOptions(options: LoadOptions): { maxGpuMemory: number | null; moePolicy: MoePolicy } {
  const bytes = options.maxGpuMemory;
  if (bytes !== undefined && bytes !== null
    && (typeof bytes !== 'number' || !Number.isFinite(bytes) || bytes < 0)) {
    throw new HearthError(
      'bad-request',
      `maxGpuMemory is ${String(bytes)}; give the bytes of GPU memory for the experts' slots, a finite number of at least 0, or leave it unset`,
    );
  }
  const policy = options.moePolicy ?? 'lrfu';
  if (!MOE_POLICIES.includes(policy)) {
    throw new HearthError('bad-request', `moePolicy '${String(policy)}': use 'lru', 'lfu' or 'lrfu'`);
  }
  return { maxGpuMemory: bytes == null ? null : Math.floor(bytes), moePolicy: policy };
}

/** `gpuLayers` checked (code `bad-request`), as the worker takes it. */
function gpuLayersOption(options: LoadOptions): number | null {
  const n = options.gpuLayers;
  if (n === undefined || n === null) return null;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0) {
    throw new HearthError(
      'bad-request',
      `gpuLayers is ${String(n)}; give the number of transformer blocks to run on the GPU (the last ones, with the output head), an integer of at least 0, or leave it unset for all of them`,
    );
  }
  return n;
}

/** The files of `source`, URLs resolved against the page. */
function sourceSpecs(source: ModelSource): SourceSpec[] {
  const list = Array.isArray(source) ? source : [source];
  if (list.length === 0) throw new HearthError('bad-request', 'no model source given; pass a URL, a File or a Blob');
  return list.map((s, i) => {
    if (typeof Blob !== 'undefined' && s instanceof Blob) {
      const name = typeof File !== 'undefined' && s instanceof File ? s.name : `blob-${i}.gguf`;
      return { kind: 'blob', blob: s, name };
    }
    const base = globalThis.location?.href;
    return { kind: 'url', url: new URL(String(s), base).href };
  });
}

/** A model loaded in a Web Worker. Create one with {@link Hearth.load}. */
export class HearthEngine {
  /** What was loaded and how it runs. */
  readonly info: ModelInfo;
  /** OpenAI-shaped chat completions: `engine.chat.completions.create({...})`. */
  readonly chat: { completions: ChatApi };
  /** OpenAI-shaped text completions: `engine.completions.create({...})`. */
  readonly completions: CompletionsApi;
  readonly #gen: Generator;

  /** @internal */
  constructor(worker: Worker, info: ModelInfo) {
    this.info = info;
    this.#gen = new Generator(worker, info);
    this.chat = { completions: new ChatApi(this.#gen) };
    this.completions = new CompletionsApi(this.#gen);
  }

  /** Token ids of `text` (`addSpecial`: BOS where the model adds one). */
  tokenize(text: string, opts: { addSpecial?: boolean; parseSpecial?: boolean } = {}): Promise<number[]> {
    return this.#gen.call({
      type: 'tokenize', rid: 0, text, addSpecial: opts.addSpecial ?? true, parseSpecial: opts.parseSpecial ?? false,
    }) as Promise<number[]>;
  }

  /** The text of token ids. */
  detokenize(ids: number[]): Promise<string> {
    return this.#gen.call({ type: 'detokenize', rid: 0, ids }) as Promise<string>;
  }

  /** Counters since the load: steps, throughput, and what an MoE model's
   * expert cache did (`expertCache`: hit rate, bytes copied and experts
   * computed on the CPU per token; null without one). Answered between
   * steps. */
  stats(): Promise<EngineStats> {
    return this.#gen.call({ type: 'stats', rid: 0 }) as Promise<EngineStats>;
  }

  /** Starts recording a Perfetto trace in the engine (a recording in
   * progress is dropped): every engine step (schedule, model, sample),
   * each request's phases, each op and, on WebGPU where the adapter has
   * timestamp queries inside passes, each kernel. `LoadOptions.trace`
   * starts one before the load, to hold the load's phases too. */
  startTrace(): Promise<void> {
    return this.#gen.call({ type: 'trace-start', rid: 0 }) as Promise<void>;
  }

  /** Stops the recording and returns the trace as a file for
   * https://ui.perfetto.dev (empty when nothing was recording):
   * `URL.createObjectURL(await engine.stopTrace())` makes a download link. */
  async stopTrace(): Promise<Blob> {
    const bytes = (await this.#gen.call({ type: 'trace-stop', rid: 0 })) as Uint8Array<ArrayBuffer>;
    return new Blob([bytes], { type: 'application/octet-stream' });
  }

  /** Generations live now. */
  get activeRequests(): number {
    return this.#gen.active;
  }

  /** Ends every generation (`finish_reason: 'abort'`), stops the worker and
   * frees its memory. Later calls fail with code `unloaded`. */
  async unload(): Promise<void> {
    this.#gen.terminate();
  }
}

/** The package's entry points. */
export const Hearth = {
  /** What the browser offers: the platform (`cpu`, `memory`, `gpus`) in the
   * shape of the native `hearth info --platform --json`, the defaults chosen
   * from it with why, and the package's flags. */
  capabilities,

  /** The browser cache of models: list, delete, usage against quota. */
  cache: cacheApi as CacheApi,

  /**
   * Loads a model into a new Web Worker. Rejects with a {@link HearthError}:
   * `unsupported-backend` (backend 'webgpu' without an adapter: before any
   * download), `no-acceleration`
   * (with `requireAcceleration`), `unsupported-model` (read from the header,
   * before the tensors are downloaded: architecture, tensor types, a model
   * beyond the WebGPU adapter's limits), `quota-exceeded` (before the download
   * when the size is known), `network`, `not-cached`, `aborted`,
   * `bad-request` (an invalid option: `backend`, `maxGpuMemory`, `moePolicy`,
   * `gpuLayers`; before any download).
   */
  async load(source: ModelSource, options: LoadOptions = {}): Promise<HearthEngine> {
    const t0 = performance.now();
    const caps = await capabilities();
    const backend = options.backend ?? 'auto';
    if (backend !== 'auto' && backend !== 'cpu' && backend !== 'webgpu') {
      throw new HearthError('bad-request', `backend '${String(backend)}': use 'auto', 'webgpu' or 'cpu'`);
    }
    const experts = expertOptions(options);
    const gpuLayers = gpuLayersOption(options);
    const resolved = resolveBackend(backend, caps);
    const gpu = caps.webgpu && !caps.webgpuFallback;
    const threads = Math.max(1, Math.floor(
      caps.threads ? options.threads ?? Math.min(caps.hardwareConcurrency, MAX_THREADS) : 1,
    ));
    if (options.requireAcceleration && !caps.threads && !gpu && resolved !== 'webgpu') {
      throw new HearthError(
        'no-acceleration',
        'neither WebGPU nor threads are available: serve the page with the headers '
          + "'Cross-Origin-Opener-Policy: same-origin' and 'Cross-Origin-Embedder-Policy: require-corp' "
          + "to get threads, or use a browser with a hardware WebGPU adapter (or force backend 'webgpu')",
      );
    }
    if ((options.threads ?? 1) > 1 && !caps.threads) {
      console.warn('[hearth] threads need a cross-origin isolated page (COOP/COEP headers); running on one thread');
    }
    const specs = sourceSpecs(source);
    const base = new URL(options.baseUrl ?? new URL('./', import.meta.url)).href;
    const wasmUrl = new URL(caps.threads ? 'wasm-mt/hearth_wasm.js' : 'wasm-st/hearth_wasm.js', base).href;
    const wopts: WorkerLoadOptions = {
      threads,
      contextLength: options.contextLength ?? 0,
      kvType: options.kvType ?? 'f16',
      maxConcurrentRequests: options.maxConcurrentRequests ?? 4,
      cache: options.cache ?? true,
      chatTemplate: options.chatTemplate ?? null,
      ...experts,
      gpuLayers,
      wasmUrl,
      backend: resolved,
      adapterName: caps.webgpuAdapter,
      trace: options.trace ?? false,
    };
    const worker = new Worker(new URL('worker.js', base), { type: 'module', name: 'hearth-engine' });
    const info = await new Promise<Omit<ModelInfo, 'loadSeconds'>>((resolve, reject) => {
      const onAbort = () => worker.postMessage({ type: 'abort-load' } satisfies ToWorker);
      if (options.signal?.aborted) {
        reject(new HearthError('aborted', 'the load was aborted before it started'));
        return;
      }
      options.signal?.addEventListener('abort', onAbort, { once: true });
      const done = () => {
        options.signal?.removeEventListener('abort', onAbort);
        worker.removeEventListener('message', onMessage);
        worker.removeEventListener('error', onError);
      };
      const onMessage = (ev: MessageEvent<FromWorker>) => {
        const m = ev.data;
        if (m.type === 'progress') {
          try {
            options.onProgress?.(m.progress);
          } catch (e) {
            console.error('[hearth] onProgress threw', e);
          }
        } else if (m.type === 'loaded') {
          done();
          resolve(m.info);
        } else if (m.type === 'load-error') {
          done();
          reject(new HearthError(m.code, m.message));
        }
      };
      const onError = (ev: ErrorEvent) => {
        done();
        reject(new HearthError('internal', `the engine's worker failed to start: ${ev.message || 'unknown error'} (is ${base}worker.js served?)`));
      };
      worker.addEventListener('message', onMessage);
      worker.addEventListener('error', onError);
      worker.postMessage({ type: 'load', sources: specs, options: wopts } satisfies ToWorker);
    }).catch((e: unknown) => {
      worker.terminate();
      throw HearthError.from(e);
    });
    return new HearthEngine(worker, { ...info, loadSeconds: (performance.now() - t0) / 1000 });
  },
};

export default Hearth;
