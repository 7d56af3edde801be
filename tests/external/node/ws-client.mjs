// Reads a socket of sse-gateway (docs/WEBSOCKET.md) with the npm package `ws` and prints what happened, one JSON
// object per line: {event:"open",protocol}, {event:"message",data}, {event:"cut"}, {event:"close",code,reason},
// {event:"refused",status,body}, {event:"error",message}, {event:"timeout"}.
// Usage: WS_OPTS='{…}' node ws-client.mjs URL, where WS_OPTS may hold: protocols (list), origin, headers (object),
// sendOnOpen (texts sent once open), sendAfter ([{after: n, data}]: sent after the n-th message), cutAfter (n: the
// connection dropped after the n-th message, no close handshake), timeoutMs (default 20000).
import WebSocket from 'ws';

const url = process.argv[2];
const opts = JSON.parse(process.env.WS_OPTS || '{}');
const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const ws = new WebSocket(url, opts.protocols || [], {
  origin: opts.origin,
  headers: opts.headers || {},
  maxPayload: 64 << 20,
});
const timer = setTimeout(() => {
  out({ event: 'timeout' });
  process.exit(0);
}, opts.timeoutMs || 20000);
let n = 0;
ws.on('unexpected-response', (_req, res) => {
  let body = '';
  res.on('data', (c) => (body += c));
  res.on('end', () => {
    out({ event: 'refused', status: res.statusCode, body });
    process.exit(0);
  });
});
ws.on('open', () => {
  out({ event: 'open', protocol: ws.protocol });
  for (const text of opts.sendOnOpen || []) ws.send(text);
});
ws.on('message', (data, isBinary) => {
  n += 1;
  out({ event: 'message', data: isBinary ? null : data.toString('utf8') });
  for (const s of (opts.sendAfter || []).filter((s) => s.after === n)) ws.send(s.data);
  if (opts.cutAfter === n) {
    out({ event: 'cut' });
    ws.terminate();
    clearTimeout(timer);
    process.exit(0);
  }
});
ws.on('close', (code, reason) => {
  out({ event: 'close', code, reason: reason.toString('utf8') });
  clearTimeout(timer);
});
ws.on('error', (e) => out({ event: 'error', message: String(e && e.message) }));
