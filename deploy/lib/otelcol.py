#!/usr/bin/env python3
"""Checks an OpenTelemetry Collector configuration by its structure (run by deploy/check.sh).

The collector binary (otelcol / otelcol-contrib, whose `validate` subcommand would be the real
check) is a Go release binary or a container image, fetched from neither PyPI, npm, crates.io nor
Debian, and no registry reachable here ships the collector's configuration schema. So this script
checks what the collector itself refuses at start, and the gateway's needs, from the YAML:

  * top-level keys only receivers, processors, exporters, connectors, extensions, service;
    service only extensions, pipelines, telemetry;
  * every component id is `type` or `type/name`, its type one the collector (core or contrib
    distribution) has for that kind: KNOWN below; removed types (the `logging` exporter) fail,
    deprecated aliases (`otlp`/`otlphttp` exporters) are noted;
  * every component in service.pipelines.* and service.extensions is defined, and every defined
    one is used (the collector ignores an unused one silently: a typo, a pipeline not wired);
    a connector is an exporter of one pipeline and a receiver of another;
  * pipeline ids are traces|metrics|logs[/name] with non-empty receivers and exporters, no
    component twice in a list;
  * memory_limiter first and batch last among a pipeline's processors (the collector's
    documented practice), memory_limiter with check_interval and a limit;
  * for the gateway (docs/OBSERVABILITY.md: OTLP/HTTP protobuf, port 4318, /v1/traces): a traces
    pipeline receives from an otlp receiver with an http protocol on port 4318 (default path);
  * every `endpoint` parses as host:port (http(s)://host:port[/path] for OTLP/HTTP exporters),
    after `${env:NAME:-default}` is replaced by its default (one without a default fails: it
    cannot be checked);
  * with `--compose FILE`: a service of that Compose file mounts this config, and every
    service with OTEL_EXPORTER_OTLP_ENDPOINT points it at that service's port 4318 over http://
    on a shared network.

Usage: otelcol.py [--compose COMPOSE.yaml] CONFIG.yaml...   exit 1 on any error
       otelcol.py --self-test    the checks against a good config and deliberately broken ones
Needs PyYAML (deploy/tools/requirements.txt; check.sh's virtualenv).
"""

import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml

SECTIONS = ("receivers", "processors", "exporters", "connectors", "extensions")
TOP_LEVEL = set(SECTIONS) | {"service"}
SERVICE_KEYS = {"extensions", "pipelines", "telemetry"}
SIGNALS = ("traces", "metrics", "logs")
GATEWAY_PORT = 4318  # the gateway's default collector port (OTLP/HTTP)

# Component types by kind: the core distribution (otelcol) and the common ones of contrib
# (otelcol-contrib) as of collector 0.165. Extend when a config here needs another.
KNOWN = {
    "receivers": {
        "otlp", "nop",  # core
        "jaeger", "zipkin", "prometheus", "hostmetrics", "filelog", "k8s_cluster", "kubeletstats",
        "k8sobjects", "journald", "syslog", "kafka", "docker_stats", "redis", "httpcheck",
    },
    "processors": {
        "batch", "memory_limiter",  # core
        "attributes", "resource", "resourcedetection", "filter", "transform", "redaction",
        "tail_sampling", "probabilistic_sampler", "k8sattributes", "span", "groupbytrace",
        "groupbyattrs", "cumulativetodelta", "deltatocumulative", "metricstransform", "interval",
    },
    "exporters": {
        "otlp_grpc", "otlp_http", "otlp", "otlphttp", "debug", "nop",  # core
        "file", "kafka", "prometheus", "prometheusremotewrite", "zipkin", "loadbalancing",
        "clickhouse", "elasticsearch", "awsxray", "googlecloud", "datadog", "splunk_hec",
    },
    "connectors": {"forward", "spanmetrics", "count", "routing", "servicegraph", "signaltometrics", "failover"},
    "extensions": {
        "zpages", "memory_limiter",  # core
        "health_check", "healthcheckv2", "pprof", "file_storage", "bearertokenauth", "basicauth",
        "oauth2client", "oidc", "headers_setter", "sigv4auth", "k8s_observer", "docker_observer",
    },
}
REMOVED = {("exporters", "logging"): "the logging exporter was removed (collector 0.111): use debug"}
DEPRECATED = {
    ("exporters", "otlp"): "alias of otlp_grpc since collector 0.144",
    ("exporters", "otlphttp"): "alias of otlp_http since collector 0.144",
}
HTTP_URL_EXPORTERS = {"otlp_http", "otlphttp", "prometheusremotewrite", "zipkin", "elasticsearch", "splunk_hec"}
ID_RE = re.compile(r"^([a-z][a-z0-9_]*)(?:/([^/\s]+))?$")
PIPELINE_RE = re.compile(r"^(traces|metrics|logs)(?:/([^/\s]+))?$")
ENV_RE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class Checker:
    def __init__(self, label: str):
        self.label = label
        self.errors: list = []
        self.notes: list = []

    def err(self, msg: str):
        self.errors.append(f"{self.label}: {msg}")

    def note(self, msg: str):
        self.notes.append(f"{self.label}: {msg}")


