// The engine's Web Worker: loads the wasm build the page picked, opens the
// model (cache, download, or Blob), then steps the engine while any request
// is live, posting each step's events. Messages (new requests, aborts) are
// handled between steps, so concurrent generations share one scheduler.

/// <reference lib="webworker" />

import { HearthError } from './errors.js';
import { blobReader, type Reader } from './cache.js';
import { openUrl } from './download.js';
import type { EngineRequest, FinishedEvent, FromWorker, SourceSpec, TokenEvent, ToWorker, WorkerLoadOptions } from './protocol.js';
import type { EngineStats, ExpertCacheInfo, ExpertCacheStats, LoadProgress, ModelInfo } from './types.js';

/** The wasm-bindgen module's exports used here. */
interface WasmModule {
  default(): Promise<unknown>;
  buildKind(): string;
  initThreadPool?(n: number): Promise<unknown>;
  inspect(readers: Reader[], options: string): Promise<string>;
  load(readers: Reader[], options: string, onProgress: (d: number, t: number, td: number, tt: number) => void): Promise<WasmEngine>;
  traceStart(): void;
  traceStop(): Uint8Array | undefined;
}

interface WasmEngine {
  info(): string;
  addRequest(json: string): number;
  cancel(id: number): string;
  hasUnfinished(): boolean;
  step(): Promise<string>;
  tokenize(text: string, addSpecial: boolean, parseSpecial: boolean): Uint32Array;
  detokenize(ids: Uint32Array): string;
  stats(): string;
}

const scope = self as unknown as DedicatedWorkerGlobalScope;
const post = (m: FromWorker) => scope.postMessage(m);

let engine: WasmEngine | null = null;
let loadAbort: AbortController | null = null;
/** Page request id -> engine request id, and back. */
const byRid = new Map<number, number>();
const byEngineId = new Map<number, number>();
let stepping = false;
/** Messages that arrived while a step ran. */
const queue: ToWorker[] = [];

scope.onmessage = (ev: MessageEvent<ToWorker>) => {
  const m = ev.data;
  if (m.type === 'load') void load(m.sources, m.options);
  else if (m.type === 'abort-load') loadAbort?.abort();
  else if (stepping) queue.push(m);
  else handle(m);
};

function fail(rid: number, e: unknown): void {
  const err = HearthError.from(e);
  post({ type: 'request-error', rid, code: err.code, message: err.message });
}

/** Handles a request message (never during a step). */
function handle(m: ToWorker): void {
  if (!engine) {
    if ('rid' in m) fail(m.rid, new HearthError('unloaded', 'no model is loaded in this worker'));
    return;
  }
  try {
    if (m.type === 'generate') {
      const id = engine.addRequest(JSON.stringify(m.request satisfies EngineRequest));
      byRid.set(m.rid, id);
      byEngineId.set(id, m.rid);
      kick();
    } else if (m.type === 'abort') {
      const id = byRid.get(m.rid);
      if (id === undefined) return;
      const finished = JSON.parse(engine.cancel(id)) as FinishedEvent;
      dispatch([finished]);
    } else if (m.type === 'tokenize') {
      post({ type: 'result', rid: m.rid, value: [...engine.tokenize(m.text, m.addSpecial, m.parseSpecial)] });
    } else if (m.type === 'detokenize') {
      post({ type: 'result', rid: m.rid, value: engine.detokenize(Uint32Array.from(m.ids)) });
    } else if (m.type === 'trace-start') {
      wasmPromise?.then((mod) => {
        mod.traceStart();
        post({ type: 'result', rid: m.rid, value: null });
      }, (e: unknown) => fail(m.rid, e));
    } else if (m.type === 'trace-stop') {
      wasmPromise?.then((mod) => {
        const bytes = mod.traceStop() ?? new Uint8Array(0);
        scope.postMessage({ type: 'result', rid: m.rid, value: bytes } satisfies FromWorker, [bytes.buffer]);
      }, (e: unknown) => fail(m.rid, e));
    } else if (m.type === 'stats') {
      post({ type: 'result', rid: m.rid, value: engineStats(JSON.parse(engine.stats()) as RawStats) });
    }
  } catch (e) {
    if ('rid' in m) fail(m.rid, e);
  }
}

