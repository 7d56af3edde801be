//! The edge's metric families: `edge` (requests, streams by body mode and outcome, client faults, with the
//! upstream's) and `translator` (the translator's families and its `Observer` for the daemon).

pub mod edge;
pub mod translator;
