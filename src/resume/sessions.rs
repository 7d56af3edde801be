//! STUB until the sessions branch lands: the streams of a binding, for session sockets.

use crate::resume::id::Token;

pub struct Listed {
    pub token: Token,
    pub ended: bool,
}

pub struct Session {
    listed: Vec<Listed>,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("too many sessions")]
    Full,
}

impl Session {
    pub fn listed(&self) -> &[Listed] {
        &self.listed
    }

    pub async fn next_start(&mut self) -> Option<Token> {
        std::future::pending().await
    }
}

pub fn stub() -> Session {
    Session { listed: Vec::new() }
}
