//! Deciding a request: `handler` takes it (CONNECT and bad hosts refused, preflights of a held stream and
//! resumption's routes answered, the rest forwarded); `resumption` answers from held streams (it asks `resume/`
//! and answers; `resume/` never needs the edge); `answers` are the responses the edge writes itself.

pub mod answers;
pub mod handler;
pub mod resumption;
