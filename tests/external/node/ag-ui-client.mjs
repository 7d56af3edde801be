// Runs a scripted conversation through @ag-ui/client's HttpAgent (with the client's own enforceEvents schema check
// and verifyEvents order rules, both always on) against a gateway path speaking AG-UI 1.0 (DESIGN §5.3).
// Usage: node ag-ui-client.mjs --url <agent url, e.g. http://127.0.0.1:PORT/agui> --script <json file>
// Script: {threadId?, turns: [{text}], frontendTools: {<toolName>: <output> | {"error": "..."}}, forwardedProps?,
//          maxRuns? (default 10)}
//   - one HttpAgent, one threadId; each turn adds a user message and runs the agent with the frontend tools
//     declared in `tools`;
//   - a run that finishes with pending frontend tool calls (RUN_FINISHED outcome.pendingToolCallIds, or, failing
//     that, calls in the messages with no result whose names are frontend tools) gets one `tool` message per call
//     (content: the output as JSON, or the error text with `error` set) and the agent runs again;
//   - more than maxRuns runs fails (the re-run loop).
// Prints one JSON line: {messages, events: [[event types of run 1], ...], errors: [client errors: verify, schema,
// HTTP], runErrors: [{message, code}] (RUN_ERROR events), warnings: [what the client stripped or dropped, from its
// console.warn], runs, pending: [[tool call ids answered after run i]]}.
// Exit 1 when the client failed (anything in `errors`: verifyEvents, the schema check (`schema: <path>: <message>`),
// the transport, or, checked here since the client accepts it, a stream that ends without RUN_FINISHED/RUN_ERROR),
// on too many runs or after 30 s; 0 otherwise (a RUN_ERROR is a finding in `runErrors`, not a failure).
import { randomUUID } from 'node:crypto';
import { HttpAgent } from '@ag-ui/client';
import { urlAndScript } from './args.mjs';

const { url, script } = urlAndScript('node ag-ui-client.mjs --url <agent url> --script <json file>');
const frontendTools = script.frontendTools ?? {};
const maxRuns = script.maxRuns ?? 10;
const TIMEOUT_MS = 30000;

const out = { messages: [], events: [], errors: [], runErrors: [], warnings: [], runs: 0, pending: [] };
// The client reports what it strips (unknown fields) and drops (unknown event types) with console.warn.
const warn = console.warn.bind(console);
console.warn = (...a) => {
  out.warnings.push(a.map(String).join(' '));
  warn(...a);
};

const agent = new HttpAgent({ url, threadId: script.threadId ?? `thread-${randomUUID()}` });
function print() {
  out.messages = agent.messages;
  process.stdout.write(JSON.stringify(out) + '\n');
}
function fail(message) {
  console.error(`ag-ui-client: ${message}`);
  print();
  process.exit(1);
}
setTimeout(() => fail(`timed out after ${TIMEOUT_MS} ms`), TIMEOUT_MS).unref();

const tools = Object.keys(frontendTools).map((name) => ({
  name,
  description: `frontend tool ${name}`,
  parameters: { type: 'object', properties: {} },
}));

// Tool calls in the thread that no tool message answers, keyed by id: {id, name}.
function unanswered() {
  const answered = new Set(agent.messages.filter((m) => m.role === 'tool').map((m) => m.toolCallId));
  const calls = [];
  for (const m of agent.messages) {
    for (const tc of m.role === 'assistant' ? m.toolCalls ?? [] : []) {
      if (!answered.has(tc.id)) calls.push({ id: tc.id, name: tc.function?.name });
    }
  }
  return calls;
}

// A schema failure is a ZodError whose message is its issues as JSON: shortened to `schema: <path>: <message>`.
function describe(e) {
  const msg = String(e?.message ?? e);
  try {
    const issues = JSON.parse(msg);
    if (Array.isArray(issues) && issues.every((i) => i && Array.isArray(i.path))) {
      return 'schema: ' + issues.map((i) => `${i.path.join('.') || '(event)'}: ${i.message}`).join('; ');
    }
  } catch {}
  return msg;
}

async function run() {
  if (out.runs >= maxRuns) fail(`more than maxRuns=${maxRuns} runs: the client keeps re-running`);
  out.runs += 1;
  const types = [];
  out.events.push(types);
  let finished = null;
  try {
    await agent.runAgent(
      { runId: `run-${randomUUID()}`, tools, context: [], forwardedProps: script.forwardedProps },
      {
        onEvent: ({ event }) => {
          types.push(event.type);
        },
        onRunErrorEvent: ({ event }) => {
          out.runErrors.push({ message: event.message, code: event.code ?? null });
        },
        onRunFinishedEvent: (p) => {
          finished = p;
        },
      },
    );
  } catch (e) {
    out.errors.push(describe(e));
    return false;
  }
  if (out.runErrors.length) return false;
  // The client itself accepts a stream that just stops; the protocol ends a run with RUN_FINISHED or RUN_ERROR.
  if (types[types.length - 1] !== 'RUN_FINISHED') {
    out.errors.push(`the stream ended without RUN_FINISHED or RUN_ERROR (checked by this script, not by the client); last event: ${types[types.length - 1]}`);
    return false;
  }
  // The calls to answer: those the run names as pending, else those left without a result; only the page's tools.
  const open = unanswered();
  const byId = new Map(open.map((c) => [c.id, c]));
  let ids = finished?.outcome === 'success' && finished.pendingToolCallIds?.length ? finished.pendingToolCallIds : open.map((c) => c.id);
  ids = ids.filter((id) => byId.has(id) && Object.prototype.hasOwnProperty.call(frontendTools, byId.get(id).name));
  if (ids.length === 0) return true;
  out.pending.push(ids);
  for (const id of ids) {
    const answer = frontendTools[byId.get(id).name];
    const isError = answer && typeof answer === 'object' && !Array.isArray(answer) && Object.keys(answer).length === 1 && typeof answer.error === 'string';
    agent.addMessage(
      isError
        ? { id: `tool-${randomUUID()}`, role: 'tool', toolCallId: id, content: answer.error, error: answer.error }
        : { id: `tool-${randomUUID()}`, role: 'tool', toolCallId: id, content: JSON.stringify(answer) },
    );
  }
  return run();
}

for (const turn of script.turns ?? []) {
  agent.addMessage({ id: `user-${randomUUID()}`, role: 'user', content: turn.text });
  if (!(await run())) break;
}
print();
process.exit(out.errors.length ? 1 : 0);
