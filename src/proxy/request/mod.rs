//! What a client's request says, read before anything is forwarded: its headers (hop-by-hop, `X-Forwarded-*`),
//! the wire format it asks for and which responses are translated (`negotiate`), the fallback agent id (`agent`),
//! and its body on the way upstream, with a stall timeout and failures marked as the client's (`body`).

pub mod agent;
pub mod body;
pub mod headers;
pub mod negotiate;
