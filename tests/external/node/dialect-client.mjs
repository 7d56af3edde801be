// Reads translated streams from sse-gateway as the legacy web app does: @microsoft/fetch-event-source POSTs the
// run (its own SSE parser: getBytes → getLines → getMessages), and each message's data is JSON.parse'd into an
// envelope unless it is [DONE]. Prints one JSON line per URL: {url, status, envelopes, done, error}.
// Usage: node dialect-client.mjs AGENT_ID URL... (tests/dialects_e2e.rs)
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { fetchEventSource } = require('@microsoft/fetch-event-source');

// The library is written for a page: it reads `window` for its timers and `document` for the tab's visibility
// (openWhenHidden: true keeps it from listening; dispose() still unregisters).
globalThis.window = globalThis;
globalThis.document = { hidden: false, addEventListener() {}, removeEventListener() {} };

async function read(agent, url) {
  const got = { url, status: 0, envelopes: [], done: false, error: null };
  try {
    await fetchEventSource(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-agent-id': agent },
      body: '{}',
      openWhenHidden: true,
      async onopen(res) {
        got.status = res.status;
        const type = res.headers.get('content-type') || '';
        if (!res.ok || !type.startsWith('text/event-stream')) {
          throw new Error(`not an event stream: ${res.status} ${type}`);
        }
      },
      onmessage(ev) {
        if (ev.data === '[DONE]') {
          got.done = true;
          return;
        }
        if (got.done) {
          throw new Error(`data after [DONE]: ${ev.data}`);
        }
        got.envelopes.push(JSON.parse(ev.data));
      },
      onerror(err) {
        // No retry: a failure is the test's finding.
        throw err;
      },
    });
  } catch (e) {
    got.error = `${e}`;
  }
  return got;
}

const [agent, ...urls] = process.argv.slice(2);
for (const url of urls) {
  process.stdout.write(JSON.stringify(await read(agent, url)) + '\n');
}
