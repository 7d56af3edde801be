// A stand-in for the gateway's frontend outputs (DESIGN §5.3), to check ai-sdk-client.mjs, ag-ui-client.mjs and the
// useChat page (tests/external/browser/use-chat/) without the gateway: hand-written, valid streams of both protocols.
// Usage: node mock-frontend-server.mjs [--port N] [--pace-ms N]   (prints {"port": N} once listening)
//   POST /api/chat                 AI SDK UI message stream v1 (x-vercel-ai-ui-message-stream: v1, data: [DONE] last)
//   GET  /api/chat/<chat id>/stream  the chat's running stream replayed from its start; 204 when none is running
//   POST /agui                     AG-UI 1.0 events (RunAgentInput in, no [DONE])
//   GET  /requests                 what the server was sent: [{method, path, body}]
//   GET  /page                     the built use-chat page (tests/external/browser/use-chat/dist/index.html), if built
//   POST /report                   what the page reports (kept; GET /report returns the last one)
// A path may start with /v/<variant> to get a deliberately odd stream (see VARIANTS_AI and VARIANTS_AGUI): the
// findings in README-frontends.md were observed with them. CORS: any origin is allowed (the page may be served
// from another origin).
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { opt } from './args.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const PORT = Number(opt('--port', 0));
const PACE = Number(opt('--pace-ms', 15));
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const requests = [];
let lastReport = null;
// chat id -> {chunks: [string], done: boolean}: what the chat's current response has written so far.
const running = new Map();

const gw = (agent, extra = {}) => ({ gateway: { agent, ...extra } });

// ---- AI SDK -------------------------------------------------------------------------------------------------------
function aiFirstTurn(n) {
  const m = `msg-a${n}`;
  return [
    { type: 'start', messageId: m, messageMetadata: { agent: 'root', agent_uuid: 'agent-1' } },
    { type: 'start-step' },
    { type: 'reasoning-start', id: `r${n}`, providerMetadata: gw('root') },
    { type: 'reasoning-delta', id: `r${n}`, delta: 'Let me think.' },
    { type: 'reasoning-end', id: `r${n}` },
    { type: 'text-start', id: `t${n}a`, providerMetadata: gw('root') },
    { type: 'text-delta', id: `t${n}a`, delta: 'Hello ' },
    { type: 'text-delta', id: `t${n}a`, delta: 'there.' },
    { type: 'text-end', id: `t${n}a` },
    // A backend-run tool of the legacy app: dynamic, not providerExecuted.
    { type: 'tool-input-start', toolCallId: `call-search-${n}`, toolName: 'search', dynamic: true, providerMetadata: gw('root') },
    { type: 'tool-input-delta', toolCallId: `call-search-${n}`, inputTextDelta: '{"q":' },
    { type: 'tool-input-delta', toolCallId: `call-search-${n}`, inputTextDelta: '"paris"}' },
    { type: 'tool-input-available', toolCallId: `call-search-${n}`, toolName: 'search', input: { q: 'paris' }, dynamic: true, providerMetadata: gw('root') },
    { type: 'tool-output-available', toolCallId: `call-search-${n}`, output: { hits: 2 }, dynamic: true, providerMetadata: gw('root') },
    // A server tool (the model provider ran it).
    { type: 'tool-input-start', toolCallId: `srv-${n}`, toolName: 'web_fetch', dynamic: true, providerExecuted: true },
    { type: 'tool-input-available', toolCallId: `srv-${n}`, toolName: 'web_fetch', input: { url: 'https://example.com/paris' }, dynamic: true, providerExecuted: true, providerMetadata: gw('root') },
    { type: 'tool-output-available', toolCallId: `srv-${n}`, output: 'Paris is the capital of France.', dynamic: true, providerExecuted: true },
    { type: 'source-url', sourceId: `src-${n}`, url: 'https://example.com/paris', title: 'Paris', providerMetadata: gw('root', { cited_text: 'capital of France' }) },
    { type: 'source-document', sourceId: `doc-${n}`, mediaType: 'text/plain', title: 'Notes', providerMetadata: gw('root') },
    // A subagent starts, and writes.
    { type: 'data-agent', id: 'sub-1', data: { agent: 'sub-1', parent: 'root', meta_init: { name: 'researcher' } } },
    { type: 'text-start', id: `t${n}s`, providerMetadata: gw('sub-1') },
    { type: 'text-delta', id: `t${n}s`, delta: 'Subagent says hi.' },
    { type: 'text-end', id: `t${n}s` },
    { type: 'finish-step' },
    // The next model turn: asks the page's tool, and ends the turn.
    { type: 'start-step' },
    { type: 'text-start', id: `t${n}b`, providerMetadata: gw('root') },
    { type: 'text-delta', id: `t${n}b`, delta: 'Where are you?' },
    { type: 'text-end', id: `t${n}b` },
    { type: 'tool-input-start', toolCallId: `call-loc-${n}`, toolName: 'get_location', dynamic: true, providerMetadata: gw('root') },
    { type: 'tool-input-available', toolCallId: `call-loc-${n}`, toolName: 'get_location', input: {}, dynamic: true, providerMetadata: gw('root') },
    { type: 'data-awaiting-frontend-tools', id: `await-${n}`, data: { tool_use_ids: [`call-loc-${n}`] } },
    { type: 'finish-step' },
    { type: 'finish', finishReason: 'tool-calls' },
  ];
}

