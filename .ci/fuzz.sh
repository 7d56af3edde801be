#!/usr/bin/env bash
# Runs the `translate` fuzz target for a bounded time and prints the exec count.
#   .ci/fuzz.sh [SECONDS]        default 60
# Env:
#   FUZZ_SANITIZER  address|none (default none: the core is #![forbid(unsafe_code)], and without ASan the
#                   target runs several times more execs per second)
#   FUZZ_FORK       N > 0: libFuzzer fork mode with N workers and -ignore_crashes=1, so that a known crash
#                   does not end the run (every crash is still saved); default 0 (stop at the first crash)
# A crash leaves its input in fuzz/artifacts/translate/ and makes this script exit non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
sanitizer="${FUZZ_SANITIZER:-none}"
fork="${FUZZ_FORK:-0}"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# cargo-fuzz passes nightly-only flags (-Zsanitizer, -Cpasses=sancov-module, ...); the machine has only
# a stable toolchain, and RUSTC_BOOTSTRAP=1 makes it accept them.
export RUSTC_BOOTSTRAP=1

# New inputs go to a scratch corpus (ignored by git); the committed seeds are read only.
work=fuzz/target/corpus-work/translate
mkdir -p "$work" fuzz/artifacts/translate
# The full libFuzzer output stays here for inspection.
log=fuzz/target/fuzz-translate.log

mode=()
if [ "$fork" -gt 0 ]; then
    mode=(-fork="$fork" -ignore_crashes=1)
fi

crashes_before=$(find fuzz/artifacts/translate -name 'crash-*' | wc -l)
status=0
cargo fuzz run --sanitizer "$sanitizer" translate "$work" fuzz/corpus/translate -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${mode[@]}" \
    >"$log" 2>&1 || status=$?

# Distinct panics (location and message), with how often each was hit.
# (Fork mode keeps the inner logs elsewhere: triage with tests/fuzz_regressions.rs, see fuzz/README.md.)
{ grep -E -A1 'panicked at' "$log" | grep -v -E '^--$' | sed -E 's/^thread .* panicked at/panicked at/' |
    paste - - | sort | uniq -c | sort -rn | head -20; } || true
{ grep -E '^(SUMMARY|INFO: fuzzed for|INFO: exiting)' "$log" | sort | uniq -c | head -20; } || true
# Exec count: the final stats (normal mode), or the last "#N:" progress line (fork mode).
execs=$( (grep -E '^stat::number_of_executed_units:' "$log" || true) | awk '{s += $2} END {print s + 0}')
if [ "$execs" -eq 0 ]; then
    execs=$( (grep -E '^#[0-9]+' "$log" || true) | tail -n 1 | sed -E 's/^#([0-9]+).*/\1/')
fi
crashes=$(($(find fuzz/artifacts/translate -name 'crash-*' | wc -l) - crashes_before))
echo "fuzz: target translate, ${secs}s, sanitizer ${sanitizer}, fork ${fork}: ${execs:-0} execs, ${crashes} new crash inputs, exit status ${status}"
if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    tail -n 40 "$log"
    echo "fuzz: crash inputs are in fuzz/artifacts/translate/ (minimise, then copy to fuzz/regressions/translate/)"
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
