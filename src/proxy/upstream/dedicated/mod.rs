//! The dedicated connection of an event stream: one request written, one response read, no task of its own.
//! `error` (what fails), `framing` (RFC 9112 §6 body framing, the chunked decoder), `head` (request head written,
//! response head read), `connection` (the exchange and the response body).

pub mod connection;
pub mod error;
pub mod framing;
pub mod head;
