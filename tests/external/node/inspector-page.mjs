// The stream inspector's pages in headless Chromium, driven over the DevTools protocol (with `ws`), for
// tests/inspector.rs: node inspector-page.mjs CHROMIUM ADMIN_ORIGIN TOKEN
//
// Opens /debug/streams as a browser would (sent to the token form, the token typed in once, the cookie kept), waits
// for a live stream in the list, opens its page and samples both columns while the run streams, then waits for its
// end. Prints one JSON line: what the page showed, every request the page made, every console error, exception or
// CSP violation. Chromium is killed with its whole process group at the end.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import WebSocket from 'ws';

const [chromium, origin, token] = process.argv.slice(2);
const profile = mkdtempSync(join(tmpdir(), 'sse-gw-inspector-'));
const browser = spawn(chromium, [
  '--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-quic', '--no-first-run',
  '--no-default-browser-check', '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--disable-extensions', '--disable-background-timer-throttling', '--disable-renderer-backgrounding',
  '--disable-backgrounding-occluded-windows', '--no-proxy-server', '--remote-debugging-address=127.0.0.1',
  '--remote-debugging-port=0', `--user-data-dir=${profile}`, 'about:blank',
], { detached: true, stdio: ['ignore', 'ignore', 'pipe'] });

function quit(code) {
  try { process.kill(-browser.pid, 'SIGKILL'); } catch { /* gone */ }
  try { rmSync(profile, { recursive: true, force: true }); } catch { /* kept */ }
  process.exit(code);
}
setTimeout(() => { console.error('inspector-page: out of time'); quit(3); }, 60000).unref();

const wsUrl = await new Promise((resolve, reject) => {
  let err = '';
  browser.stderr.on('data', (d) => {
    err += d;
    const m = err.match(/DevTools listening on (ws:\/\/\S+)/);
    if (m) resolve(m[1]);
  });
  browser.on('exit', () => reject(new Error(`chromium exited: ${err}`)));
});

const ws = new WebSocket(wsUrl);
await new Promise((r) => ws.once('open', r));
let nextId = 1;
const pending = new Map();
const errors = [];
const requests = [];
let sessionId;
ws.on('message', (raw) => {
  const m = JSON.parse(raw);
  if (m.id && pending.has(m.id)) {
    const { resolve, reject } = pending.get(m.id);
    pending.delete(m.id);
    if (m.error) reject(new Error(JSON.stringify(m.error)));
    else resolve(m.result);
    return;
  }
  if (m.sessionId !== sessionId) return;
  const p = m.params || {};
  switch (m.method) {
    case 'Runtime.consoleAPICalled':
      if (p.type === 'error' || p.type === 'assert' || p.type === 'warning') {
        errors.push(`console.${p.type}: ${(p.args || []).map((a) => a.value ?? a.description).join(' ')}`);
      }
      break;
    case 'Runtime.exceptionThrown':
      errors.push(`exception: ${p.exceptionDetails?.exception?.description ?? p.exceptionDetails?.text}`);
      break;
    case 'Log.entryAdded':
      // Failed loads, CSP violations, and whatever else Chromium logs as an error.
      if (p.entry.level === 'error' || p.entry.level === 'warning') errors.push(`log.${p.entry.level}: ${p.entry.text} ${p.entry.url ?? ''}`);
      break;
    case 'Network.requestWillBeSent':
      requests.push(p.request.url);
      break;
    default:
  }
});
function send(method, params = {}, session = sessionId) {
  const id = nextId++;
  ws.send(JSON.stringify({ id, method, params, ...(session ? { sessionId: session } : {}) }));
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function evaluate(expression) {
  const r = await send('Runtime.evaluate', { expression, returnByValue: true, awaitPromise: true });
  if (r.exceptionDetails) throw new Error(`evaluate ${expression}: ${r.exceptionDetails.text}`);
  return r.result.value;
}
async function until(what, expression, ms = 20000) {
  const deadline = Date.now() + ms;
  for (;;) {
    let v;
    try { v = await evaluate(expression); } catch { v = undefined; }
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

const out = {};
try {
  const { targetId } = await send('Target.createTarget', { url: 'about:blank' }, undefined);
  ({ sessionId } = await send('Target.attachToTarget', { targetId, flatten: true }, undefined));
  for (const domain of ['Runtime', 'Log', 'Network', 'Page']) await send(`${domain}.enable`);

  // The list, as a browser opens it: sent to the form, the token typed once, back on the list with a cookie.
  await send('Page.navigate', { url: `${origin}/debug/streams` });
  out.form = await until('the token form', `location.pathname === '/debug/login' && !!document.querySelector('form input[name=token]') && location.pathname`);
  await evaluate(`document.querySelector('input[name=token]').value = ${JSON.stringify(token)}; document.querySelector('form').submit(); true`);
  await until('the list', `location.pathname === '/debug/streams' && document.body && document.body.dataset.view === 'list'`);
  out.cookieVisibleToScript = await evaluate('document.cookie');
  const live = await until('a live stream listed', `(() => { const tr = [...document.querySelectorAll('#streams tr')].find((r) => r.children[1] && r.children[1].textContent === 'live'); return tr ? tr.dataset.id : ''; })()`);
  out.listed = live;

  // Its page: both columns, growing while the run streams.
  await evaluate(`document.querySelector('#streams tr[data-id="${live}"] a').click(); true`);
  await until('the stream page', `document.body && document.body.dataset.view === 'stream' && Number(document.body.dataset.envelopes || 0) > 0 && Number(document.body.dataset.raw || 0) > 0`);
  const sample = `({ raw: document.querySelectorAll('#raw .rec.raw').length, envelopes: document.querySelectorAll('#env .rec.envelope').length, links: document.querySelectorAll('#env a[href^="#raw-"]').length, ended: document.body.dataset.ended === 'true' })`;
  out.first = await evaluate(sample);
  await sleep(1500);
  out.second = await evaluate(sample);
  await until('the end of the run', `document.body.dataset.ended === 'true'`, 30000);
  await sleep(300);
  out.last = await evaluate(sample);
  out.summary = await evaluate(`document.getElementById('summary').textContent`);
  out.firstEnvelope = await evaluate(`(document.querySelector('#env .rec.envelope') || {}).textContent || ''`);
} catch (e) {
  out.failure = String(e && e.stack || e);
}
out.errors = errors;
out.requests = requests;
console.log(JSON.stringify(out));
ws.close();
quit(0);
