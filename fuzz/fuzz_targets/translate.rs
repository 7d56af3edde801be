//! Fuzz target `translate`: any bytes, split at fuzzer-chosen points, under fuzzer-chosen options; the
//! checks are in `fuzz/check.rs` (shared with `tests/fuzz_regressions.rs`).
#![no_main]

#[path = "../check.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
