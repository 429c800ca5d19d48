// The package's public types: load options, the OpenAI-shaped requests and
// responses, cache entries. Field names of requests and responses follow the
// OpenAI REST API (snake_case) so code written for it ports unchanged.

/** Where a model runs. `auto` picks WebGPU when the browser gives a hardware
 * adapter and the model fits it, else the CPU (wasm SIMD128, threaded when the
 * page is cross-origin isolated); a software adapter (`isFallbackAdapter`,
 * e.g. SwiftShader) is slower than the CPU path, so `auto` passes it over.
 * `webgpu` uses any adapter and fails with code `unsupported-backend` when
 * there is none (before any download), or `unsupported-model` when the model
 * does not fit the adapter's limits. */
export type Backend = 'auto' | 'webgpu' | 'cpu';

/** Which expert a Mixture-of-Experts model's full set of GPU slots gives up
 * for a new one (see {@link LoadOptions.maxGpuMemory}): `lru` the least
 * recently used, `lfu` the least frequently used, `lrfu` both at once (each
 * use weighs less as it ages, so an expert used often long ago ranks with one
 * used once lately). */
export type MoePolicy = 'lru' | 'lfu' | 'lrfu';

/** A model to load:
 * - a URL (absolute or relative to the page) of a `.gguf` file, or the first
 *   part of a split model (`name-00001-of-00003.gguf`: the other parts are
 *   fetched too). Downloaded with HTTP `Range` requests into the browser cache
 *   (OPFS, else Cache Storage), resumable after a reload. A URL already in the
 *   cache loads without the network; the cache id of a model is its absolute
 *   URL, so `CachedModel.id` is also a valid source;
 * - a `File` or `Blob` (e.g. from `<input type=file>`), read in place;
 * - an array of URLs, Files or Blobs: the parts of a split model, in order. */
export type ModelSource = string | URL | Blob | Array<string | URL | Blob>;

/** Options of {@link Hearth.load}. */
export interface LoadOptions {
  /** Where to run the model (default `auto`). */
  backend?: Backend;
  /** Called as the download and the load progress. */
  onProgress?: (progress: LoadProgress) => void;
  /** Aborts the download or the load (rejects with code `aborted`). A partial
   * download stays in the cache and resumes on the next load. */
  signal?: AbortSignal;
  /** Record a Perfetto trace from the start of the load (default false);
   * `engine.stopTrace()` returns it. */
  trace?: boolean;
  /** CPU threads (default: `navigator.hardwareConcurrency`, capped at 8, when
   * the page is cross-origin isolated; else 1). Needs COOP/COEP headers for
   * more than one. */
  threads?: number;
  /** Most tokens of one sequence, prompt plus output (default: the model's
   * trained context, at most 4096). */
  contextLength?: number;
  /** Element type of the K/V cache (default `f16`). */
  kvType?: 'f16' | 'f32';
  /** Most requests decoded together (default 4); more wait in the queue. */
  maxConcurrentRequests?: number;
  /** Keep a URL source in the browser cache (default true). With false the
   * model is fetched into memory and not stored. */
  cache?: boolean;
  /** A built-in chat template (`chatml`, `llama3`, `gemma`) instead of the
   * model's own. */
  chatTemplate?: string;
  /** Bytes of GPU memory the routed experts of a Mixture-of-Experts model
   * (Qwen3-MoE, Mixtral) may use on WebGPU. When set, the experts stay in the
   * engine's wasm memory and the GPU holds this many bytes of expert slots:
   * each step, an expert several tokens are routed to and not in a slot is
   * copied into one (a full set gives one up by
   * {@link LoadOptions.moePolicy}); one routed to a single token (every miss
   * of a decode step), or one that finds every slot in use by the step, is
   * computed on the CPU instead. So a model whose
   * experts exceed the adapter's memory or limits still runs with most of
   * its work on the GPU: the other weights, the K/V cache and the
   * activations are there as without it. Where all experts fit, they stay on the GPU; below
   * one expert's bytes, every expert is computed on the CPU.
   * `info.expertCache` says where they went, `engine.stats()` what the cache
   * did. The wasm memory must hold the experts (at most 4 GiB in all).
   * Default: unset (every weight on the GPU). No effect on a dense model or
   * on the CPU backend. A finite number of at least 0 (fractions dropped),
   * else the load fails with `bad-request`. */
  maxGpuMemory?: number;
  /** Which expert a full set of slots gives up (default `lrfu`); used with
   * {@link LoadOptions.maxGpuMemory}. Another value fails with
   * `bad-request`. */
  moePolicy?: MoePolicy;
  /** Transformer blocks to run on WebGPU when the model is split between the
   * GPU and the CPU: the last `gpuLayers` blocks and the output head run on the
   * GPU, the blocks before on the CPU path (wasm SIMD128, their weights in the
   * engine's wasm memory), the hidden state crossing from the CPU to the GPU
   * once per step. So a model whose weights exceed the adapter's memory or
   * limits still runs with its last blocks on the GPU. `info.hostBlocks` and
   * `info.gpuBlocks` say how it was split. llama.cpp's `-ngl` counts the
   * output head as one of its layers: its `-ngl N+1` is `gpuLayers: N` here
   * (0: only the head on the GPU; more than the model has: every block).
   * Default: unset (every block on the GPU). No effect on the CPU backend. A
   * finite integer of at least 0, else the load fails with `bad-request`. */
  gpuLayers?: number;
  /** Refuse to run on one CPU thread without WebGPU (default false: allowed,
   * but slow). The error (code `no-acceleration`) comes before any download. */
  requireAcceleration?: boolean;
  /** Where the package's `dist/` is served, when a bundler moved the files
   * (default: next to this module). */
  baseUrl?: string | URL;
}

