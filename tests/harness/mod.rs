//! The test harness, one of each helper, at three levels:
//!
//! - [`core`]: the translator in-process (`feed`/`finish`), a legacy-backend emitter with its expectation, the
//!   strict output parser and block comparator;
//!
//! and, shared by the levels, one seeded PRNG ([`rng`]).
//!
//! Each test crate includes it with `mod harness;` and uses the level it needs; the benches include single files
//! by path.

#![allow(dead_code)]

pub mod rng;
pub mod core;