/** The engine's `stats()` JSON (see www/wasm/src/lib.rs). */
interface RawStats {
  steps: number;
  prefill_tokens_per_s: number;
  decode_tokens_per_s: number;
  expert_cache: null | {
    steps: number; tokens: number; hits: number; misses: number; copies: number; bytes_copied: number;
    host_experts: number; host_seconds: number; hit_rate: number; bytes_copied_per_token: number;
    host_experts_per_token: number; summary: string;
  };
}

/** The package's shape of the engine's stats. */
function engineStats(raw: RawStats): EngineStats {
  const c = raw.expert_cache;
  const expertCache: ExpertCacheStats | null = c && {
    steps: c.steps,
    tokens: c.tokens,
    hits: c.hits,
    misses: c.misses,
    copies: c.copies,
    bytesCopied: c.bytes_copied,
    hostExperts: c.host_experts,
    hostSeconds: c.host_seconds,
    hitRate: c.hit_rate,
    bytesCopiedPerToken: c.bytes_copied_per_token,
    hostExpertsPerToken: c.host_experts_per_token,
    summary: c.summary,
  };
  return {
    steps: raw.steps,
    prefillTokensPerS: raw.prefill_tokens_per_s,
    decodeTokensPerS: raw.decode_tokens_per_s,
    expertCache,
  };
}

/** The engine's `expert_cache` report of a load (see www/wasm/src/backend.rs). */
function expertCacheInfo(raw: unknown): ExpertCacheInfo | null {
  if (!raw) return null;
  const r = raw as { policy: ExpertCacheInfo['policy']; slots: number; slot_bytes: number; offloaded_bytes: number; host_only_layers: number };
  return {
    policy: r.policy,
    slots: r.slots,
    slotBytes: r.slot_bytes,
    offloadedBytes: r.offloaded_bytes,
    hostOnlyLayers: r.host_only_layers,
  };
}

/** Posts events grouped by page request. */
function dispatch(events: Array<TokenEvent | FinishedEvent>): void {
  const groups = new Map<number, { tokens: TokenEvent[]; finished: FinishedEvent | null }>();
  for (const e of events) {
    const rid = byEngineId.get(e.request);
    if (rid === undefined) continue;
    const g = groups.get(rid) ?? { tokens: [], finished: null };
    if (e.type === 'token') g.tokens.push(e);
    else {
      g.finished = e;
      byEngineId.delete(e.request);
      byRid.delete(rid);
    }
    groups.set(rid, g);
  }
  for (const [rid, g] of groups) post({ type: 'events', rid, tokens: g.tokens, finished: g.finished });
}

/** A macrotask turn, so messages (aborts, new requests) get in between steps. */
function yieldToEvents(): Promise<void> {
  return new Promise((resolve) => {
    const ch = new MessageChannel();
    ch.port1.onmessage = () => resolve();
    ch.port2.postMessage(null);
  });
}

/** Steps the engine until no request is live. */
function kick(): void {
  if (stepping) return;
  stepping = true;
  void (async () => {
    try {
      while (engine?.hasUnfinished()) {
        const events = JSON.parse(await engine.step()) as Array<TokenEvent | FinishedEvent>;
        dispatch(events);
        await yieldToEvents();
        for (const m of queue.splice(0)) handle(m);
      }
    } catch (e) {
      // A failed step ends every live request with the error.
      for (const rid of [...byRid.keys()]) fail(rid, e);
      byRid.clear();
      byEngineId.clear();
    } finally {
      stepping = false;
      for (const m of queue.splice(0)) handle(m);
    }
  })();
}

let wasmPromise: Promise<WasmModule> | null = null;

/** Imports and starts the wasm build (and its thread pool) once. */
function wasm(o: WorkerLoadOptions): Promise<WasmModule> {
  wasmPromise ??= (async () => {
    const mod = (await import(o.wasmUrl)) as WasmModule;
    await mod.default();
    if (mod.initThreadPool && o.threads > 1) await mod.initThreadPool(o.threads);
    return mod;
  })();
  return wasmPromise;
}