/** Progress of a load. `download` phases repeat per file of a split model. */
export interface LoadProgress {
  /** `download`: bytes from the network into the cache; `cache`: the model
   * was found in the cache; `load`: tensors into the engine; `ready`. */
  phase: 'download' | 'cache' | 'load' | 'ready';
  /** Bytes done in this phase (for `download`, over all files, including
   * bytes a previous, interrupted download already stored). */
  loaded: number;
  /** Bytes of this phase in all. */
  total: number;
  /** Tensors loaded, in the `load` phase. */
  tensorsDone?: number;
  /** Tensors of the model. */
  tensorsTotal?: number;
}

/** What was loaded and how it runs. */
export interface ModelInfo {
  /** The cache id (absolute URL) of a URL source; `blob:NAME` otherwise. */
  id: string;
  /** `general.name` from the GGUF metadata, else the file name. */
  name: string;
  /** `general.architecture` (`llama`, `qwen2`, `gemma3`, ...). */
  architecture: string;
  /** Bytes of all files. */
  sizeBytes: number;
  /** Tensor count. */
  tensors: number;
  /** Context length the model was trained with. */
  trainedContextLength: number;
  /** Context length of this engine (prompt plus output). */
  contextLength: number;
  /** Vocabulary size. */
  vocabSize: number;
  /** Whether the model has a chat template (chat completions need one). */
  hasChatTemplate: boolean;
  /** Where it runs. */
  backend: 'cpu' | 'webgpu';
  /** The WebGPU adapter (`backend: 'webgpu'`), as the browser describes
   * it; null on the CPU. */
  adapter: string | null;
  /** Why `auto` did not take WebGPU although the browser has an adapter
   * (null when it did, or when it was not tried). */
  webgpuDeclined: string | null;
  /** Bytes of the engine's wasm memory after the load (it never shrinks).
   * On WebGPU the weights are not in it (but for the experts an expert cache
   * keeps there, {@link ModelInfo.expertCache}, and the CPU's blocks of a
   * layer split, {@link ModelInfo.hostBlocks}). */
  wasmMemoryBytes: number;
  /** Where a Mixture-of-Experts model's routed experts went with
   * {@link LoadOptions.maxGpuMemory}; null when every weight is on the
   * device (no `maxGpuMemory`, a dense model, the CPU backend, or all
   * experts fit). */
  expertCache: ExpertCacheInfo | null;
  /** Transformer blocks run on the CPU: every block on the CPU backend, the
   * first ones of a model split by {@link LoadOptions.gpuLayers} on WebGPU,
   * else 0. */
  hostBlocks: number;
  /** Transformer blocks run on the GPU, the last ones of the model (0 on the
   * CPU backend); with {@link ModelInfo.hostBlocks}, every block. */
  gpuBlocks: number;
  /** The wasm build: `threaded` (cross-origin isolated page) or `single`. */
  build: 'threaded' | 'single';
  /** CPU threads in use. */
  threads: number;
  /** Whether the weights came from the browser cache. */
  fromCache: boolean;
  /** Seconds from `Hearth.load` to ready (download included). */
  loadSeconds: number;
}

