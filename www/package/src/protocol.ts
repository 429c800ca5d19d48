// Messages between the page (index.ts) and the engine's Web Worker (worker.ts).

import type { HearthErrorCode, LoadProgress, ModelInfo, MoePolicy } from './types.js';

/** A file to load: a URL (downloaded through the cache) or a Blob. */
export type SourceSpec = { kind: 'url'; url: string } | { kind: 'blob'; blob: Blob; name: string };

/** Options the worker needs (the serializable part of LoadOptions). */
export interface WorkerLoadOptions {
  threads: number;
  contextLength: number;
  kvType: 'f16' | 'f32';
  maxConcurrentRequests: number;
  cache: boolean;
  chatTemplate: string | null;
  /** GPU bytes for an MoE model's expert slots (null: no expert cache). */
  maxGpuMemory: number | null;
  moePolicy: MoePolicy;
  /** Blocks on the GPU when the model is split with the CPU (null: all). */
  gpuLayers: number | null;
  /** URL of the wasm build's JS (`dist/wasm-mt/hearth_wasm.js` or `-st`). */
  wasmUrl: string;
  /** The backend as the page resolved it: `auto` here means a hardware
   * adapter, taken when the model fits it. */
  backend: 'cpu' | 'webgpu' | 'auto';
  /** The page's name of its WebGPU adapter (wgpu may report none). */
  adapterName: string | null;
  /** Start a trace before the load (`LoadOptions.trace`). */
  trace: boolean;
}

/** The engine's request (see www/wasm/src/request.rs). */
export interface EngineRequest {
  prompt: { text: string } | { tokens: number[] } | { chat: Array<{ role: string; content: string }> };
  max_tokens: number | null;
  temperature: number;
  top_p: number;
  top_k: number;
  min_p: number;
  repeat_penalty: number;
  presence_penalty: number;
  frequency_penalty: number;
  seed: number;
  stop: string[];
  logprobs: number | null;
  ignore_eos: boolean;
}

export type ToWorker =
  | { type: 'load'; sources: SourceSpec[]; options: WorkerLoadOptions }
  | { type: 'abort-load' }
  | { type: 'generate'; rid: number; request: EngineRequest }
  | { type: 'abort'; rid: number }
  | { type: 'tokenize'; rid: number; text: string; addSpecial: boolean; parseSpecial: boolean }
  | { type: 'detokenize'; rid: number; ids: number[] }
  | { type: 'stats'; rid: number }
  | { type: 'trace-start'; rid: number }
  | { type: 'trace-stop'; rid: number };

/** A token event (see request.rs). */
export interface TokenEvent {
  type: 'token';
  request: number;
  token: number;
  text: string;
  logprob: null | {
    token: string;
    bytes: number[];
    logprob: number;
    top_logprobs: Array<{ token: string; bytes: number[]; logprob: number }>;
  };
}

/** A finished event (see request.rs). */
export interface FinishedEvent {
  type: 'finished';
  request: number;
  reason: 'stop' | 'length' | 'abort' | 'error';
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  queue_s: number;
  prefill_s: number;
  decode_s: number;
  error: string | null;
}

export type FromWorker =
  | { type: 'progress'; progress: LoadProgress }
  | { type: 'loaded'; info: Omit<ModelInfo, 'loadSeconds'> }
  | { type: 'load-error'; code: HearthErrorCode; message: string }
  | { type: 'events'; rid: number; tokens: TokenEvent[]; finished: FinishedEvent | null }
  | { type: 'request-error'; rid: number; code: HearthErrorCode; message: string }
  | { type: 'result'; rid: number; value: unknown };
