//! Fuzz target `edge`: the HTTP edge the gateway owns (agent ids from headers and JSON bodies, the upstream path
//! under the prefix, forwarded headers); the checks are in `fuzz/check_edge.rs` (shared with
//! `tests/fuzz_regressions.rs`).
#![no_main]

#[path = "../check_edge.rs"]
mod check_edge;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check_edge::check(data));
