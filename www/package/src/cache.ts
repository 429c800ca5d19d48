// The model cache: OPFS (a directory per model, one file per split), or
// Cache Storage (16 MiB chunk entries) where OPFS is missing. A model's id is
// the absolute URL of its first file. Downloads are resumable: the bytes
// already stored are the prefix a `Range` request continues from.

import type { CachedModel, CacheUsage } from './types.js';

const DIR = 'hearth-models';
const CACHE_NAME = 'hearth-models';
/** Bytes per Cache Storage entry. */
export const CHUNK = 16 << 20;

/** What the cache knows of a model. */
export interface ModelMeta {
  id: string;
  urls: string[];
  /** Total bytes of each file (0 when not yet known). */
  sizes: number[];
  /** `ETag` (or `Last-Modified`) of each file: a change restarts its download. */
  tags: string[];
  complete: boolean;
  updated: number;
}

/** A readable file: `{ size, read(offset, length) }`, what the wasm loader takes. */
export interface Reader {
  size: number;
  read(offset: number, length: number): Promise<Uint8Array>;
}

/** A reader over a Blob (a File, an OPFS file): reads only the asked range. */
export function blobReader(blob: Blob): Reader {
  return {
    size: blob.size,
    read: async (offset, length) => new Uint8Array(await blob.slice(offset, offset + length).arrayBuffer()),
  };
}

/** Hex SHA-256 of `text`: a safe directory / key name for a URL. */
export async function keyOf(id: string): Promise<string> {
  const d = await crypto.subtle.digest('SHA-256', new TextEncoder().encode(id));
  return [...new Uint8Array(d)].map((b) => b.toString(16).padStart(2, '0')).join('').slice(0, 32);
}

function hasOpfs(): boolean {
  return typeof navigator !== 'undefined' && typeof navigator.storage?.getDirectory === 'function';
}

function hasCaches(): boolean {
  return typeof caches !== 'undefined';
}

/** Where a model's bytes are kept. */
export interface Store {
  readonly kind: 'opfs' | 'cache-storage';
  meta(): Promise<ModelMeta | null>;
  writeMeta(meta: ModelMeta): Promise<void>;
  /** Bytes of file `i` stored so far (the resumable prefix). */
  stored(i: number): Promise<number>;
  /** Drops file `i`'s bytes (its remote copy changed). */
  reset(i: number): Promise<void>;
  /** Appends `data` to file `i` (at its stored length). */
  append(i: number, data: Uint8Array): Promise<void>;
  /** Writes pending data (called at the end and before a pause). */
  flush(i: number): Promise<void>;
  /** The stored bytes of file `i` as a Blob. */
  blob(i: number): Promise<Blob>;
  remove(): Promise<void>;
}

async function opfsRoot(): Promise<FileSystemDirectoryHandle> {
  const root = await navigator.storage.getDirectory();
  return root.getDirectoryHandle(DIR, { create: true });
}

/** A synchronous OPFS handle (dedicated workers only). */
interface SyncHandle {
  write(data: Uint8Array, opts: { at: number }): number;
  getSize(): number;
  truncate(size: number): void;
  flush(): void;
  close(): void;
}

/** OPFS: `hearth-models/<key>/meta.json` and `part-<i>.gguf`. In a worker
 * the download writes through a sync access handle (in place, fast); on the
 * page `createWritable` (which copies the file, so it batches writes). */
