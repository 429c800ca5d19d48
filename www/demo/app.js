// Hearth demo chat page. Plain ES module, no framework: the page keeps the
// conversation as OpenAI-style messages and sends the whole list on each turn;
// the engine applies the model's chat template.
//
// Query parameters: `model=URL` preselects (and loads) a model; `autoload=0`
// only fills the field; `engine=fake` swaps in the test double from
// ./testing/fake-hearth.js (UI tests without a model; a banner says so).
import { bytes, backendLabel, explain, rate } from './format.js';

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const FAKE = query.get('engine') === 'fake';

const state = {
  /** The module exporting `Hearth` (real package or test double). */
  api: null,
  engine: null,
  /** @type {Array<{role: string, content: string}>} the conversation, system prompt excluded. */
  messages: [],
  loadCtl: null,
  genCtl: null,
};

function setMode(mode) {
  document.body.dataset.state = mode; // idle | loading | ready | generating (tests wait on it)
  const ready = mode === 'ready';
  $('prompt').disabled = !(ready || mode === 'generating');
  $('send').disabled = !ready;
  for (const b of $('suggestions').querySelectorAll('button')) b.disabled = !ready;
  $('send').hidden = mode === 'generating';
  $('stop').hidden = mode !== 'generating';
  $('prompt').placeholder = state.engine ? 'Message the model…' : 'Load a model to start';
  $('status-dot').className = 'dot ' + (mode === 'ready' ? 'ready' : mode === 'idle' ? '' : 'busy');
}

// ------------------------------------------------------------------ errors

function showError(err, context) {
  const { title, text, hint } = explain(err, context);
  $('error-title').textContent = title;
  $('error-text').textContent = text;
  $('error-hint').textContent = hint;
  $('error').hidden = false;
  console.error(context, err);
}
$('error-close').onclick = () => { $('error').hidden = true; };

// ---------------------------------------------------------------- progress

const PHASES = { download: 'Downloading', cache: 'Reading from the cache', load: 'Loading into the engine', ready: 'Ready' };
function showProgress(p) {
  $('progress').hidden = false;
  $('progress-phase').textContent = PHASES[p.phase] ?? p.phase;
  const fill = $('progress-fill');
  if (p.total > 0) {
    fill.classList.remove('indeterminate');
    fill.style.width = `${Math.min(100, (100 * p.loaded) / p.total).toFixed(1)}%`;
    const tensors = p.tensorsTotal ? ` · ${p.tensorsDone ?? 0}/${p.tensorsTotal} tensors` : '';
    $('progress-bytes').textContent = `${bytes(p.loaded)} / ${bytes(p.total)}${tensors}`;
  } else {
    fill.classList.add('indeterminate');
    $('progress-bytes').textContent = p.loaded ? bytes(p.loaded) : '';
  }
}

// ------------------------------------------------------------------- load

async function load(source, label) {
  state.loadCtl?.abort();
  state.genCtl?.abort();
  const ctl = new AbortController();
  state.loadCtl = ctl;
  $('error').hidden = true;
  $('app').classList.remove('side-open');
  setMode('loading');
  $('status-model').textContent = `Loading ${label}…`;
  $('status-backend').hidden = true;
  showProgress({ phase: 'download', loaded: 0, total: 0 });
  const old = state.engine;
  state.engine = null;
  try {
    if (old) await old.unload?.();
    const threads = Number($('threads').value) || undefined;
    const engine = await state.api.Hearth.load(source, {
      backend: $('backend').value, threads, signal: ctl.signal,
      onProgress: (p) => { if (state.loadCtl === ctl) showProgress(p); },
    });
    if (state.loadCtl !== ctl) { await engine.unload?.(); return; }
    state.engine = engine;
    const info = engine.info;
    $('status-model').textContent = info.name;
    $('status-model').title = `${info.architecture}, ${bytes(info.sizeBytes)}, context ${info.contextLength} tokens${info.fromCache ? ', from the cache' : ''}, loaded in ${info.loadSeconds.toFixed(1)} s`;
    $('status-backend').textContent = backendLabel(info);
    $('status-backend').hidden = false;
    $('progress').hidden = true;
    if (!info.hasChatTemplate) {
      showError({ code: 'no-template' }, 'load');
    }
    setMode('ready');
    $('prompt').focus();
  } catch (err) {
    if (state.loadCtl !== ctl) return;
    $('progress').hidden = true;
    $('status-model').textContent = 'No model loaded';
    setMode('idle');
    if (err?.code !== 'aborted' && err?.name !== 'AbortError') showError(err, 'load');
  } finally {
    if (state.loadCtl === ctl) state.loadCtl = null;
    refreshCache();
  }
}

