//! What a frontend read is: the protocol, and what the request told its encoder (`Turn`); how a chunk is framed.

use serde::{Deserialize, Serialize};

/// A frontend protocol the gateway speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Protocol {
    /// The Vercel AI SDK's UI Message Stream protocol v1 (`useChat`).
    #[serde(rename = "ai-sdk")]
    AiSdk,
    /// AG-UI 1.0 (`@ag-ui/client`'s `HttpAgent`, CopilotKit).
    #[serde(rename = "ag-ui")]
    AgUi,
}

impl Protocol {
    pub const ALL: [Protocol; 2] = [Protocol::AiSdk, Protocol::AgUi];

    /// Its name in config, `X-Stream-Format` and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Protocol::AiSdk => "ai-sdk",
            Protocol::AgUi => "ag-ui",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str().eq_ignore_ascii_case(s))
    }

    /// Response headers the protocol's client looks for, beside `content-type: text/event-stream`.
    pub const fn headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Protocol::AiSdk => &[("x-vercel-ai-ui-message-stream", "v1")],
            Protocol::AgUi => &[],
        }
    }
}

/// What the request told the encoder about its turn: the ids the client holds and expects. Kept with the held
/// stream, so a resumed read writes the same ids as the first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    /// AI SDK: the assistant message's id (a continuation's is the message it continues: a new id makes `useChat`
    /// show a second message).
    pub message_id: String,
    /// AG-UI: the thread and the run.
    pub thread_id: String,
    pub run_id: String,
    /// Starts every id the encoder makes up (blocks, sources, messages), so ids stay unique across the thread.
    pub prefix: String,
    /// Tool calls the client's messages already hold: never announced again.
    pub known_tools: Vec<String>,
    /// Tool results the client sent (AG-UI `tool` messages): never echoed back.
    pub known_results: Vec<String>,
    /// The agent a continuation continues (it sends no `meta_init`).
    pub agent: Option<String>,
}

/// Writes one SSE event `data: <json>\n\n`.
pub fn write_event(out: &mut Vec<u8>, chunk: &impl Serialize) {
    out.extend_from_slice(b"data: ");
    // Serializing our own types into a Vec cannot fail (no map with non-string keys, no I/O).
    let _ = serde_json::to_writer(&mut *out, chunk);
    out.extend_from_slice(b"\n\n");
}
