//! Resumable streams.

pub mod redis;
