// A static file server for the browser tests (and the demo): the repository
// root at /, the test models at /models/, HTTP Range requests, ETags, and the
// COOP/COEP headers that make a page cross-origin isolated (threads). Paths
// under /st/ serve the same files WITHOUT those headers (a single-thread page).
//
//   node tests/browser/server.mjs [--port 8080] [--root DIR] [--models DIR]
//   import { startServer } from './server.mjs'  ->  { url, close() }

import { createServer } from 'node:http';
import { createReadStream, promises as fs } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.json': 'application/json',
  '.map': 'application/json',
  '.wasm': 'application/wasm',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ts': 'text/plain; charset=utf-8',
  '.gguf': 'application/octet-stream',
};

/** The file a URL path names, or null when it escapes the roots. */
function resolve(urlPath, root, models) {
  const clean = decodeURIComponent(urlPath.split('?')[0]);
  const [base, rel] = clean.startsWith('/models/') ? [models, clean.slice('/models/'.length)] : [root, clean.slice(1)];
  const file = path.resolve(base, rel);
  return file === base || file.startsWith(base + path.sep) ? file : null;
}

/** Starts the server; resolves to `{ url, port, close }`. */
export function startServer({ port = 0, host = '127.0.0.1', root = repo, models = process.env.HEARTH_MODELS ?? path.join(repo, '.cache/models'), log = false } = {}) {
  const server = createServer(async (req, res) => {
    let urlPath = req.url ?? '/';
    const isolated = !urlPath.startsWith('/st/');
    if (!isolated) urlPath = urlPath.slice(3);
    if (isolated) {
      res.setHeader('Cross-Origin-Opener-Policy', 'same-origin');
      res.setHeader('Cross-Origin-Embedder-Policy', 'require-corp');
    }
    res.setHeader('Cross-Origin-Resource-Policy', 'same-origin');
    res.setHeader('Accept-Ranges', 'bytes');
    let file = resolve(urlPath, root, models);
    try {
      if (!file) throw new Error('outside the roots');
      let st = await fs.stat(file);
      if (st.isDirectory()) {
        file = path.join(file, 'index.html');
        st = await fs.stat(file);
      }
      const etag = `"${st.size.toString(16)}-${Math.floor(st.mtimeMs).toString(16)}"`;
      res.setHeader('ETag', etag);
      res.setHeader('Content-Type', TYPES[path.extname(file)] ?? 'application/octet-stream');
      // Code may come from the HTTP cache (the offline test); models never
      // do: the package stores them itself.
      res.setHeader('Cache-Control', file.endsWith('.gguf') ? 'no-store' : 'max-age=600');
      const range = /^bytes=(\d*)-(\d*)$/.exec(req.headers.range ?? '');
      let start = 0;
      let end = st.size - 1;
      if (range && (range[1] !== '' || range[2] !== '')) {
        if (range[1] === '') {
          start = Math.max(0, st.size - Number(range[2]));
        } else {
          start = Number(range[1]);
          if (range[2] !== '') end = Math.min(end, Number(range[2]));
        }
        if (start > end || start >= st.size) {
          res.writeHead(416, { 'Content-Range': `bytes */${st.size}` });
          res.end();
          return;
        }
        res.writeHead(206, { 'Content-Range': `bytes ${start}-${end}/${st.size}`, 'Content-Length': end - start + 1 });
      } else {
        res.writeHead(200, { 'Content-Length': st.size });
      }
      if (log) console.log(req.method, req.url, req.headers.range ?? '', res.statusCode);
      if (req.method === 'HEAD' || st.size === 0) {
        res.end();
        return;
      }
      createReadStream(file, { start, end }).pipe(res);
    } catch {
      res.writeHead(404, { 'Content-Type': 'text/plain' });
      res.end(`not found: ${urlPath}\n`);
    }
  });
  const sockets = new Set();
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  return new Promise((resolveStart, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      const { port: p } = server.address();
      resolveStart({
        port: p,
        url: `http://${host}:${p}`,
        close: () => new Promise((r) => {
          for (const s of sockets) s.destroy();
          server.close(() => r());
        }),
      });
    });
  });
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const arg = (name, dflt) => {
    const i = process.argv.indexOf(`--${name}`);
    return i > 0 ? process.argv[i + 1] : dflt;
  };
  const s = await startServer({
    port: Number(arg('port', 8080)),
    root: path.resolve(arg('root', repo)),
    models: path.resolve(arg('models', process.env.HEARTH_MODELS ?? path.join(repo, '.cache/models'))),
    log: process.argv.includes('--log'),
  });
  console.log(`serving ${arg('root', repo)} at ${s.url}/ (COOP/COEP on; /st/... without), models at ${s.url}/models/`);
}
