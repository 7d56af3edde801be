//! What can go wrong: talking to Redis ([`StoreError`]), opening a stream ([`OpenError`]), reading one
//! ([`ReadError`]).

use std::time::Duration;

use redis::RedisError;
use thiserror::Error;

/// A failure to talk to Redis.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The options are not usable.
    #[error("invalid Redis store options: {0}")]
    Options(&'static str),
    /// The client or the server reported an error.
    #[error("Redis {op} failed")]
    Redis {
        op: &'static str,
        #[source]
        source: RedisError,
    },
    /// No answer within `op_timeout`.
    #[error("Redis {op}: no answer within {after:?}")]
    Timeout { op: &'static str, after: Duration },
    /// An answer of an unexpected shape (a key of another type, say).
    #[error("Redis {op}: unexpected reply: {what}")]
    Reply { op: &'static str, what: String },
}

/// Why a stream cannot be opened (or cancelled).
#[derive(Debug, Error)]
pub enum OpenError {
    /// No such stream, or it expired.
    #[error("unknown stream")]
    Unknown,
    /// The stream exists but was opened with another binding.
    #[error("binding differs")]
    Denied,
    /// The event after the asked position is older than the first stored event.
    #[error("position no longer held: first stored event is {first}")]
    Gap { first: u64 },
    /// This instance already has `max_readers` remote readers open.
    #[error("too many remote readers on this instance")]
    Busy,
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why a remote reader cannot go on.
#[derive(Debug, Error)]
pub enum ReadError {
    /// Every stored event was read, and the owner died (or stopped writing) before the stream's end.
    #[error("the stream's owner was lost before its end")]
    Lost,
    /// The events after the reader's position were trimmed while it read.
    #[error("events {expected}.. trimmed: first stored event is {first}")]
    Gap { expected: u64, first: u64 },
    /// A stored event is not UTF-8: no gateway wrote it (a gateway's events are its translator's text), and no
    /// reader is given it.
    #[error("stored event {seq} is not UTF-8")]
    NotText { seq: u64 },
    /// Redis failed; the reader keeps its position, so `next` may be called again.
    #[error(transparent)]
    Store(#[from] StoreError),
}
