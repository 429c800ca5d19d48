// Requests to the worker: OpenAI-shaped bodies checked and turned into the
// engine's requests, events turned into OpenAI-shaped chunks and results.

import { HearthError } from './errors.js';
import type { EngineRequest, FinishedEvent, FromWorker, TokenEvent, ToWorker } from './protocol.js';
import type {
  ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ChunkStream, Completion, CompletionChunk,
  CompletionRequest, CompletionUsage, FinishReason, ModelInfo, RequestOptions, SamplingOptions, Timings, TokenLogprob,
} from './types.js';

/** Events of one request as they arrive from the worker. */
interface Sink {
  push(tokens: TokenEvent[], finished: FinishedEvent | null): void;
  fail(err: HearthError): void;
}

/** A number parameter: `undefined`/`null` gives `dflt`; else it must be
 * finite and within `[lo, hi]`. */
function num(body: SamplingOptions, key: keyof SamplingOptions, dflt: number, lo: number, hi: number): number {
  const v = body[key];
  if (v === undefined || v === null) return dflt;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < lo || v > hi) {
    throw new HearthError('bad-request', `${String(key)} is ${String(v)}; it must be a number from ${lo} to ${hi}`);
  }
  return v;
}

/** The engine's request for an OpenAI-shaped body. */
export function engineRequest(body: SamplingOptions, prompt: EngineRequest['prompt']): EngineRequest {
  const stop = body.stop == null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop];
  if (stop.length > 16 || stop.some((s) => typeof s !== 'string' || s.length === 0)) {
    throw new HearthError('bad-request', 'stop must be a non-empty string or an array of at most 16 of them');
  }
  const maxTokens = body.max_tokens ?? body.max_completion_tokens ?? null;
  if (maxTokens !== null && (!Number.isInteger(maxTokens) || maxTokens < 1)) {
    throw new HearthError('bad-request', `max_tokens is ${maxTokens}; ask for at least 1 token, or leave it unset`);
  }
  const topLogprobs = num(body, 'top_logprobs', 0, 0, 20);
  return {
    prompt,
    max_tokens: maxTokens,
    temperature: num(body, 'temperature', 1, 0, 2),
    top_p: num(body, 'top_p', 1, 0, 1),
    top_k: Math.floor(num(body, 'top_k', 0, 0, 1e9)),
    min_p: num(body, 'min_p', 0, 0, 1),
    repeat_penalty: num(body, 'repetition_penalty', 1, 0.01, 10),
    presence_penalty: num(body, 'presence_penalty', 0, -2, 2),
    frequency_penalty: num(body, 'frequency_penalty', 0, -2, 2),
    seed: Math.floor(num(body, 'seed', Math.floor(Math.random() * 2 ** 32), 0, Number.MAX_SAFE_INTEGER)),
    stop,
    logprobs: body.logprobs ? Math.floor(topLogprobs) : null,
    ignore_eos: body.ignore_eos ?? false,
  };
}

/** OpenAI usage and Hearth timings of a finished request. */
function usageOf(f: FinishedEvent): { usage: CompletionUsage; timings: Timings } {
  const computed = f.prompt_tokens - f.cached_tokens;
  return {
    usage: {
      prompt_tokens: f.prompt_tokens,
      completion_tokens: f.completion_tokens,
      total_tokens: f.prompt_tokens + f.completion_tokens,
      prompt_tokens_details: { cached_tokens: f.cached_tokens },
    },
    timings: {
      queue_s: f.queue_s,
      prefill_s: f.prefill_s,
      decode_s: f.decode_s,
      prefill_tokens_per_s: f.prefill_s > 0 ? computed / f.prefill_s : 0,
      decode_tokens_per_s: f.decode_s > 0 ? Math.max(0, f.completion_tokens - 1) / f.decode_s : 0,
    },
  };
}

/** OpenAI logprobs of token events, or null when none were asked for. */
function logprobsOf(tokens: TokenEvent[]): { content: TokenLogprob[] } | null {
  const content = tokens.flatMap((t) => (t.logprob ? [t.logprob] : []));
  return content.length > 0 ? { content } : null;
}

/** An async queue of chunks with `abort()`. */
class Queue<T> implements ChunkStream<T> {
  #items: T[] = [];
  #waiting: Array<(r: IteratorResult<T>) => void> = [];
  #failWaiting: Array<(e: unknown) => void> = [];
  #done = false;
  #error: unknown = null;
  readonly abort: () => void;

  constructor(abort: () => void) {
    this.abort = abort;
  }

  put(item: T): void {
    const w = this.#waiting.shift();
    this.#failWaiting.shift();
    if (w) w({ value: item, done: false });
    else this.#items.push(item);
  }

