//! The WebSocket output (DESIGN §5.2, docs/WEBSOCKET.md): held streams read over a socket, one per stream's URL
//! or one per session (every stream of the caller's binding). A socket is one more reader of the held streams:
//! the events it sends are the very bytes SSE readers get.
//!
//! `upgrade` checks and answers the handshake and spawns the socket; `serve` runs it (readers, backpressure,
//! the client's messages, close codes); `messages` writes and reads what goes over it (the two subprotocols);
//! `wire` writes the messages to the connection, one byte queue with tungstenite's control frames; `metrics`
//! counts it; `cap` holds the sockets under `websocket.max_sockets`.

pub mod cap;
pub mod messages;
pub mod metrics;
pub mod serve;
pub mod upgrade;
pub mod wire;
