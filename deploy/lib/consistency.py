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
  render-nginx D writes deploy/nginx/*.conf into D with host paths (pid, logs, temp dirs)
                 moved into D, for `nginx -t -p D -c D/nginx.conf` without root paths.
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
    if pats != ignore_patterns(DEPLOY / "docker/.dockerignore"):
        fail("docker/.dockerignore and docker/Dockerfile.dockerignore differ")
    else:
        ok("Dockerfile.dockerignore and .dockerignore agree")
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
            if not any(path == c or path.startswith(c + "/") for c in copied):
                fail(f"Cargo.toml [[{section}]] {t['name']} ({path}) is not copied into the builder stage")
            else:
                ok(f"Cargo.toml [[{section}]] {t['name']} ({path}) is in the build context")
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
        if p.returncode != 0:
            fail(f"cargo metadata --locked in the builder's context: {p.stderr.strip()[-500:]}")
        else:
            ok("cargo resolves the manifest and Cargo.lock from the COPY'd files alone (--locked)")
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
    if not user or user[-1].split(":")[0] in ("root", "0"):
        fail("the runtime stage must end with a non-root USER")
    else:
        ok(f"runtime user {user[-1]}")
    if not re.search(r"^HEALTHCHECK .*\n?.*127\.0\.0\.1:9090/healthz", df, re.M):
        fail("HEALTHCHECK must probe http://127.0.0.1:9090/healthz")
    else:
        ok("HEALTHCHECK on the admin port's /healthz")
    if len(re.findall(r"^FROM ", df, re.M)) < 2:
        fail("the Dockerfile must be multi-stage")
    else:
        ok("multi-stage build")
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
        if set(kust.get("resources", [])) != files:
            fail(f"{style}: kustomization resources {kust.get('resources')} != files {sorted(files)}")
        else:
            ok(f"{style}: kustomization lists every manifest")
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
            if grace <= sleep + drain:
                fail(f"{name}: terminationGracePeriodSeconds {grace} <= preStop {sleep} + drain {drain}")
            else:
                ok(f"{name}: grace {grace}s > preStop {sleep:g}s + drain {drain:g}s")
            ports = {p["name"]: p["containerPort"] for p in gw.get("ports", [])}
            for var, pname in (("SSE_GATEWAY__SERVER__LISTEN", "http"), ("SSE_GATEWAY__SERVER__ADMIN_LISTEN", "admin")):
                addr = env.get(var, "")
                if not addr.startswith("0.0.0.0:") or int(addr.rsplit(":", 1)[1]) != ports.get(pname):
                    fail(f"{name}: {var}={addr!r} must bind 0.0.0.0 on containerPort {pname}={ports.get(pname)}")
                else:
                    ok(f"{name}: {var} matches containerPort {pname}")
            for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
                get = gw.get(probe, {}).get("httpGet", {})
                if get.get("port") != "admin" or get.get("path") != path:
                    fail(f"{name}: {probe} must be GET {path} on port admin, is {get}")
                else:
                    ok(f"{name}: {probe} GET {path} on the admin port")
            upstream = env.get("SSE_GATEWAY__UPSTREAM__URL", "")
            others = [c for c in spec["containers"] if c is not gw]
            if style == "sidecar":
                backend = others[0] if others else {}
                bports = [p["containerPort"] for p in backend.get("ports", [])]
                m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/?", upstream)
                if not m or int(m.group(1)) not in bports:
                    fail(f"{name}: sidecar upstream {upstream!r} must be http://127.0.0.1:<backend port {bports}>")
                else:
                    ok(f"{name}: upstream is the backend container on loopback")
                bsleep = prestop_sleep(backend)
                if bsleep < sleep + drain or grace <= bsleep:
                    fail(f"{name}: backend preStop {bsleep}s must be >= gateway preStop+drain and < grace")
                else:
                    ok(f"{name}: backend outlives the gateway's drain ({bsleep:g}s)")
            for svc in by_kind.get("Service", []):
                if selects({"matchLabels": svc["spec"]["selector"]}, labels):
                    tps = {p["targetPort"] for p in svc["spec"]["ports"]}
                    if not tps <= {"http", "admin"}:
                        fail(f"{style}/{svc['metadata']['name']}: targets {tps}, not the gateway's ports")
                    else:
                        ok(f"{style}/{svc['metadata']['name']}: targets the gateway ({', '.join(sorted(tps))})")
            for kind in ("PodDisruptionBudget",):
                for o in by_kind.get(kind, []):
                    if not selects(o["spec"]["selector"], labels):
                        fail(f"{style}/{kind}: selector does not match the pods")
                    else:
                        ok(f"{style}/{kind} selects the pods")
            for hpa in by_kind.get("HorizontalPodAutoscaler", []):
                ref = hpa["spec"]["scaleTargetRef"]
                if ref["kind"] != "Deployment" or ref["name"] != dep["metadata"]["name"]:
                    fail(f"{style}/HPA: scaleTargetRef {ref} is not {dep['metadata']['name']}")
                else:
                    ok(f"{style}/HPA scales {ref['name']}")
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
    if secs(stop) <= DEFAULT_DRAIN_SECS:
        fail(f"TimeoutStopSec={stop} must exceed the drain timeout ({DEFAULT_DRAIN_SECS:g} s)")
    else:
        ok(f"TimeoutStopSec={stop} > drain timeout {DEFAULT_DRAIN_SECS:g}s")
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
        if keys.get(k, [None])[-1] != v:
            fail(f"{k} should be {v}")
        else:
            ok(f"{k}={v}")
    if "ExecReload" in keys:
        fail("ExecReload is set but the daemon has no reload signal")
    else:
        ok("no ExecReload (the daemon has no reload; restart drains)")
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
        if d.get(k) != [v]:
            fail(f"nginx: {k} should be {v}, is {d.get(k)}")
        else:
            ok(f"nginx: {k} {v}")
    if 'Connection ""' not in " ".join(d.get("proxy_set_header", [])):
        fail('nginx: proxy_set_header Connection "" (upstream keep-alive) missing')
    else:
        ok('nginx: Connection "" to the gateways (keep-alive)')
    if not d.get("keepalive"):
        fail("nginx: upstream keepalive pool missing")
    else:
        ok(f"nginx: upstream keepalive {d['keepalive'][0]}")
    for k in ("proxy_read_timeout", "proxy_send_timeout"):
        v = secs(d.get(k, ["60s"])[0])
        if v <= 2 * DEFAULT_KEEPALIVE_SECS:
            fail(f"nginx: {k} {v}s should be well above the keepalive interval {DEFAULT_KEEPALIVE_SECS:g}s")
        else:
            ok(f"nginx: {k} {v:g}s > 2 x keepalive {DEFAULT_KEEPALIVE_SECS:g}s")
    gz = re.search(r"gzip_types([^;]*);", main)
    if gz and "text/event-stream" in gz.group(1):
        fail("nginx.conf: text/event-stream must not be in gzip_types")
    else:
        ok("nginx.conf: text/event-stream not in gzip_types")

    cfg = re.sub(r"#.*", "", (DEPLOY / "haproxy/haproxy.cfg").read_text())
    timeouts = dict(re.findall(r"^\s*timeout (\S+) (\S+)", cfg, re.M))
    for k in ("client", "server", "tunnel"):
        v = timeouts.get(k)
        val = secs(v.replace("h", "")) * 3600 if v and v.endswith("h") else secs(v) if v else 0
        if val <= 2 * DEFAULT_KEEPALIVE_SECS:
            fail(f"haproxy: timeout {k} {v} should be well above the keepalive interval")
        else:
            ok(f"haproxy: timeout {k} {v}")
    if re.search(r"^\s*compression ", cfg, re.M):
        fail("haproxy: no compression (SSE must not be compressed)")
    else:
        ok("haproxy: no compression")
    if "option http-keep-alive" not in cfg or "http-reuse" not in cfg:
        fail("haproxy: keep-alive to the gateways (option http-keep-alive, http-reuse) missing")
    else:
        ok("haproxy: keep-alive and connection reuse to the gateways")
    if "uri /readyz" not in cfg:
        fail("haproxy: health check should use /readyz (drain-aware)")
    else:
        ok("haproxy: health check on /readyz")
    if "shutdown-sessions" in cfg:
        fail("haproxy: on-marked-down shutdown-sessions would cut draining streams")
    return finish()


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
    for name, env, args in sets:
        if not env:
            fail(f"{name}: no SSE_GATEWAY__ settings found")
            continue
        rc, out = effective(env, args)
        if rc != 0:
            fail(f"{name}: sse-gateway --check-config exit {rc}: {out.strip()}")
            continue
        # Each value must show up in the effective configuration the daemon prints.
        lost = []
        for k, v in env.items():
            key = k.split("__")[-1].lower()
            if not re.search(rf'^{key} = "?{re.escape(v)}(\.0)?"?$', out, re.M):
                lost.append(f"{k}={v}")
        if lost:
            fail(f"{name}: accepted, but not in the effective config: {lost}")
        else:
            ok(f"{name}: {len(env)} settings accepted by the daemon")
    return finish()


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
    if cmd == "render-nginx" and len(sys.argv) == 3:
        render_nginx(Path(sys.argv[2]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
