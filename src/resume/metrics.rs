//! The resume metric families: resumptions by outcome, what was replayed, what is held, the store's work.
//! Never labelled by stream: a token in a label would open the stream to whoever reads the metrics.

use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::telemetry::{counter, counters, gauge, histograms, latency_buckets, name, register};

/// The `result` label's values of `resume_store_operations_total`, indexed by `!ok`.
const RESULTS: [&str; 2] = ["ok", "error"];

label_enum! {
    /// Which bound made the owner remove events from Redis (`resume_store_evicted_bytes_total{bound}`).
    pub enum Bound {
        /// `buffer_bytes` of one stream.
        Stream = "stream",
        /// `max_total_bytes` of this instance.
        Total = "total",
    }
}

label_enum! {
    /// A kind of Redis round trip (`resume_store_operations_total{op}`, `resume_store_seconds{op}`).
    pub enum StoreOp {
        Connect = "connect",
        /// The owner's pipelined appends, trims and meta updates.
        Write = "write",
        /// A reader's first look at a stream: its meta and first event.
        Open = "open",
        /// A reader's catch-up reads.
        Read = "read",
        /// A follower's blocking `XREAD` (its time includes the block).
        Follow = "follow",
        /// A remote primary's cursor.
        Report = "report",
        /// The owner's poll of a remote primary's cursor and of a cancel.
        RemoteState = "remote_state",
        Cancel = "cancel",
        /// A stream's CORS answer, read for a request elsewhere.
        Cors = "cors",
        /// A session's listing of its binding's streams.
        List = "list",
        /// The announcements' pub/sub connection and its (un)subscriptions.
        Subscribe = "subscribe",
        /// A frontend chat's record (docs/FRONTENDS.md), read or written.
        Chat = "chat",
    }
}

label_enum! {
    /// How a request naming one of our streams was answered (`resume_requests_total{outcome}`).
    pub enum Resumption {
        Replayed = "replayed",
        Gap = "gap",
        Unknown = "unknown",
        Denied = "denied",
        /// A watcher refused: the stream has `resume.max_watchers_per_stream` of them (429).
        WatchersFull = "watchers_full",
    }
}

label_enum! {
    /// A bound of the memory store that acted (`resume_limited_total{limit}`).
    pub enum Limit {
        /// A writer nobody reads paused: all streams together held `resume.max_total_bytes`.
        TotalBytes = "total_bytes",
        /// The longest waiting stream in grace given up: `resume.max_grace_streams` were in grace.
        GraceStreams = "grace_streams",
        /// The binding's longest waiting stream in grace given up: `resume.max_grace_streams_per_binding`.
        GracePerBinding = "grace_per_binding",
        /// A watcher closed: its client read nothing for `resume.watcher_write_timeout_secs`.
        WatcherStalled = "watcher_stalled",
    }
}

label_enum! {
    /// Where a held stream is in its life (`resume_streams{state}`).
    pub enum Held {
        /// Its upstream is read, a primary subscriber attached.
        Live = "live",
        /// Its upstream is read, nobody attached: dropped at the end of `resume.grace_secs`.
        Grace = "grace",
        /// Ended, readable until `resume.retention_secs`.
        Retained = "retained",
    }
}

label_enum! {
    /// How a held stream's run ended (`resume_ended_total{how}`).
    pub enum End {
        /// The upstream ended (whatever it said).
        Completed = "completed",
        /// Nobody reconnected within the grace period: the upstream was dropped.
        Abandoned = "abandoned",
        /// `DELETE` on the stream's URL.
        Cancelled = "cancelled",
        /// Cut at the drain deadline.
        Drained = "drained",
        /// Its owning instance went away mid-run (seen by readers on another instance).
        Lost = "lost",
    }
}

label_enum! {
    /// What became of a stream's start told to a session (`resume_session_announcements_total{outcome}`).
    pub enum Announcement {
        /// Handed to the session (`Session::next_start`).
        Delivered = "delivered",
        /// The oldest of a session's queue, dropped: the session did not take its announcements
        /// (`resume.session_queue`).
        Dropped = "dropped",
    }
}

pub struct ResumeMetrics {
    pub requests: [IntCounter; Resumption::ALL.len()],
    pub replayed_events: IntCounter,
    pub replayed_bytes: IntCounter,
    pub streams: [IntGauge; Held::ALL.len()],
    pub held_bytes: IntGauge,
    pub subscribers: IntGauge,
    pub ended: [IntCounter; End::ALL.len()],
    pub watchers_closed: IntCounter,
    pub limited: [IntCounter; Limit::ALL.len()],
    /// By `StoreOp`, then `RESULTS`.
    pub store_ops: [[IntCounter; RESULTS.len()]; StoreOp::ALL.len()],
    pub store_seconds: [Histogram; StoreOp::ALL.len()],
    pub unresumable: IntCounter,
    /// Event bytes the owner removed from Redis to keep a bound, by bound (`stream`, `total`).
    pub store_evicted_bytes: [IntCounter; Bound::ALL.len()],
    /// Streams whose keys vanished from Redis without a failed write (a flush, a failover).
    pub store_lost: IntCounter,
    /// Remote readers refused because `resume.max_remote_readers` were open.
    pub remote_readers_refused: IntCounter,
    /// Reconnect to first replayed byte.
    pub first_replayed_byte: Histogram,
    /// Sessions (every stream of a binding) open on this instance.
    pub sessions: IntGauge,
    /// Sessions refused: this instance had as many as it takes.
    pub sessions_refused: IntCounter,
    /// Streams' starts told to sessions, by outcome.
    pub announcements: [IntCounter; Announcement::ALL.len()],
}

