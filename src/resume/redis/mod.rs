//! The Redis/Valkey store of resumable streams: the owning instance mirrors its events to Stream entries
//! `0-<last seq>` (a write round's events of a stream together) through one batching writer task; any instance
//! replays (`XRANGE`) and follows (a few follower tasks per instance, each one blocking `XREAD` over every waiting
//! reader's stream).
//!
//! Keys of one stream share the hash tag `{<token>}`, so a cluster keeps them on one slot:
//!
//! ```text
//! <prefix>{<token>}:events   Stream of the events: entry 0-<seq> of one event, field "e" = its bytes; or
//!                            0-<last> of n events (a round's of the stream), n fields "es", in order
//!                            (events last-n+1 ..= last); see `RedisOptions::entry_bounds`
//! <prefix>{<token>}:meta     hash: binding (hex), agent, state live|finished|lost, last_seq, end
//! <prefix>{<token>}:owner    the owner's liveness: PX 3 x heartbeat, refreshed every heartbeat
//! <prefix>{<token>}:primary  the cursor of a primary reader on another instance: SET PX 3 x heartbeat
//! <prefix>{<token>}:cancel   a cancel asked by any instance: SET PX ttl
//! <prefix>bind:<binding>     sorted set of the binding's streams (token hex, scored by creation time in ms):
//!                            the newest BINDING_INDEX_MAX, expiring with the streams' ttl (session listings)
//! ```
//!
//! With the stream's create, the owner also publishes `<instance>:<token>` on the channel
//! `<prefix>started:<binding>` (`<binding>`: the binding's 64 hex digits), for the sessions of every instance
//! (`announce`).
//!
//! Order is what makes reading safe without transactions. The writer sends one pipeline at a time on one
//! connection, so Redis applies a stream's commands in the order they were queued: its events before its
//! `state finished`, and `state finished` before the owner key is deleted. A reader asks for the owner key
//! first, then the meta hash, then the events, in one pipeline: `finished` seen means every event is there
//! (or was dropped to keep a bound: the reader then gets a gap, never a silent end), and an owner key gone
//! while the state is still `live`, and still gone a heartbeat later on the reader's clock (a stall also lets
//! it expire; the owner sets it again as soon as Redis answers), means the owner died. A
//! pipeline whose round trip failed is sent again as it was (a repeated `XADD` of an id already there is a
//! no-op), so retrying keeps that order.
//!
//! Expiry: a stream's keys expire `ttl` after the owner last refreshed them. The heartbeat refreshes a live
//! stream's (one round a heartbeat, whatever it writes meanwhile); its create, its end and its loss set them
//! from then; a new events key gets its expiry in the round of its first `XADD`. A stream nobody refreshes (its
//! owner gone) is gone `ttl` later.
//!
//! Bounds: the owner knows each stored event's seq and size; once a stream holds more than `buffer_bytes` plus
//! [`RedisOptions::trim_slack`] (a sixteenth of it), or more than `max_events` plus
//! [`RedisOptions::events_slack`] (a sixteenth, at most 100), it trims it
//! with `XTRIM MINID` back to both (plus the newest frame), whole entries at a time (an entry holds at most half
//! of either slack, [`RedisOptions::entry_bounds`], so it keeps at least its bounds and less than an entry more):
//! a stream holds at most `buffer_bytes` + `buffer_bytes / 16` and its newest frame, trimmed once per that slack
//! rather than every round (an `XADD` carries no `MAXLEN`). Everything this instance has in Redis (live streams, and
//! finished ones until their keys expire) to `max_total_bytes`: the oldest finished streams' events go first,
//! then live streams are trimmed down to [`LIVE_FLOOR_BYTES`].
//!
//! A stream whose own command Redis refuses (out of memory under `noeviction`, a key of another type), whose
//! queue overflows, or whose meta hash vanished (a flush, a failover to an empty replica) is not resumable for
//! good: nothing more of it is written (so no hole can appear in the middle of what is stored), its state
//! becomes `lost` where Redis still takes it, and its owner key is deleted. Readers get every stored event,
//! then [`ReadError::Lost`]. Out of memory, the stream holding the most is given up (its events deleted) and
//! the others' refused commands are sent again, so one long run cannot take every stream down with it.
//!
//! One job a file: [`store`] is the handle, [`writer`] the write path (the one task that writes what this
//! instance owns), [`follower`] the blocking `XREAD`s, [`reader`] a reader of any instance's stream; [`slot`] is
//! what the handle and the writer share, [`keys`] the names written, [`reply`] the parsing of Stream replies,
//! [`trip`] one timed round trip, [`options`] and [`error`] the settings and failures.

mod error;
mod follower;
mod keys;
mod options;
mod reader;
mod reply;
mod slot;
mod store;
mod trip;
mod writer;

/// Most follower connections per instance (the ceiling of `resume.redis_follow_connections`).
pub use crate::config::MAX_FOLLOW_CONNECTIONS;

/// How a stream ended, stored in its meta hash (`End::as_str`).
pub use super::metrics::End;
/// The bounds that evict events and the kinds of round trip, as the metrics label them.
pub use super::metrics::{Bound, StoreOp};

pub use error::{OpenError, ReadError, StoreError};
pub use keys::BINDING_INDEX_MAX;
pub(crate) use keys::{start_channel, unix_us};
pub use options::{RedisOptions, FOLLOW_BLOCK, LIVENESS_HEARTBEATS, MAX_EVENTS_SLACK, TRIM_SLACK_FRACTION};
pub use reader::{RemoteReader, READ_COUNT};
pub use store::{Indexed, Mirrored, RedisStore, RemoteState};
pub(crate) use trip::round_trip;
pub use trip::StoreObserver;
pub use writer::{LIVE_FLOOR_BYTES, MAX_BATCH_BYTES, MAX_BATCH_FRAMES};
