#!/usr/bin/env python3
"""Cross-file checks of deploy/ that no single-file validator makes (run by deploy/check.sh).

Subcommands:
  docker         Dockerfile COPY sources exist and pass the .dockerignore allow-list; the
                 two ignore files agree; EXPOSE, USER, HEALTHCHECK are what the docs say.
  kubernetes     per Deployment: grace period > preStop sleep + drain timeout; probes on the
                 admin port with /healthz and /readyz; ConfigMap ports match containerPorts;
                 Services, PDB, HPA and ServiceMonitor select what exists; sidecar upstream
                 is the backend container on 127.0.0.1 and the backend outlives the drain.
  systemd        TimeoutStopSec above the drain timeout; the hardening keys the issue names.
  lb             nginx and haproxy: SSE-safe settings and timeouts above the keepalive.
  daemon-config BIN  the daemon itself (`BIN --check-config`, which rejects unknown keys
                 and bad values) accepts every setting shipped here: each ConfigMap's
                 environment, the Dockerfile's ENV, the systemd unit's Environment= and its
                 --config file (config/default.toml, as the install steps copy it).
  fresh-metrics BIN  a fresh gateway (BIN, default settings, nothing served yet) exposes in
                 its /metrics every sse_gateway_* series the dashboard's queries and the alert
                 rules' expressions name (as written: a histogram's _bucket, a counter's _total),
                 so no panel shows "No data" and no rule goes unevaluated before the first
                 request, resumption or close (issue 34: labelled families start at zero).
  render-kustomize D  `kubectl kustomize` of every kustomization in deploy/kubernetes, and
                 of sidecar + the redis component, into D/<name>.yaml.
  render-nginx D writes deploy/nginx/*.conf into D with host paths (pid, logs, temp dirs)
                 moved into D, for `nginx -t -p D -c D/nginx.conf` without root paths.
  resume         resumable streams (issue 15) against their contract, docs/RESUME.md: every
                 sse_gateway_resume_* metric, label and label value the dashboard, the alert
                 rules and their tests use is in its Metrics list; every
                 SSE_GATEWAY__RESUME__* setting shipped (compose, kubernetes) is one of its
                 resume.* keys. (The names come from the doc, not from src/, because the
                 implementation lands separately: once src/ registers them, the end-to-end
                 check also requires each to be scraped.)
  compose        deploy/compose/compose.yaml: two or more gateways with identical settings,
                 resume.store = "redis" on a store service they share, one binding key,
                 drain-safe stop_grace_period; its haproxy.cfg balances round-robin over
                 exactly those gateways with /readyz checks on the admin port.
  kubernetes-resume FILE...  kustomize-rendered overlays with deploy/kubernetes/redis
                 (check.sh renders them): the gateway gets resume.store = "redis", a
                 redis_url naming the Valkey Service and port, the binding key and the
                 password from the one Secret Valkey uses too; the NetworkPolicy admits the
                 gateway pods to Valkey.
Needs PyYAML (installed by check.sh into its virtualenv).
"""

import fnmatch
import re
import sys
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent.parent
ROOT = DEPLOY.parent
# The daemon's defaults (config.rs): drain 30 s, keepalive 15 s, admin port 9090.
DEFAULT_DRAIN_SECS = 30.0
DEFAULT_KEEPALIVE_SECS = 15.0

errors: list = []
notes: list = []


def fail(msg: str):
    errors.append(msg)


def ok(msg: str):
    notes.append(msg)


def fail_if(failed: bool, fail_msg: str, ok_msg: str):
    """Records one check: fail_msg if it failed, else ok_msg (both messages are built up front)."""
    if failed:
        fail(fail_msg)
    else:
        ok(ok_msg)


def finish() -> int:
    for n in notes:
        print(f"  ok   {n}")
    for e in errors:
        print(f"  FAIL {e}")
    print(f"{len(notes)} checks passed, {len(errors)} failed")
    return 1 if errors else 0


# ---------------------------------------------------------------------------- docker
def ignore_patterns(path: Path) -> list:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def ignored(rel: str, patterns: list) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    result = False
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.rstrip("/")
        pat_dir = pat.replace("**/", "")
        matched = (
            fnmatch.fnmatch(rel, pat)
            or rel.startswith(pat + "/")
            or ("**/" in pat and (fnmatch.fnmatch(rel, "*" + pat_dir) or ("/" + pat_dir + "/") in ("/" + rel + "/")))
        )
        if matched:
            result = not neg
    return result


def check_docker() -> int:
    df = (DEPLOY / "docker/Dockerfile").read_text()
    pats = ignore_patterns(DEPLOY / "docker/Dockerfile.dockerignore")
    fail_if(
        pats != ignore_patterns(DEPLOY / "docker/.dockerignore"),
        "docker/.dockerignore and docker/Dockerfile.dockerignore differ",
        "Dockerfile.dockerignore and .dockerignore agree",
    )
    for m in re.finditer(r"^COPY (?!--from)(.+)$", df, re.M):
        srcs = m.group(1).split()[:-1]
        for s in srcs:
            rel = s.rstrip("/").removeprefix("./")
            if not (ROOT / rel).exists():
                # config/ comes with the daemon branch; an absent source breaks the build.
                fail(f"COPY source {rel} does not exist in the repository")
            elif ignored(rel, pats):
                fail(f"COPY source {rel} is excluded by the .dockerignore")
            else:
                ok(f"COPY source {rel} exists and is in the build context")
    # Targets declared in Cargo.toml must be in the context, or cargo refuses the manifest.
    import tomllib

    copied = [s.rstrip("/").removeprefix("./") for m in re.finditer(r"^COPY (?!--from)(.+)$", df, re.M) for s in m.group(1).split()[:-1]]
    manifest = tomllib.loads((ROOT / "Cargo.toml").read_text())
    for section, default_dir in (("bin", "src/bin"), ("bench", "benches"), ("test", "tests"), ("example", "examples")):
        for t in manifest.get(section, []):
            path = t.get("path") or f"{default_dir}/{t['name']}.rs"
            fail_if(
                not any(path == c or path.startswith(c + "/") for c in copied),
                f"Cargo.toml [[{section}]] {t['name']} ({path}) is not copied into the builder stage",
                f"Cargo.toml [[{section}]] {t['name']} ({path}) is in the build context",
            )
    if (ROOT / "build.rs").exists() and "build.rs" not in copied:
        fail("build.rs exists but is not copied into the builder stage")
    # The builder stage's view of the repository: only the COPY'd paths. cargo must resolve
    # the manifest and the lock file there as `cargo build --locked` will in the image.
    import shutil
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="docker-ctx-") as ctx:
        for c in copied:
            src = ROOT / c
            if src.is_dir():
                shutil.copytree(src, Path(ctx) / c, ignore=shutil.ignore_patterns("target"))
            elif src.exists():
                shutil.copy2(src, Path(ctx) / c)
        p = subprocess.run(
            ["cargo", "metadata", "--locked", "--format-version", "1"],
            cwd=ctx,
            capture_output=True,
            text=True,
            timeout=300,
        )
        fail_if(
            p.returncode != 0,
            f"cargo metadata --locked in the builder's context: {p.stderr.strip()[-500:]}",
            "cargo resolves the manifest and Cargo.lock from the COPY'd files alone (--locked)",
        )
    for bad in ("target/release/sse-gateway", ".git/HEAD"):
        if not ignored(bad, pats):
            fail(f".dockerignore lets {bad} into the context")
    ok("target/ and .git/ stay out of the context")
    expose = re.search(r"^EXPOSE (.+)$", df, re.M)
    if not expose or set(expose.group(1).split()) != {"8080", "9090"}:
        fail("EXPOSE must list 8080 and 9090")
    else:
        ok("EXPOSE 8080 9090")
    user = re.findall(r"^USER (\S+)", df, re.M)
    fail_if(
        not user or user[-1].split(":")[0] in ("root", "0"),
        "the runtime stage must end with a non-root USER",
        f"runtime user {user[-1]}",
    )
    fail_if(
        not re.search(r"^HEALTHCHECK .*\n?.*127\.0\.0\.1:9090/healthz", df, re.M),
        "HEALTHCHECK must probe http://127.0.0.1:9090/healthz",
        "HEALTHCHECK on the admin port's /healthz",
    )
    fail_if(len(re.findall(r"^FROM ", df, re.M)) < 2, "the Dockerfile must be multi-stage", "multi-stage build")
    if "SSE_GATEWAY__SERVER__ADMIN_LISTEN=0.0.0.0:9090" not in df:
        fail("the image must bind the admin listener on all interfaces (probes, Prometheus)")
    return finish()


