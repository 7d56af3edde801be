// What a test page saw, reported to the test (tests/resume_clients.rs) with one POST /report on the page's
// origin: {done, reason, events: [{t, id, data, retry}], opens: [{t, status, stream}], errors, notes}, and what a
// page adds with put(key, value).
// The page ends on `[DONE]`, or when it gives up (the `timeout_ms` query parameter, default 25000).
export function collector() {
  const started = performance.now();
  const t = () => Math.round(performance.now() - started);
  const report = { done: false, reason: '', events: [], opens: [], errors: [], notes: [] };
  let sent = false;
  const c = {
    open(status, stream) {
      report.opens.push({ t: t(), status, stream });
    },
    message(id, data, retry) {
      report.events.push({ t: t(), id, data, retry });
    },
    error(what) {
      report.errors.push(`${t()} ms: ${what}`);
    },
    note(what) {
      report.notes.push(`${t()} ms: ${what}`);
    },
    put(key, value) {
      report[key] = value;
    },
    get finished() {
      return sent;
    },
    finish(done, reason) {
      if (sent) return;
      sent = true;
      report.done = done;
      report.reason = reason || '';
      fetch('/report', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(report),
      }).catch((e) => console.error(`report failed: ${e}`));
    },
  };
  window.addEventListener('error', (e) => c.error(`page error: ${e.message}`));
  window.addEventListener('unhandledrejection', (e) => c.error(`unhandled rejection: ${e.reason}`));
  const timeout = Number(new URLSearchParams(location.search).get('timeout_ms') || 25000);
  setTimeout(() => c.finish(false, `the page gave up after ${timeout} ms without [DONE]`), timeout);
  return c;
}

// A tab the page hides and shows itself, through the DOM fetch-event-source reads (document.hidden,
// visibilityState, a `visibilitychange` event on document): `hideThenShow()` hides it for 700 ms, noting both on `c`.
export function tab(c) {
  let hidden = false;
  Object.defineProperty(document, 'hidden', { configurable: true, get: () => hidden });
  Object.defineProperty(document, 'visibilityState', {
    configurable: true,
    get: () => (hidden ? 'hidden' : 'visible'),
  });
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  async function hideThenShow() {
    hidden = true;
    c.note('tab hidden');
    document.dispatchEvent(new Event('visibilitychange'));
    await sleep(700);
    hidden = false;
    c.note('tab shown');
    document.dispatchEvent(new Event('visibilitychange'));
  }
  return { hideThenShow };
}

// fetch-event-source's `onopen` check: an OK text/event-stream response, or a `Fatal` error naming what came instead
// (a page's `onerror` rethrows it, so that the library gives up rather than retrying).
export class Fatal extends Error {}
export async function expectEventStream(res) {
  const type = res.headers.get('content-type') || '';
  if (!res.ok || !type.startsWith('text/event-stream')) {
    throw new Fatal(`HTTP ${res.status} ${type}: ${await res.text()}`);
  }
}
