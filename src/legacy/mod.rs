//! Legacy items: tokenizer, per-kind unescaping, raw dialect, agent scopes.

use crate::sse::SseEvent;
use crate::translate::{Observer, Options};

/// Placeholder until the item parser lands.
pub struct Parser {
    agent: String,
}

impl Parser {
    pub fn new(_opts: Options, fallback_agent: &str) -> Self {
        Self {
            agent: fallback_agent.to_owned(),
        }
    }
    pub fn on_sse(&mut self, _ev: SseEvent<'_>, _out: &mut Vec<u8>, _obs: &mut impl Observer) {}
    pub fn finish(&mut self, _out: &mut Vec<u8>, _obs: &mut impl Observer) {}
    pub fn abort(&mut self, _msg: &str, _out: &mut Vec<u8>, _obs: &mut impl Observer) {}
    pub fn agent(&self) -> &str {
        &self.agent
    }
    pub fn buffered_bytes(&self) -> usize {
        0
    }
}
