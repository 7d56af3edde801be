// Runs a scripted conversation through the `ai` package's own chat state machine (AbstractChat, what useChat wraps)
// and its DefaultChatTransport, against a gateway path speaking the UI message stream protocol v1 (DESIGN §5.3).
// Usage:
//   node ai-sdk-client.mjs --ai 5|7 --url <api url, e.g. http://127.0.0.1:PORT/api/chat> --script <json file>
//   node ai-sdk-client.mjs --ai 5|7 --url <api url> --script <json file> --resume
// Script: {chatId, turns: [{text, files?: [FileUIPart]}], frontendTools: {<toolName>: <output> | {"error": "..."}},
//          resumeAfterMs?, maxPosts?}
//   - each turn is chat.sendMessage({text, files}); sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls
//     re-posts when the page's tools are answered; onToolCall answers only the tools named in frontendTools (the
//     others are the backend's: a page filters by its own tool names), with addToolOutput (output, or
//     state 'output-error' + errorText for {"error": ...});
//   - resumeAfterMs: the first turn's POST is dropped after that many ms (chat.stop(), as a page reload would), and a
//     new chat with the same id and the messages the page would have kept (up to the user's message) calls
//     resumeStream() (GET <url>/<chatId>/stream) and goes on from there;
//   - maxPosts (default 10): one POST more than this and the client fails (the re-post loop of DESIGN §5.3).
//   --resume: only resumeStream() for chatId on a new chat; prints the same shape (messages = what was read).
// Prints one JSON line: {messages: UIMessage[], posts, errors: [onError messages], status, requests: [{method, url,
// status, body}], finishes: [{finishReason, isError, isAbort}]}. Exit 1 (message on stderr, the line still printed
// when there is one) on too many POSTs, a 30 s timeout, or a bad command line; exit 0 otherwise (a stream error is
// a finding reported in `errors`/`status`, not a failure of this script).
import { flag, opt, urlAndScript } from './args.mjs';

const major = opt('--ai');
const resumeOnly = flag('--resume');
const { url, script } = urlAndScript(
  'node ai-sdk-client.mjs --ai 5|7 --url <api url> --script <json file> [--resume]',
  ['5', '7'].includes(major),
);
const ai = await import(major === '7' ? 'ai' : 'ai5');
const { AbstractChat, DefaultChatTransport, lastAssistantMessageIsCompleteWithToolCalls } = ai;

const TIMEOUT_MS = 30000;
const maxPosts = script.maxPosts ?? 10;
const frontendTools = script.frontendTools ?? {};
const out = { messages: [], posts: 0, errors: [], status: 'ready', requests: [], finishes: [] };
let chat = null;

function print() {
  if (chat) {
    out.messages = chat.messages;
    out.status = chat.status;
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}
function fail(message) {
  console.error(`ai-sdk-client (ai ${major}): ${message}`);
  print();
  process.exit(1);
}
setTimeout(() => fail(`timed out after ${TIMEOUT_MS} ms (status ${chat?.status})`), TIMEOUT_MS).unref();

// The transport's fetch, counted: every POST is one request of the page to the gateway.
async function countingFetch(input, init = {}) {
  const method = (init.method || 'GET').toUpperCase();
  const rec = { method, url: String(input), status: 0 };
  if (init.body) {
    try {
      rec.body = JSON.parse(init.body);
    } catch {
      rec.body = init.body;
    }
  }
  out.requests.push(rec);
  if (method === 'POST') {
    out.posts += 1;
    if (out.posts > maxPosts) {
      fail(`more than maxPosts=${maxPosts} POSTs: the client keeps re-posting (sendAutomaticallyWhen loop)`);
    }
  }
  const res = await fetch(input, init);
  rec.status = res.status;
  return res;
}

// The chat's state, as @ai-sdk/react keeps it (new arrays on change, messages snapshotted on replace).
class State {
  constructor(messages = []) {
    this.status = 'ready';
    this.error = undefined;
    this.messages = messages;
  }
  pushMessage = (m) => {
    this.messages = this.messages.concat(m);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (i, m) => {
    this.messages = [...this.messages.slice(0, i), this.snapshot(m), ...this.messages.slice(i + 1)];
  };
  snapshot = (v) => structuredClone(v);
}

class Chat extends AbstractChat {
  constructor({ messages, ...init }) {
    super({ ...init, state: new State(messages) });
  }
}

function newChat(messages = []) {
  const c = new Chat({
    id: script.chatId,
    messages,
    transport: new DefaultChatTransport({ api: url, fetch: countingFetch }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
    onError: (e) => out.errors.push(String(e?.message ?? e)),
    onFinish: ({ isError, isAbort, finishReason }) => out.finishes.push({ finishReason: finishReason ?? null, isError: !!isError, isAbort: !!isAbort }),
    onToolCall: ({ toolCall }) => {
      if (toolCall.providerExecuted) return;
      if (!Object.prototype.hasOwnProperty.call(frontendTools, toolCall.toolName)) return; // not the page's tool
      const answer = frontendTools[toolCall.toolName];
      const add = (c.addToolOutput ?? c.addToolResult).bind(c);
      const isError = answer && typeof answer === 'object' && !Array.isArray(answer) && Object.keys(answer).length === 1 && typeof answer.error === 'string';
      // Not awaited: onToolCall runs inside the chat's job queue, which addToolOutput also uses (awaiting deadlocks).
      const p = isError
        ? add({ state: 'output-error', tool: toolCall.toolName, toolCallId: toolCall.toolCallId, errorText: answer.error })
        : add({ tool: toolCall.toolName, toolCallId: toolCall.toolCallId, output: answer });
      Promise.resolve(p).catch((e) => out.errors.push(`addToolOutput: ${e?.message ?? e}`));
    },
  });
  return c;
}

// Waits until the chat is idle (ready or error) and stays so for a moment (an automatic re-post may follow).
async function settle() {
  let idle = 0;
  while (idle < 5) {
    await new Promise((r) => setTimeout(r, 20));
    idle = chat.status === 'ready' || chat.status === 'error' ? idle + 1 : 0;
  }
}

if (resumeOnly) {
  chat = newChat([]);
  await chat.resumeStream();
  await settle();
} else {
  chat = newChat([]);
  for (const [i, turn] of (script.turns ?? []).entries()) {
    const msg = turn.files ? { text: turn.text, files: turn.files } : { text: turn.text };
    if (i === 0 && script.resumeAfterMs != null) {
      const sending = chat.sendMessage(msg);
      await new Promise((r) => setTimeout(r, script.resumeAfterMs));
      // The page goes away mid-stream; the new one has kept the messages up to the user's.
      const kept = chat.messages.slice(0, chat.messages.findLastIndex((m) => m.role === 'user') + 1);
      await chat.stop();
      await sending.catch(() => {});
      chat = newChat(structuredClone(kept));
      await chat.resumeStream();
    } else {
      await chat.sendMessage(msg);
    }
    await settle();
    if (chat.status === 'error') break;
  }
}
print();
process.exit(0);
