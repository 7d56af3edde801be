//! Level 1, the core in-process: a legacy-backend emitter with its expected envelopes, random scenario parts,
//! and the translator driven directly (`feed`/`finish`) with a strict parser and block comparator for its output.

pub mod emitter;
pub mod envelopes;
pub mod gen;
