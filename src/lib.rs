//! sse-gateway: translates legacy XML-in-SSE agent streams into the JSON
//! envelope protocol.
//!
//! The pipeline, one module per stage (imports run top to bottom only):
//!
//! ```text
//! proxy/      hyper edge: forwards requests, adapts body frames to `translate`
//! translate/  the sans-I/O pipeline: feed(bytes) -> SSE bytes, plus counters
//! legacy/     item tokenizer, per-kind unescaping, raw dialect, agent scopes
//! sse/        decoder (bytes -> events) and encoder (envelopes -> bytes)
//! envelope/   the 13 envelope types and the byte-budget chunker
//! ```
//!
//! Nothing below `proxy/` uses tokio, hyper or prometheus.
#![forbid(unsafe_code)]

pub mod envelope;
pub mod legacy;
pub mod sse;
pub mod translate;

// The daemon around the core (imports run proxy -> translate, never back).
pub mod admin;
pub mod cli;
pub mod config;
pub mod demo;
pub mod proxy;
pub mod telemetry;