# ---------------------------------------------------------------------------- kubernetes
def load_docs(d: Path) -> list:
    docs = []
    for f in sorted(d.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                doc["__file"] = f"{d.name}/{f.name}"
                docs.append(doc)
    return docs


def secs(v) -> float:
    return float(str(v).rstrip("s"))


def prestop_sleep(container: dict) -> float:
    ps = container.get("lifecycle", {}).get("preStop", {})
    if "sleep" in ps:
        return float(ps["sleep"]["seconds"])
    cmd = ps.get("exec", {}).get("command", [])
    if len(cmd) == 2 and cmd[0].endswith("sleep"):
        return float(cmd[1])
    return 0.0


def selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def check_kubernetes() -> int:
    for style in ("standalone", "sidecar"):
        docs = load_docs(DEPLOY / "kubernetes" / style)
        by_kind: dict = {}
        for d in docs:
            by_kind.setdefault(d["kind"], []).append(d)
        kust = by_kind.get("Kustomization", [{}])[0]
        files = {f.name for f in (DEPLOY / "kubernetes" / style).glob("*.yaml")} - {"kustomization.yaml"}
        fail_if(
            set(kust.get("resources", [])) != files,
            f"{style}: kustomization resources {kust.get('resources')} != files {sorted(files)}",
            f"{style}: kustomization lists every manifest",
        )
        for kind in ("Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"):
            if kind not in by_kind:
                fail(f"{style}: no {kind}")
        cms = {c["metadata"]["name"]: c.get("data", {}) for c in by_kind.get("ConfigMap", [])}
        for dep in by_kind.get("Deployment", []):
            name = f"{style}/{dep['metadata']['name']}"
            pod = dep["spec"]["template"]
            labels = pod["metadata"]["labels"]
            spec = pod["spec"]
            grace = spec.get("terminationGracePeriodSeconds", 30)
            gws = [c for c in spec["containers"] if "sse-gateway" in c["image"]]
            if len(gws) != 1:
                fail(f"{name}: expected one sse-gateway container")
                continue
            gw = gws[0]
            env = {}
            for ef in gw.get("envFrom", []):
                env.update(cms.get(ef.get("configMapRef", {}).get("name"), {}))
            for e in gw.get("env", []):
                env[e["name"]] = e.get("value")
            drain = secs(env.get("SSE_GATEWAY__SERVER__DRAIN_TIMEOUT_SECS", DEFAULT_DRAIN_SECS))
            sleep = prestop_sleep(gw)
            if sleep <= 0:
                fail(f"{name}: the gateway needs a preStop sleep (LB deregistration before the drain)")
            fail_if(
                grace <= sleep + drain,
                f"{name}: terminationGracePeriodSeconds {grace} <= preStop {sleep} + drain {drain}",
                f"{name}: grace {grace}s > preStop {sleep:g}s + drain {drain:g}s",
            )
            ports = {p["name"]: p["containerPort"] for p in gw.get("ports", [])}
            for var, pname in (("SSE_GATEWAY__SERVER__LISTEN", "http"), ("SSE_GATEWAY__SERVER__ADMIN_LISTEN", "admin")):
                addr = env.get(var, "")
                fail_if(
                    not addr.startswith("0.0.0.0:") or int(addr.rsplit(":", 1)[1]) != ports.get(pname),
                    f"{name}: {var}={addr!r} must bind 0.0.0.0 on containerPort {pname}={ports.get(pname)}",
                    f"{name}: {var} matches containerPort {pname}",
                )
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                get = gw.get(probe, {}).get("httpGet", {})
                fail_if(
                    get.get("port") != "admin" or get.get("path") != path,
                    f"{name}: {probe} must be GET {path} on port admin, is {get}",
                    f"{name}: {probe} GET {path} on the admin port",
                )
            upstream = env.get("SSE_GATEWAY__UPSTREAM__URL", "")
            others = [c for c in spec["containers"] if c is not gw]
            if style == "sidecar":
                backend = others[0] if others else {}
                bports = [p["containerPort"] for p in backend.get("ports", [])]
                m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/?", upstream)
                fail_if(
                    not m or int(m.group(1)) not in bports,
                    f"{name}: sidecar upstream {upstream!r} must be http://127.0.0.1:<backend port {bports}>",
                    f"{name}: upstream is the backend container on loopback",
                )
                bsleep = prestop_sleep(backend)
                fail_if(
                    bsleep < sleep + drain or grace <= bsleep,
                    f"{name}: backend preStop {bsleep}s must be >= gateway preStop+drain and < grace",
                    f"{name}: backend outlives the gateway's drain ({bsleep:g}s)",
                )
            for svc in by_kind.get("Service", []):
                if selects({"matchLabels": svc["spec"]["selector"]}, labels):
                    tps = {p["targetPort"] for p in svc["spec"]["ports"]}
                    fail_if(
                        not tps <= {"http", "admin"},
                        f"{style}/{svc['metadata']['name']}: targets {tps}, not the gateway's ports",
                        f"{style}/{svc['metadata']['name']}: targets the gateway ({', '.join(sorted(tps))})",
                    )
            for kind in ("PodDisruptionBudget",):
                for o in by_kind.get(kind, []):
                    fail_if(
                        not selects(o["spec"]["selector"], labels),
                        f"{style}/{kind}: selector does not match the pods",
                        f"{style}/{kind} selects the pods",
                    )
            for hpa in by_kind.get("HorizontalPodAutoscaler", []):
                ref = hpa["spec"]["scaleTargetRef"]
                fail_if(
                    ref["kind"] != "Deployment" or ref["name"] != dep["metadata"]["name"],
                    f"{style}/HPA: scaleTargetRef {ref} is not {dep['metadata']['name']}",
                    f"{style}/HPA scales {ref['name']}",
                )
            if dep["spec"].get("strategy", {}).get("rollingUpdate", {}).get("maxUnavailable", 1) != 0:
                fail(f"{name}: rollingUpdate.maxUnavailable should be 0 (new pod ready before an old one drains)")
        for sm in by_kind.get("ServiceMonitor", []):
            sel = sm["spec"]["selector"]
            svcs = [s for s in by_kind.get("Service", []) if selects(sel, s["metadata"].get("labels", {}))]
            ports = {p["name"] for s in svcs for p in s["spec"]["ports"]}
            eps = {e["port"] for e in sm["spec"]["endpoints"]}
            if not svcs or not eps <= ports:
                fail(f"{style}/ServiceMonitor: selects {len(svcs)} Services with ports {ports}, wants {eps}")
            elif any(p["name"] == "http" for s in svcs for p in s["spec"]["ports"]):
                fail(f"{style}/ServiceMonitor: selects the public Service")
            else:
                ok(f"{style}/ServiceMonitor scrapes port {', '.join(eps)} of {', '.join(s['metadata']['name'] for s in svcs)}")
    return finish()


# ---------------------------------------------------------------------------- systemd
def check_systemd() -> int:
    unit = (DEPLOY / "systemd/sse-gateway.service").read_text()
    keys: dict = {}
    for line in unit.splitlines():
        m = re.match(r"^(\w+)=(.*)$", line)
        if m:
            keys.setdefault(m.group(1), []).append(m.group(2))
    stop = keys.get("TimeoutStopSec", ["90s"])[-1]
    fail_if(
        secs(stop) <= DEFAULT_DRAIN_SECS,
        f"TimeoutStopSec={stop} must exceed the drain timeout ({DEFAULT_DRAIN_SECS:g} s)",
        f"TimeoutStopSec={stop} > drain timeout {DEFAULT_DRAIN_SECS:g}s",
    )
    want = {
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "RestrictNamespaces": "yes",
        "MemoryDenyWriteExecute": "yes",
        "KillSignal": "SIGTERM",
    }
    for k, v in want.items():
        fail_if(keys.get(k, [None])[-1] != v, f"{k} should be {v}", f"{k}={v}")
    fail_if(
        "ExecReload" in keys,
        "ExecReload is set but the daemon has no reload signal",
        "no ExecReload (the daemon has no reload; restart drains)",
    )
    return finish()


# ---------------------------------------------------------------------------- load balancers
def check_lb() -> int:
    conf = re.sub(r"#.*", "", (DEPLOY / "nginx/sse-gateway.conf").read_text())
    main = re.sub(r"#.*", "", (DEPLOY / "nginx/nginx.conf").read_text())
    d = {}
    for m in re.finditer(r"^\s*(\w+)\s+([^;]*);", conf, re.M):
        d.setdefault(m.group(1), []).append(m.group(2).strip())
    for k, v in {
        "proxy_buffering": "off",
        "proxy_cache": "off",
        "proxy_request_buffering": "off",
        "gzip": "off",
        "proxy_http_version": "1.1",
    }.items():
        fail_if(d.get(k) != [v], f"nginx: {k} should be {v}, is {d.get(k)}", f"nginx: {k} {v}")
    if 'Connection ""' not in " ".join(d.get("proxy_set_header", [])):
        fail('nginx: proxy_set_header Connection "" (upstream keep-alive) missing')
    else:
        ok('nginx: Connection "" to the gateways (keep-alive)')
    fail_if(
        not d.get("keepalive"),
        "nginx: upstream keepalive pool missing",
        f"nginx: upstream keepalive {d['keepalive'][0]}",
    )
    for k in ("proxy_read_timeout", "proxy_send_timeout"):
        v = secs(d.get(k, ["60s"])[0])
        fail_if(
            v <= 2 * DEFAULT_KEEPALIVE_SECS,
            f"nginx: {k} {v}s should be well above the keepalive interval {DEFAULT_KEEPALIVE_SECS:g}s",
            f"nginx: {k} {v:g}s > 2 x keepalive {DEFAULT_KEEPALIVE_SECS:g}s",
        )
    gz = re.search(r"gzip_types([^;]*);", main)
    fail_if(
        gz and "text/event-stream" in gz.group(1),
        "nginx.conf: text/event-stream must not be in gzip_types",
        "nginx.conf: text/event-stream not in gzip_types",
    )

    # Resumable streams: the reconnect's Last-Event-ID and the bound headers (Authorization,
    # Cookie) reach the gateway as the client sent them; X-Gateway-Stream reaches the client.
    if re.search(r"proxy_pass_request_headers\s+off", conf):
        fail("nginx: proxy_pass_request_headers off would drop Last-Event-ID")
    bad = [h for h in d.get("proxy_set_header", []) if h.split()[0].lower() in RESUME_REQUEST_HEADERS]
    hidden = [h for h in d.get("proxy_hide_header", []) if h.lower() == "x-gateway-stream"]
    fail_if(
        bad or hidden,
        f"nginx: resumption headers overridden or hidden: {bad + hidden}",
        "nginx: Last-Event-ID, Authorization, Cookie forwarded as sent; X-Gateway-Stream not hidden",
    )
    if "non_idempotent" in " ".join(d.get("proxy_next_upstream", [])):
        fail("nginx: proxy_next_upstream non_idempotent would replay a POST (and restart the run)")
    check_haproxy_sse(DEPLOY / "haproxy/haproxy.cfg")
    check_haproxy_sse(DEPLOY / "compose/haproxy.cfg")
    return finish()


RESUME_REQUEST_HEADERS = ("last-event-id", "authorization", "cookie")


def check_haproxy_sse(path: Path) -> None:
    """SSE-safe settings of one HAProxy config (deploy/haproxy, deploy/compose)."""
    rel = path.relative_to(DEPLOY).as_posix()
    cfg = re.sub(r"#.*", "", path.read_text())
    timeouts = dict(re.findall(r"^\s*timeout (\S+) (\S+)", cfg, re.M))
    for k in ("client", "server", "tunnel"):
        v = timeouts.get(k)
        val = secs(v.replace("h", "")) * 3600 if v and v.endswith("h") else secs(v) if v else 0
        fail_if(
            val <= 2 * DEFAULT_KEEPALIVE_SECS,
            f"{rel}: timeout {k} {v} should be well above the keepalive interval",
            f"{rel}: timeout {k} {v}",
        )
    fail_if(
        re.search(r"^\s*compression ", cfg, re.M),
        f"{rel}: no compression (SSE must not be compressed)",
        f"{rel}: no compression",
    )
    fail_if(
        "option http-keep-alive" not in cfg or "http-reuse" not in cfg,
        f"{rel}: keep-alive to the gateways (option http-keep-alive, http-reuse) missing",
        f"{rel}: keep-alive and connection reuse to the gateways",
    )
    fail_if(
        "uri /readyz" not in cfg,
        f"{rel}: health check should use /readyz (drain-aware)",
        f"{rel}: health check on /readyz",
    )
    if "shutdown-sessions" in cfg:
        fail(f"{rel}: on-marked-down shutdown-sessions would cut draining streams")
    touched = [
        m.group(0).strip()
        for m in re.finditer(r"^\s*http-request\s+(?:del-header|set-header|replace-header|replace-value)\s+(\S+).*$", cfg, re.M)
        if m.group(1).lower() in RESUME_REQUEST_HEADERS
    ]
    touched += [m.group(0).strip() for m in re.finditer(r"^\s*http-response\s+del-header\s+x-gateway-stream\b.*$", cfg, re.M | re.I)]
    fail_if(
        touched,
        f"{rel}: resumption headers rewritten or removed: {touched}",
        f"{rel}: Last-Event-ID, Authorization, Cookie forwarded as sent; X-Gateway-Stream kept",
    )


def check_daemon_config(binary: str) -> int:
    import os
    import subprocess

    def effective(env: dict, args=()) -> tuple:
        base = {k: v for k, v in os.environ.items() if not k.startswith("SSE_GATEWAY__")}
        p = subprocess.run(
            [binary, *args, "--check-config"],
            env={**base, **env},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        return p.returncode, p.stdout + p.stderr

    sets = []
    for style in ("standalone", "sidecar"):
        for doc in load_docs(DEPLOY / "kubernetes" / style):
            if doc["kind"] == "ConfigMap":
                sets.append((f"{style} ConfigMap {doc['metadata']['name']}", doc["data"], ()))
    df = (DEPLOY / "docker/Dockerfile").read_text().replace("\\\n", " ")
    denv = {}
    for m in re.finditer(r"^ENV (.+)$", df, re.M):
        denv.update(dict(re.findall(r"(SSE_GATEWAY__\w+)=(\S+)", m.group(1))))
    sets.append(("Dockerfile ENV", denv, ()))
    unit = (DEPLOY / "systemd/sse-gateway.service").read_text()
    uenv = dict(re.findall(r"^Environment=(SSE_GATEWAY__\w+)=(\S+)$", unit, re.M))
    conf = re.search(r"^ExecStart=\S+ --config (\S+)", unit, re.M)
    if not conf:
        fail("systemd: ExecStart should pass --config FILE")
    sets.append(("systemd Environment= + --config (config/default.toml)", uenv, ("--config", str(ROOT / "config/default.toml"))))
    # Resumable streams (issue 15): the compose gateways and the kustomize overlays with
    # deploy/kubernetes/redis, secrets and required variables replaced by sample values.
    compose = yaml.safe_load((DEPLOY / "compose/compose.yaml").read_text())
    for svc_name, svc in compose["services"].items():
        # The OTEL_* variables too (traces, docs/OBSERVABILITY.md): the daemon refuses a bad one
        # at start and with --check-config; they are not part of the effective configuration.
        cenv = {k: v for k, v in compose_env(svc).items() if k.startswith(("SSE_GATEWAY__", "OTEL_"))}
        if any(k.startswith("SSE_GATEWAY__") for k in cenv):
            cenv = {k: re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: SAMPLE_VARS.get(m.group(1), "sample"), v) for k, v in cenv.items()}
            sets.append((f"compose {svc_name} environment", cenv, ()))
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kustomize-") as d:
        for f in render_overlays(Path(d)):
            if "redis" in f.stem:
                sets.append((f"kubernetes {f.stem} (rendered) gateway env", rendered_gateway_env(f), ()))
    _, base_out = effective({})
    has_resume = "[resume]" in base_out
    for name, env, args in sets:
        if not env:
            fail(f"{name}: no SSE_GATEWAY__ settings found")
            continue
        pending = sorted(k for k in env if k.startswith("SSE_GATEWAY__RESUME__"))
        if pending and not has_resume:
            # NOTE: remove this branch once the daemon has [resume] (issue 15).
            ok(f"{name}: {len(pending)} resume settings not run through the daemon: it has no [resume] section yet (issue 15)")
            env = {k: v for k, v in env.items() if k not in pending}
        rc, out = effective(env, args)
        if rc != 0:
            fail(f"{name}: sse-gateway --check-config exit {rc}: {out.strip()}")
            continue
        # Each value must show up in the effective configuration the daemon prints.
        lost = []
        for k, v in env.items():
            if k in SECRET_SETTINGS or k.startswith("OTEL_"):
                continue  # accepted; its value may be redacted in (or absent from) the effective configuration
            key = k.split("__")[-1].lower()
            if not re.search(rf'^{key} = "?{re.escape(v)}(\.0)?"?$', out, re.M):
                lost.append(f"{k}={v}")
        fail_if(
            lost,
            f"{name}: accepted, but not in the effective config: {lost}",
            f"{name}: {len(env)} settings accepted by the daemon",
        )
    return finish()


# ---------------------------------------------------------------------------- fresh metrics
SERIES_RE = re.compile(r"\b(sse_gateway_[a-z0-9_]+)\b")


def deployed_series() -> dict:
    """series name -> where it is queried, for every sse_gateway_* name in the dashboard's
    expressions (panels, nested rows, query variables) and the rules' `expr`s; names the
    rules record themselves are left out (Prometheus makes those, not the gateway)."""
    import json

    exprs = []
    dash = json.loads((DEPLOY / "grafana/dashboard.json").read_text())

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                exprs.append((f"dashboard panel {p['id']} '{p['title']}'", t.get("expr", "")))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        exprs.append((f"dashboard variable ${v.get('name')}", q.get("query", "") if isinstance(q, dict) else str(q or "")))
    rules = yaml.safe_load((DEPLOY / "prometheus/rules/sse-gateway.rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    for g in rules["groups"]:
        for r in g["rules"]:
            exprs.append((f"rule {r.get('alert') or r.get('record')}", r["expr"]))
    out: dict = {}
    for where, expr in exprs:
        for name in SERIES_RE.findall(expr):
            if name not in recorded:
                out.setdefault(name, []).append(where)
    return out


def check_fresh_metrics(binary: str) -> int:
    import os
    import socket
    import subprocess
    import tempfile
    import time
    import urllib.request

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    binary = os.path.abspath(binary)
    wanted = deployed_series()
    if len(wanted) < 20:
        fail(f"read only {len(wanted)} series from the dashboard and the rules; their format changed?")
        return finish()
    # Default settings (no SSE_GATEWAY__* from the caller), an upstream nobody listens on: the
    # gateway starts without reaching it, and nothing is served before the scrape.
    admin = f"127.0.0.1:{free_port()}"
    argv = [binary, "--upstream", f"http://127.0.0.1:{free_port()}", "--listen", f"127.0.0.1:{free_port()}", "--admin-listen", admin]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SSE_GATEWAY__")}
    text = None
    with tempfile.TemporaryFile() as log:
        p = subprocess.Popen(argv, env=env, cwd=tempfile.gettempdir(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            end = time.monotonic() + 20
            while text is None and time.monotonic() < end and p.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=2) as r:
                        text = r.read().decode()
                except OSError:
                    time.sleep(0.1)
        finally:
            # Stopped by its own PID, pass or fail.
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            log.seek(0)
            output = log.read().decode(errors="replace")
    if text is None:
        fail(f"{' '.join(argv)}: no /metrics within 20 s (exit {p.returncode}):\n{output[-2000:]}")
        return finish()
    exposed = {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and not line.startswith("#")}
    missing = sorted(set(wanted) - exposed)
    for name in missing:
        fail(f"{name} (queried by {', '.join(sorted(set(wanted[name])))}) is not in a fresh gateway's /metrics")
    if not missing:
        ok(f"all {len(wanted)} series the dashboard and the rules query are in a fresh gateway's /metrics ({len(exposed)} series exposed)")
    return finish()


# ---------------------------------------------------------------------------- resumable streams
# The contract of issue 15. NOTE: the resume metrics and the resume.* keys are not in src/
# yet (the implementation lands on its own branch), so their names, labels and label values
# are read from docs/RESUME.md here. When src/ registers them, the end-to-end check (e2e.py)
# requires every one the dashboard and rules name to be scraped from the real daemon, and
# `daemon-config` runs the shipped resume settings through the daemon's --check-config.
RESUME_DOC = ROOT / "docs/RESUME.md"
RESUME_ENV_RE = re.compile(r"\bSSE_GATEWAY__RESUME__([A-Z0-9_]+)\b")
SEL_RE = re.compile(r"\b(sse_gateway_resume_[a-z_]+)\b(\{[^}]*\})?")
MATCHER_RE = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def resume_contract() -> tuple:
    """(config keys, metrics) of docs/RESUME.md; metrics: name -> {"labels": {label: values
    or None}, "histogram": bool}, from the bullets of its "Metrics" section."""
    text = RESUME_DOC.read_text()
    keys = set(re.findall(r"`resume\.([a-z_]+)", text))
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    metrics = {}
    for m in re.finditer(r"`([a-z_]+)(?:\{([^}]*)\})?`(\s*\(histogram\))?", section):
        labels = {}
        for part in filter(None, (p.strip() for p in (m.group(2) or "").split(","))):
            name, _, vals = part.partition("=")
            labels[name.strip()] = set(vals.strip('"').split("|")) if vals else None
        if not m.group(1).startswith("sse_gateway"):  # the heading's `sse_gateway_` prefix
            metrics["sse_gateway_" + m.group(1)] = {"labels": labels, "histogram": bool(m.group(3))}
    return keys, metrics


def resume_env_settings() -> list:
    """(where, KEY) for every SSE_GATEWAY__RESUME__KEY in the shipped deploy files."""
    out = []
    for f in sorted(DEPLOY.rglob("*")):
        if f.is_file() and f.suffix in (".yaml", ".yml", ".cfg", ".conf", ".service", ".md", "") and "tools" not in f.parts:
            try:
                text = f.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            for m in RESUME_ENV_RE.finditer(text):
                out.append((f.relative_to(DEPLOY).as_posix(), m.group(1)))
    df = DEPLOY / "docker/Dockerfile"
    return out + [("docker/Dockerfile", m.group(1)) for m in RESUME_ENV_RE.finditer(df.read_text())]


def check_resume_expr(where: str, expr: str, metrics: dict) -> None:
    used = SEL_RE.findall(expr)
    if not used:
        return
    allowed_by = {"job", "instance"}
    for name, selector in used:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        spec = metrics.get(name) or (metrics.get(base) if metrics.get(base, {}).get("histogram") else None)
        if spec is None:
            fail(f"{where}: {name} is not a metric of docs/RESUME.md")
            continue
        allowed_by |= set(spec["labels"])
        if name != base:
            allowed_by.add("le")
        for label, op, value in MATCHER_RE.findall(selector or ""):
            if label in ("job", "instance"):
                continue
            if label not in spec["labels"]:
                fail(f"{where}: {name} has no label {label} in docs/RESUME.md")
            elif spec["labels"][label] is not None and op in ("=~", "!~"):
                unknown = set(value.split("|")) - spec["labels"][label]
                if unknown:
                    fail(f"{where}: {name}{{{label}}} has no value {sorted(unknown)} in docs/RESUME.md")
            elif spec["labels"][label] is not None and value not in spec["labels"][label]:
                fail(f"{where}: {name}{{{label}}} has no value {value!r} in docs/RESUME.md")
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        for label in filter(None, (g.strip() for g in group.split(","))):
            if label not in allowed_by:
                fail(f"{where}: grouping by {label}, which no resume metric in the expression has")
    ok(f"{where}: {', '.join(sorted({n for n, _ in used}))}")


def check_resume() -> int:
    import json

    keys, metrics = resume_contract()
    if not keys or len(metrics) < 10:
        fail(f"docs/RESUME.md: read {len(keys)} resume.* keys and {len(metrics)} metrics; its format changed?")
        return finish()
    ok(f"docs/RESUME.md: {len(keys)} resume.* keys, {len(metrics)} metrics")
    dash = json.loads((DEPLOY / "grafana/dashboard.json").read_text())
    panels = [q for p in dash["panels"] for q in [p] + p.get("panels", [])]
    seen = set()
    for p in panels:
        for t in p.get("targets", []):
            check_resume_expr(f"dashboard panel {p['id']} '{p['title']}' {t['refId']}", t.get("expr", ""), metrics)
            seen |= {n for n, _ in SEL_RE.findall(t.get("expr", ""))}
    rules = yaml.safe_load((DEPLOY / "prometheus/rules/sse-gateway.rules.yml").read_text())
    for g in rules["groups"]:
        for r in g["rules"]:
            check_resume_expr(f"rule {r.get('alert') or r.get('record')}", r["expr"], metrics)
    tests = yaml.safe_load((DEPLOY / "prometheus/tests/sse-gateway.test.yml").read_text())
    for t in tests["tests"]:
        series = " ".join(x["series"] for x in t.get("input_series", []))
        check_resume_expr(f"rule test '{t['name']}'", series, metrics)
    # The row shows every family of the contract (histograms through their _bucket series).
    shown = {re.sub(r"_bucket$", "", n) for n in seen}
    missing = sorted(set(metrics) - shown)
    fail_if(
        missing,
        f"dashboard: no panel for {missing}",
        f"dashboard: a panel for each of the {len(metrics)} resume metrics",
    )
    settings = resume_env_settings()
    for where, key in settings:
        if key.lower() not in keys:
            fail(f"{where}: SSE_GATEWAY__RESUME__{key} is not a resume.* key of docs/RESUME.md {sorted(keys)}")
    fail_if(
        not settings,
        "no SSE_GATEWAY__RESUME__* setting shipped anywhere in deploy/",
        f"{len(settings)} SSE_GATEWAY__RESUME__* settings, all resume.* keys of docs/RESUME.md",
    )
    return finish()


def compose_env(svc: dict) -> dict:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def check_compose() -> int:
    from urllib.parse import urlsplit

    path = DEPLOY / "compose/compose.yaml"
    doc = yaml.safe_load(path.read_text())
    services = doc.get("services", {})
    gws = {n: s for n, s in services.items() if any(k.startswith("SSE_GATEWAY__") for k in compose_env(s))}
    if len(gws) < 2:
        fail(f"compose: needs two or more gateway services, has {sorted(gws)}")
        return finish()
    envs = {n: compose_env(s) for n, s in gws.items()}
    first = next(iter(envs.values()))
    fail_if(
        any(e != first for e in envs.values()),
        f"compose: the gateways' settings differ: {envs}",
        f"compose: {len(gws)} gateways ({', '.join(gws)}) with identical settings",
    )
    builds = {json_key(s.get("build")) + (s.get("image") or "") for s in gws.values()}
    fail_if(
        len(builds) != 1,
        "compose: the gateways must run the same image (same build or image)",
        "compose: one image for every gateway",
    )
    fail_if(
        first.get("SSE_GATEWAY__RESUME__STORE") != "redis",
        "compose: SSE_GATEWAY__RESUME__STORE must be redis (a reconnect may land on the other instance)",
        'compose: resume.store = "redis"',
    )
    url = urlsplit(first.get("SSE_GATEWAY__RESUME__REDIS_URL", ""))
    store = services.get(url.hostname or "")
    if url.scheme not in ("redis", "rediss") or store is None:
        fail(f"compose: resume.redis_url {url.geturl()!r} must name a service of the file")
    else:
        cmd = " ".join(map(str, store.get("command", [])))
        port = int(re.search(r"--port\s+(\d+)", cmd).group(1)) if "--port" in cmd else 6379
        shared = set(store.get("networks", [])) & set.intersection(*(set(s.get("networks", [])) for s in gws.values()))
        fail_if(
            (url.port or 6379) != port or not shared,
            f"compose: redis_url port {url.port} / store port {port}, shared networks {shared}",
            f"compose: redis_url reaches service {url.hostname}:{port} on network {', '.join(sorted(shared))}",
        )
        if store.get("ports"):
            fail(f"compose: the store {url.hostname} must not publish ports")
        fail_if(
            not all(doc.get("networks", {}).get(n, {}).get("internal") for n in store.get("networks", [])),
            f"compose: the store's networks should be internal (only the gateways reach it)",
            f"compose: the store is only on internal networks, no published ports",
        )
        fail_if(
            "healthcheck" not in store or any(s.get("depends_on", {}).get(url.hostname, {}).get("condition") != "service_healthy" for s in gws.values()),
            "compose: gateways should wait for a healthy store (healthcheck + depends_on service_healthy)",
            "compose: gateways start after the store is healthy",
        )
    key = first.get("SSE_GATEWAY__RESUME__BINDING_KEY", "")
    fail_if(
        not re.fullmatch(r"\$\{[A-Z0-9_]+:\?[^}]+\}", key),
        f"compose: resume.binding_key must come from a required variable (${{VAR:?msg}}), not {key!r}",
        "compose: resume.binding_key from one required variable, shared by every gateway",
    )
    for n, s in gws.items():
        g = secs(s.get("stop_grace_period", "10s"))
        drain = secs(envs[n].get("SSE_GATEWAY__SERVER__DRAIN_TIMEOUT_SECS", DEFAULT_DRAIN_SECS))
        fail_if(
            g <= drain,
            f"compose: {n} stop_grace_period {g:g}s <= drain timeout {drain:g}s",
            f"compose: {n} stop_grace_period {g:g}s > drain timeout {drain:g}s",
        )
    # The load balancer: the committed haproxy.cfg, round-robin over exactly the gateways.
    lbs = [(n, s) for n, s in services.items() if any(str(v).startswith("./haproxy.cfg:") for v in s.get("volumes", []))]
    if len(lbs) != 1:
        fail("compose: one service should mount ./haproxy.cfg (the load balancer)")
        return finish()
    name, lb = lbs[0]
    cfg = re.sub(r"#.*", "", (DEPLOY / "compose/haproxy.cfg").read_text())
    backend = cfg.split("backend ", 1)[1] if "backend " in cfg else ""
    servers = dict(re.findall(r"^\s*server\s+\S+\s+([\w.-]+):(\d+)", backend, re.M))
    fail_if(
        set(servers) != set(gws) or any(p != "8080" for p in servers.values()),
        f"compose/haproxy.cfg: servers {servers} should be the gateways {sorted(gws)} on port 8080",
        f"compose/haproxy.cfg: servers are the gateways on their public port",
    )
    if not re.search(r"^\s*balance\s+roundrobin\b", backend, re.M):
        fail("compose/haproxy.cfg: balance roundrobin (so a reconnect goes to the other instance)")
    else:
        ok("compose/haproxy.cfg: round-robin")
    if not re.search(r"default-server .*\bport 9090\b", backend):
        fail("compose/haproxy.cfg: health checks on the admin port 9090")
    bind = re.search(r"^\s*bind\s+\S*:(\d+)", cfg, re.M)
    published = [str(p).rsplit(":", 1)[0].rsplit(":", 1)[-1] for p in lb.get("ports", [])]
    fail_if(
        not bind or bind.group(1) not in published,
        f"compose: {name} publishes {lb.get('ports')} but haproxy binds {bind and bind.group(1)}",
        f"compose: {name} publishes haproxy's port {bind.group(1)}",
    )
    deps = lb.get("depends_on", {})
    if set(deps) != set(gws):
        fail(f"compose: {name} should depend on every gateway, depends on {sorted(deps)}")
    return finish()


def json_key(v) -> str:
    import json

    return json.dumps(v, sort_keys=True)


def check_kubernetes_resume(files: list) -> int:
    from urllib.parse import urlsplit

    if not files:
        fail("no rendered overlays given")
    for f in files:
        label = Path(f).stem
        docs = [d for d in yaml.safe_load_all(Path(f).read_text()) if d]
        by_kind: dict = {}
        for d in docs:
            by_kind.setdefault(d["kind"], []).append(d)
        gw_deps = [
            (d, c)
            for d in by_kind.get("Deployment", [])
            for c in d["spec"]["template"]["spec"]["containers"]
            if "sse-gateway" in c.get("image", "")
        ]
        if len(gw_deps) != 1:
            fail(f"{label}: expected one gateway container, found {len(gw_deps)}")
            continue
        dep, gw = gw_deps[0]
        env = gw.get("env", [])
        names = [e["name"] for e in env]
        val = {e["name"]: e.get("value") for e in env}
        ref = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in env}
        if val.get("SSE_GATEWAY__RESUME__STORE") != "redis":
            fail(f"{label}: SSE_GATEWAY__RESUME__STORE is {val.get('SSE_GATEWAY__RESUME__STORE')!r}, not redis")
        else:
            ok(f"{label}: the gateway runs resume.store = \"redis\"")
        bk = ref.get("SSE_GATEWAY__RESUME__BINDING_KEY")
        fail_if(
            not bk or not bk.get("name") or not bk.get("key") or bk.get("optional"),
            f"{label}: SSE_GATEWAY__RESUME__BINDING_KEY must come from a required Secret key, is {bk}",
            f"{label}: resume.binding_key from Secret {bk['name']}/{bk['key']}",
        )
        raw = val.get("SSE_GATEWAY__RESUME__REDIS_URL") or ""
        # $(VAR) references expand only variables defined earlier in the list.
        idx = names.index("SSE_GATEWAY__RESUME__REDIS_URL") if raw else -1
        for var in re.findall(r"\$\((\w+)\)", raw):
            if var not in names[:idx]:
                fail(f"{label}: redis_url uses $({var}), not defined before it")
        url = urlsplit(re.sub(r"\$\(\w+\)", "secret", raw))
        svcs = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == url.hostname]
        if url.scheme not in ("redis", "rediss") or len(svcs) != 1:
            fail(f"{label}: redis_url {raw!r} must name a Service of the overlay")
            continue
        svc = svcs[0]
        sport = [p for p in svc["spec"]["ports"] if p["port"] == (url.port or 6379)]
        stores = [
            d
            for d in by_kind.get("Deployment", [])
            if selects({"matchLabels": svc["spec"]["selector"]}, d["spec"]["template"]["metadata"]["labels"])
        ]
        if not sport or len(stores) != 1:
            fail(f"{label}: Service {url.hostname} has no port {url.port} or does not select one store Deployment")
            continue
        store = stores[0]
        sc = store["spec"]["template"]["spec"]["containers"][0]
        cports = {p["name"]: p["containerPort"] for p in sc.get("ports", [])}
        tp = sport[0]["targetPort"]
        fail_if(
            cports.get(tp, tp) not in cports.values(),
            f"{label}: Service {url.hostname} targets {tp}, not a port of {sc['name']}",
            f"{label}: redis_url -> Service {url.hostname}:{url.port or 6379} -> {store['metadata']['name']}",
        )
        # The password: the same Secret key on both sides.
        sref = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in sc.get("env", [])}
        args = " ".join(sc.get("args", []))
        pw = re.search(r"--requirepass \$\((\w+)\)", args)
        url_vars = re.findall(r"\$\((\w+)\)", raw)
        if not pw or not url_vars:
            fail(f"{label}: the store needs --requirepass $(VAR) and redis_url the same password")
        elif (sref.get(pw.group(1)) or {}) != (ref.get(url_vars[0]) or {"none": 1}):
            fail(f"{label}: store password {sref.get(pw.group(1))} and redis_url's {ref.get(url_vars[0])} differ")
        else:
            s_ = sref[pw.group(1)]
            ok(f"{label}: store and gateway share the password Secret {s_['name']}/{s_['key']}")
        if store["spec"].get("strategy", {}).get("type") != "Recreate" or store["spec"].get("replicas", 1) != 1:
            fail(f"{label}: the store must be one replica with strategy Recreate (a second one holds no keys)")
        # The NetworkPolicy admits the gateway pods to the store.
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        pols = [p for p in by_kind.get("NetworkPolicy", []) if selects(p["spec"]["podSelector"], store["spec"]["template"]["metadata"]["labels"])]
        admitted = any(
            selects(src.get("podSelector", {}), pod_labels)
            for p in pols
            for rule in p["spec"].get("ingress", [])
            for src in rule.get("from", [])
        )
        fail_if(
            not pols or not admitted,
            f"{label}: no NetworkPolicy admitting the gateway pods {pod_labels} to the store",
            f"{label}: NetworkPolicy admits the gateway pods to the store",
        )
    return finish()


# Sample values for the compose file's required variables and the Secrets' keys.
SAMPLE_VARS = {
    "SSE_UPSTREAM_URL": "http://legacy-agent-backend:8000",
    "SSE_RESUME_BINDING_KEY": "0123456789abcdef" * 4,
    "binding-key": "0123456789abcdef" * 4,
    "valkey-password": "fedcba9876543210" * 4,
}
# Settings whose values hold secrets: accepted, but not expected verbatim in --check-config.
SECRET_SETTINGS = {"SSE_GATEWAY__RESUME__BINDING_KEY", "SSE_GATEWAY__RESUME__REDIS_URL"}


def render_overlays(dest: Path) -> list:
    """`kubectl kustomize` of every shipped kustomization (standalone, sidecar,
    standalone-redis) and of sidecar + the redis component (an overlay made in dest);
    writes dest/<name>.yaml, returns the paths. Raises if kubectl fails or is missing."""
    import os
    import shutil
    import subprocess

    kubectl = shutil.which("kubectl")
    if not kubectl:
        raise SystemExit("kubectl (with its built-in kustomize) is not installed")
    dest.mkdir(parents=True, exist_ok=True)
    dirs = {d.name: d for d in sorted((DEPLOY / "kubernetes").iterdir()) if (d / "kustomization.yaml").exists()}
    comps = {n for n, d in dirs.items() if "kind: Component" in (d / "kustomization.yaml").read_text()}
    work = dest / "sidecar-redis.d"
    work.mkdir(exist_ok=True)
    rel = lambda p: os.path.relpath(p, work)  # noqa: E731 - kustomize refuses absolute paths
    (work / "kustomization.yaml").write_text(
        f"resources: [{rel(dirs['sidecar'])}]\ncomponents: [{rel(dirs['redis'])}]\n"
    )
    targets = {n: d for n, d in dirs.items() if n not in comps}
    targets["sidecar-redis"] = work
    out = []
    for name, d in targets.items():
        p = subprocess.run([kubectl, "kustomize", str(d)], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise SystemExit(f"kubectl kustomize {d}: {p.stderr.strip()}")
        f = dest / f"{name}.yaml"
        f.write_text(p.stdout)
        out.append(f)
    return out


def rendered_gateway_env(f: Path) -> dict:
    """The SSE_GATEWAY__ environment of the gateway container of a rendered overlay, as the
    kubelet would give it: envFrom ConfigMaps, then env with $(VAR) expanded; Secret keys
    replaced by SAMPLE_VARS."""
    docs = [d for d in yaml.safe_load_all(f.read_text()) if d]
    cms = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            if "sse-gateway" not in c.get("image", ""):
                continue
            env = {}
            for ef in c.get("envFrom", []):
                env.update(cms.get(ef.get("configMapRef", {}).get("name"), {}))
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                v = SAMPLE_VARS.get(ref["key"], "sample") if ref else e.get("value", "")
                env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), v)
            return {k: v for k, v in env.items() if k.startswith("SSE_GATEWAY__")}
    return {}


