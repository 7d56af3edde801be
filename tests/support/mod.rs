//! Shared test support: a legacy-backend emitter with its expected envelopes,
//! an output parser and block comparator, and a small seeded PRNG.
#![allow(dead_code)]

pub mod emitter;
pub mod envelopes;
pub mod gen;
pub mod rng;
