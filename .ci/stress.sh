#!/usr/bin/env bash
# Stress: the soak scenario (benches/soak.rs) for 30 s at the full rate (2,000 events/s, 50 concurrent streams of
# 1-10 s), 127.0.0.1 only; exits non-zero when a stream lost or corrupted an envelope, RSS trends up or fds leak.
# It runs the test-profile build that `cargo test --all-targets` already made (no release build in CI); use
# `cargo bench --bench soak -- --minutes 5` for the full soak. The fault and client-fault suites
# (tests/faults.rs, tests/stress.rs) run with the other tests. Extra arguments go to the soak.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
cargo test --locked --bench soak -- --minutes 0.5 --concurrency 50 --rate 2000 --min-secs 1 --max-secs 10 "$@"