impl ResumeMetrics {
    pub fn register(r: &Registry) -> prometheus::Result<Self> {
        let streams = register(
            r,
            IntGaugeVec::new(
                Opts::new(name("resume_streams"), "Resumable streams held, by state."),
                &["state"],
            )?,
        )?;
        // Every series of the labelled families below exists from the start (at zero, with the memory store too),
        // so the dashboard's panels and the alert rules that name them have data on a fresh instance.
        let store_ops = register(
            r,
            IntCounterVec::new(
                Opts::new(
                    name("resume_store_operations_total"),
                    "Shared-store operations, by operation and result.",
                ),
                &["op", "result"],
            )?,
        )?;
        let store_seconds = histograms(
            r,
            "resume_store_seconds",
            "Shared-store operation latency.",
            "op",
            latency_buckets(),
        )?;
        Ok(Self {
            requests: counters(
                r,
                "resume_requests_total",
                "Requests naming one of our streams (Last-Event-ID or the stream's URL), by outcome.",
                "outcome",
                Resumption::ALL.map(Resumption::as_str),
            )?,
            replayed_events: counter(
                r,
                "resume_replayed_events_total",
                "Held events sent again to a resuming or watching subscriber.",
            )?,
            replayed_bytes: counter(r, "resume_replayed_bytes_total", "Bytes of held events sent again.")?,
            streams: Held::ALL.map(|s| streams.with_label_values(&[s.as_str()])),
            held_bytes: gauge(r, "resume_held_bytes", "Bytes of events held for resumption.")?,
            subscribers: gauge(
                r,
                "resume_subscribers",
                "Subscribers reading held streams (resumed clients and watchers).",
            )?,
            ended: counters(
                r,
                "resume_ended_total",
                "Resumable runs ended, by how.",
                "how",
                End::ALL.map(End::as_str),
            )?,
            watchers_closed: counter(
                r,
                "resume_watchers_closed_total",
                "Watchers closed because they fell behind what the stream holds.",
            )?,
            limited: counters(
                r,
                "resume_limited_total",
                "Times a bound of held streams acted, by bound: a writer nobody reads paused at the total, a \
                 stream in grace given up past a cap, a watcher closed for not reading.",
                "limit",
                Limit::ALL.map(Limit::as_str),
            )?,
            store_ops: StoreOp::ALL.map(|op| RESULTS.map(|res| store_ops.with_label_values(&[op.as_str(), res]))),
            store_seconds: StoreOp::ALL.map(|op| store_seconds.with_label_values(&[op.as_str()])),
            unresumable: counter(
                r,
                "resume_unresumable_total",
                "Streams that stopped being resumable through the shared store (slow or down).",
            )?,
            store_evicted_bytes: counters(
                r,
                "resume_store_evicted_bytes_total",
                "Event bytes removed from the shared store to keep a bound, by bound (stream: resume.buffer_bytes; \
                 total: resume.max_total_bytes).",
                "bound",
                Bound::ALL.map(Bound::as_str),
            )?,
            store_lost: counter(
                r,
                "resume_store_lost_total",
                "Streams whose keys vanished from the shared store without a failed write (a flush, a failover).",
            )?,
            remote_readers_refused: counter(
                r,
                "resume_remote_readers_refused_total",
                "Reads of streams owned elsewhere refused with 503 because resume.max_remote_readers were open.",
            )?,
            first_replayed_byte: register(
                r,
                Histogram::with_opts(
                    HistogramOpts::new(
                        name("resume_first_byte_seconds"),
                        "From a resuming request to its first replayed byte.",
                    )
                    .buckets(latency_buckets()),
                )?,
            )?,
            sessions: gauge(
                r,
                "resume_sessions",
                "Sessions (every stream of a binding, for a session socket) open on this instance.",
            )?,
            sessions_refused: counter(
                r,
                "resume_sessions_refused_total",
                "Sessions refused because this instance had as many open as it takes.",
            )?,
            announcements: counters(
                r,
                "resume_session_announcements_total",
                "Streams' starts told to sessions, by outcome: delivered, or dropped from the queue of a session \
                 that did not take them (resume.session_queue).",
                "outcome",
                Announcement::ALL.map(Announcement::as_str),
            )?,
        })
    }

    pub fn resumption(&self, r: Resumption) {
        self.requests[r as usize].inc();
    }

    pub fn held(&self, state: Held) -> &IntGauge {
        &self.streams[state as usize]
    }

    pub fn ended(&self, how: End) {
        self.ended[how as usize].inc();
    }

    pub fn announcement(&self, a: Announcement) {
        self.announcements[a as usize].inc();
    }

    pub fn limited(&self, limit: Limit) {
        self.limited[limit as usize].inc();
    }
}
