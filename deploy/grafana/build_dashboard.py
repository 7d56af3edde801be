#!/usr/bin/env python3
"""Writes deploy/grafana/dashboard.json, the sse-gateway Grafana dashboard.

The dashboard is generated so that every panel follows the same conventions (data source
variable, $job/$instance filter, units, legend) and stays reviewable as code. Edit this
file, run `python3 deploy/grafana/build_dashboard.py`, and commit both; deploy/check.sh
fails when dashboard.json is not what this script writes.

Usage: build_dashboard.py [--check]   (--check: compare instead of writing)
"""

import json
import sys
from pathlib import Path

OUT = Path(__file__).with_name("dashboard.json")
# Dashboard JSON schema version of current Grafana releases (@grafana/schema 13.x).
SCHEMA_VERSION = 42

DS = {"type": "prometheus", "uid": "${datasource}"}
# Every query is filtered by the two variables; instance is multi-value with an All of ".*".
SEL = 'job=~"$job", instance=~"$instance"'
RATE = "$__rate_interval"


def sel(extra: str = "") -> str:
    return "{" + SEL + (", " + extra if extra else "") + "}"


def sum_rate(metric: str, by: str = "") -> str:
    """The per-second rate of a counter, summed (per `by` label) over the selected instances."""
    return f"sum{by_clause(by)}(rate({metric}{sel()}[{RATE}]))"


def sum_of(metric: str, by: str = "") -> str:
    """A gauge summed (per `by` label) over the selected instances."""
    return f"sum{by_clause(by)}({metric}{sel()})"


def by_clause(by: str) -> str:
    return f" by ({by}) " if by else ""


S5XX = sel('status_class="5xx"')
STRANSLATE = sel('mode="translate"')


def target(expr: str, legend: str = "__auto", ref: str = "A", **extra) -> dict:
    t = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend, "range": True, "instant": False}
    t.update(extra)
    return t


def targets(*pairs) -> list:
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def quantiles(metric: str, by: str = "", qs=(0.5, 0.95, 0.99), label: str = "") -> list:
    """histogram_quantile series for a histogram, one per quantile (and per `by` label)."""
    group = f"{by}, le" if by else "le"
    out = []
    for q in qs:
        expr = f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{sel()}[{RATE}])))"
        name = f"p{int(q * 100)}"
        legend = f"{label}{name}" + (f" {{{{{by}}}}}" if by else "")
        out.append((expr, legend))
    return out


class Layout:
    """Places panels on Grafana's 24-column grid, row after row."""

    def __init__(self):
        self.panels = []
        self.y = 0
        self.x = 0
        self.row_h = 0
        self.next_id = 1

    def _id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title: str, description: str):
        self._newline()
        self.panels.append(
            {
                "type": "row",
                "id": self._id(),
                "title": title,
                "description": description,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
            }
        )
        self.y += 1

    def _newline(self):
        self.y += self.row_h
        self.x = 0
        self.row_h = 0

    def add(self, w: int, h: int, *panels: dict):
        """Places the panels one after the other, each w columns wide and h high."""
        for panel in panels:
            if self.x + w > 24:
                self._newline()
            panel["id"] = self._id()
            panel["gridPos"] = {"h": h, "w": w, "x": self.x, "y": self.y}
            self.x += w
            self.row_h = max(self.row_h, h)
            self.panels.append(panel)


def timeseries(title, description, tgts, unit="short", stack=False, min0=True):
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 10 if not stack else 30,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
    }
    defaults = {"unit": unit, "custom": custom}
    if min0:
        defaults["min"] = 0
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def ops_by_kind(title, description, counter):
    """A stacked timeseries of a counter's rate, one series per `kind` label."""
    tgts = targets((sum_rate(counter, by="kind"), "{{kind}}"))
    return timeseries(title, description, tgts, unit="ops", stack=True)


def stat(title, description, expr, unit="short", thresholds=None, decimals=None):
    steps = thresholds or [{"color": "green", "value": None}]
    defaults = {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}, "color": {"mode": "thresholds"}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, title, instant=True, range=False)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"values": False, "calcs": ["lastNotNull"], "fields": ""},
            "orientation": "auto",
            "textMode": "value",
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "wideLayout": True,
            "showPercentChange": False,
            "percentChangeColorMode": "standard",
        },
    }


