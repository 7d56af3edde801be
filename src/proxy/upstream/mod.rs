//! Reaching the one configured upstream: `pool` (hyper's pooled client, the request rewrite, and the response body
//! either way), `dedicated/` (an event stream's own connection, written and read with `httparse`), and how an
//! exchange failed (`kind` for the metrics, `error` as it travels up the body stack).

pub mod dedicated;
pub mod error;
pub mod kind;
pub mod pool;