/** The expert cache of a model loaded with {@link LoadOptions.maxGpuMemory}. */
export interface ExpertCacheInfo {
  /** Which expert a full set of slots gives up. */
  policy: MoePolicy;
  /** Experts the GPU's slots hold, all layers together. */
  slots: number;
  /** GPU bytes of the slots (at most `maxGpuMemory`). */
  slotBytes: number;
  /** Bytes of the experts kept in wasm memory instead of on the GPU. */
  offloadedBytes: number;
  /** MoE layers without slots, whose experts the CPU computes (the budget
   * was below one expert's bytes). */
  hostOnlyLayers: number;
}

/** Counters since the load, from {@link HearthEngine.stats}. */
export interface EngineStats {
  /** Scheduler steps that ran the model. */
  steps: number;
  /** Prompt tokens computed per second, over all requests. */
  prefillTokensPerS: number;
  /** Tokens generated per second, over all requests. */
  decodeTokensPerS: number;
  /** What the expert cache did; null without one
   * ({@link ModelInfo.expertCache}). */
  expertCache: ExpertCacheStats | null;
}

/** What an expert cache did since the load. Each routed expert counts once
 * per layer and step (a prompt's tokens routed to one expert: one use). */
export interface ExpertCacheStats {
  /** Steps that ran through the cache. */
  steps: number;
  /** Tokens of those steps. */
  tokens: number;
  /** Routed experts (of layers with slots) found in a GPU slot. */
  hits: number;
  /** Routed experts (of layers with slots) not in one: copied in, or
   * computed on the CPU. */
  misses: number;
  /** Misses copied into a slot. */
  copies: number;
  /** Bytes copied into slots. */
  bytesCopied: number;
  /** Experts computed on the CPU (misses routed to a single token or that
   * found no free slot, and every expert of a layer without slots). */
  hostExperts: number;
  /** Seconds the GPU waited on the CPU (staging copies, computing experts). */
  hostSeconds: number;
  /** `hits / (hits + misses)` (1 before anything was routed). */
  hitRate: number;
  /** `bytesCopied / tokens`. */
  bytesCopiedPerToken: number;
  /** `hostExperts / tokens`. */
  hostExpertsPerToken: number;
  /** All of it on one line, as the native CLI prints it. */
  summary: string;
}

/** The CPU as the native `hearth info --platform --json` describes it. */
export interface CpuInfo {
  /** `wasm32` in a browser. */
  arch: string;
  /** Kernel tiers this engine runs, slowest first (`scalar`, `simd128`). */
  isa_tiers: string[];
  /** The fastest of them. */
  best_isa: string;
  /** `navigator.hardwareConcurrency`. */
  logical_cores: number;
  /** Worker threads can run (a cross-origin isolated page). */
  threads: boolean;
}

/** The host's memory, where the browser tells. */
export interface MemoryInfo {
  /** `navigator.deviceMemory` in bytes (rounded by the browser; Chromium only). */
  total_bytes: number | null;
  /** Not known in a browser. */
  available_bytes: number | null;
  /** Not measured in a browser. */
  read_gbps: number | null;
}

/** One GPU adapter, as the native `GpuInfo`. */
export interface GpuInfo {
  backend: 'webgpu' | 'cuda';
  index: number;
  /** For people: nothing is chosen from it. */
  name: string;
  api: string;
  /** `cpu` for a software adapter (`isFallbackAdapter`); browsers tell no more. */
  device_type: 'discrete' | 'integrated' | 'virtual' | 'cpu' | 'other';
  driver: string | null;
  compute_capability: string | null;
  memory_bytes: number | null;
  free_memory_bytes: number | null;
  limits: {
    max_buffer_bytes: number;
    max_storage_binding_bytes: number;
    max_workgroup_storage_bytes: number;
    max_workgroup_invocations: number;
  };
  features: {
    f16: boolean;
    subgroups: boolean;
    subgroup_min_size: number;
    subgroup_max_size: number;
    /** WGSL `dot4I8Packed` (`packed_4x8_integer_dot_product`). */
    int8_dot: boolean;
    matrix_units: boolean;
    timestamp_queries: boolean;
  };
}

/** One default and why it was chosen. */
export interface Choice<T> {
  value: T;
  why: string;
}

/** The backend `backend: 'auto'` asks for, and why. */
export type BackendChoice = Choice<'cpu' | 'webgpu'>;

/** What the package uses where no load option says otherwise. */
export interface PlatformDefaults {
  backend: BackendChoice;
  /** `threads` (the CPU path's workers). */
  threads: Choice<number>;
  /** `kvType`. */
  kv_type: Choice<'f16' | 'f32'>;
  /** The CPU path's kernels. */
  kernels: Choice<string>;
}