def heatmap(title, description, metric, unit):
    expr = f"sum by (le) (increase({metric}_bucket{sel()}[{RATE}]))"
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, "{{le}}", format="heatmap")],
        "fieldConfig": {"defaults": {"custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False}}}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "fill": "dark-orange",
                "scale": "exponential",
                "exponent": 0.5,
                "steps": 64,
                "reverse": False,
            },
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "showValue": "never",
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "yAxis": {"axisPlacement": "left", "unit": unit, "reverse": False},
        },
    }


def build() -> dict:
    L = Layout()

    # ------------------------------------------------------------------ overview
    L.row("Overview", "Is the fleet up, ready and serving streams right now?")
    L.add(
        4,
        4,
        stat(
            "Targets up",
            "Gateway admin endpoints Prometheus scraped successfully (up == 1).",
            sum_of("up"),
        ),
        stat(
            "Ready",
            "Instances whose /readyz is true. Lower than 'Targets up' while instances drain.",
            sum_of("sse_gateway_ready"),
        ),
        stat(
            "Draining",
            "Instances shutting down (SIGTERM received, finishing open streams).",
            sum_of("sse_gateway_draining"),
            thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}],
        ),
        stat("Active streams", "Event streams open now, all modes.", sum_of("sse_gateway_active_streams")),
        stat(
            "Requests / s",
            "All requests answered (streams and pass-through).",
            sum_rate("sse_gateway_requests_total"),
            unit="reqps",
        ),
        stat(
            "5xx ratio",
            "Share of requests answered with a 5xx status (502/504 from the gateway, or the upstream's own).",
            f"(sum(rate(sse_gateway_requests_total{S5XX}[{RATE}])) or vector(0)) "
            f"/ sum(rate(sse_gateway_requests_total{sel()}[{RATE}]))",
            unit="percentunit",
            thresholds=[
                {"color": "green", "value": None},
                {"color": "orange", "value": 0.01},
                {"color": "red", "value": 0.05},
            ],
            decimals=2,
        ),
    )

    # ------------------------------------------------------------------ RED
    L.row("Requests and streams", "Rate, errors and duration: the RED view of streams and requests.")
    L.add(
        8,
        8,
        timeseries(
            "Active streams by mode",
            "Open event streams: translate (JSON envelopes), passthrough (legacy stream), shadow.",
            targets((sum_of("sse_gateway_active_streams", by="mode"), "{{mode}}")),
            stack=True,
        ),
        timeseries(
            "Requests by status class",
            "Requests answered per second, by mode and HTTP status class.",
            targets(
                (
                    sum_rate("sse_gateway_requests_total", by="mode, status_class"),
                    "{{mode}} {{status_class}}",
                )
            ),
            unit="reqps",
            stack=True,
        ),
        timeseries(
            "Streams ended by outcome",
            "Streams ending per second: completed, upstream_error (backend failed mid-stream), "
            "client_gone (the client hung up first).",
            targets(
                (
                    sum_rate("sse_gateway_streams_total", by="outcome"),
                    "{{outcome}}",
                )
            ),
            unit="ops",
            stack=True,
        ),
    )
    L.add(
        12,
        8,
        timeseries(
            "Stream duration",
            "How long translated streams stay open (p50 / p95 / p99).",
            targets(*quantiles("sse_gateway_stream_duration_seconds", by="mode")),
            unit="s",
        ),
        timeseries(
            "Requests by instance",
            "Requests per second per instance: uneven bars show the load balancer's spread.",
            targets(
                (
                    sum_rate("sse_gateway_requests_total", by="instance"),
                    "{{instance}}",
                )
            ),
            unit="reqps",
        ),
    )

    # ------------------------------------------------------------------ latency
    L.row(
        "Latency",
        "Time to first byte on both sides of the gateway, and what translation adds to each event.",
    )
    L.add(
        12,
        9,
        timeseries(
            "Time to first byte: upstream vs downstream",
            "Upstream: request sent to the backend's response head. Downstream: request received to the "
            "first body byte handed to the client. The gap is what the gateway adds before a stream starts.",
            targets(
                *quantiles("sse_gateway_upstream_ttfb_seconds", label="upstream "),
                *quantiles("sse_gateway_downstream_ttfb_seconds", label="downstream "),
            ),
            unit="s",
        ),
        heatmap(
            "Per-event translation latency",
            "Upstream event complete to its envelopes written, every event. Design target: p99 under 100 µs.",
            "sse_gateway_event_translation_seconds",
            "s",
        ),
    )
    L.add(
        24,
        7,
        timeseries(
            "Per-event translation latency quantiles",
            "p50 / p99 / p99.9 of the per-event translation latency, per instance.",
            targets(
                *[
                    (
                        f"histogram_quantile({q}, sum by (instance, le) "
                        f"(rate(sse_gateway_event_translation_seconds_bucket{sel()}[{RATE}])))",
                        f"p{str(q * 100).rstrip('0').rstrip('.')} {{{{instance}}}}",
                    )
                    for q in (0.5, 0.99, 0.999)
                ]
            ),
            unit="s",
        ),
    )

    # ------------------------------------------------------------------ fragmentation
    L.row(
        "Fragmentation and chunking",
        "What only this gateway sees: legacy items split across upstream events, and envelopes split to "
        "fit the byte budget.",
    )
    L.add(
        8,
        8,
        timeseries(
            "Fragmented legacy items",
            "Share of legacy items that spanned more than one upstream event or data: line. A proxy "
            "or buffer between the backend and the gateway that starts splitting events shows up here.",
            targets(
                (
                    f"sum(rate(sse_gateway_fragmented_items_total{sel()}[{RATE}])) "
                    f"/ sum(rate(sse_gateway_items_total{sel()}[{RATE}]))",
                    "fragmented share",
                ),
            ),
            unit="percentunit",
        ),
        timeseries(
            "Legacy items per second",
            "Legacy items translated per second, and how many of them arrived fragmented.",
            targets(
                (sum_rate("sse_gateway_items_total"), "items"),
                (sum_rate("sse_gateway_fragmented_items_total"), "fragmented"),
            ),
            unit="ops",
        ),
        timeseries(
            "Streams by dialect",
            "Translated streams started per second by the upstream dialect they were read as: xml (legacy, "
            "raw events included), raw, cogency, agent_sdk. Under dialect = auto this is what the first event "
            "told; a stream no dialect reads is not counted here but as an unexpected parse error.",
            targets((sum_rate("sse_gateway_stream_dialects_total", by="dialect"), "{{dialect}}")),
            unit="ops",
            stack=True,
        ),
        timeseries(
            "Upstream events per legacy item",
            "How many upstream SSE events one legacy item spanned (p50 / p99 / max bucket).",
            targets(*quantiles("sse_gateway_item_upstream_events", qs=(0.5, 0.99, 1.0))),
        ),
        timeseries(
            "Envelopes per block",
            "Output chunks per closed block, by envelope type (p50 / p99): large tool results and "
            "histories are split into many budget-sized envelopes.",
            targets(*quantiles("sse_gateway_block_chunks", by="type", qs=(0.5, 0.99))),
        ),
        heatmap(
            "Envelope size distribution",
            "Size of each envelope's JSON object in bytes. Everything should sit at or below the budget "
            "(2048 by default).",
            "sse_gateway_envelope_bytes",
            "bytes",
        ),
        timeseries(
            "Envelopes and oversize envelopes by type",
            "Envelopes written per second by type, and those sent over the budget (citations, or fixed "
            "fields alone over it): oversize is drawn on the same axis, look for non-zero lines.",
            targets(
                (sum_rate("sse_gateway_envelopes_total", by="type"), "{{type}}"),
                (
                    sum_rate("sse_gateway_oversize_envelopes_total", by="type"),
                    "oversize {{type}}",
                ),
            ),
            unit="ops",
        ),
    )

    # ------------------------------------------------------------------ errors
    L.row(
        "Errors",
        "Bad upstream input, upstream failures and clients that left: each is counted, and each answered "
        "by a well-formed error envelope or a clean close.",
    )
    L.add(
        8,
        8,
        ops_by_kind(
            "Parse errors by kind",
            "Legacy input the translator could not parse (syntax, entity, invalid_utf8, item_too_large, "
            "truncated, invalid_json, unexpected, invalid_id); each became an error envelope.",
            "sse_gateway_parse_errors_total",
        ),
        timeseries(
            "Unknown tags and scope conflicts",
            "Unknown legacy tags (passed on as text or dropped, per config) and agent-scope conflicts "
            "(a block opened while another was open, e.g. parallel subagents).",
            targets(
                (sum_rate("sse_gateway_unknown_tags_total"), "unknown tags"),
                (sum_rate("sse_gateway_scope_conflicts_total"), "scope conflicts"),
            ),
            unit="ops",
        ),
        ops_by_kind(
            "Upstream errors by kind",
            "Failures talking to the backend: connect, timeout (no response head in time), reset "
            "(mid-stream), protocol, status (5xx from the backend).",
            "sse_gateway_upstream_errors_total",
        ),
    )
    L.add(
        12,
        7,
        timeseries(
            "Client disconnects",
            "Responses whose client went away before the end (the upstream request is dropped at once).",
            targets((sum_rate("sse_gateway_client_disconnects_total"), "client disconnects")),
            unit="ops",
        ),
        timeseries(
            "Keepalives sent",
            "': keepalive' comments written to idle translated streams, so that idle timeouts of load "
            "balancers in between do not cut them.",
            targets((sum_rate("sse_gateway_keepalives_total"), "keepalives")),
            unit="ops",
        ),
    )

    # ------------------------------------------------------------------ traffic
    L.row("Traffic", "Bytes through the gateway, per mode and direction, and the upstream connections used.")
    L.add(
        12,
        8,
        timeseries(
            "Bytes in and out",
            "Response body bytes read from the upstream (in) and sent to clients (out). JSON envelopes are "
            "larger than the legacy XML they replace; the ratio shows by how much.",
            targets(
                (sum_rate("sse_gateway_bytes_in_total", by="mode"), "in {{mode}}"),
                (sum_rate("sse_gateway_bytes_out_total", by="mode"), "out {{mode}}"),
            ),
            unit="Bps",
        ),
    )
    L.add(
        6,
        8,
        timeseries(
            "Output / input byte ratio",
            "Bytes sent per byte received on translated streams.",
            targets(
                (
                    f"sum(rate(sse_gateway_bytes_out_total{STRANSLATE}[{RATE}])) "
                    f"/ sum(rate(sse_gateway_bytes_in_total{STRANSLATE}[{RATE}]))",
                    "out / in",
                )
            ),
            unit="none",
        ),
        timeseries(
            "Upstream requests by connection",
            "Requests sent to the backend: on a dedicated connection (requests that accept "
            "text/event-stream, read by the response itself; upstream.stream_connections) or from the pool.",
            targets(
                (
                    sum_rate("sse_gateway_upstream_requests_total", by="connection"),
                    "{{connection}}",
                )
            ),
            unit="reqps",
            stack=True,
        ),
    )

    # ------------------------------------------------------------------ resumable streams
    # Metric names and labels: docs/RESUME.md ("Metrics"). lib/consistency.py checks every
    # sse_gateway_resume_* name and label used here against that list.
    L.row(
        "Resumable streams",
        "Reconnects with Last-Event-ID answered by the gateway, the streams and bytes it holds for them, "
        "and the shared store (resume.store = \"redis\"). See docs/RESUME.md.",
    )
    L.add(
        8,
        8,
        timeseries(
            "Resumptions by outcome",
            "Reconnects answered by the gateway per second: replayed (held events sent, then live), gap "
            "(410: the position is no longer held), unknown (410: token unknown or expired, e.g. another "
            "instance on the memory store), denied (404: Authorization/Cookie differ from the original).",
            targets(
                (
                    sum_rate("sse_gateway_resume_requests_total", by="outcome"),
                    "{{outcome}}",
                )
            ),
            unit="reqps",
            stack=True,
        ),
        timeseries(
            "Events replayed",
            "Held events sent again to reconnecting clients and watchers, per second.",
            targets((sum_rate("sse_gateway_resume_replayed_events_total"), "events")),
            unit="ops",
        ),
        timeseries(
            "Bytes replayed",
            "Bytes of held events sent again to reconnecting clients and watchers, per second.",
            targets((sum_rate("sse_gateway_resume_replayed_bytes_total"), "replayed")),
            unit="Bps",
        ),
        timeseries(
            "Streams held by state",
            "live: a client is attached; grace: none attached, the upstream kept for resume.grace_secs; "
            "retained: finished, readable for resume.retention_secs.",
            targets((sum_of("sse_gateway_resume_streams", by="state"), "{{state}}")),
            stack=True,
        ),
        timeseries(
            "Bytes held",
            "Event bytes held for resumption, per instance (bounded by resume.max_total_bytes each; the "
            "oldest finished streams are evicted first).",
            targets((sum_of("sse_gateway_resume_held_bytes", by="instance"), "{{instance}}")),
            unit="bytes",
        ),
        timeseries(
            "Subscribers",
            "Clients reading held streams (originals, reconnections and watchers), per instance.",
            targets((sum_of("sse_gateway_resume_subscribers", by="instance"), "{{instance}}")),
        ),
        timeseries(
            "Held streams ended, watchers closed",
            "Held streams ending per second by how (completed, abandoned: nobody back within the grace "
            "period, cancelled: DELETE, lost: the owning instance died), and watchers closed for falling "
            "behind the buffer (watcher_behind).",
            targets(
                (sum_rate("sse_gateway_resume_ended_total", by="how"), "{{how}}"),
                (sum_rate("sse_gateway_resume_watchers_closed_total"), "watchers closed"),
            ),
            unit="ops",
        ),
        timeseries(
            "Store operations and errors",
            "Operations on the resume store per second, by operation and result; any error line above zero "
            "means streams may be marked not resumable.",
            targets(
                (
                    sum_rate("sse_gateway_resume_store_operations_total", by="op, result"),
                    "{{op}} {{result}}",
                )
            ),
            unit="ops",
        ),
        timeseries(
            "Store latency p99",
            "p99 duration of resume store operations, by operation (Redis/Valkey round trips, pipelined "
            "writes included). Writes never delay live streams; slow reads delay replays.",
            targets(*quantiles("sse_gateway_resume_store_seconds", by="op", qs=(0.99,))),
            unit="s",
        ),
    )
    L.add(
        12,
        7,
        timeseries(
            "Unresumable streams",
            "Streams marked not resumable per second because the store failed (they go on live, but a "
            "client that disconnects cannot resume them), per instance.",
            targets(
                (
                    sum_rate("sse_gateway_resume_unresumable_total", by="instance"),
                    "{{instance}}",
                )
            ),
            unit="ops",
        ),
        timeseries(
            "Reconnect to first replayed byte",
            "From a resuming request (Last-Event-ID or a watcher) to the first byte of its replayed events: "
            "p50 and p99. Target: p99 under 5 ms with the memory store, 10 ms with Redis on loopback.",
            targets(*quantiles("sse_gateway_resume_first_byte_seconds", qs=(0.5, 0.99))),
            unit="s",
        ),
    )
    L.add(
        12,
        7,
        timeseries(
            "Resume limits reached",
            "Bounds of docs/SECURITY.md hit, per second: a writer nobody reads paused at resume.max_total_bytes "
            "(total_bytes), a stream in grace given up past resume.max_grace_streams or its per-binding cap, a "
            "watcher closed for reading nothing (watcher_stalled), and reconnects or watchers refused past "
            "resume.max_remote_readers. Steady non-zero lines mean a bound is too small or a client misbehaves.",
            targets(
                (sum_rate("sse_gateway_resume_limited_total", by="limit"), "{{limit}}"),
                (sum_rate("sse_gateway_resume_remote_readers_refused_total"), "remote readers refused"),
            ),
            unit="ops",
        ),
        timeseries(
            "Store bounds and lost data",
            "Bytes of events removed from Redis per second to keep a stream within resume.buffer_bytes (stream) "
            "or an instance within resume.max_total_bytes (total); and streams whose keys Redis lost without a "
            "failed write (a flush, a failover to an empty replica): any of these means readers elsewhere get "
            "resume_unknown for them.",
            targets(
                (sum_rate("sse_gateway_resume_store_evicted_bytes_total", by="bound"), "evicted {{bound}}"),
                (sum_rate("sse_gateway_resume_store_lost_total"), "streams lost by Redis"),
            ),
            unit="short",
        ),
    )

    # ------------------------------------------------------------------ WebSocket output
    # Metric families: docs/METRICS.md ("WebSocket output"), src/proxy/socket/metrics.rs.
    L.row(
        "WebSocket output",
        "Held streams read over WebSocket (per-stream and session sockets): sockets open, messages and "
        "batches written, closes by code, handshakes refused and bounds reached. See docs/WEBSOCKET.md.",
    )
    L.add(
        8,
        8,
        timeseries(
            "Sockets open by kind",
            "WebSocket connections open: stream (one stream's URL) and session (every stream of a binding). "
            "At most websocket.max_sockets per instance; past it handshakes are refused (503).",
            targets((sum_of("sse_gateway_websocket_sockets", by="kind"), "{{kind}}")),
            stack=True,
        ),
        timeseries(
            "Messages and batches",
            "WebSocket messages written to clients per second (a batch counts once), batches among them "
            "(written while a write was pending: the client reads slowly), messages carried inside batches, "
            "and messages received from clients.",
            targets(
                (sum_rate("sse_gateway_websocket_messages_total"), "messages"),
                (sum_rate("sse_gateway_websocket_batches_total"), "batches"),
                (sum_rate("sse_gateway_websocket_batched_messages_total"), "messages in batches"),
                (sum_rate("sse_gateway_websocket_received_total"), "received"),
            ),
            unit="ops",
        ),
        timeseries(
            "Closes by code",
            "Sockets closed per second by close code (docs/WEBSOCKET.md): 1000 the stream ended, 1001 "
            "draining, 1003/1008/1009 a client's fault, 1011 the gateway failed, 4000 gap, 4001 unknown, "
            "4002 cancelled, 4003 behind, 4004 busy, 4005 store unavailable.",
            targets((sum_rate("sse_gateway_websocket_closes_total", by="code"), "{{code}}")),
            unit="ops",
            stack=True,
        ),
    )
    L.add(
        12,
        7,
        timeseries(
            "Handshakes refused by reason",
            "WebSocket handshakes answered without an upgrade, per second: origin (an Origin not allowed: "
            "cross-site WebSocket hijacking), sockets (websocket.max_sockets open), handshake (not a valid "
            "handshake or no subprotocol spoken), no_binding (a session without bound values).",
            targets((sum_rate("sse_gateway_websocket_refused_total", by="reason"), "{{reason}}")),
            unit="ops",
            stack=True,
        ),
        timeseries(
            "WebSocket limits reached",
            "Sockets closed per second by a bound of docs/SECURITY.md: write_timeout / queue_full (the client "
            "fell behind: close 4003), pong_timeout, auth_timeout (1008), message_size (1009), session_streams "
            "(websocket.max_streams_per_session). Steady non-zero lines mean a bound is too small or clients misbehave.",
            targets((sum_rate("sse_gateway_websocket_limited_total", by="limit"), "{{limit}}")),
            unit="ops",
            stack=True,
        ),
    )
    L.add(
        12,
        7,
        timeseries(
            "Sessions open",
            "Session sockets' registrations per instance (every stream of a binding, told as it starts on any "
            "instance; docs/RESUME.md, Sessions). At most websocket.max_sockets; refusals per second beside.",
            targets(
                (sum_of("sse_gateway_resume_sessions", by="instance"), "{{instance}}"),
                (sum_rate("sse_gateway_resume_sessions_refused_total"), "refused/s"),
            ),
        ),
        timeseries(
            "Stream starts told to sessions",
            "Starts of streams told to session sockets per second: delivered, or dropped because a session "
            "had resume.session_queue starts waiting (it reads its socket too slowly).",
            targets((sum_rate("sse_gateway_resume_session_announcements_total", by="outcome"), "{{outcome}}")),
            unit="ops",
            stack=True,
        ),
    )

    variables = [
        {
            "type": "datasource",
            "name": "datasource",
            "label": "Data source",
            "query": "prometheus",
            "refresh": 1,
            "regex": "",
            "hide": 0,
            "options": [],
        },
        {
            "type": "query",
            "name": "job",
            "label": "Job",
            "datasource": DS,
            "query": {"query": "label_values(sse_gateway_ready, job)", "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,
            "sort": 1,
            "multi": False,
            "includeAll": False,
            "hide": 0,
            "options": [],
            "regex": "",
        },
        {
            "type": "query",
            "name": "instance",
            "label": "Instance",
            "datasource": DS,
            "query": {
                "query": 'label_values(sse_gateway_ready{job=~"$job"}, instance)',
                "refId": "PrometheusVariableQueryEditor-VariableQuery",
            },
            "refresh": 2,
            "sort": 1,
            "multi": True,
            "includeAll": True,
            "allValue": ".*",
            "hide": 0,
            "options": [],
            "regex": "",
        },
    ]

    return {
        "title": "sse-gateway",
        "uid": "sse-gateway",
        "description": "sse-gateway: legacy agent SSE to JSON envelopes. RED view of streams, latency, "
        "fragmentation and chunking, errors, traffic, resumable streams, WebSocket output. Source: deploy/grafana/build_dashboard.py.",
        "tags": ["sse-gateway", "sse", "proxy"],
        "editable": True,
        "graphTooltip": 1,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "weekStart": "",
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {"list": variables},
        "panels": L.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python3 {Path(__file__).as_posix()}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