$('url-form').onsubmit = (e) => {
  e.preventDefault();
  const url = $('model-url').value.trim();
  if (url) load(new URL(url, location.href).href, url.split('/').pop());
};
$('model-file').onchange = () => {
  const f = $('model-file').files?.[0];
  if (f) load(f, f.name);
  $('model-file').value = '';
};
$('cancel-load').onclick = () => {
  state.loadCtl?.abort();
  state.loadCtl = null;
  $('progress').hidden = true;
  $('status-model').textContent = 'Load cancelled (a partial download resumes next time)';
  setMode(state.engine ? 'ready' : 'idle');
};

// ------------------------------------------------------------------ cache

async function refreshCache() {
  const cache = state.api?.Hearth.cache;
  if (!cache) return;
  try {
    const [models, usage] = await Promise.all([cache.list(), cache.usage()]);
    const list = $('cache-list');
    list.replaceChildren(...models.map(cacheItem));
    $('cache-empty').hidden = models.length > 0;
    $('usage').textContent = usage.quota ? `${bytes(usage.models)} of ${bytes(usage.quota)}` : '';
  } catch (err) {
    $('cache-empty').hidden = false;
    $('cache-empty').textContent = `The cache cannot be read here (${err?.message ?? err}).`;
  }
}

function cacheItem(m) {
  const li = document.createElement('li');
  const name = document.createElement('span');
  name.className = 'name';
  name.textContent = m.name;
  name.title = m.id;
  const size = document.createElement('span');
  size.className = 'size' + (m.complete ? '' : ' partial');
  size.textContent = m.complete ? bytes(m.bytes) : `${bytes(m.bytes)} / ${bytes(m.totalBytes)}`;
  size.title = m.complete ? `in ${m.storage}` : 'partial download: Load resumes it';
  const use = document.createElement('button');
  use.className = 'btn small';
  use.textContent = m.complete ? 'Load' : 'Resume';
  use.onclick = () => { $('model-url').value = m.id; load(m.id, m.name); };
  const del = document.createElement('button');
  del.className = 'btn ghost small';
  del.textContent = 'Delete';
  del.title = `Delete ${m.name} from the browser cache`;
  del.onclick = async () => {
    try { await state.api.Hearth.cache.delete(m.id); } catch (err) { showError(err, 'cache'); }
    refreshCache();
  };
  li.append(name, size, use, del);
  return li;
}

// ------------------------------------------------------------------- chat

function addMessage(role, text) {
  $('empty').hidden = true;
  const div = document.createElement('div');
  div.className = `msg ${role}`;
  div.dataset.testid = `msg-${role}`;
  const who = document.createElement('div');
  who.className = 'role';
  who.textContent = role === 'user' ? 'You' : state.engine?.info.name ?? 'Model';
  const bubble = document.createElement('div');
  bubble.className = 'bubble';
  bubble.textContent = text;
  div.append(who, bubble);
  $('messages').append(div);
  scrollDown(true);
  return div;
}

function scrollDown(force) {
  const m = $('messages');
  if (force || m.scrollHeight - m.scrollTop - m.clientHeight < 80) m.scrollTop = m.scrollHeight;
}

function statsLine(el, parts) {
  let s = el.querySelector('.stats');
  if (!s) { s = document.createElement('div'); s.className = 'stats'; s.dataset.testid = 'stats'; el.append(s); }
  s.replaceChildren(...parts.map(([text, cls]) => {
    const span = document.createElement('span');
    span.textContent = text;
    if (cls) span.className = cls;
    return span;
  }));
}

async function send(text) {
  const engine = state.engine;
  if (!engine || !text.trim()) return;
  $('error').hidden = true;
  state.messages.push({ role: 'user', content: text });
  addMessage('user', text);
  const el = addMessage('assistant', '');
  const bubble = el.querySelector('.bubble');
  bubble.classList.add('streaming');
  const ctl = new AbortController();
  state.genCtl = ctl;
  setMode('generating');
  const system = $('system').value.trim();
  const request = {
    messages: system ? [{ role: 'system', content: system }, ...state.messages] : [...state.messages],
    stream: true,
    max_tokens: Number($('max-tokens').value) || undefined,
    temperature: Number($('temperature').value),
  };
  let answer = '';
  let pieces = 0;
  let firstAt = 0;
  let last = null;
  const t0 = performance.now();
  try {
    const stream = await engine.chat.completions.create(request, { signal: ctl.signal });
    for await (const chunk of stream) {
      const delta = chunk.choices[0]?.delta?.content ?? '';
      if (delta) {
        if (!pieces) firstAt = performance.now();
        pieces += 1;
        answer += delta;
        bubble.textContent = answer;
        const live = rate(pieces - 1, performance.now() - firstAt);
        statsLine(el, [[`first token ${((firstAt - t0) / 1000).toFixed(2)} s`], [live ? `decode ≈ ${live.toFixed(1)} tok/s` : 'decoding…']]);
        scrollDown(false);
      }
      if (chunk.choices[0]?.finish_reason || chunk.timings) last = chunk;
    }
  } catch (err) {
    if (err?.name !== 'AbortError' && err?.code !== 'aborted') showError(err, 'generate');
  } finally {
    bubble.classList.remove('streaming');
    state.genCtl = null;
  }
  finish(el, answer, last, ctl.signal.aborted);
  if (state.engine === engine) setMode('ready');
}