/** What the browser offers, from {@link Hearth.capabilities}: the platform
 * in the shape of the native `hearth info --platform --json` (`cpu`,
 * `memory`, `gpus`, `defaults`) and the package's flags. */
export interface Capabilities {
  /** The CPU: wasm SIMD128, cores, threads. */
  cpu: CpuInfo;
  /** The host's memory where the browser tells. */
  memory: MemoryInfo;
  /** The WebGPU adapter, if the browser gives one. */
  gpus: GpuInfo[];
  /** The choices made from them, with why. */
  defaults: PlatformDefaults;
  /** `crossOriginIsolated`: threads (SharedArrayBuffer) are available. */
  threads: boolean;
  /** `navigator.hardwareConcurrency`. */
  hardwareConcurrency: number;
  /** The browser has a WebGPU adapter. */
  webgpu: boolean;
  /** The adapter's description (`vendor architecture` when the browser
   * gives none); null without one. */
  webgpuAdapter: string | null;
  /** The adapter is a software one (`isFallbackAdapter`: SwiftShader):
   * `backend: 'auto'` then runs on the CPU. */
  webgpuFallback: boolean;
  /** The WebGPU backend is in this build of the package. */
  webgpuBackend: boolean;
  /** Origin Private File System available for the model cache. */
  opfs: boolean;
  /** Cache Storage available (fallback model cache). */
  cacheStorage: boolean;
}

// ---------------------------------------------------------------- requests

/** Sampling and stopping parameters shared by both endpoints. */
export interface SamplingOptions {
  /** Most tokens to generate (default: until end of generation or the context
   * is full). `max_completion_tokens` is accepted as an alias. */
  max_tokens?: number | null;
  /** Alias of `max_tokens` (newer OpenAI name). */
  max_completion_tokens?: number | null;
  /** 0 is greedy (argmax); default 1. */
  temperature?: number | null;
  /** Nucleus sampling (default 1: off). */
  top_p?: number | null;
  /** Keep the K most likely tokens (default 0: off). Not in OpenAI's API. */
  top_k?: number | null;
  /** Drop tokens less likely than P times the most likely (default 0). */
  min_p?: number | null;
  /** Random seed (default: random). Same seed, same output. */
  seed?: number | null;
  /** Up to 4 strings that end generation; the output is cut before them. */
  stop?: string | string[] | null;
  /** OpenAI presence penalty (default 0). */
  presence_penalty?: number | null;
  /** OpenAI frequency penalty (default 0). */
  frequency_penalty?: number | null;
  /** llama.cpp's repetition penalty (default 1: off). */
  repetition_penalty?: number | null;
  /** Return the log-probability of each token. */
  logprobs?: boolean | null;
  /** With `logprobs`, the N most likely alternatives too (0-20). */
  top_logprobs?: number | null;
  /** Keep generating past end-of-generation tokens (benchmarks). */
  ignore_eos?: boolean;
  /** Add the generated token ids to each choice (`token_ids`), as vLLM does. */
  return_token_ids?: boolean;
  /** Ignored; for source compatibility with OpenAI clients. */
  model?: string;
  /** Ignored: usage is always sent with the last chunk. */
  stream_options?: { include_usage?: boolean } | null;
  /** Ignored; for source compatibility (one choice is generated). */
  n?: 1 | null;
}

/** One chat message. */
export interface ChatMessage {
  role: 'system' | 'developer' | 'user' | 'assistant' | (string & {});
  content: string | Array<{ type: 'text'; text: string }>;
}

/** `engine.chat.completions.create` body. */
export interface ChatCompletionRequest extends SamplingOptions {
  messages: ChatMessage[];
  stream?: boolean | null;
}

/** `engine.completions.create` body. `prompt` as token ids is used exactly
 * as given (no BOS added); as text it is tokenized like llama.cpp does. */
export interface CompletionRequest extends SamplingOptions {
  prompt: string | number[];
  stream?: boolean | null;
}

/** Second argument of `create`, as in the OpenAI SDK. */
export interface RequestOptions {
  /** Aborting ends the generation at once and frees its K/V blocks; the
   * result (or the stream's last chunk) then has `finish_reason: 'abort'`. */
  signal?: AbortSignal;
}

// --------------------------------------------------------------- responses

/** Why a generation ended: an end token or stop string (`stop`), the token
 * limit or a full context (`length`), an `AbortSignal` (`abort`), or a
 * numerical failure of the model (`error`). */