/** What `inspect` says of a model (see www/wasm/src/inspect.rs). */
interface Inspected {
  backend: 'cpu' | 'webgpu';
  adapter: string | null;
  webgpu_declined: string | null;
}

async function load(sources: SourceSpec[], o: WorkerLoadOptions): Promise<void> {
  loadAbort = new AbortController();
  const signal = loadAbort.signal;
  const progress = (p: LoadProgress) => post({ type: 'progress', progress: p });
  try {
    const mod = await wasm(o);
    if (o.trace) mod.traceStart();
    const threaded = mod.buildKind() === 'threaded';
    const options = (backend: string) => JSON.stringify({
      threads: threaded ? o.threads : 1,
      n_ctx: o.contextLength,
      kv_type: o.kvType,
      max_num_seqs: o.maxConcurrentRequests,
      chat_template: o.chatTemplate,
      backend,
      max_gpu_memory: o.maxGpuMemory,
      moe_policy: o.moePolicy,
      gpu_layers: o.gpuLayers,
    });
    // The header decides the backend (and fails early) before any download.
    const seen: { inspected: Inspected | null } = { inspected: null };
    const inspect = async (r: Reader[]) => {
      seen.inspected = JSON.parse(await mod.inspect(r, options(o.backend))) as Inspected;
    };
    let readers: Reader[];
    let fromCache = false;
    let id: string;
    let size: number;
    const first = sources[0]!;
    if (sources.every((s) => s.kind === 'blob')) {
      readers = sources.map((s) => blobReader((s as { blob: Blob }).blob));
      id = `blob:${(first as { name: string }).name}`;
      size = readers.reduce((a, r) => a + r.size, 0);
    } else if (sources.length === 1 && first.kind === 'url') {
      const opened = await openUrl(first.url, { cache: o.cache, signal, progress, inspect });
      ({ readers, fromCache, size } = opened);
      id = first.url;
    } else {
      throw new HearthError('bad-request', 'pass one URL (part 1 of a split model fetches the others), or Files/Blobs only');
    }
    if (signal.aborted) throw new HearthError('aborted', 'the load was aborted');
    // A cached model, a Blob, or a server without Range: inspected now.
    if (!seen.inspected) await inspect(readers);
    const decided = seen.inspected!;
    let last = 0;
    engine = await mod.load(readers, options(decided.backend), (done, total, td, tt) => {
      const now = performance.now();
      if (now - last < 100 && done < total) return;
      last = now;
      progress({ phase: 'load', loaded: done, total, tensorsDone: td, tensorsTotal: tt });
    });
    const raw = JSON.parse(engine.info()) as Record<string, unknown>;
    const name = (raw.name as string | null) ?? decodeURIComponent(id.split('/').pop() ?? id);
    const info: Omit<ModelInfo, 'loadSeconds'> = {
      id,
      name,
      architecture: raw.architecture as string,
      sizeBytes: size,
      tensors: raw.tensors as number,
      trainedContextLength: raw.trained_context_length as number,
      contextLength: raw.context_length as number,
      vocabSize: raw.vocab_size as number,
      hasChatTemplate: raw.has_chat_template as boolean,
      backend: raw.backend as 'cpu' | 'webgpu',
      adapter: raw.backend === 'webgpu' ? ((raw.adapter as string | null) || o.adapterName) : null,
      webgpuDeclined: decided.webgpu_declined,
      wasmMemoryBytes: raw.wasm_memory_bytes as number,
      expertCache: expertCacheInfo(raw.expert_cache),
      hostBlocks: raw.host_blocks as number,
      gpuBlocks: raw.gpu_blocks as number,
      build: threaded ? 'threaded' : 'single',
      threads: raw.threads as number,
      fromCache,
    };
    progress({ phase: 'ready', loaded: size, total: size });
    post({ type: 'loaded', info });
  } catch (e) {
    const err = signal.aborted ? new HearthError('aborted', 'the load was aborted') : HearthError.from(e);
    post({ type: 'load-error', code: err.code, message: err.message });
  } finally {
    loadAbort = null;
  }
}