def expand_env(value: str, c: Checker, where: str):
    """${env:NAME:-default} (and ${NAME:-default}) → the default; None if one has none."""
    missing = [m.group(1) for m in ENV_RE.finditer(value) if m.group(2) is None]
    if missing:
        c.err(f"{where}: ${{env:{missing[0]}}} has no default (write ${{env:{missing[0]}:-host:port}}), so it cannot be checked")
        return None
    return ENV_RE.sub(lambda m: m.group(2), value)


def host_port(value, c: Checker, where: str, url: bool = False):
    """Checks an endpoint; returns its port or None."""
    if not isinstance(value, str) or not value:
        c.err(f"{where}: endpoint {value!r} is not a string")
        return None
    v = expand_env(value, c, where)
    if v is None:
        return None
    if url or "://" in v:
        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.hostname:
            c.err(f"{where}: endpoint {value!r} should be http(s)://host:port[/path]")
            return None
        try:
            port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            c.err(f"{where}: endpoint {value!r} has a bad port")
            return None
        return port
    m = re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]*):(\d{1,5})", v)
    if not m or not 0 < int(m.group(2)) < 65536:
        c.err(f"{where}: endpoint {value!r} should be host:port")
        return None
    return int(m.group(2))


def walk_endpoints(node, path: str):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "endpoint":
                yield path, v
            else:
                yield from walk_endpoints(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk_endpoints(v, f"{path}[{i}]")


def check_config(doc, c: Checker):
    if not isinstance(doc, dict):
        c.err("not a YAML mapping")
        return
    for k in doc:
        if k not in TOP_LEVEL:
            c.err(f"unknown top-level key {k!r} (allowed: {', '.join(sorted(TOP_LEVEL))})")
    defined = {}  # kind -> {id: config}
    for kind in SECTIONS:
        sec = doc.get(kind) or {}
        if not isinstance(sec, dict):
            c.err(f"{kind} should be a mapping of component ids")
            sec = {}
        defined[kind] = {}
        for cid, cfg in sec.items():
            m = ID_RE.match(str(cid))
            if not m:
                c.err(f"{kind}: {cid!r} is not type or type/name")
                continue
            typ = m.group(1)
            if (kind, typ) in REMOVED:
                c.err(f"{kind}: {cid}: {REMOVED[kind, typ]}")
            elif typ not in KNOWN[kind]:
                c.err(f"{kind}: {cid}: unknown {kind[:-1]} type {typ!r} (known: {', '.join(sorted(KNOWN[kind]))})")
            elif (kind, typ) in DEPRECATED:
                c.note(f"{kind}: {cid}: {DEPRECATED[kind, typ]}")
            if cfg is not None and not isinstance(cfg, dict):
                c.err(f"{kind}: {cid}: its settings should be a mapping (or empty)")
                cfg = {}
            defined[kind][str(cid)] = cfg or {}

    svc = doc.get("service")
    if not isinstance(svc, dict):
        c.err("service: missing, or not a mapping")
        return
    for k in svc:
        if k not in SERVICE_KEYS:
            c.err(f"service: unknown key {k!r} (allowed: {', '.join(sorted(SERVICE_KEYS))})")
    used = {kind: set() for kind in SECTIONS}
    exts = svc.get("extensions") or []
    if not isinstance(exts, list):
        c.err("service.extensions should be a list")
        exts = []
    for e in exts:
        if e not in defined["extensions"]:
            c.err(f"service.extensions: {e!r} is not defined under extensions")
        used["extensions"].add(e)

    pipelines = svc.get("pipelines")
    if not isinstance(pipelines, dict) or not pipelines:
        c.err("service.pipelines: none defined")
        pipelines = {}
    conn_as = {"exporters": set(), "receivers": set()}
    for pid, p in pipelines.items():
        where = f"service.pipelines.{pid}"
        if not PIPELINE_RE.match(str(pid)):
            c.err(f"{where}: pipeline id should be traces|metrics|logs[/name]")
        if not isinstance(p, dict):
            c.err(f"{where}: should be a mapping")
            continue
        for k in p:
            if k not in ("receivers", "processors", "exporters"):
                c.err(f"{where}: unknown key {k!r}")
        for role in ("receivers", "processors", "exporters"):
            ids = p.get(role) or []
            if not isinstance(ids, list):
                c.err(f"{where}.{role} should be a list")
                continue
            if role != "processors" and not ids:
                c.err(f"{where}.{role}: empty (a pipeline needs at least one)")
            if len(set(ids)) != len(ids):
                c.err(f"{where}.{role}: a component is listed twice: {ids}")
            for cid in ids:
                if cid in defined[role]:
                    used[role].add(cid)
                elif role != "processors" and cid in defined["connectors"]:
                    used["connectors"].add(cid)
                    conn_as[role].add(cid)
                else:
                    c.err(f"{where}.{role}: {cid!r} is not defined under {role}" + ("" if role == "processors" else " or connectors"))
        procs = [str(x) for x in (p.get("processors") or []) if isinstance(p.get("processors"), list)]
        types = [x.split("/")[0] for x in procs]
        if "memory_limiter" in types and types[0] != "memory_limiter":
            c.err(f"{where}.processors: memory_limiter must come first, not {procs}")
        if "batch" in types and types[-1] != "batch":
            c.err(f"{where}.processors: batch must come last, not {procs}")
    for cid in defined["connectors"]:
        if cid in used["connectors"] and not (cid in conn_as["exporters"] and cid in conn_as["receivers"]):
            c.err(f"connectors: {cid} must be an exporter of one pipeline and a receiver of another")
    for kind in SECTIONS:
        for cid in defined[kind]:
            if cid not in used[kind]:
                c.err(f"{kind}: {cid} is defined but used in no pipeline" + (" (service.extensions)" if kind == "extensions" else ""))

    for cid, cfg in defined["processors"].items():
        if cid.split("/")[0] == "memory_limiter":
            if not cfg.get("check_interval"):
                c.err(f"processors: {cid}: check_interval is required (the collector refuses 0)")
            if not (cfg.get("limit_mib") or cfg.get("limit_percentage")):
                c.err(f"processors: {cid}: set limit_mib or limit_percentage")

    # Endpoints, everywhere they appear.
    for kind in SECTIONS:
        for cid, cfg in defined[kind].items():
            url = kind == "exporters" and cid.split("/")[0] in HTTP_URL_EXPORTERS
            for path, v in walk_endpoints(cfg, f"{kind}.{cid}"):
                host_port(v, c, path, url=url and path == f"{kind}.{cid}")

    # What the gateway needs: OTLP/HTTP on 4318, default /v1/traces, in a traces pipeline.
    ok_receivers = []
    for cid, cfg in defined["receivers"].items():
        if cid.split("/")[0] != "otlp":
            continue
        protos = cfg.get("protocols") or {}
        if not isinstance(protos, dict) or not protos:
            c.err(f"receivers.{cid}: protocols: needs http (and/or grpc)")
            continue
        for k in protos:
            if k not in ("http", "grpc"):
                c.err(f"receivers.{cid}.protocols: unknown protocol {k!r}")
        if "http" not in protos:
            continue
        http = protos["http"] or {}
        port = host_port(http.get("endpoint", "localhost:4318"), c, f"receivers.{cid}.protocols.http")
        path = http.get("traces_url_path", "/v1/traces")
        if port != GATEWAY_PORT:
            c.err(f"receivers.{cid}.protocols.http: port {port}, the gateway's collector port is {GATEWAY_PORT}")
        elif path != "/v1/traces":
            c.err(f"receivers.{cid}.protocols.http: traces_url_path {path!r}; OTEL_EXPORTER_OTLP_ENDPOINT appends /v1/traces")
        else:
            ok_receivers.append(cid)
    traces = [pid for pid, p in pipelines.items() if str(pid).split("/")[0] == "traces" and isinstance(p, dict)
              and set(p.get("receivers") or []) & set(ok_receivers)]
    if not traces:
        c.err(f"no traces pipeline receives from an otlp receiver with protocols.http on port {GATEWAY_PORT} (the gateway exports OTLP/HTTP protobuf only)")
    return traces, ok_receivers


def check_compose(compose_path: Path, config_path: Path, c: Checker):
    """The Compose file's collector service mounts this config; gateways point at it."""
    doc = yaml.safe_load(compose_path.read_text())
    services = doc.get("services") or {}
    collectors = []
    for name, s in services.items():
        for v in s.get("volumes") or []:
            src = str(v).split(":", 1)[0]
            if src.startswith(".") and (compose_path.parent / src).resolve() == config_path.resolve():
                target = str(v).split(":")[1]
                collectors.append((name, s, target))
    if len(collectors) != 1:
        c.err(f"{compose_path.name}: one service should mount {config_path.name}, found {[n for n, _, _ in collectors]}")
        return
    name, coll, target = collectors[0]
    image = str(coll.get("image", ""))
    want = "/etc/otelcol-contrib/config.yaml" if "contrib" in image else "/etc/otelcol/config.yaml"
    if target != want and not any(str(a).endswith(target) for a in (coll.get("command") or [])):
        c.err(f"{compose_path.name}: {name} mounts the config at {target}; the image {image} reads {want} (or pass --config)")
    c.note(f"{compose_path.name}: {name} ({image}) mounts it at {target}")
    pointed = 0
    for sname, s in services.items():
        env = s.get("environment") or {}
        if isinstance(env, list):
            env = dict(e.split("=", 1) for e in env)
        url = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if url is None:
            continue
        pointed += 1
        u = urlsplit(str(url))
        if u.scheme != "http" or u.hostname != name or (u.port or 80) != GATEWAY_PORT or u.path not in ("", "/"):
            c.err(f"{compose_path.name}: {sname}: OTEL_EXPORTER_OTLP_ENDPOINT {url!r} should be http://{name}:{GATEWAY_PORT} (plain http, base URL)")
        shared = set(s.get("networks") or ["default"]) & set(coll.get("networks") or ["default"])
        if not shared:
            c.err(f"{compose_path.name}: {sname} and {name} share no network")
    if not pointed:
        c.err(f"{compose_path.name}: no service sets OTEL_EXPORTER_OTLP_ENDPOINT to {name}")
    else:
        c.note(f"{compose_path.name}: {pointed} services export to http://{name}:{GATEWAY_PORT}")


def run(paths, compose=None) -> int:
    rc = 0
    for p in paths:
        c = Checker(str(p))
        try:
            doc = yaml.safe_load(Path(p).read_text())
        except yaml.YAMLError as e:
            print(f"FAIL {p}: not YAML: {e}")
            rc = 1
            continue
        res = check_config(doc, c)
        if compose:
            check_compose(Path(compose), Path(p), c)
        for n in c.notes:
            print(f"note {n}")
        for e in c.errors:
            print(f"FAIL {e}")
        if c.errors:
            rc = 1
        else:
            traces, recv = res
            counts = ", ".join(f"{len(doc.get(k) or {})} {k}" for k in SECTIONS if doc.get(k))
            print(f"ok   {p}: {counts}; the gateway's OTLP/HTTP :{GATEWAY_PORT} ({', '.join(recv)}) feeds {', '.join(traces)}")
    return rc


# ------------------------------------------------------------------------------ self-test
GOOD = """
extensions: {health_check: {endpoint: "0.0.0.0:13133"}}
receivers:
  otlp: {protocols: {http: {endpoint: "0.0.0.0:4318"}}}
processors:
  memory_limiter: {check_interval: 1s, limit_mib: 400}
  batch: {}
exporters:
  otlp_grpc/backend: {endpoint: "${env:BACKEND:-tempo:4317}", tls: {insecure: true}}
  otlp_http: {endpoint: "http://jaeger:4318"}
service:
  extensions: [health_check]
  pipelines:
    traces: {receivers: [otlp], processors: [memory_limiter, batch], exporters: [otlp_grpc/backend, otlp_http]}
"""

# (what is broken, a replacement applied to GOOD, a fragment the error must contain)
BROKEN = [
    ("unknown top-level key", ("extensions:", "exporter: {}\nextensions:"), "unknown top-level key 'exporter'"),
    ("unknown component type", ("otlp_http: {", "otlp_htp: {"), "unknown exporter type 'otlp_htp'"),
    ("removed logging exporter", ("otlp_http: {endpoint: \"http://jaeger:4318\"}", "logging: {}"), "logging exporter was removed"),
    ("bad component id", ("otlp_grpc/backend:", "otlp_grpc/a/b:"), "is not type or type/name"),
    ("pipeline names an undefined exporter", ("exporters: [otlp_grpc/backend, otlp_http]", "exporters: [otlp_grpc/tempo, otlp_http]"), "'otlp_grpc/tempo' is not defined"),
    ("defined exporter unused", ("exporters: [otlp_grpc/backend, otlp_http]", "exporters: [otlp_grpc/backend]"), "otlp_http is defined but used in no pipeline"),
    ("extension not enabled", ("extensions: [health_check]", "extensions: []"), "health_check is defined but used"),
    ("service extension undefined", ("extensions: [health_check]", "extensions: [health_check, pprof]"), "'pprof' is not defined under extensions"),
    ("bad pipeline id", ("    traces: {", "    spans: {"), "pipeline id should be"),
    ("no receivers", ("receivers: [otlp]", "receivers: []"), "receivers: empty"),
    ("batch before memory_limiter", ("[memory_limiter, batch]", "[batch, memory_limiter]"), "memory_limiter must come first"),
    ("memory_limiter without check_interval", ("check_interval: 1s, ", ""), "check_interval is required"),
    ("gateway port wrong", ("0.0.0.0:4318", "0.0.0.0:4319"), "the gateway's collector port is 4318"),
    ("grpc only", ("protocols: {http: {endpoint: \"0.0.0.0:4318\"}}", "protocols: {grpc: {endpoint: \"0.0.0.0:4317\"}}"), "exports OTLP/HTTP protobuf only"),
    ("endpoint not host:port", ("tempo:4317", "tempo"), "should be host:port"),
    ("env without default", ("${env:BACKEND:-tempo:4317}", "${env:BACKEND}"), "has no default"),
    ("otlp_http endpoint not a URL", ("http://jaeger:4318", "jaeger:4318"), "should be http(s)://host:port"),
    ("traces path moved", ("{endpoint: \"0.0.0.0:4318\"}", "{endpoint: \"0.0.0.0:4318\", traces_url_path: /traces}"), "appends /v1/traces"),
    ("unknown service key", ("  extensions: [health_check]", "  extension: [health_check]\n  extensions: [health_check]"), "service: unknown key 'extension'"),
]

GOOD_COMPOSE = """
services:
  gw:
    environment: {OTEL_EXPORTER_OTLP_ENDPOINT: "http://otel-collector:4318"}
    networks: [front]
  otel-collector:
    image: otel/opentelemetry-collector-contrib:0.165.0
    volumes: ["../otel/otel-collector.yaml:/etc/otelcol-contrib/config.yaml:ro"]
    networks: [front]
"""
BROKEN_COMPOSE = [
    ("compose: gateway on the grpc port", ("otel-collector:4318", "otel-collector:4317"), "should be http://otel-collector:4318"),
    ("compose: https endpoint", ("http://otel", "https://otel"), "should be http://otel-collector:4318"),
    ("compose: traces path in the base URL", ("4318\"", "4318/v1/traces\""), "should be http://otel-collector:4318"),
    ("compose: config not mounted", ("../otel/otel-collector.yaml:", "../otel/other.yaml:"), "one service should mount"),
    ("compose: wrong config path in the image", ("/etc/otelcol-contrib/", "/etc/otelcol/"), "reads /etc/otelcol-contrib/config.yaml"),
    ("compose: no shared network", ("    networks: [front]\n  otel", "    networks: [back]\n  otel"), "share no network"),
]


def self_test() -> int:
    bad = 0
    c = Checker("good")
    check_config(yaml.safe_load(GOOD), c)
    if c.errors:
        print(f"FAIL the good config is refused: {c.errors}")
        bad += 1
    for what, (old, new), expect in BROKEN:
        if old not in GOOD:
            print(f"FAIL self-test {what!r}: {old!r} not in the good config")
            bad += 1
            continue
        c = Checker(what)
        check_config(yaml.safe_load(GOOD.replace(old, new, 1)), c)
        if not any(expect in e for e in c.errors):
            print(f"FAIL broken config not caught ({what}): expected {expect!r}, got {c.errors}")
            bad += 1
    # --compose: a Compose file beside the config, good and broken.
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        cfg = Path(d, "otel/otel-collector.yaml")
        cfg.parent.mkdir()
        cfg.write_text(GOOD)
        compose = Path(d, "compose/compose.yaml")
        compose.parent.mkdir()
        for what, (old, new), expect in [("good compose", ("", ""), None)] + BROKEN_COMPOSE:
            compose.write_text(GOOD_COMPOSE.replace(old, new, 1) if old else GOOD_COMPOSE)
            c = Checker(what)
            check_compose(compose, cfg, c)
            caught = any(expect in e for e in c.errors) if expect else not c.errors
            if not caught or (old and old not in GOOD_COMPOSE):
                print(f"FAIL self-test {what}: expected {expect!r}, got {c.errors}")
                bad += 1
    n = len(BROKEN) + len(BROKEN_COMPOSE)
    print(f"self-test: good config and compose accepted, {n} broken ones checked, {bad} not caught")
    return 1 if bad else 0


def main() -> int:
    args = sys.argv[1:]
    if args == ["--self-test"]:
        return self_test()
    compose = None
    if len(args) >= 2 and args[0] == "--compose":
        compose, args = args[1], args[2:]
    if not args or any(a.startswith("-") for a in args):
        print(__doc__, file=sys.stderr)
        return 2
    return run(args, compose)


if __name__ == "__main__":
    sys.exit(main())
