// Static server for `make bench-browser`, bound to 127.0.0.1, with the
// COOP/COEP/CORP headers that make the page cross-origin isolated
// (SharedArrayBuffer, hence threads, for both engines). Answers HTTP Range.
//
// Adapted from the wllama-bench harness (server.mjs of the wllama anchor
// measurements, 2026-11-29): same headers and Range handling, routes changed
// to mount several roots and several models.
//
//   startServer({ roots: { '/prefix/': dir, ... }, files: { '/path': file }, index })
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.mjs': 'text/javascript',
  '.css': 'text/css', '.svg': 'image/svg+xml', '.png': 'image/png',
  '.wasm': 'application/wasm', '.json': 'application/json', '.map': 'application/json',
  '.gguf': 'application/octet-stream',
};

function resolve(p, roots, files) {
  if (files[p]) return files[p];
  // Longest prefix first so '/a/b/' wins over '/a/'.
  const pres = Object.keys(roots).sort((a, b) => b.length - a.length);
  for (const pre of pres) {
    if (!p.startsWith(pre)) continue;
    const dir = path.resolve(roots[pre]);
    const f = path.resolve(dir, '.' + p.slice(pre.length - 1));
    if (f === dir || f.startsWith(dir + path.sep)) return f;
  }
  return null;
}

/** Serves `roots` (URL prefix ending in '/' -> directory) and `files` (URL ->
 * file); '/' answers `index` when given. Resolves to { server, port, url }. */
export function startServer({ roots = {}, files = {}, index = null, port = 0, log = false } = {}) {
  const server = http.createServer((req, res) => {
    let p;
    try { p = decodeURIComponent(req.url.split('?')[0]); } catch { p = '/'; }
    if (p.endsWith('/') && index && p === '/') p = index;
    let file = resolve(p, roots, files);
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
    if (m) {
      if (m[1] === '') start = Math.max(0, st.size - Number(m[2]));
      else { start = Number(m[1]); if (m[2] !== '') end = Math.min(Number(m[2]), st.size - 1); }
      if (start > end) { res.writeHead(416, { ...h, 'Content-Range': `bytes */${st.size}` }); res.end(); return; }
      code = 206; h['Content-Range'] = `bytes ${start}-${end}/${st.size}`;
    }
    h['Content-Length'] = end - start + 1;
    res.writeHead(code, h);
    if (log) console.error(`[server] ${req.method} ${p} ${code}`);
    if (req.method === 'HEAD') { res.end(); return; }
    fs.createReadStream(file, { start, end }).pipe(res);
  });
  return new Promise((ok, fail) => {
    server.once('error', fail);
    server.listen(port, '127.0.0.1', () => {
      const port = server.address().port;
      ok({ server, port, url: `http://127.0.0.1:${port}` });
    });
  });
}
