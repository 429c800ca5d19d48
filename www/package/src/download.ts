// Fetching a model by URL into the cache with HTTP Range requests, resuming
// where a previous download stopped, and readers over the stored bytes.

import { HearthError } from './errors.js';
import { blobReader, storeFor, type ModelMeta, type Reader, type Store } from './cache.js';
import type { LoadProgress } from './types.js';

/** `name-00001-of-00003.gguf` -> the three URLs; any other URL -> itself. */
export function splitUrls(url: string): string[] {
  const u = new URL(url);
  const m = /^(.*)-(\d{5})-of-(\d{5})\.gguf$/.exec(u.pathname);
  if (!m) return [url];
  const count = Number(m[3]);
  if (Number(m[2]) !== 1) {
    throw new HearthError('bad-request', `${url} is part ${Number(m[2])} of a split model; pass the URL of part 1 (-00001-of-${m[3]}.gguf)`);
  }
  return Array.from({ length: count }, (_, i) => {
    const v = new URL(url);
    v.pathname = `${m[1]}-${String(i + 1).padStart(5, '0')}-of-${m[3]}.gguf`;
    return v.href;
  });
}

/** A server answer that is not what a Range download needs. */
function httpError(url: string, res: Response): HearthError {
  return new HearthError('network', `GET ${url} answered ${res.status} ${res.statusText}; check the URL (and CORS headers for another origin)`);
}

/** Total size and version tag of `url`, from a one-byte Range request. */
async function probe(url: string, signal: AbortSignal): Promise<{ size: number; tag: string; ranges: boolean }> {
  let res: Response;
  try {
    res = await fetch(url, { headers: { Range: 'bytes=0-0' }, signal, cache: 'no-store' });
  } catch (e) {
    if (signal.aborted) throw new HearthError('aborted', 'the load was aborted');
    throw new HearthError('network', `cannot reach ${url}: ${(e as Error).message}`);
  }
  if (!res.ok) throw httpError(url, res);
  const tag = res.headers.get('etag') ?? res.headers.get('last-modified') ?? '';
  const range = /\/(\d+)$/.exec(res.headers.get('content-range') ?? '');
  await res.body?.cancel();
  if (res.status === 206 && range) return { size: Number(range[1]), tag, ranges: true };
  const len = Number(res.headers.get('content-length') ?? NaN);
  return { size: Number.isFinite(len) ? len : 0, tag, ranges: false };
}

/** A reader of `url` through Range requests (headers before the download). */
function rangeReader(url: string, size: number, signal: AbortSignal): Reader {
  return {
    size,
    async read(offset, length) {
      const res = await fetch(url, { headers: { Range: `bytes=${offset}-${offset + length - 1}` }, signal, cache: 'no-store' });
      if (res.status !== 206) throw httpError(url, res);
      return new Uint8Array(await res.arrayBuffer());
    },
  };
}

/** Reads at least this long come from one streamed response, not a request each. */
const STREAM_MIN_READ = 1 << 20;

/**
 * A reader of `url` for a load that does not keep the model (`cache: false`):
 * the loader reads tensors in file order, so large reads are served from one
 * streamed response (`Range: bytes=N-`) as its bytes arrive, and the model is
 * never whole in memory: only the bytes since the last read's start are kept
 * (the loader may read back into its previous chunk). Small reads (headers)
 * and reads behind that window are Range requests of their own.
 */