export type FinishReason = 'stop' | 'length' | 'abort' | 'error';

/** Token counts, OpenAI's shape. */
export interface CompletionUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  prompt_tokens_details: { cached_tokens: number };
}

/** Where the time went (not in OpenAI's API). */
export interface Timings {
  /** Seconds waiting for a slot. */
  queue_s: number;
  /** Seconds from the first scheduled step to the first token. */
  prefill_s: number;
  /** Seconds from the first token to the end. */
  decode_s: number;
  /** Prompt tokens computed per second (cached tokens excluded). */
  prefill_tokens_per_s: number;
  /** Tokens generated per second after the first. */
  decode_tokens_per_s: number;
}

/** Log-probabilities of a token and its alternatives, OpenAI's shape. */
export interface TokenLogprob {
  token: string;
  logprob: number;
  bytes: number[] | null;
  top_logprobs: Array<{ token: string; logprob: number; bytes: number[] | null }>;
}

/** A whole chat completion (`stream` false). */
export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{
    index: 0;
    message: { role: 'assistant'; content: string };
    finish_reason: FinishReason;
    logprobs: { content: TokenLogprob[] } | null;
    token_ids?: number[];
  }>;
  usage: CompletionUsage;
  timings: Timings;
}

/** One streamed piece of a chat completion. The last chunk has the
 * `finish_reason`, `usage` and `timings`. */
export interface ChatCompletionChunk {
  id: string;
  object: 'chat.completion.chunk';
  created: number;
  model: string;
  choices: Array<{
    index: 0;
    delta: { role?: 'assistant'; content?: string };
    finish_reason: FinishReason | null;
    logprobs: { content: TokenLogprob[] } | null;
    token_ids?: number[];
  }>;
  usage?: CompletionUsage;
  timings?: Timings;
}

/** A whole text completion (`stream` false). */
export interface Completion {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: Array<{
    index: 0;
    text: string;
    finish_reason: FinishReason;
    logprobs: { content: TokenLogprob[] } | null;
    token_ids?: number[];
  }>;
  usage: CompletionUsage;
  timings: Timings;
}

/** One streamed piece of a text completion (`object` is `text_completion`,
 * as OpenAI sends it). */
export interface CompletionChunk {
  id: string;
  object: 'text_completion';
  created: number;
  model: string;
  choices: Array<{
    index: 0;
    text: string;
    finish_reason: FinishReason | null;
    logprobs: { content: TokenLogprob[] } | null;
    token_ids?: number[];
  }>;
  usage?: CompletionUsage;
  timings?: Timings;
}

/** A stream of chunks: iterate with `for await`; `abort()` ends it as an
 * `AbortSignal` would. */
export interface ChunkStream<T> extends AsyncIterable<T> {
  abort(): void;
}

// ------------------------------------------------------------------ cache

/** A model in the browser cache. */
export interface CachedModel {
  /** The absolute URL of its first file; pass it to `Hearth.load`. */
  id: string;
  /** File name of the first part. */
  name: string;
  /** Bytes stored. */
  bytes: number;
  /** Bytes of the whole model (known once the first response came). */
  totalBytes: number;
  /** All bytes are stored (false: an interrupted download, resumable). */
  complete: boolean;
  /** Parts of a split model (1 otherwise). */
  files: number;
  /** Where it is kept. */
  storage: 'opfs' | 'cache-storage';
  /** When the download last wrote (ms since the epoch). */
  updated: number;
}

/** Storage use, from `navigator.storage.estimate()`. */
export interface CacheUsage {
  /** Bytes of cached models. */
  models: number;
  /** Bytes the origin uses in all. */
  usage: number;
  /** Bytes the origin may use. */
  quota: number;
  /** Whether the storage is persistent (not evicted under pressure). */
  persisted: boolean;
}

/** Error codes of {@link HearthError}. */
export type HearthErrorCode =
  | 'unsupported-backend' // backend 'webgpu' asked for, not available
  | 'no-acceleration' // requireAcceleration, and neither WebGPU nor threads
  | 'unsupported-model' // architecture, tensor type or file not runnable
  | 'quota-exceeded' // the model does not fit the storage quota
  | 'network' // the download failed (status, CORS, no Range support)
  | 'not-cached' // a cache id that is not in the cache, offline
  | 'aborted' // the load's AbortSignal fired
  | 'bad-request' // invalid request parameters (message says which)
  | 'unloaded' // the engine was unloaded
  | 'internal'; // anything else (message has the details)
