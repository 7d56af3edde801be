//! The frontends' room (DESIGN 5.3, docs/FRONTENDS.md): the `[[frontend]]` routes (`routes`), the request adapter
//! that turns a `useChat` or AG-UI request into the legacy backend's (`adapter`), what is remembered of a chat
//! between its turns (`chats`), and `serve`, which `decide::handler` calls: it rewrites a turn's request, answers
//! a bad body, the AI SDK's resume route and a preflight, and sets the response's encoder (`body::encode`).

pub mod adapter;
pub mod chats;
pub mod routes;
pub mod serve;
