//! Accepting and serving connections: `server` (listeners, limits, the graceful drain), `workers` (the
//! single-threaded runtimes connections are served on), `http1` (plain HTTP/1.1 requests on the client's socket,
//! without hyper's per-connection buffers; any other goes to hyper), `conn` (one client connection's socket and
//! state).

pub mod conn;
pub mod http1;
pub mod server;
pub mod workers;