function streamReader(url: string, size: number, signal: AbortSignal, onBytes: (n: number) => void): Reader {
  const ranged = rangeReader(url, size, signal);
  let body: ReadableStreamDefaultReader<Uint8Array> | null = null;
  /** File offset of the next byte the response gives. */
  let pos = 0;
  /** The bytes just before `pos` that a later read may ask again. */
  let kept = new Uint8Array(0);
  const open = async (offset: number) => {
    await body?.cancel().catch(() => {});
    const res = await fetch(url, { headers: { Range: `bytes=${offset}-` }, signal, cache: 'no-store' });
    if (res.status !== 206 || !res.body) throw httpError(url, res);
    body = res.body.getReader();
    pos = offset;
    kept = new Uint8Array(0);
  };
  return {
    size,
    async read(offset, length) {
      if (length < STREAM_MIN_READ || (body && offset < pos - kept.length)) return ranged.read(offset, length);
      // Far ahead (tensors the loader skips): a new request beats reading through.
      if (!body || offset > pos + 8 * STREAM_MIN_READ) await open(offset);
      const parts: Uint8Array[] = offset < pos ? [kept.subarray(offset - (pos - kept.length))] : [];
      let have = parts[0]?.length ?? 0;
      while (have < length) {
        const { done, value } = await body!.read();
        if (done) throw new HearthError('network', `${url} ended at byte ${pos} of ${size}; load again`);
        onBytes(value.length);
        const from = Math.max(0, offset - pos);
        pos += value.length;
        if (from < value.length) {
          parts.push(value.subarray(from));
          have += value.length - from;
        }
      }
      // Kept from this read's start on: the loader's next read starts there or later.
      kept = new Uint8Array(have);
      let at = 0;
      for (const p of parts) {
        kept.set(p, at);
        at += p.length;
      }
      return kept.subarray(0, length);
    },
  };
}

/** Reads from the stored prefix where it covers the range, else the network. */
function prefixReader(stored: Blob, remote: Reader): Reader {
  return {
    size: remote.size,
    read: (offset, length) => (offset + length <= stored.size ? blobReader(stored).read(offset, length) : remote.read(offset, length)),
  };
}

/** Streams the rest of file `i` into `store`. */
async function fetchRest(store: Store, i: number, url: string, size: number, signal: AbortSignal, onBytes: (n: number) => void): Promise<void> {
  let have = await store.stored(i);
  if (have >= size) return;
  let res: Response;
  try {
    res = await fetch(url, { headers: have > 0 ? { Range: `bytes=${have}-` } : {}, signal, cache: 'no-store' });
  } catch (e) {
    if (signal.aborted) throw new HearthError('aborted', 'the download was aborted; it resumes on the next load');
    throw new HearthError('network', `download of ${url} failed at byte ${have}: ${(e as Error).message}; load again to resume`);
  }
  if (!res.ok || !res.body) throw httpError(url, res);
  if (have > 0 && res.status !== 206) {
    // The server ignored the Range: start over.
    await store.reset(i);
    have = 0;
  }
  const reader = res.body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      await store.append(i, value);
      onBytes(value.length);
    }
  } catch (e) {
    await store.flush(i).catch(() => {});
    if (signal.aborted) throw new HearthError('aborted', 'the download was aborted; it resumes on the next load');
    throw HearthError.from(e).code === 'quota-exceeded'
      ? HearthError.from(e)
      : new HearthError('network', `download of ${url} broke off: ${(e as Error).message}; load again to resume`);
  }
  await store.flush(i);
  const got = await store.stored(i);
  if (got !== size) {
    throw new HearthError('network', `${url}: stored ${got} bytes but the file has ${size}; load again to resume`);
  }
}

/** What `openUrl` needs from its caller. */
export interface OpenUrlOptions {
  cache: boolean;
  signal: AbortSignal;
  progress: (p: LoadProgress) => void;
  /** Checks the model from its headers before the tensors are downloaded;
   * rejects for a model this build cannot run. */
  inspect: (readers: Reader[]) => Promise<void>;
}