async function opfsStore(key: string): Promise<Store> {
  const dir = await (await opfsRoot()).getDirectoryHandle(key, { create: true });
  const part = (i: number) => dir.getFileHandle(`part-${i}.gguf`, { create: true });
  const canSync = typeof (FileSystemFileHandle.prototype as { createSyncAccessHandle?: unknown }).createSyncAccessHandle === 'function';
  const handles = new Map<number, SyncHandle>();
  const pending = new Map<number, Uint8Array[]>();
  const pendingBytes = new Map<number, number>();
  const sync = async (i: number): Promise<SyncHandle> => {
    let h = handles.get(i);
    if (!h) {
      const fh = (await part(i)) as unknown as { createSyncAccessHandle(): Promise<SyncHandle> };
      h = await fh.createSyncAccessHandle();
      handles.set(i, h);
    }
    return h;
  };
  const closeSync = (i: number) => {
    const h = handles.get(i);
    if (h) {
      h.flush();
      h.close();
      handles.delete(i);
    }
  };
  const write = async (i: number, truncate: boolean) => {
    const chunks = pending.get(i) ?? [];
    const handle = await part(i);
    const at = truncate ? 0 : (await handle.getFile()).size;
    const w = await handle.createWritable({ keepExistingData: !truncate });
    if (chunks.length > 0) await w.write({ type: 'write', position: at, data: new Blob(chunks as BlobPart[]) });
    await w.close();
    pending.set(i, []);
    pendingBytes.set(i, 0);
  };
  return {
    kind: 'opfs',
    async meta() {
      try {
        const f = await (await dir.getFileHandle('meta.json')).getFile();
        return JSON.parse(await f.text()) as ModelMeta;
      } catch {
        return null;
      }
    },
    async writeMeta(meta) {
      const w = await (await dir.getFileHandle('meta.json', { create: true })).createWritable();
      await w.write(JSON.stringify(meta));
      await w.close();
    },
    async stored(i) {
      const h = handles.get(i);
      if (h) return h.getSize();
      return (await (await part(i)).getFile()).size + (pendingBytes.get(i) ?? 0);
    },
    async reset(i) {
      closeSync(i);
      pending.set(i, []);
      await write(i, true);
    },
    async append(i, data) {
      if (canSync) {
        const h = await sync(i);
        h.write(data, { at: h.getSize() });
        return;
      }
      const list = pending.get(i) ?? [];
      list.push(data);
      pending.set(i, list);
      const n = (pendingBytes.get(i) ?? 0) + data.length;
      pendingBytes.set(i, n);
      if (n >= 32 << 20) await write(i, false);
    },
    async flush(i) {
      closeSync(i);
      if ((pendingBytes.get(i) ?? 0) > 0) await write(i, false);
    },
    async blob(i) {
      closeSync(i);
      return (await part(i)).getFile();
    },
    async remove() {
      for (const i of [...handles.keys()]) closeSync(i);
      await (await opfsRoot()).removeEntry(key, { recursive: true });
    },
  };
}

/** Cache Storage: `https://hearth.invalid/<key>/meta` and `/<key>/<i>/<chunk>`
 * entries of CHUNK bytes (the last may be shorter). */
async function cacheStore(key: string): Promise<Store> {
  const cache = await caches.open(CACHE_NAME);
  const url = (path: string) => `https://hearth.invalid/${key}/${path}`;
  const buffers = new Map<number, Uint8Array[]>();
  const sizes = new Map<number, number>();
  const chunkCount = async (i: number) => {
    const keys = await cache.keys();
    return keys.filter((r) => r.url.startsWith(url(`${i}/`))).length;
  };
  const storedFull = async (i: number) => {
    let n = 0;
    let total = 0;
    for (;;) {
      const r = await cache.match(url(`${i}/${n}`));
      if (!r) return total;
      total += Number(r.headers.get('content-length') ?? (await r.clone().blob()).size);
      n += 1;
    }
  };
  const put = async (i: number, force: boolean) => {
    const list = buffers.get(i) ?? [];
    const have = list.reduce((a, b) => a + b.length, 0);
    if (have === 0 || (!force && have < CHUNK)) return;
    const blob = new Blob(list as BlobPart[]);
    const n = await chunkCount(i);
    let off = 0;
    for (let c = n; off < blob.size && (force || blob.size - off >= CHUNK); c++) {
      const piece = blob.slice(off, off + CHUNK);
      await cache.put(url(`${i}/${c}`), new Response(piece, { headers: { 'content-length': String(piece.size) } }));
      off += piece.size;
    }
    buffers.set(i, off < blob.size ? [new Uint8Array(await blob.slice(off).arrayBuffer())] : []);
  };
  return {
    kind: 'cache-storage',
    async meta() {
      const r = await cache.match(url('meta'));
      return r ? ((await r.json()) as ModelMeta) : null;
    },
    async writeMeta(meta) {
      await cache.put(url('meta'), new Response(JSON.stringify(meta)));
    },
    async stored(i) {
      // Only whole chunks survive a reload: a partial last chunk is
      // stored only at the end of the file.
      const base = sizes.get(i) ?? (await storedFull(i));
      sizes.set(i, base);
      const pend = (buffers.get(i) ?? []).reduce((a, b) => a + b.length, 0);
      return base + pend;
    },
    async reset(i) {
      for (const r of await cache.keys()) if (r.url.startsWith(url(`${i}/`))) await cache.delete(r);
      buffers.set(i, []);
      sizes.set(i, 0);
    },
    async append(i, data) {
      const list = buffers.get(i) ?? [];
      list.push(data);
      buffers.set(i, list);
      await put(i, false);
    },
    async flush(i) {
      await put(i, true);
    },
    async blob(i) {
      const parts: Blob[] = [];
      for (let c = 0; ; c++) {
        const r = await cache.match(url(`${i}/${c}`));
        if (!r) break;
        parts.push(await r.blob());
      }
      return new Blob(parts);
    },
    async remove() {
      for (const r of await cache.keys()) if (r.url.startsWith(url(''))) await cache.delete(r);
    },
  };
}