function aiContinuation(messageId, answer) {
  return [
    { type: 'start', messageId },
    { type: 'start-step' },
    { type: 'text-start', id: `${messageId}-c`, providerMetadata: gw('root') },
    { type: 'text-delta', id: `${messageId}-c`, delta: `Got ${JSON.stringify(answer)}.` },
    { type: 'text-end', id: `${messageId}-c` },
    { type: 'finish-step' },
    { type: 'finish', finishReason: 'stop', messageMetadata: { agent: 'root', agent_uuid: 'agent-1' } },
  ];
}

function aiPlainTurn(n, text) {
  return [
    { type: 'start', messageId: `msg-a${n}`, messageMetadata: { agent: 'root', agent_uuid: 'agent-1' } },
    { type: 'start-step' },
    { type: 'text-start', id: `t${n}` },
    { type: 'text-delta', id: `t${n}`, delta: `You said: ${text}` },
    { type: 'text-end', id: `t${n}` },
    { type: 'finish-step' },
    { type: 'finish', finishReason: 'stop' },
  ];
}

const base = [
  { type: 'start', messageId: 'msg-v' },
  { type: 'start-step' },
  { type: 'text-start', id: 'tv' },
  { type: 'text-delta', id: 'tv', delta: 'before ' },
];
const VARIANTS_AI = {
  // An `error` chunk mid-text, more content after it.
  error: [...base, { type: 'error', errorText: 'boom' }, { type: 'text-delta', id: 'tv', delta: 'after' }, { type: 'text-end', id: 'tv' }, { type: 'finish-step' }, { type: 'finish', finishReason: 'stop' }],
  // A delta without its start.
  'orphan-delta': [{ type: 'start', messageId: 'msg-v' }, { type: 'start-step' }, { type: 'text-delta', id: 'nope', delta: 'x' }, { type: 'finish' }],
  // finish without finish-step, no [DONE] (the stream just ends).
  'no-finish-step': [...base, { type: 'text-end', id: 'tv' }, { type: 'finish', finishReason: 'stop' }],
  // A chunk type v5 does not know.
  custom: [...base, { type: 'text-end', id: 'tv' }, { type: 'custom', kind: 'gateway.x' }, { type: 'finish-step' }, { type: 'finish' }],
  // finishReason names v7 dropped ("unknown") / added ("interrupted").
  'finish-unknown': [...base, { type: 'text-end', id: 'tv' }, { type: 'finish-step' }, { type: 'finish', finishReason: 'unknown' }],
  'finish-interrupted': [...base, { type: 'text-end', id: 'tv' }, { type: 'finish-step' }, { type: 'finish', finishReason: 'interrupted' }],
  // tool-output-available for a dynamic call, without `dynamic: true`.
  'output-no-dynamic': [{ type: 'start', messageId: 'msg-v' }, { type: 'start-step' }, { type: 'tool-input-available', toolCallId: 'c1', toolName: 'search', input: {}, dynamic: true }, { type: 'tool-output-available', toolCallId: 'c1', output: 1 }, { type: 'finish-step' }, { type: 'finish' }],
  // A tool output whose call was never sent.
  'output-no-call': [{ type: 'start', messageId: 'msg-v' }, { type: 'start-step' }, { type: 'tool-output-available', toolCallId: 'zz', output: 1, dynamic: true }, { type: 'finish' }],
  // A text part that spans a finish-step/start-step.
  'text-across-steps': [...base, { type: 'finish-step' }, { type: 'start-step' }, { type: 'text-delta', id: 'tv', delta: 'after' }, { type: 'text-end', id: 'tv' }, { type: 'finish-step' }, { type: 'finish' }],
  // A data part without an id, a transient one, one with extra fields, and one updated in place by id.
  data: [...base, { type: 'text-end', id: 'tv' }, { type: 'data-x', data: 1 }, { type: 'data-x', data: 2 }, { type: 'data-t', data: 't', transient: true }, { type: 'data-y', id: 'y', data: 'old', providerMetadata: gw('root') }, { type: 'data-y', id: 'y', data: 'new' }, { type: 'finish-step' }, { type: 'finish' }],
  // A backend-run tool (not providerExecuted) alone in the last step, finish stop: the re-post loop.
  'backend-tool-one-step': [{ type: 'start', messageId: 'msg-v' }, { type: 'start-step' }, { type: 'tool-input-available', toolCallId: 'b1', toolName: 'search', input: {}, dynamic: true }, { type: 'tool-output-available', toolCallId: 'b1', output: 1, dynamic: true }, { type: 'text-start', id: 'tv' }, { type: 'text-delta', id: 'tv', delta: 'done' }, { type: 'text-end', id: 'tv' }, { type: 'finish-step' }, { type: 'finish', finishReason: 'stop' }],
  // The same, with an empty step before finish: the last step then holds no tool part.
  'backend-tool-trailing-step': [{ type: 'start', messageId: 'msg-v' }, { type: 'start-step' }, { type: 'tool-input-available', toolCallId: 'b1', toolName: 'search', input: {}, dynamic: true }, { type: 'tool-output-available', toolCallId: 'b1', output: 1, dynamic: true }, { type: 'finish-step' }, { type: 'start-step' }, { type: 'finish', finishReason: 'stop' }],
  // ... and with messageMetadata on that finish (which writes the message, trailing step included).
  'backend-tool-trailing-step-meta': [{ type: 'start', messageId: 'msg-v' }, { type: 'start-step' }, { type: 'tool-input-available', toolCallId: 'b1', toolName: 'search', input: {}, dynamic: true }, { type: 'tool-output-available', toolCallId: 'b1', output: 1, dynamic: true }, { type: 'finish-step' }, { type: 'start-step' }, { type: 'finish', finishReason: 'stop', messageMetadata: { agent: 'root' } }],
  // A field that is not in the schema's shape (strictness check), and a wrongly typed documented field.
  'extra-field': [...base, { type: 'text-end', id: 'tv', gatewayExtra: 1 }, { type: 'finish-step' }, { type: 'finish' }],
  'bad-field-type': [...base, { type: 'text-end', id: 'tv' }, { type: 'source-url', sourceId: 's', url: 'u', title: 5 }, { type: 'finish' }],
};

