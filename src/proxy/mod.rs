//! The edge: the daemon's HTTP side around the translator. Its rooms follow a request's path, and are declared
//! here bottom up; a room imports only from the rooms above it in this list (`tests/tidy.rs` holds every file to
//! it: no import circle between files).
//!
//! ```text
//!  accept/    a connection accepted and served: listeners, worker runtimes, the plain HTTP/1.1 path, the client
//!     │       connection's state
//!  decide/    a request decided: answered from a held stream (resumption's routes), upgraded to a socket,
//!     │       refused, or forwarded
//!  socket/    the WebSocket output: a held stream or a session read over a socket
//!     │
//!  frontend/  the frontends' routes (AI SDK, AG-UI): a turn's request adapted, a chat remembered, its encoder
//!     │
//!  body/      the response body stack: the layers over the upstream body (translate, hold, follow, timers, …)
//!     │
//!  inspect/   the stream inspector's tap: a translated stream's events and envelopes kept for `/debug/`
//!     │
//!  trace/     OpenTelemetry: a request's SERVER span, a run's `invoke_agent` spans (a tap), the OTLP exporter
//!     │
//!  metrics/   the edge's metric families and the translator's observer
//!  upstream/  the upstream reached: the pooled client, the dedicated event-stream connection, its failures
//!  request/   what a request says: headers, the wire format asked for, the agent id, the body sent upstream
//!  base/      what the body stack and the connection share: the drain deadline, flushes, quiet side futures
//! ```

pub mod base;
pub mod request;
pub mod upstream;
pub mod metrics;
pub mod inspect;
pub mod trace;
pub mod body;
pub mod frontend;
pub mod socket;
pub mod decide;
pub mod accept;
