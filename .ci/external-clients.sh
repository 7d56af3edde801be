#!/usr/bin/env bash
# Installs the third-party SSE clients that tests/external_clients.rs runs
# against the gateway: eventsource-parser (npm) and httpx-sse (PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v npm >/dev/null; then
  (cd tests/external/node && npm install --no-audit --no-fund --loglevel=error)
else
  echo "external-clients: npm not found" >&2
fi
if command -v python3 >/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check httpx httpx-sse
else
  echo "external-clients: python3 not found" >&2
fi