function finish(el, answer, last, aborted) {
  if (answer) state.messages.push({ role: 'assistant', content: answer });
  else state.messages.pop(); // nothing came back: drop the unanswered turn, keep the history valid
  if (!answer) el.querySelector('.bubble').textContent = aborted ? '(stopped before the first token)' : '(no answer)';
  const t = last?.timings;
  const u = last?.usage;
  const reason = last?.choices?.[0]?.finish_reason ?? (aborted ? 'abort' : null);
  const parts = [];
  if (t) {
    parts.push([`prefill ${t.prefill_tokens_per_s.toFixed(1)} tok/s`], [`decode ${t.decode_tokens_per_s.toFixed(1)} tok/s`]);
  }
  if (u) parts.push([`${u.prompt_tokens} prompt + ${u.completion_tokens} tokens`]);
  if (state.engine) parts.push([backendLabel(state.engine.info)]);
  if (reason === 'abort') parts.push(['stopped', 'stopped']);
  if (reason === 'length') parts.push(['cut at the token limit', 'stopped']);
  statsLine(el, parts);
}

$('composer').onsubmit = (e) => {
  e.preventDefault();
  if (document.body.dataset.state !== 'ready') return;
  const text = $('prompt').value;
  $('prompt').value = '';
  autosize();
  send(text);
};
$('prompt').addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); $('composer').requestSubmit(); }
});
function autosize() { const p = $('prompt'); p.style.height = 'auto'; p.style.height = `${Math.min(p.scrollHeight + 2, 200)}px`; }
$('prompt').addEventListener('input', autosize);
$('suggestions').onclick = (e) => {
  const b = e.target.closest('button');
  if (!b || document.body.dataset.state !== 'ready') return;
  send(b.textContent);
};
$('stop').onclick = () => state.genCtl?.abort();
document.addEventListener('keydown', (e) => { if (e.key === 'Escape') state.genCtl?.abort(); });
// A .gguf dropped anywhere on the page loads like the file picker.
document.addEventListener('dragover', (e) => { if (e.dataTransfer?.types.includes('Files')) e.preventDefault(); });
document.addEventListener('drop', (e) => {
  const f = [...(e.dataTransfer?.files ?? [])].find((x) => x.name.endsWith('.gguf'));
  if (!f) return;
  e.preventDefault();
  load(f, f.name);
});
$('new-chat').onclick = () => {
  state.genCtl?.abort();
  state.messages = [];
  $('messages').replaceChildren($('empty'));
  $('empty').hidden = false;
  $('prompt').focus();
};

// ------------------------------------------------------------ theme, layout

const THEMES = ['auto', 'light', 'dark'];
function applyTheme(t) {
  if (t === 'auto') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = t;
  $('theme').title = `Theme: ${t}`;
}
applyTheme(localStorage.getItem('hearth-theme') ?? 'auto');
$('theme').onclick = () => {
  const next = THEMES[(THEMES.indexOf(localStorage.getItem('hearth-theme') ?? 'auto') + 1) % THEMES.length];
  localStorage.setItem('hearth-theme', next);
  applyTheme(next);
};
$('toggle-side').onclick = () => $('app').classList.toggle('side-open');

// ------------------------------------------------------------------- start

async function start() {
  setMode('idle');
  try {
    state.api = FAKE ? await import('./testing/fake-hearth.js') : await import('@hearth/web');
  } catch (err) {
    showError({ code: 'no-package', cause: err }, 'start');
    return;
  }
  $('test-double').hidden = !FAKE;
  try {
    const caps = await state.api.Hearth.capabilities?.();
    if (caps) {
      $('caps').textContent = [
        caps.webgpu
          ? (caps.webgpuFallback ? `software WebGPU adapter (${caps.webgpuAdapter}): Auto runs on the CPU` : `WebGPU: ${caps.webgpuAdapter}`)
          : 'No WebGPU adapter',
        caps.threads ? `threads available (${caps.hardwareConcurrency} cores)` : 'page not cross-origin isolated: one CPU thread',
      ].join(' · ');
    }
  } catch { /* capabilities are informative only */ }
  refreshCache();
  const model = query.get('model');
  if (model) {
    const url = new URL(model, location.href).href;
    $('model-url').value = url;
    if (query.get('autoload') !== '0') load(url, url.split('/').pop());
  }
}
start();