def render_nginx(dest: Path, listen: str = "", servers: list = None) -> None:
    """Copies the nginx configs into dest, host paths moved there; optionally sets the
    listen address and the upstream servers (the end-to-end check)."""
    dest.mkdir(parents=True, exist_ok=True)
    main = (DEPLOY / "nginx/nginx.conf").read_text()
    subs = [
        (r"^pid .*;$", f"pid {dest}/nginx.pid;"),
        (r"^error_log .*;$", f"error_log {dest}/error.log info;"),
        (r"^(\s*)access_log .*;$", rf"\1access_log {dest}/access.log;"),
        (r"^worker_processes .*;$", "worker_processes 1;"),
        (r"^(\s*)worker_connections .*;$", r"\1worker_connections 512;"),
        (
            r"^(\s*)include sse-gateway\.conf;$",
            rf"\1client_body_temp_path {dest}/client_body;\n\1proxy_temp_path {dest}/proxy;\n"
            rf"\1fastcgi_temp_path {dest}/fastcgi;\n\1uwsgi_temp_path {dest}/uwsgi;\n"
            rf"\1scgi_temp_path {dest}/scgi;\n\1include sse-gateway.conf;",
        ),
    ]
    for pat, rep in subs:
        main, n = re.subn(pat, rep, main, flags=re.M)
        if n != 1:
            raise SystemExit(f"render-nginx: pattern {pat!r} matched {n} times in nginx.conf")
    (dest / "nginx.conf").write_text(main)
    site = (DEPLOY / "nginx/sse-gateway.conf").read_text()
    site, n = re.subn(
        r"^(\s*)access_log /var/log/nginx/access\.log sse_gateway;$",
        rf"\1access_log {dest}/access.log sse_gateway;",
        site,
        flags=re.M,
    )
    if n != 1:
        raise SystemExit("render-nginx: no token-free access_log in sse-gateway.conf")
    if listen:
        site, n = re.subn(r"^(\s*)listen 80;$", rf"\1listen {listen};", site, flags=re.M)
        if n != 1:
            raise SystemExit("render-nginx: no `listen 80;` in sse-gateway.conf")
    if servers:
        lines = re.findall(r"^\s*server 10\.0\.0\.\d+:8080 (.*);$", site, re.M)
        if not lines:
            raise SystemExit("render-nginx: no example server lines in sse-gateway.conf")
        params = lines[0]
        new = "\n".join(f"    server {s} {params};" for s in servers)
        site = re.sub(r"^\s*server 10\.0\.0\.\d+:8080 .*;$\n?", "", site, flags=re.M)
        site = site.replace("upstream sse_gateway {\n", "upstream sse_gateway {\n" + new + "\n", 1)
    (dest / "sse-gateway.conf").write_text(site)
    # nginx workers may run as nobody: let them reach the temp dirs.
    dest.chmod(0o755)


def main() -> int:
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "docker":
        return check_docker()
    if cmd == "kubernetes":
        return check_kubernetes()
    if cmd == "systemd":
        return check_systemd()
    if cmd == "lb":
        return check_lb()
    if cmd == "daemon-config" and len(sys.argv) == 3:
        return check_daemon_config(sys.argv[2])
    if cmd == "fresh-metrics" and len(sys.argv) == 3:
        return check_fresh_metrics(sys.argv[2])
    if cmd == "resume":
        return check_resume()
    if cmd == "compose":
        return check_compose()
    if cmd == "kubernetes-resume":
        return check_kubernetes_resume(sys.argv[2:])
    if cmd == "render-kustomize" and len(sys.argv) == 3:
        for f in render_overlays(Path(sys.argv[2])):
            print(f"rendered {f.name}: {sum(1 for d in yaml.safe_load_all(f.read_text()) if d)} objects")
        return 0
    if cmd == "render-nginx" and len(sys.argv) == 3:
        render_nginx(Path(sys.argv[2]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