async function aiChat(req, res, body, variant) {
  const origin = req.headers.origin;
  let chunks;
  const lastRole = body?.messages?.[body.messages.length - 1]?.role;
  if (variant === 'new-id-continuation' || variant === 'no-id-continuation') {
    // A frontend tool call, then a continuation whose `start` names another message id, or none.
    chunks = lastRole === 'assistant' ? aiContinuation(variant === 'no-id-continuation' ? undefined : 'other-id', 'x') : aiFirstTurn(1);
  } else if (variant) {
    chunks = VARIANTS_AI[variant];
    if (!chunks) return answer(res, 404, { error: `no variant ${variant}` }, origin);
  } else {
    if (!body || typeof body.id !== 'string' || !Array.isArray(body.messages) || typeof body.trigger !== 'string') {
      return answer(res, 400, { error: 'body must be {id, messages, trigger, messageId?}' }, origin);
    }
    const last = body.messages[body.messages.length - 1];
    const userTurns = body.messages.filter((m) => m.role === 'user').length;
    if (last && last.role === 'assistant') {
      const answered = last.parts.find((p) => (p.type === 'dynamic-tool' ? p.toolName : p.type.slice(5)) === 'get_location' && (p.state === 'output-available' || p.state === 'output-error'));
      chunks = aiContinuation(last.id, answered ? answered.output ?? { error: answered.errorText } : null);
    } else {
      const text = (last?.parts || []).filter((p) => p.type === 'text').map((p) => p.text).join('');
      chunks = userTurns === 1 ? aiFirstTurn(userTurns) : aiPlainTurn(userTurns, text);
    }
  }
  const lines = chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`);
  if (!variant || variant !== 'no-finish-step') lines.push('data: [DONE]\n\n');
  const rec = { chunks: [], done: false };
  if (body && typeof body.id === 'string') running.set(body.id, rec);
  res.writeHead(200, {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    'x-vercel-ai-ui-message-stream': 'v1',
    ...cors(origin),
  });
  let open = true;
  res.on('close', () => (open = false));
  // Written to the record whether or not the client still reads (the gateway keeps a run going for a resume).
  for (const l of lines) {
    await sleep(PACE);
    rec.chunks.push(l);
    if (open) res.write(l);
  }
  rec.done = true;
  if (open) res.end();
}

async function aiResume(req, res, chatId) {
  const origin = req.headers.origin;
  const rec = running.get(chatId);
  if (!rec || rec.done) {
    res.writeHead(204, cors(origin));
    return res.end();
  }
  res.writeHead(200, { 'content-type': 'text/event-stream', 'x-vercel-ai-ui-message-stream': 'v1', ...cors(origin) });
  let i = 0;
  while (true) {
    while (i < rec.chunks.length) res.write(rec.chunks[i++]);
    if (rec.done) break;
    await sleep(5);
  }
  res.end();
}

// ---- AG-UI --------------------------------------------------------------------------------------------------------
let runSeq = 0;
function aguiRun(input, variant) {
  const n = ++runSeq;
  const { threadId, runId } = input;
  const started = { type: 'RUN_STARTED', threadId, runId };
  const fin = (outcome) => ({ type: 'RUN_FINISHED', threadId, runId, outcome });
  if (variant) {
    const V = {
      'content-before-start': [started, { type: 'TEXT_MESSAGE_CONTENT', messageId: 'x', delta: 'a' }, fin({ type: 'success' })],
      'finish-open-message': [started, { type: 'TEXT_MESSAGE_START', messageId: `x${n}`, role: 'assistant' }, fin({ type: 'success' })],
      'finish-open-subagent': [started, { type: 'SUBAGENT_STARTED', subagentRunId: `s${n}`, name: 'sub' }, fin({ type: 'success' })],
      'custom-no-value': [started, { type: 'CUSTOM', name: 'meta_final' }, fin({ type: 'success' })],
      'custom-null-value': [started, { type: 'CUSTOM', name: 'meta_final', value: null }, fin({ type: 'success' })],
      'unknown-event': [started, { type: 'GATEWAY_THING', value: 1 }, fin({ type: 'success' })],
      'extra-field': [started, { type: 'TEXT_MESSAGE_START', messageId: `x${n}`, role: 'assistant', agent: 'root' }, { type: 'TEXT_MESSAGE_CONTENT', messageId: `x${n}`, delta: 'a', metadata: { agent: 'root' } }, { type: 'TEXT_MESSAGE_END', messageId: `x${n}` }, fin({ type: 'success' })],
      'finished-no-ids': [started, { type: 'RUN_FINISHED', outcome: { type: 'success' } }],
      'run-error': [started, { type: 'TEXT_MESSAGE_START', messageId: `x${n}`, role: 'assistant' }, { type: 'RUN_ERROR', message: 'boom', code: 'upstream' }],
      'after-run-error': [started, { type: 'RUN_ERROR', message: 'boom' }, { type: 'CUSTOM', name: 'late', value: 1 }],
      'reasoning-no-role': [started, { type: 'REASONING_START', messageId: `r${n}` }, { type: 'REASONING_MESSAGE_START', messageId: `r${n}` }, { type: 'REASONING_MESSAGE_END', messageId: `r${n}` }, { type: 'REASONING_END', messageId: `r${n}` }, fin({ type: 'success' })],
      'subagent-no-name': [started, { type: 'SUBAGENT_STARTED', subagentRunId: `s${n}` }, { type: 'SUBAGENT_FINISHED', subagentRunId: `s${n}` }, fin({ type: 'success' })],
      'subagent-reuse': [started, { type: 'SUBAGENT_STARTED', subagentRunId: 's', name: 'a' }, { type: 'SUBAGENT_FINISHED', subagentRunId: 's' }, { type: 'SUBAGENT_STARTED', subagentRunId: 's', name: 'a' }, { type: 'SUBAGENT_FINISHED', subagentRunId: 's' }, fin({ type: 'success' })],
      'subagent-tag-mismatch': [started, { type: 'SUBAGENT_STARTED', subagentRunId: `s${n}`, name: 'a' }, { type: 'TEXT_MESSAGE_START', messageId: `x${n}`, role: 'assistant' }, { type: 'TEXT_MESSAGE_CONTENT', messageId: `x${n}`, delta: 'a', subagentRunId: `s${n}` }, { type: 'TEXT_MESSAGE_END', messageId: `x${n}` }, { type: 'SUBAGENT_FINISHED', subagentRunId: `s${n}` }, fin({ type: 'success' })],
      'no-run-finished': [started, { type: 'TEXT_MESSAGE_START', messageId: `x${n}`, role: 'assistant' }, { type: 'TEXT_MESSAGE_CONTENT', messageId: `x${n}`, delta: 'a' }, { type: 'TEXT_MESSAGE_END', messageId: `x${n}` }],
      'tool-result-before-end': [started, { type: 'TOOL_CALL_START', toolCallId: `c${n}`, toolCallName: 't' }, { type: 'TOOL_CALL_RESULT', messageId: `tr${n}`, toolCallId: `c${n}`, content: 'x' }, { type: 'TOOL_CALL_END', toolCallId: `c${n}` }, fin({ type: 'success' })],
      'done-marker': [started, fin({ type: 'success' }), '[DONE]'],
    };
    return V[variant];
  }
  const last = input.messages[input.messages.length - 1];
  if (last && last.role === 'tool') {
    return [
      started,
      { type: 'TEXT_MESSAGE_START', messageId: `m${n}`, role: 'assistant' },
      { type: 'TEXT_MESSAGE_CONTENT', messageId: `m${n}`, delta: `Got ${last.content}.` },
      { type: 'TEXT_MESSAGE_END', messageId: `m${n}` },
      { type: 'CUSTOM', name: 'meta_final', value: { agent: 'root' } },
      fin({ type: 'success' }),
    ];
  }
  const userTurns = input.messages.filter((m) => m.role === 'user').length;
  if (userTurns > 1) {
    return [
      started,
      { type: 'TEXT_MESSAGE_START', messageId: `m${n}`, role: 'assistant' },
      { type: 'TEXT_MESSAGE_CONTENT', messageId: `m${n}`, delta: `You said: ${last?.content}` },
      { type: 'TEXT_MESSAGE_END', messageId: `m${n}` },
      fin({ type: 'success' }),
    ];
  }
  const meta = { metadata: { agent: 'root' } };
  return [
    started,
    { type: 'CUSTOM', name: 'meta_init', value: { agent: 'root', agent_uuid: 'agent-1' } },
    { type: 'REASONING_START', messageId: `r${n}`, ...meta },
    { type: 'REASONING_MESSAGE_START', messageId: `r${n}`, role: 'reasoning', ...meta },
    { type: 'REASONING_MESSAGE_CONTENT', messageId: `r${n}`, delta: 'Let me think.' },
    { type: 'REASONING_MESSAGE_END', messageId: `r${n}` },
    { type: 'REASONING_END', messageId: `r${n}` },
    { type: 'TEXT_MESSAGE_START', messageId: `m${n}a`, role: 'assistant', ...meta },
    { type: 'TEXT_MESSAGE_CONTENT', messageId: `m${n}a`, delta: 'Hello ' },
    { type: 'TEXT_MESSAGE_CONTENT', messageId: `m${n}a`, delta: 'there.' },
    { type: 'TEXT_MESSAGE_END', messageId: `m${n}a` },
    { type: 'TOOL_CALL_START', toolCallId: `call-search-${n}`, toolCallName: 'search', parentMessageId: `m${n}a`, ...meta },
    { type: 'TOOL_CALL_ARGS', toolCallId: `call-search-${n}`, delta: '{"q":"paris"}' },
    { type: 'TOOL_CALL_END', toolCallId: `call-search-${n}` },
    { type: 'TOOL_CALL_RESULT', messageId: `tr${n}`, toolCallId: `call-search-${n}`, role: 'tool', content: '{"hits":2}' },
    { type: 'CUSTOM', name: 'citation', value: { url: 'https://example.com/paris', title: 'Paris' } },
    { type: 'SUBAGENT_STARTED', subagentRunId: `sa${n}`, name: 'researcher', metadata: { agent: 'sub-1' } },
    { type: 'TEXT_MESSAGE_START', messageId: `m${n}s`, role: 'assistant', subagentRunId: `sa${n}` },
    { type: 'TEXT_MESSAGE_CONTENT', messageId: `m${n}s`, delta: 'Subagent says hi.', subagentRunId: `sa${n}` },
    { type: 'TEXT_MESSAGE_END', messageId: `m${n}s`, subagentRunId: `sa${n}` },
    { type: 'SUBAGENT_FINISHED', subagentRunId: `sa${n}` },
    { type: 'TOOL_CALL_START', toolCallId: `call-loc-${n}`, toolCallName: 'get_location', ...meta },
    { type: 'TOOL_CALL_ARGS', toolCallId: `call-loc-${n}`, delta: '{}' },
    { type: 'TOOL_CALL_END', toolCallId: `call-loc-${n}` },
    fin({ type: 'success', pendingToolCallIds: [`call-loc-${n}`] }),
  ];
}

async function agui(req, res, input, variant) {
  const origin = req.headers.origin;
  if (!input || typeof input.threadId !== 'string' || typeof input.runId !== 'string' || !Array.isArray(input.messages)) {
    return answer(res, 400, { error: 'body must be RunAgentInput' }, origin);
  }
  const events = aguiRun(input, variant);
  if (!events) return answer(res, 404, { error: `no variant ${variant}` }, origin);
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', ...cors(origin) });
  for (const e of events) {
    await sleep(PACE);
    res.write(`data: ${typeof e === 'string' ? e : JSON.stringify(e)}\n\n`);
  }
  res.end();
}

// ---- HTTP ---------------------------------------------------------------------------------------------------------
function cors(origin) {
  return origin ? { 'access-control-allow-origin': origin, vary: 'Origin' } : {};
}
function answer(res, status, json, origin) {
  res.writeHead(status, { 'content-type': 'application/json', ...cors(origin) });
  res.end(JSON.stringify(json));
}

const server = http.createServer(async (req, res) => {
  let raw = '';
  for await (const c of req) raw += c;
  let body = null;
  try {
    body = raw ? JSON.parse(raw) : null;
  } catch {
    body = raw;
  }
  let p = new URL(req.url, 'http://x').pathname;
  requests.push({ method: req.method, path: p, body });
  let variant = null;
  const v = p.match(/^\/v\/([^/]+)(\/.*)$/);
  if (v) [, variant, p] = v;
  const origin = req.headers.origin;
  try {
    if (req.method === 'OPTIONS') {
      res.writeHead(204, {
        ...cors(origin),
        'access-control-allow-methods': 'GET, POST',
        'access-control-allow-headers': req.headers['access-control-request-headers'] || 'content-type',
      });
      return res.end();
    }
    if (req.method === 'POST' && p === '/api/chat') return await aiChat(req, res, body, variant);
    const r = p.match(/^\/api\/chat\/([^/]+)\/stream$/);
    if (req.method === 'GET' && r) return await aiResume(req, res, decodeURIComponent(r[1]));
    if (req.method === 'POST' && p === '/agui') return await agui(req, res, body, variant);
    if (req.method === 'GET' && p === '/requests') return answer(res, 200, requests);
    if (req.method === 'POST' && p === '/report') {
      lastReport = body;
      return answer(res, 200, { ok: true });
    }
    if (req.method === 'GET' && p === '/report') return answer(res, lastReport ? 200 : 404, lastReport);
    if (req.method === 'GET' && p === '/page') {
      const f = path.join(here, '../browser/use-chat/dist/index.html');
      if (!fs.existsSync(f)) return answer(res, 404, { error: 'run build.mjs first' });
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
      return res.end(fs.readFileSync(f));
    }
    answer(res, 404, { error: 'not found' }, origin);
  } catch (e) {
    if (!res.headersSent) answer(res, 500, { error: String(e) }, origin);
    else res.end();
  }
});
server.listen(PORT, '127.0.0.1', () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n');
});
