// Static server for `make demo` and `make bench-browser`, bound to
// 127.0.0.1: the repository root at /, the models at /models/, HTTP Range,
// and the COOP/COEP/CORP headers that make a page cross-origin isolated
// (SharedArrayBuffer, hence threads). Same interface as
// tests/browser/server.mjs, which it gives way to once that one is shared.
//
// Adapted from the wllama-bench harness (server.mjs of the wllama anchor
// measurements, 2026-11-29): same headers and Range handling.
//
//   startServer({ port, root, models }) -> { url, port, close() }
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.mjs': 'text/javascript',
  '.css': 'text/css', '.svg': 'image/svg+xml', '.png': 'image/png',
  '.wasm': 'application/wasm', '.json': 'application/json', '.map': 'application/json',
  '.gguf': 'application/octet-stream',
};

/** The file a URL path names, or null when it escapes its root. */
function resolve(p, root, models) {
  const [base, rel] = p.startsWith('/models/') ? [models, p.slice('/models/'.length)] : [root, p.slice(1)];
  const f = path.resolve(base, rel);
  return f === base || f.startsWith(base + path.sep) ? f : null;
}

/** Serves `root` at / and `models` at /models/. */
export function startServer({ port = 0, root = REPO, models = process.env.HEARTH_MODELS ?? path.join(REPO, '.cache/models'), log = false } = {}) {
  root = path.resolve(root);
  models = path.resolve(models);
  const server = http.createServer((req, res) => {
    let p;
    try { p = decodeURIComponent(req.url.split('?')[0]); } catch { p = '/'; }
    let file = resolve(p, root, models);
    let st = null;
    try { st = file && fs.statSync(file); } catch { st = null; }
    if (st && st.isDirectory()) {
      file = path.join(file, 'index.html');
      try { st = fs.statSync(file); } catch { st = null; }
    }
    const h = {
      'Cache-Control': 'no-store',
      'Cross-Origin-Opener-Policy': 'same-origin',
      'Cross-Origin-Embedder-Policy': 'require-corp',
      'Cross-Origin-Resource-Policy': 'same-origin',
    };
    if (!st || !st.isFile()) { res.writeHead(404, h); res.end('not found'); return; }
    h['Content-Type'] = TYPES[path.extname(file)] || 'application/octet-stream';
    h['Accept-Ranges'] = 'bytes';
    let start = 0, end = st.size - 1, code = 200;
    const m = /^bytes=(\d*)-(\d*)$/.exec(req.headers.range || '');
    if (m && (m[1] !== '' || m[2] !== '')) {
      if (m[1] === '') start = Math.max(0, st.size - Number(m[2]));
      else { start = Number(m[1]); if (m[2] !== '') end = Math.min(Number(m[2]), st.size - 1); }
      if (start > end) { res.writeHead(416, { ...h, 'Content-Range': `bytes */${st.size}` }); res.end(); return; }
      code = 206; h['Content-Range'] = `bytes ${start}-${end}/${st.size}`;
    }
    h['Content-Length'] = end - start + 1;
    res.writeHead(code, h);
    if (log) console.error(`[server] ${req.method} ${p} ${code}`);
    if (req.method === 'HEAD' || st.size === 0) { res.end(); return; }
    fs.createReadStream(file, { start, end }).pipe(res);
  });
  const sockets = new Set();
  server.on('connection', (s) => { sockets.add(s); s.on('close', () => sockets.delete(s)); });
  return new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(port, '127.0.0.1', () => {
      const p = server.address().port;
      ok({
        port: p, url: `http://127.0.0.1:${p}`,
        close: () => new Promise((r) => { for (const s of sockets) s.destroy(); server.close(() => r()); }),
      });
    });
  });
}