/** Readers over model `url` (all its splits), downloading what the cache lacks. */
export async function openUrl(url: string, o: OpenUrlOptions): Promise<{ readers: Reader[]; fromCache: boolean; size: number }> {
  const urls = splitUrls(url);
  const store = o.cache ? await storeFor(url) : null;
  const meta = await store?.meta();
  if (store && meta?.complete) {
    const blobs = await Promise.all(urls.map((_, i) => store.blob(i)));
    if (blobs.every((b, i) => b.size === meta.sizes[i])) {
      const size = blobs.reduce((a, b) => a + b.size, 0);
      o.progress({ phase: 'cache', loaded: size, total: size });
      return { readers: blobs.map(blobReader), fromCache: true, size };
    }
  }
  let probes;
  try {
    probes = await Promise.all(urls.map((u) => probe(u, o.signal)));
  } catch (e) {
    const err = HearthError.from(e);
    if (err.code === 'network' && meta) {
      throw new HearthError('not-cached', `${url} is only partly cached and the server cannot be reached (${err.message}); reconnect and load again to resume`);
    }
    throw err;
  }
  const size = probes.reduce((a, p) => a + p.size, 0);
  const ranges = probes.every((p) => p.ranges && p.size > 0);
  if (!store && ranges) {
    // No cache: the loader reads the model as it streams in.
    await o.inspect(probes.map((p, i) => rangeReader(urls[i]!, p.size, o.signal)));
    let done = 0;
    let last = 0;
    const onBytes = (n: number) => {
      done += n;
      const now = performance.now();
      if (now - last > 100 || done === size) {
        last = now;
        o.progress({ phase: 'download', loaded: done, total: size });
      }
    };
    return { readers: probes.map((p, i) => streamReader(urls[i]!, p.size, o.signal, onBytes)), fromCache: false, size };
  }
  if (!store || !ranges) {
    // A server without Range: plain download into memory.
    return { readers: await fetchWhole(urls, size, o), fromCache: false, size };
  }
  const fresh: ModelMeta = { id: url, urls, sizes: probes.map((p) => p.size), tags: probes.map((p) => p.tag), complete: false, updated: Date.now() };
  for (let i = 0; i < urls.length; i++) {
    // A changed remote file (size or tag) invalidates what was stored.
    if (!meta || meta.sizes[i] !== fresh.sizes[i] || meta.tags[i] !== fresh.tags[i]) await store.reset(i);
  }
  let have = 0;
  for (let i = 0; i < urls.length; i++) have += await store.stored(i);
  const est = await navigator.storage?.estimate?.();
  if (est?.quota !== undefined && est.usage !== undefined && est.quota - est.usage < size - have) {
    throw new HearthError('quota-exceeded', `the model needs ${fmt(size - have)} more but the browser allows only ${fmt(est.quota - est.usage)} more for this site; delete cached models (Hearth.cache) or free disk space`);
  }
  await store.writeMeta(fresh);
  const stored = await Promise.all(urls.map((_, i) => store.blob(i)));
  await o.inspect(probes.map((p, i) => prefixReader(stored[i]!, rangeReader(urls[i]!, p.size, o.signal))));
  let done = have;
  o.progress({ phase: 'download', loaded: done, total: size });
  let last = 0;
  for (let i = 0; i < urls.length; i++) {
    await fetchRest(store, i, urls[i]!, fresh.sizes[i]!, o.signal, (n) => {
      done += n;
      const now = performance.now();
      if (now - last > 100 || done === size) {
        last = now;
        o.progress({ phase: 'download', loaded: done, total: size });
      }
    });
  }
  await store.writeMeta({ ...fresh, complete: true, updated: Date.now() });
  const blobs = await Promise.all(urls.map((_, i) => store.blob(i)));
  return { readers: blobs.map(blobReader), fromCache: false, size };
}

/** Downloads every file into memory (no cache). */
async function fetchWhole(urls: string[], size: number, o: OpenUrlOptions): Promise<Reader[]> {
  let done = 0;
  const out: Reader[] = [];
  for (const u of urls) {
    const res = await fetch(u, { signal: o.signal });
    if (!res.ok || !res.body) throw httpError(u, res);
    const parts: Uint8Array[] = [];
    const r = res.body.getReader();
    for (;;) {
      const { done: end, value } = await r.read();
      if (end) break;
      parts.push(value);
      done += value.length;
      o.progress({ phase: 'download', loaded: done, total: size || done });
    }
    out.push(blobReader(new Blob(parts as BlobPart[])));
  }
  return out;
}

/** `1234567` -> `1.2 MB`. */
function fmt(bytes: number): string {
  const units = ['B', 'kB', 'MB', 'GB', 'TB'];
  let v = bytes;
  let u = 0;
  while (v >= 1000 && u < units.length - 1) {
    v /= 1000;
    u++;
  }
  return `${v.toFixed(u === 0 ? 0 : 1)} ${units[u]}`;
}
