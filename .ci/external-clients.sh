#!/usr/bin/env bash
# Installs the third-party clients that the real-client tests run against the gateway:
# - tests/external_clients.rs: eventsource-parser (npm) and httpx-sse (PyPI);
# - tests/resume_clients.rs: headless Chromium (Debian's `chromium`) and @microsoft/fetch-event-source (npm,
#   version pinned in tests/external/node/package.json and package-lock.json);
# - tests/dialects_e2e.rs: the same @microsoft/fetch-event-source under node;
# - tests/websocket_clients.rs: npm `ws` (pinned in package.json and package-lock.json), PyPI `websockets` (pinned
#   here) and Chromium's own WebSocket;
# - tests/inspector.rs: headless Chromium driven over the DevTools protocol by
#   tests/external/node/inspector-page.mjs, with the same npm `ws`;
# - the frontend-protocol tests (DESIGN 5.3): npm `ai` 7.0.173 and `ai5` (= ai@5.0.277) run by
#   tests/external/node/ai-sdk-client.mjs, `@ag-ui/client` 1.0.0 by tests/external/node/ag-ui-client.mjs, and
#   `react`/`react-dom` 19.3.1, `@ai-sdk/react` 4.0.177 (the one for ai 7) and `esbuild` 0.28.2, which bundle the
#   useChat page tests/external/browser/use-chat/ for headless Chromium (all pinned in package.json and
#   package-lock.json; `ai` 7 declares node >= 22 but runs on node 20, npm only warns EBADENGINE).
# Those tests fail under CI=true when a client is missing, and are skipped with a note elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v npm >/dev/null; then
  (cd tests/external/node && npm ci --no-audit --no-fund --loglevel=error)
else
  echo "external-clients: npm not found" >&2
fi
if command -v python3 >/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check httpx httpx-sse "websockets==17.4"
else
  echo "external-clients: python3 not found" >&2
fi
if [ -x /usr/bin/chromium ] || [ -n "${CHROMIUM:-}" ]; then
  :
elif command -v apt-get >/dev/null; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
else
  echo "external-clients: chromium missing and apt-get not found" >&2
fi
if [ -x /usr/bin/chromium ]; then
  /usr/bin/chromium --version 2>/dev/null || true
fi
