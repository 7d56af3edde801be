#!/usr/bin/env bash
# deploy/check.sh — machine checks for everything under deploy/ (called by .ci/run).
#
#   1. installs its tools: Debian packages (nginx, haproxy, prometheus/promtool, systemd),
#      a virtualenv with hadolint + kubernetes-validate (deploy/tools/requirements.txt) and
#      npm validators (deploy/tools/package.json), cached in $SSE_DEPLOY_CACHE;
#   2. static checks: hadolint, Kubernetes schemas (core + ServiceMonitor CRD) of the files
#      and of the kustomize-rendered overlays (kubectl kustomize; the Redis/Valkey
#      component), cross-file consistency (grace periods vs drain timeout, probes,
#      selectors, the resume store's Service/Secret/NetworkPolicy), the compose example
#      (dclint, haproxy -c, consistency), systemd-analyze, nginx -t, haproxy -c, promtool
#      (config, rules, rule unit tests), the Grafana dashboard against Grafana's schema
#      types, resume metric names/labels/keys against docs/RESUME.md, the OpenTelemetry
#      Collector config by structure (lib/otelcol.py, with a self-test on broken copies);
#   3. with the release binary: the daemon's own --check-config accepts every setting shipped
#      here (ConfigMaps, Dockerfile ENV, systemd unit); a fresh gateway's /metrics has every
#      series the dashboard and the rules query (also with SSE_DEPLOY_SKIP_E2E=1 when
#      SSE_GATEWAY_BIN is set); then the end-to-end check
#      (deploy/e2e.py): demo upstream, two gateways,
#      nginx and haproxy in front, Prometheus scraping them; every PromQL expression of the
#      dashboard and the alert rules must return data.
#
# Ends with `deploy-check: N passed, M failed`; exit status 1 if anything failed.
# Env: SSE_DEPLOY_CACHE (tool cache dir), SSE_DEPLOY_SKIP_INSTALL=1 (use what is there),
#      SSE_DEPLOY_SKIP_E2E=1 (static checks only), SSE_GATEWAY_BIN (use this binary,
#      skip cargo build), K8S_VERSIONS (default "1.30.0 1.37.0").
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPLOY=$ROOT/deploy
CACHE=${SSE_DEPLOY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/sse-gateway-deploy}
K8S_VERSIONS=${K8S_VERSIONS:-"1.30.0 1.37.0"}
VENV=$CACHE/venv
NPM_DIR=$CACHE/npm
PY=$VENV/bin/python
TMP=$(mktemp -d "${TMPDIR:-/tmp}/deploy-check.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

passed=0
failed=0
failures=()

# run NAME CMD...: runs one check, prints ok/FAIL with the tail (or all, on failure) of its output.
run() {
  local name=$1 out=$TMP/out.$RANDOM start=$SECONDS
  shift
  if "$@" >"$out" 2>&1; then
    passed=$((passed + 1))
    printf 'ok   %-34s (%ss)\n' "$name" $((SECONDS - start))
    tail -n 3 "$out" | sed 's/^/       /'
  else
    failed=$((failed + 1))
    failures+=("$name")
    printf 'FAIL %-34s (%ss)\n' "$name" $((SECONDS - start))
    tail -n 60 "$out" | sed 's/^/       /'
  fi
}

# ------------------------------------------------------------------------------ install
install_tools() {
  local need=()
  command -v nginx >/dev/null || need+=(nginx)
  command -v haproxy >/dev/null || need+=(haproxy)
  command -v promtool >/dev/null && command -v prometheus >/dev/null || need+=(prometheus)
  command -v systemd-analyze >/dev/null || need+=(systemd)
  command -v curl >/dev/null || need+=(curl)
  command -v node >/dev/null && command -v npm >/dev/null || need+=(nodejs npm)
  python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
  if ((${#need[@]})); then
    echo "installing Debian packages: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null || return 1
  fi
  mkdir -p "$CACHE"
  if [[ ! -x $PY ]]; then
    python3 -m venv "$VENV" || return 1
  fi
  if ! cmp -s "$DEPLOY/tools/requirements.txt" "$VENV/.requirements.txt"; then
    "$PY" -m pip install --quiet --disable-pip-version-check -r "$DEPLOY/tools/requirements.txt" || return 1
    cp "$DEPLOY/tools/requirements.txt" "$VENV/.requirements.txt"
  fi
  mkdir -p "$NPM_DIR"
  if ! cmp -s "$DEPLOY/tools/package.json" "$NPM_DIR/package.json" || [[ ! -d $NPM_DIR/node_modules ]]; then
    cp "$DEPLOY/tools/package.json" "$NPM_DIR/package.json"
    (cd "$NPM_DIR" && npm install --no-audit --no-fund --loglevel=error --engine-strict=false) || return 1
  fi
  echo "tools: $(nginx -v 2>&1), $(haproxy -v | head -1 | cut -d' ' -f1-3), $(promtool --version 2>&1 | head -1 | cut -d' ' -f1-3), $("$VENV/bin/hadolint" --version), kubernetes-validate $("$VENV/bin/kubernetes-validate" --version), node $(node --version)"
}

if [[ ${SSE_DEPLOY_SKIP_INSTALL:-0} != 1 ]]; then
  run "install tools" install_tools
fi
export PATH=$VENV/bin:$PATH

# ------------------------------------------------------------------------------ docker
run "hadolint Dockerfile" hadolint --failure-threshold style "$DEPLOY/docker/Dockerfile"
run "docker build context" "$PY" "$DEPLOY/lib/consistency.py" docker

# ------------------------------------------------------------------------------ kubernetes
k8s_schemas() {
  local v rc=0
  for v in $K8S_VERSIONS; do
    # Kustomization and ServiceMonitor have no core schema (warnings); the CRD is checked below.
    kubernetes-validate --strict --quiet -k "$v" "$DEPLOY"/kubernetes/*/*.yaml || rc=1
    echo "kubernetes-validate --strict -k $v: $(ls "$DEPLOY"/kubernetes/*/*.yaml | wc -l) files"
  done
  return $rc
}
run "kubernetes core schemas" k8s_schemas
run "kubernetes ServiceMonitor schema" env NODE_PATH="$NPM_DIR/node_modules" \
  node "$DEPLOY/kubernetes/validate-crds.mjs" "$DEPLOY"/kubernetes/*/*.yaml
run "kubernetes consistency" "$PY" "$DEPLOY/lib/consistency.py" kubernetes
# The kustomizations as kubectl would apply them (kubectl's built-in kustomize): every
# shipped one, and sidecar + the redis component. The rendered objects go through the
# same schema checks, then the resume-specific consistency (store, Secret, NetworkPolicy).
RENDERED=$TMP/rendered
run "kustomize build (kubectl kustomize)" "$PY" "$DEPLOY/lib/consistency.py" render-kustomize "$RENDERED"
k8s_rendered_schemas() {
  local v rc=0
  for v in $K8S_VERSIONS; do
    kubernetes-validate --strict --quiet -k "$v" "$RENDERED"/*.yaml || rc=1
    echo "kubernetes-validate --strict -k $v: $(ls "$RENDERED"/*.yaml | wc -l) rendered overlays"
  done
  return $rc
}
run "kubernetes rendered overlays schemas" k8s_rendered_schemas
run "kubernetes rendered ServiceMonitors" env NODE_PATH="$NPM_DIR/node_modules" \
  node "$DEPLOY/kubernetes/validate-crds.mjs" "$RENDERED"/*.yaml
run "kubernetes resume store (redis)" bash -c "'$PY' '$DEPLOY/lib/consistency.py' kubernetes-resume '$RENDERED'/*redis.yaml"

# ------------------------------------------------------------------------------ compose
run "compose file (dclint: compose-spec schema + rules)" \
  "$NPM_DIR/node_modules/.bin/dclint" --color=false --max-warnings 0 "$DEPLOY/compose/compose.yaml"
run "compose haproxy -c" haproxy -c -f "$DEPLOY/compose/haproxy.cfg"
run "compose consistency" "$PY" "$DEPLOY/lib/consistency.py" compose

# ------------------------------------------------------------------------------ systemd
systemd_verify() {
  # verify needs the ExecStart binary to exist: point it at a stand-in in a temp dir.
  local d=$TMP/systemd out
  mkdir -p "$d" && cp /bin/true "$d/sse-gateway"
  sed "s#^ExecStart=/usr/local/bin/sse-gateway#ExecStart=$d/sse-gateway#" \
    "$DEPLOY/systemd/sse-gateway.service" >"$d/sse-gateway.service"
  # systemd-analyze verify exits 0 on unknown keys and bad values: any output is a failure.
  out=$(systemd-analyze verify "$d/sse-gateway.service" 2>&1)
  if [[ -n $out ]]; then
    echo "$out"
    return 1
  fi
  echo "systemd-analyze verify: clean"
  # Exposure score (0 = locked down, 10 = unsafe); fail above 2.0.
  systemd-analyze security --offline=yes --threshold=20 "$d/sse-gateway.service" | tail -1
}
run "systemd-analyze verify + security" systemd_verify
run "systemd consistency" "$PY" "$DEPLOY/lib/consistency.py" systemd

# ------------------------------------------------------------------------------ load balancers
nginx_test() {
  # The committed files as they are, with only the host paths (pid, logs) moved to a temp dir.
  local d=$TMP/nginx
  mkdir -p "$d"
  "$PY" "$DEPLOY/lib/consistency.py" render-nginx "$d" || return 1
  nginx -t -p "$d" -c "$d/nginx.conf"
}
run "nginx -t" nginx_test
run "haproxy -c" haproxy -c -f "$DEPLOY/haproxy/haproxy.cfg"
run "load balancer SSE settings" "$PY" "$DEPLOY/lib/consistency.py" lb
# Metric names, labels and config keys of resumable streams against docs/RESUME.md (the
# implementation lands separately; see the note in lib/consistency.py).
run "resume contract (docs/RESUME.md)" "$PY" "$DEPLOY/lib/consistency.py" resume

# ------------------------------------------------------------------------------ prometheus
run "promtool check config" promtool check config "$DEPLOY/prometheus/prometheus.yml"
run "promtool check rules" promtool check rules "$DEPLOY/prometheus/rules/sse-gateway.rules.yml"
run "promtool test rules" bash -c "cd '$DEPLOY/prometheus' && promtool test rules tests/sse-gateway.test.yml"

# ------------------------------------------------------------------------------ opentelemetry
# No collector binary here (a Go release binary or an image; no registry reachable here ships
# it or its config schema): lib/otelcol.py checks the config's structure and wiring, and the
# compose example's collector service and gateway endpoints; its self-test proves it refuses
# deliberately broken configs.
run "otel collector config self-test" "$PY" "$DEPLOY/lib/otelcol.py" --self-test
run "otel collector config" "$PY" "$DEPLOY/lib/otelcol.py" \
  --compose "$DEPLOY/compose/compose.yaml" "$DEPLOY/otel/otel-collector.yaml"

# ------------------------------------------------------------------------------ grafana
run "dashboard.json up to date" "$PY" "$DEPLOY/grafana/build_dashboard.py" --check
run "dashboard schema (@grafana/schema)" env NODE_PATH="$NPM_DIR/node_modules" \
  node "$DEPLOY/grafana/typecheck.mjs" "$DEPLOY/grafana/dashboard.json"

# ------------------------------------------------------------------------------ with the binary
# A gateway that has served nothing yet: a family whose labelled series appeared only at their
# first increment left panels on "No data" and rules unevaluated on a fresh instance (issue 34).
fresh_metrics() {
  run "fresh gateway exposes every queried series" "$PY" "$DEPLOY/lib/consistency.py" fresh-metrics "$SSE_GATEWAY_BIN"
}
if [[ ${SSE_DEPLOY_SKIP_E2E:-0} == 1 && -n ${SSE_GATEWAY_BIN:-} ]]; then
  fresh_metrics
fi

# ------------------------------------------------------------------------------ end to end
if [[ ${SSE_DEPLOY_SKIP_E2E:-0} != 1 ]]; then
  build_binary() {
    if [[ -n ${SSE_GATEWAY_BIN:-} ]]; then
      echo "using SSE_GATEWAY_BIN=$SSE_GATEWAY_BIN"
      return 0
    fi
    (cd "$ROOT" && cargo build --release --locked --bin sse-gateway 2>&1 | tail -n 5)
    test -x "$ROOT/target/release/sse-gateway"
  }
  run "cargo build --release" build_binary
  export SSE_GATEWAY_BIN=${SSE_GATEWAY_BIN:-$ROOT/target/release/sse-gateway}
  run "daemon accepts shipped settings" "$PY" "$DEPLOY/lib/consistency.py" daemon-config "$SSE_GATEWAY_BIN"
  fresh_metrics
  # e2e.py prints one `ok`/`FAIL` line per assertion and its own summary line.
  e2e_out=$TMP/e2e.out
  "$PY" "$DEPLOY/e2e.py" 2>&1 | tee "$e2e_out"
  e2e_passed=$(grep -c '^ok ' "$e2e_out")
  e2e_failed=$(grep -c '^FAIL ' "$e2e_out")
  if ! grep -q '^e2e: ' "$e2e_out"; then
    e2e_failed=$((e2e_failed + 1)) # the script died before its summary
    failures+=("e2e did not finish")
  fi
  passed=$((passed + e2e_passed))
  failed=$((failed + e2e_failed))
  while read -r line; do failures+=("e2e: ${line#FAIL }"); done < <(grep '^FAIL ' "$e2e_out")
fi

if ((failed)); then
  printf 'failed: %s\n' "${failures[@]}"
fi
echo "deploy-check: $passed passed, $failed failed"
((failed == 0))
