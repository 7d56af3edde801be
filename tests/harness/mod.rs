//! The test harness, one of each helper, at three levels:
//!
//! 1. [`core`], the translator in-process (`feed`/`finish`): a legacy-backend emitter with its expectation,
//!    random scenario parts, the byte-exact output parser and block comparator;
//! 2. [`server`], the gateway in-process on ephemeral ports ([`server::TestGateway`]);
//! 3. [`process`], the real binary as a subprocess ([`process::Process`]), its memory and descriptors.
//!
//! Shared by the levels: one seeded PRNG ([`rng`]), the backend's escapes ([`escape`]), one legacy-backend emulator ([`upstream`]: a closure per
//! connection, or a list of steps), the clients ([`client`]), one SSE output reader ([`sse`]), one metrics reader
//! ([`metrics`]), a small legacy corpus with its expected blocks ([`legacy`]) and the checks of faulted streams
//! ([`faults`]), where two sequences first differ ([`diff`]), a real `redis-server` ([`redis_server`]); for the
//! real-client tests, a relay that cuts event streams mid-way ([`relay`]), headless Chromium ([`browser`]), the
//! pages and the paced run it reads ([`pages`]), a backend's CORS as Starlette answers it ([`cors`]), a
//! WebSocket client with the runs its tests read ([`ws`]), and a scripted legacy agent backend for the AI SDK and
//! AG-UI frontends ([`agent_backend`]), and node scripts run with their output read ([`node`]).
//!
//! Each test crate includes it with `mod harness;` and imports what it uses (`use harness::prelude::*` brings the
//! server and process levels' usual names); the benches include single files by path.

#![allow(dead_code)]

use std::time::Duration;

pub mod rng;
pub mod escape;
pub mod core;
pub mod sse;
pub mod metrics;
pub mod upstream;
pub mod client;
pub mod legacy;
pub mod server;
pub mod process;
pub mod faults;
pub mod diff;
pub mod redis_server;
pub mod relay;
pub mod browser;
pub mod cors;
pub mod pages;
pub mod ws;
pub mod blocks;
pub mod agent_backend;
pub mod node;
pub mod otlp;

/// Generous bound on anything a test waits for: reaching it is a failure, not a measurement.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The names the end-to-end tests use, in one import.
#[allow(unused_imports)]
pub mod prelude {
    pub use super::client::{
        assert_leaving_closes_upstream, client, get, header_value, http_get, open_run, raw, read_rest, read_to_eof,
        request, send, Client, HttpClient,
    };
    pub use super::faults::*;
    pub use super::metrics::{assert_upstream_connections, metric, resume_ended, resume_requests, resume_streams};
    pub use super::process::{rss_kib, stuck_run_with_a_short_drain, Process, RssSampler};
    pub use super::server::{gateway_with, TestGateway};
    pub use super::sse::{
        blocks, delta, envelope_values, envelopes, error_type, is_final, kind, parse_stream, sse_data, without_ids, Out,
    };
    pub use super::upstream::{
        find, paced, sse_head, Closed, ConnLog, Emulator, Ending, Recorded, Step, UpConn, Upstream,
    };
    pub use super::PATIENCE;
}
