// A useChat page (@ai-sdk/react, ai 7) as an app team would write it against the gateway's AI SDK output (DESIGN
// §5.3): DefaultChatTransport to the gateway, sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls, one
// frontend tool (`get_location`, answered {"city": "Paris"}; onToolCall fires for every call that is not
// providerExecuted, so the page filters by its own tool names), every part rendered with its agent.
// Query: ?api=<gateway api url> (or #api=<url>), &text=<first message> (default "Hi"), &then=<second message>
// (optional), &chat=<chat id> (default: useChat's own), &resume=1 (useChat's resume: true; sends nothing, needs
// &chat=), &timeout_ms=<give up> (default 25000). See README.md.
import React, { useEffect, useRef, useState } from 'react';
import { createRoot } from 'react-dom/client';
import { useChat } from '@ai-sdk/react';
import { DefaultChatTransport, lastAssistantMessageIsCompleteWithToolCalls } from 'ai';

const params = new URLSearchParams(location.search);
const hash = new URLSearchParams(location.hash.slice(1));
const param = (k) => params.get(k) ?? hash.get(k);
const API = param('api');
const TEXTS = [param('text') ?? 'Hi', param('then')].filter((t) => t != null && t !== '');
const RESUME = param('resume') === '1';
const CHAT_ID = param('chat') ?? undefined;
const TIMEOUT = Number(param('timeout_ms') ?? 25000);
const MY_TOOLS = { get_location: () => ({ city: 'Paris' }) };

const errors = [];
const requests = [];
window.addEventListener('error', (e) => errors.push(`page error: ${e.message}`));
window.addEventListener('unhandledrejection', (e) => errors.push(`unhandled rejection: ${e.reason}`));
const counted = (input, init = {}) => {
  requests.push({ method: (init.method || 'GET').toUpperCase(), url: String(input) });
  return fetch(input, init);
};

// The agent a part belongs to: providerMetadata.gateway.agent (text, reasoning, sources, files), the tool call's
// callProviderMetadata / resultProviderMetadata (tool parts: ai keeps a tool chunk's providerMetadata there), or a
// data part's data.agent.
function agentOf(part) {
  const pm = part.providerMetadata ?? part.callProviderMetadata ?? part.resultProviderMetadata;
  return pm?.gateway?.agent ?? part.data?.agent ?? '';
}
const show = (v) => (typeof v === 'string' ? v : JSON.stringify(v));

function Part({ part, index }) {
  const common = { 'data-testid': 'part', 'data-type': part.type, 'data-index': index, 'data-agent': agentOf(part) };
  if (part.type === 'text' || part.type === 'reasoning') {
    return (
      <div {...common} data-state={part.state ?? ''}>
        <span data-testid={`part-${part.type}`}>{part.text}</span>
      </div>
    );
  }
  if (part.type === 'dynamic-tool' || part.type.startsWith('tool-')) {
    const name = part.type === 'dynamic-tool' ? part.toolName : part.type.slice(5);
    return (
      <div {...common} data-tool-name={name} data-tool-call-id={part.toolCallId} data-state={part.state} data-provider-executed={part.providerExecuted ? 'true' : 'false'}>
        <code data-testid="tool-input">{show(part.input ?? null)}</code>
        {part.state === 'output-available' && <code data-testid="tool-output">{show(part.output)}</code>}
        {part.state === 'output-error' && <code data-testid="tool-error">{part.errorText}</code>}
      </div>
    );
  }
  if (part.type === 'source-url') {
    return (
      <div {...common} data-source-id={part.sourceId}>
        <a data-testid="source-url" href={part.url}>{part.title ?? part.url}</a>
      </div>
    );
  }
  if (part.type === 'source-document') {
    return (
      <div {...common} data-source-id={part.sourceId}>
        <span data-testid="source-document" data-media-type={part.mediaType}>{part.title}</span>
      </div>
    );
  }
  if (part.type === 'file') {
    return (
      <div {...common}>
        <a data-testid="file" data-media-type={part.mediaType} href={part.url}>{part.filename ?? part.mediaType}</a>
      </div>
    );
  }
  if (part.type.startsWith('data-')) {
    return (
      <div {...common} data-part-id={part.id ?? ''}>
        <code data-testid="data">{show(part.data)}</code>
      </div>
    );
  }
  return <div {...common} />; // step-start and anything else: its type is what matters
}

function App() {
  const [phase, setPhase] = useState('idle');
  const sent = useRef(0);
  const active = useRef(false);
  const { messages, sendMessage, status, error, addToolOutput } = useChat({
    id: CHAT_ID,
    resume: RESUME,
    transport: new DefaultChatTransport({ api: API, fetch: counted }),
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls,
    onToolCall: ({ toolCall }) => {
      if (toolCall.providerExecuted || !MY_TOOLS[toolCall.toolName]) return; // not this page's tool
      // Not awaited: onToolCall runs inside the chat's queue (awaiting addToolOutput there deadlocks).
      addToolOutput({ tool: toolCall.toolName, toolCallId: toolCall.toolCallId, output: MY_TOOLS[toolCall.toolName](toolCall.input) });
    },
    onError: (e) => errors.push(`onError: ${e.message}`),
  });

  // Sends the texts one after the other, each when the previous run is over (status back to ready for a moment: an
  // automatic re-post, once the frontend tool is answered, comes within that quiet time). With resume=1 it sends
  // nothing: useChat resumes the chat's stream on mount, and the page is done when that is over (or, after a 204,
  // when nothing happened for 1.5 s).
  useEffect(() => {
    if (status === 'submitted' || status === 'streaming') {
      active.current = true;
      return;
    }
    if (phase === 'done') return;
    const quiet = RESUME && !active.current ? 1500 : 300;
    const t = setTimeout(() => {
      if (status === 'error' || RESUME || (active.current && sent.current >= TEXTS.length)) {
        setPhase('done');
      } else if (sent.current < TEXTS.length) {
        active.current = false;
        sendMessage({ text: TEXTS[sent.current++] });
      }
    }, quiet);
    return () => clearTimeout(t);
  }, [status, phase, messages.length]);

  useEffect(() => {
    const t = setTimeout(() => finish(false, `gave up after ${TIMEOUT} ms (status ${status})`), TIMEOUT);
    return () => clearTimeout(t);
  }, []);

  const state = { done: phase === 'done', status, error: error ? error.message : null, errors, requests, messages };
  window.__state = state;
  useEffect(() => {
    if (phase === 'done') finish(true, '');
  }, [phase]);

  return (
    <main data-testid="chat" data-status={status} data-done={phase === 'done' ? 'true' : 'false'}>
      {!API && <p data-testid="no-api">no ?api= or #api= given</p>}
      {messages.map((m, i) => (
        <section key={m.id} data-testid="message" data-index={i} data-id={m.id} data-role={m.role} data-agent={m.metadata?.agent ?? ''}>
          {m.parts.map((p, j) => (
            <Part key={j} part={p} index={j} />
          ))}
        </section>
      ))}
      {error && <p data-testid="error">{error.message}</p>}
      {phase === 'done' && <pre data-testid="state">{JSON.stringify(state)}</pre>}
    </main>
  );
}

let finished = false;
function finish(done, reason) {
  if (finished) return;
  finished = true;
  const report = { ...window.__state, done, reason };
  window.__state = report;
  window.__done = true;
  // As the other browser tests do: one POST /report to the page's own origin (ignored when nobody listens).
  fetch('/report', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(report) }).catch(() => {});
}

createRoot(document.getElementById('root')).render(<App />);
