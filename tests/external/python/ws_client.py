"""Reads a socket of sse-gateway (docs/WEBSOCKET.md) with the PyPI package `websockets` and prints what happened,
one JSON object per line, as tests/external/node/ws-client.mjs does (same WS_OPTS, same lines).

Usage: WS_OPTS='{...}' python3 ws_client.py URL
"""
import asyncio
import json
import os
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus


def out(o) -> None:
    sys.stdout.write(json.dumps(o) + "\n")
    sys.stdout.flush()


async def main(url: str, opts: dict) -> None:
    kw = {"max_size": 64 << 20, "open_timeout": 10, "ping_interval": None}
    if opts.get("protocols"):
        kw["subprotocols"] = opts["protocols"]
    if opts.get("origin"):
        kw["origin"] = opts["origin"]
    if opts.get("headers"):
        kw["additional_headers"] = opts["headers"]
    try:
        ws = await connect(url, **kw)
    except InvalidStatus as e:
        body = e.response.body.decode("utf-8", "replace") if e.response.body else ""
        out({"event": "refused", "status": e.response.status_code, "body": body})
        return
    out({"event": "open", "protocol": ws.subprotocol})
    for text in opts.get("sendOnOpen", []):
        await ws.send(text)
    n = 0
    try:
        async for msg in ws:
            n += 1
            out({"event": "message", "data": msg if isinstance(msg, str) else None})
            for s in opts.get("sendAfter", []):
                if s["after"] == n:
                    await ws.send(s["data"])
            if opts.get("cutAfter") == n:
                out({"event": "cut"})
                ws.transport.abort()
                return
    except ConnectionClosed:
        pass
    out({"event": "close", "code": ws.close_code, "reason": ws.close_reason})


if __name__ == "__main__":
    options = json.loads(os.environ.get("WS_OPTS", "{}"))
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1], options), options.get("timeoutMs", 20000) / 1000))
    except (asyncio.TimeoutError, TimeoutError):
        out({"event": "timeout"})
