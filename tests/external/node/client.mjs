// Reads a translated stream from sse-gateway with the eventsource-parser package and prints each event's
// data, one per line. Usage: node client.mjs URL
import { createParser } from 'eventsource-parser';

const url = process.argv[2];
const res = await fetch(url, {
  method: 'POST',
  headers: { 'content-type': 'application/json', accept: 'text/event-stream' },
  body: '{}',
});
if (!res.ok) {
  console.error(`HTTP ${res.status}`);
  process.exit(1);
}
const parser = createParser({ onEvent: (event) => process.stdout.write(event.data + '\n') });
const decoder = new TextDecoder();
for await (const chunk of res.body) {
  parser.feed(decoder.decode(chunk, { stream: true }));
}
