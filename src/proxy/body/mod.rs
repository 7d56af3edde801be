//! The response body: a stack of small `Body` adapters over the upstream body, each with one job.
//!
//! No task or channel per stream: the client connection polls this body only when it can write, so a slow
//! client stops the reads from the upstream socket (backpressure) and nothing is buffered beyond one frame.
//! How the stream ended (completed, upstream error, client gone) is recorded exactly once, on drop at the latest.
//!
//! The stacks, outermost first (each adapter polls the one inside it; all static dispatch):
//!
//! ```text
//! translated:    Record ─ Keepalive ─ Encode ─ Hold ─ Translate ─┐
//! pass-through:  Abort ─ Record ─ Original ──────────────────────┴─ Idle ─ Coalesce ─ UpstreamIncoming
//! resumed:       Keepalive ─ Encode ─ Follow ─ (the hub)
//! ```
//!
//! - `coalesce`: the upstream chunks already there, gathered per client frame (`Gather`).
//! - `timers`: `Idle` ends a silent upstream; `Keepalive` writes comments while a translated stream waits.
//! - `translate`: the translator over each batch (translate mode); `original`: the upstream's own bytes
//!   (pass-through, and shadow with its translator watching).
//! - `hold`: ids on the translated events, held for resumption; a pump reads on through a disconnect.
//! - `follow`: a reconnection or a watcher reading a held stream.
//! - `encode`: a frontend's protocol (AI SDK, AG-UI) over the held envelopes, when the request asked for one.
//! - `record`: the stream's metrics, its outcome (once, drop included) and its end-of-stream log line.
//! - `abort`: a pass-through failure held back until the client connection has flushed.
//!
//! A new layer over the translated stream (a replay buffer, another output) is a `Layer` adapter placed between
//! `Translate` and `Keepalive`, forwarding `ending`, `totals` and `cut_for_drain`.
//!
//! Files, bottom up: `layer` (what a layer is), the layers (each wraps the one inside it), `stack` (the stacks'
//! types and `ResponseBody`, which builds them: the one place a new layer is added).

pub mod abort;
pub mod coalesce;
pub mod encode;
pub mod follow;
pub mod hold;
pub mod layer;
pub mod original;
pub mod record;
#[cfg(test)]
pub mod script;
pub mod stack;
pub mod timers;
pub mod translate;