/** The store of model `id`: OPFS when the browser has it, else Cache Storage;
 * null when neither exists. */
export async function storeFor(id: string): Promise<Store | null> {
  const key = await keyOf(id);
  if (hasOpfs()) {
    try {
      return await opfsStore(key);
    } catch {
      // OPFS can be present but refused (private windows): fall back.
    }
  }
  return hasCaches() ? cacheStore(key) : null;
}

/** Metas of every cached model, with where they are. */
async function allMetas(): Promise<Array<{ meta: ModelMeta; store: Store }>> {
  const out: Array<{ meta: ModelMeta; store: Store }> = [];
  if (hasOpfs()) {
    try {
      const root = await opfsRoot();
      for await (const [key, handle] of (root as unknown as AsyncIterable<[string, FileSystemHandle]>)) {
        if (handle.kind !== 'directory') continue;
        const store = await opfsStore(key);
        const meta = await store.meta();
        if (meta) out.push({ meta, store });
      }
    } catch {
      // No OPFS access: only Cache Storage below.
    }
  }
  if (hasCaches()) {
    const cache = await caches.open(CACHE_NAME);
    for (const r of await cache.keys()) {
      const m = /^https:\/\/hearth\.invalid\/([0-9a-f]+)\/meta$/.exec(r.url);
      if (!m) continue;
      const store = await cacheStore(m[1]!);
      const meta = await store.meta();
      if (meta) out.push({ meta, store });
    }
  }
  return out;
}

/** The browser cache of models. */
export interface CacheApi {
  /** Models in the cache, complete or partly downloaded. */
  list(): Promise<CachedModel[]>;
  /** Whether model `id` (its URL) is completely cached. */
  has(id: string | URL): Promise<boolean>;
  /** Deletes model `id` (its URL); false when it was not cached. */
  delete(id: string | URL): Promise<boolean>;
  /** Deletes every cached model. */
  clear(): Promise<void>;
  /** Bytes of cached models, and the origin's usage against its quota. */
  usage(): Promise<CacheUsage>;
  /** Asks the browser not to evict the cache under storage pressure. */
  persist(): Promise<boolean>;
}

async function describe(meta: ModelMeta, store: Store): Promise<CachedModel> {
  let bytes = 0;
  for (let i = 0; i < meta.urls.length; i++) bytes += await store.stored(i);
  return {
    id: meta.id,
    name: decodeURIComponent(new URL(meta.id).pathname.split('/').pop() ?? meta.id),
    bytes,
    totalBytes: meta.sizes.reduce((a, b) => a + b, 0),
    complete: meta.complete,
    files: meta.urls.length,
    storage: store.kind,
    updated: meta.updated,
  };
}

const abs = (id: string | URL) => new URL(String(id), globalThis.location?.href).href;

export const cacheApi: CacheApi = {
  async list() {
    const all = await allMetas();
    return Promise.all(all.map(({ meta, store }) => describe(meta, store)));
  },
  async has(id) {
    const store = await storeFor(abs(id));
    return (await store?.meta())?.complete === true;
  },
  async delete(id) {
    const target = abs(id);
    let found = false;
    for (const { meta, store } of await allMetas()) {
      if (meta.id === target) {
        await store.remove();
        found = true;
      }
    }
    return found;
  },
  async clear() {
    for (const { store } of await allMetas()) await store.remove();
  },
  async usage() {
    const models = (await cacheApi.list()).reduce((a, m) => a + m.bytes, 0);
    const est = await navigator.storage?.estimate?.() ?? {};
    const persisted = (await navigator.storage?.persisted?.()) ?? false;
    return { models, usage: est.usage ?? 0, quota: est.quota ?? 0, persisted };
  },
  async persist() {
    return (await navigator.storage?.persist?.()) ?? false;
  },
};
