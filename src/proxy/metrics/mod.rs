//! The edge's metric families: `edge` (requests, streams by body mode and outcome, client faults, with the
//! upstream's), `translator` (the translator's families and its `Observer` for the daemon) and `tap` (what else
//! watches a translated stream: its trace, the inspector).

pub mod edge;
pub mod tap;
pub mod translator;
