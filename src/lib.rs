//! sse-gateway: translates legacy XML-in-SSE agent streams into the JSON
//! envelope protocol.
//!
//! The modules are layers, declared below from the bottom up; a module
//! imports only from layers declared before it (`tests/tidy.rs` checks it).
//!
//! ```text
//! sse/        the SSE wire format: decoder (bytes -> events), encoder (event framing)
//! protocol/   the envelope protocol's vocabulary: 13 types, their fields, identifiers
//! pipeline/   what every stage shares: Options, the Observer and its Stats
//! envelope/   stage: envelopes within the byte budget (header, chunker, JSON text)
//! legacy/     stage: legacy items -> envelope pieces (tags, escapes, raw dialect, scopes)
//! translate/  the sans-I/O facade: feed(bytes) -> SSE bytes
//! frontend/   the frontends' protocols: held envelopes -> AI SDK / AG-UI chunks (DESIGN 5.3)
//! config, telemetry, demo, inspect, admin, cors, resume, proxy, cli: the daemon around it (inspect: the stream
//! inspector's state and routes; cors: the CORS answer of the gateway's own responses; resume: held streams)
//! ```
//!
//! Nothing up to `frontend/` uses tokio, hyper or prometheus.
#![forbid(unsafe_code)]

pub mod sse;
pub mod protocol;
pub mod pipeline;
pub mod envelope;
pub mod legacy;
pub mod translate;
pub mod frontend;

/// Declares the enum of a metric label's values, each variant with its value: `ALL` lists the variants in
/// declaration order (so `v as usize` indexes it) and `as_str` gives the value.
macro_rules! label_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:literal,)+ }) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $(#[$meta])*
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// In declaration order, so `v as usize` indexes it.
            pub const ALL: [$name; [$($value),+].len()] = [$($name::$variant),+];

            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $value,)+
                }
            }
        }
    };
}

/// A `Body` impl's `is_end_stream` and `size_hint`, those of the body in field `$inner`.
macro_rules! body_hints_from {
    ($inner:ident) => {
        fn is_end_stream(&self) -> bool {
            self.$inner.is_end_stream()
        }

        fn size_hint(&self) -> ::http_body::SizeHint {
            self.$inner.size_hint()
        }
    };
}

// The daemon around the core.
pub mod config;
pub mod telemetry;
pub mod demo;
pub mod inspect;
pub mod admin;
pub mod cors;
pub mod resume;
pub mod proxy;
pub mod cli;
