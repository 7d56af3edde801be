#!/usr/bin/env bash
# Runs the fuzz targets for a bounded total time and prints each one's exec count.
#   .ci/fuzz.sh [SECONDS]        default 60, split between the targets: two thirds to `translate` (the
#                                translator: large state space), one third to `edge` (the HTTP edge's pure
#                                functions: agent ids, upstream path, forwarded headers; small and fast)
# Env:
#   FUZZ_TARGETS    targets to run, space-separated (default "translate edge"); a single target gets all the time
#   FUZZ_SANITIZER  address|none (default none: the crate is #![forbid(unsafe_code)], and without ASan the
#                   targets run several times more execs per second)
#   FUZZ_FORK       N > 0: libFuzzer fork mode with N workers and -ignore_crashes=1, so that a known crash
#                   does not end the run (every crash is still saved); default 0 (stop at the first crash)
# A crash leaves its input in fuzz/artifacts/<target>/ and makes this script exit non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
sanitizer="${FUZZ_SANITIZER:-none}"
fork="${FUZZ_FORK:-0}"
read -r -a targets <<<"${FUZZ_TARGETS:-translate edge}"

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# cargo-fuzz passes nightly-only flags (-Zsanitizer, -Cpasses=sancov-module, ...); the machine has only
# a stable toolchain, and RUSTC_BOOTSTRAP=1 makes it accept them.
export RUSTC_BOOTSTRAP=1

mode=()
if [ "$fork" -gt 0 ]; then
    mode=(-fork="$fork" -ignore_crashes=1)
fi

# Seconds for one target out of the total: translate 2/3 and edge 1/3 when both run, at least 1 s each.
share() {
    if [ "${#targets[@]}" -eq 1 ]; then
        echo "$secs"
    elif [ "$1" = translate ]; then
        echo $((secs * 2 / 3 > 0 ? secs * 2 / 3 : 1))
    else
        echo $(((secs - secs * 2 / 3) / (${#targets[@]} - 1) > 0 ? (secs - secs * 2 / 3) / (${#targets[@]} - 1) : 1))
    fi
}

# run_target NAME SECONDS: one bounded libFuzzer run; returns non-zero on a crash.
run_target() {
    local target=$1 t=$2
    # New inputs go to a scratch corpus (ignored by git); the committed seeds are read only.
    local work=fuzz/target/corpus-work/$target
    mkdir -p "$work" "fuzz/artifacts/$target"
    # The full libFuzzer output stays here for inspection.
    local log=fuzz/target/fuzz-$target.log
    local crashes_before status=0 execs crashes
    crashes_before=$(find "fuzz/artifacts/$target" -name 'crash-*' | wc -l)
    cargo fuzz run --sanitizer "$sanitizer" "$target" "$work" "fuzz/corpus/$target" -- \
        -max_total_time="$t" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "${mode[@]}" \
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
    crashes=$(($(find "fuzz/artifacts/$target" -name 'crash-*' | wc -l) - crashes_before))
    echo "fuzz: target $target, ${t}s, sanitizer ${sanitizer}, fork ${fork}: ${execs:-0} execs, ${crashes} new crash inputs, exit status ${status}"
    if [ "$status" -ne 0 ] || [ "$crashes" -gt 0 ]; then
        tail -n 40 "$log"
        echo "fuzz: crash inputs are in fuzz/artifacts/$target/ (minimise, then copy to fuzz/regressions/$target/)"
        return 1
    fi
}

status=0
for target in "${targets[@]}"; do
    run_target "$target" "$(share "$target")" || status=1
done
exit "$status"
