#!/usr/bin/env bash
# One command for the load harness (issue 5): builds the release gateway, installs nginx and gnuplot when missing,
# runs the scenarios and prints the results (markdown, also appended to target/load/results-<mode>.md).
#   benches/run-load.sh quick   # CI smoke, < 3 minutes once built: fails only if a stream is dropped or a run fails
#   benches/run-load.sh full    # the figures of BENCHMARKS.md (about 15 minutes)
# Extra arguments go to the harness, e.g. `benches/run-load.sh full latency --rounds 6`.
#   benches/run-load.sh full instructions   # instructions per event under callgrind (installs valgrind)
#   benches/run-load.sh full resume         # reconnect with Last-Event-ID: first replayed byte, per store
#   benches/run-load.sh full resume --stores memory,redis,redis-other   # + the Redis store (installs redis-server)
#   benches/run-load.sh full redis          # the Redis store at scale: memory per stream, connections, CPU (issue 26)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-quick}
shift || true
scenario=all
if [[ $# -gt 0 && $1 != -* ]]; then scenario=$1; shift; fi
case $mode in
quick) flags=(--quick) ;;
full) flags=() ;;
*) echo "usage: $0 [quick|full] [scenario] [harness options]" >&2; exit 2 ;;
esac

need() { # command, Debian package
    command -v "$1" >/dev/null 2>&1 && return 0
    [[ -x /usr/sbin/$1 ]] && return 0
    echo "installing $2 (apt-get)" >&2
    if [[ $(id -u) -eq 0 ]]; then apt-get install -y "$2" >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y "$2" >/dev/null; }
    else sudo apt-get install -y "$2" >/dev/null; fi
}
need nginx nginx
need gnuplot gnuplot-nox
if [[ $scenario == instructions ]]; then need valgrind valgrind; fi
if [[ $scenario == redis || " $* " == *redis* ]]; then need redis-server redis-server; fi
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)

# The harness raises its soft limit itself (rlimit crate); this helps when the soft limit is lower than the hard.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

cargo build --release --locked --bin sse-gateway
cargo bench --locked --bench load --no-run
mkdir -p target/load
out=target/load/results-$mode.md
: >"$out"
echo "machine: $(nproc) cores; $(free -h | awk '/^Mem:/ {print $2}') memory; $(date -u +%Y-%m-%dT%H:%MZ); open files $(ulimit -n)" | tee -a "$out"
cargo bench --locked --bench load -- "$scenario" "${flags[@]}" --nginx "$nginx_bin" --out "$out" "$@"
echo "results: $out"