  end(error: unknown = null): void {
    this.#done = true;
    this.#error = error;
    if (error) for (const f of this.#failWaiting) f(error);
    else for (const w of this.#waiting) w({ value: undefined, done: true });
    this.#waiting = [];
    this.#failWaiting = [];
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return {
      next: () => {
        const item = this.#items.shift();
        if (item !== undefined) return Promise.resolve({ value: item, done: false });
        if (this.#done) return this.#error ? Promise.reject(this.#error) : Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve, reject) => {
          this.#waiting.push(resolve);
          this.#failWaiting.push(reject);
        });
      },
      return: () => {
        if (!this.#done) this.abort();
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }
}

/** Sends requests to the worker and routes its events back. */
export class Generator {
  readonly #worker: Worker;
  readonly #info: ModelInfo;
  #nextRid = 1;
  #sinks = new Map<number, Sink>();
  #calls = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  #dead: HearthError | null = null;

  constructor(worker: Worker, info: ModelInfo) {
    this.#worker = worker;
    this.#info = info;
    worker.addEventListener('message', (ev: MessageEvent<FromWorker>) => this.#onMessage(ev.data));
    worker.addEventListener('error', (ev) => this.#die(new HearthError('internal', `the engine's worker failed: ${ev.message}`)));
  }

  get active(): number {
    return this.#sinks.size;
  }

  get model(): string {
    return this.#info.name;
  }

  #onMessage(m: FromWorker): void {
    if (m.type === 'events') {
      const sink = this.#sinks.get(m.rid);
      if (m.finished) this.#sinks.delete(m.rid);
      sink?.push(m.tokens, m.finished);
    } else if (m.type === 'request-error') {
      const err = new HearthError(m.code, m.message);
      const sink = this.#sinks.get(m.rid);
      this.#sinks.delete(m.rid);
      sink?.fail(err);
      const call = this.#calls.get(m.rid);
      this.#calls.delete(m.rid);
      call?.reject(err);
    } else if (m.type === 'result') {
      const call = this.#calls.get(m.rid);
      this.#calls.delete(m.rid);
      call?.resolve(m.value);
    }
  }

  #die(err: HearthError): void {
    this.#dead = err;
    for (const s of this.#sinks.values()) s.fail(err);
    for (const c of this.#calls.values()) c.reject(err);
    this.#sinks.clear();
    this.#calls.clear();
  }

  terminate(): void {
    this.#worker.terminate();
    this.#die(new HearthError('unloaded', 'the engine was unloaded; load the model again'));
  }

  /** A one-shot call (tokenize, detokenize). */
  call(msg: ToWorker & { rid: number }): Promise<unknown> {
    if (this.#dead) return Promise.reject(this.#dead);
    const rid = this.#nextRid++;
    return new Promise((resolve, reject) => {
      this.#calls.set(rid, { resolve, reject });
      this.#worker.postMessage({ ...msg, rid });
    });
  }

  /** Starts a generation; `sink` gets its events. Returns its abort. */
  start(request: EngineRequest, sink: Sink, signal?: AbortSignal): () => void {
    if (this.#dead) throw this.#dead;
    const rid = this.#nextRid++;
    this.#sinks.set(rid, sink);
    const abort = () => {
      if (this.#sinks.has(rid)) this.#worker.postMessage({ type: 'abort', rid } satisfies ToWorker);
    };
    if (signal?.aborted) {
      queueMicrotask(abort);
    }
    signal?.addEventListener('abort', abort, { once: true });
    this.#worker.postMessage({ type: 'generate', rid, request } satisfies ToWorker);
    return abort;
  }
}

/** Text content of a chat message. */
function contentText(content: unknown, i: number): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.map((p: unknown) => {
      const part = p as { type?: string; text?: unknown };
      if (part?.type === 'text' && typeof part.text === 'string') return part.text;
      throw new HearthError('bad-request', `messages[${i}].content has a part of type ${String(part?.type)}; only text parts are supported`);
    }).join('');
  }
  throw new HearthError('bad-request', `messages[${i}].content must be a string or an array of text parts`);
}

type Shape = 'chat' | 'text';

/** Runs a request and shapes its output as chunks or one result. */
function run(gen: Generator, shape: Shape, body: ChatCompletionRequest | CompletionRequest, request: EngineRequest, opts?: RequestOptions): unknown {
  const id = `${shape === 'chat' ? 'chatcmpl' : 'cmpl'}-${crypto.randomUUID()}`;
  const created = Math.floor(Date.now() / 1000);
  const head = { id, created, model: body.model ?? gen.model };
  const withIds = body.return_token_ids === true;
  const choiceOf = (tokens: TokenEvent[], finish: FinishReason | null, first: boolean) => {
    const text = tokens.map((t) => t.text).join('');
    const ids = withIds ? { token_ids: tokens.map((t) => t.token) } : {};
    const logprobs = logprobsOf(tokens);
    if (shape === 'chat') {
      const delta = first ? { role: 'assistant' as const, content: text } : text ? { content: text } : {};
      return { index: 0 as const, delta, finish_reason: finish, logprobs, ...ids };
    }
    return { index: 0 as const, text, finish_reason: finish, logprobs, ...ids };
  };
  if (body.stream) {
    let first = true;
    let abort: () => void = () => {};
    const q = new Queue<ChatCompletionChunk | CompletionChunk>(() => abort());
    abort = gen.start(request, {
      push(tokens, finished) {
        if (tokens.length === 0 && !finished) return;
        const choice = choiceOf(tokens, finished ? finished.reason : null, first);
        first = false;
        const object = shape === 'chat' ? 'chat.completion.chunk' : 'text_completion';
        const extra = finished ? usageOf(finished) : {};
        q.put({ ...head, object, choices: [choice], ...extra } as ChatCompletionChunk | CompletionChunk);
        if (finished) q.end(finished.reason === 'error' ? new HearthError('internal', finished.error ?? 'generation failed') : null);
      },
      fail(err) {
        q.end(err);
      },
    }, opts?.signal);
    return q;
  }
  return new Promise((resolve, reject) => {
    const all: TokenEvent[] = [];
    gen.start(request, {
      push(tokens, finished) {
        all.push(...tokens);
        if (!finished) return;
        if (finished.reason === 'error') {
          reject(new HearthError('internal', finished.error ?? 'generation failed'));
          return;
        }
        const c = choiceOf(all, finished.reason, true) as Record<string, unknown>;
        const choice = shape === 'chat'
          ? { index: 0, message: { role: 'assistant', content: all.map((t) => t.text).join('') }, finish_reason: c.finish_reason, logprobs: c.logprobs, ...(withIds ? { token_ids: c.token_ids } : {}) }
          : c;
        resolve({ ...head, object: shape === 'chat' ? 'chat.completion' : 'text_completion', choices: [choice], ...usageOf(finished) });
      },
      fail: reject,
    }, opts?.signal);
  });
}

/** `engine.chat.completions`. */
export class ChatApi {
  readonly #gen: Generator;

  constructor(gen: Generator) {
    this.#gen = gen;
  }

  /** A chat completion: with `stream: true` a stream of chunks, else the
   * whole completion. The model's chat template renders the messages. */
  create(body: ChatCompletionRequest & { stream: true }, opts?: RequestOptions): Promise<ChunkStream<ChatCompletionChunk>>;
  create(body: ChatCompletionRequest & { stream?: false | null }, opts?: RequestOptions): Promise<ChatCompletion>;
  create(body: ChatCompletionRequest, opts?: RequestOptions): Promise<ChunkStream<ChatCompletionChunk> | ChatCompletion>;
  async create(body: ChatCompletionRequest, opts?: RequestOptions): Promise<ChunkStream<ChatCompletionChunk> | ChatCompletion> {
    if (!Array.isArray(body?.messages) || body.messages.length === 0) {
      throw new HearthError('bad-request', 'messages must be a non-empty array of { role, content }');
    }
    const chat = body.messages.map((m, i) => ({
      role: m.role === 'developer' ? 'system' : String(m.role),
      content: contentText(m.content, i),
    }));
    const request = engineRequest(body, { chat });
    return run(this.#gen, 'chat', body, request, opts) as Promise<ChatCompletion> | ChunkStream<ChatCompletionChunk>;
  }
}

/** `engine.completions`. */
export class CompletionsApi {
  readonly #gen: Generator;

  constructor(gen: Generator) {
    this.#gen = gen;
  }

  /** A text completion of `prompt` (text, or token ids used exactly). */
  create(body: CompletionRequest & { stream: true }, opts?: RequestOptions): Promise<ChunkStream<CompletionChunk>>;
  create(body: CompletionRequest & { stream?: false | null }, opts?: RequestOptions): Promise<Completion>;
  create(body: CompletionRequest, opts?: RequestOptions): Promise<ChunkStream<CompletionChunk> | Completion>;
  async create(body: CompletionRequest, opts?: RequestOptions): Promise<ChunkStream<CompletionChunk> | Completion> {
    const p = body?.prompt;
    let prompt: EngineRequest['prompt'];
    if (typeof p === 'string') prompt = { text: p };
    else if (Array.isArray(p) && p.every((t) => Number.isInteger(t) && t >= 0)) prompt = { tokens: p };
    else throw new HearthError('bad-request', 'prompt must be a string or an array of token ids');
    const request = engineRequest(body, prompt);
    return run(this.#gen, 'text', body, request, opts) as Promise<Completion> | ChunkStream<CompletionChunk>;
  }
}
