//! What a socket says and hears (docs/WEBSOCKET.md): the held events read back from their SSE framing, written as
//! the chosen subprotocol's messages; batches of what queued while a write was pending; the client's messages.

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::Value;

use crate::resume::id::PREFIX;

/// The messages a socket speaks, chosen by `Sec-WebSocket-Protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subprotocol {
    /// `sse-gateway.v1`: the envelopes as they are, with their ids.
    Gateway,
    /// `agent-sdk.v1`: seed 004's broadcast format.
    AgentSdk,
}

impl Subprotocol {
    pub const GATEWAY: &'static str = "sse-gateway.v1";
    pub const AGENT_SDK: &'static str = "agent-sdk.v1";
    /// Offered beside one of the above: the client sends its credential as its first message.
    pub const AUTH: &'static str = "sse-gateway.auth";

    /// Whether the client offers `sse-gateway.auth`.
    pub fn auth_offered<'a>(offers: impl Iterator<Item = &'a str>) -> bool {
        offers
            .flat_map(|v| v.split(','))
            .any(|o| o.trim().eq_ignore_ascii_case(Self::AUTH))
    }

    pub fn name(self) -> &'static str {
        match self {
            Subprotocol::Gateway => Self::GATEWAY,
            Subprotocol::AgentSdk => Self::AGENT_SDK,
        }
    }

    /// The first of the client's offers (`Sec-WebSocket-Protocol` values, comma-separated) that the gateway
    /// speaks: `Ok(None)` when the client offers none (the default, not named in the answer), `Err` when it
    /// offers only others.
    pub fn choose<'a>(offers: impl Iterator<Item = &'a str>) -> Result<Option<Subprotocol>, NotSpoken> {
        let mut offered = false;
        for offer in offers
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|o| !o.is_empty() && !o.eq_ignore_ascii_case(Self::AUTH))
        {
            offered = true;
            if offer.eq_ignore_ascii_case(Self::GATEWAY) {
                return Ok(Some(Subprotocol::Gateway));
            }
            if offer.eq_ignore_ascii_case(Self::AGENT_SDK) {
                return Ok(Some(Subprotocol::AgentSdk));
            }
        }
        if offered {
            Err(NotSpoken)
        } else {
            Ok(None)
        }
    }
}

/// The client offered only subprotocols the gateway does not speak.
#[derive(Debug, PartialEq, Eq)]
pub struct NotSpoken;

/// One held event: its id (none for the gateway's own last words) and its envelope's JSON text.
#[derive(Debug, PartialEq, Eq)]
pub struct Event<'a> {
    /// As the line holds it: read as text only where a message escapes it (the gateway's own never needs it).
    pub id: Option<&'a [u8]>,
    pub data: &'a [u8],
}

impl<'a> Event<'a> {
    /// The id as text; none when it is not UTF-8.
    fn id_str(&self) -> Option<&'a str> {
        self.id.and_then(|id| std::str::from_utf8(id).ok())
    }
}

/// The events of a frame of held events, as the gateway's own SSE encoder wrote them (`data:`, `id:`, `retry:`
/// lines in any order, a blank line after each event; comments): one `data:` line per event, so nothing is
/// joined.
pub fn events(frame: &[u8]) -> impl Iterator<Item = Event<'_>> {
    lines(frame)
        .scan((None::<&[u8]>, None::<&[u8]>), |(data, id), line| {
            if line.is_empty() {
                let event = data.take().map(|d| Event { id: id.take(), data: d });
                *id = None;
                return Some(event);
            }
            if let Some(rest) = line.strip_prefix(b"data:") {
                *data = Some(rest.strip_prefix(b" ").unwrap_or(rest));
            } else if let Some(rest) = line.strip_prefix(b"id:") {
                *id = Some(rest.strip_prefix(b" ").unwrap_or(rest));
            }
            Some(None)
        })
        .flatten()
        .filter(|e| !e.data.is_empty() && e.data != b"[DONE]")
}

/// The lines of `s`, as `s.split(|&b| b == b'\n')` gives them, found with `memchr` (the byte-by-byte split took
/// about 700 instructions an event).
fn lines(s: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    memchr::memchr_iter(b'\n', s)
        .chain(std::iter::once(s.len()))
        .map(move |end| {
            let line = &s[start..end];
            start = end + 1;
            line
        })
}

/// How a stream ended, from its last envelope: an `error` envelope the gateway wrote names why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    Cancelled,
    Abandoned,
    Behind,
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Cancelled => "cancelled",
            Outcome::Abandoned => "abandoned",
            Outcome::Behind => "behind",
            Outcome::Failed => "failed",
        }
    }

    /// The outcome an envelope says, if it is an `error` envelope.
    pub fn of_error(data: &[u8]) -> Option<Outcome> {
        if !data.starts_with(b"{\"type\":\"error\"") {
            return None;
        }
        #[derive(Deserialize)]
        struct Env<'a> {
            #[serde(borrow)]
            delta: Option<std::borrow::Cow<'a, str>>,
        }
        let delta = serde_json::from_slice::<Env<'_>>(data).ok()?.delta?;
        let kind = serde_json::from_str::<Value>(&delta)
            .ok()
            .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned));
        Some(match kind.as_deref() {
            Some("stream_cancelled") => Outcome::Cancelled,
            Some("stream_abandoned") => Outcome::Abandoned,
            Some("watcher_behind") => Outcome::Behind,
            _ => Outcome::Failed,
        })
    }
}

/// Milliseconds since the Unix epoch (seed 004's `timestamp`).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Writes `s` as a JSON string.
fn push_str(out: &mut BytesMut, s: &str) {
    // A `&str` always serializes.
    let _ = serde_json::to_writer((&mut *out).writer(), s);
}

/// An envelope's fields the seed-004 format reads.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(rename = "type", borrow)]
    ty: std::borrow::Cow<'a, str>,
    #[serde(rename = "final", default)]
    last: bool,
    #[serde(borrow, default)]
    delta: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
}

/// A block split over several envelopes, joined until its final one (seed 004 sends it whole).
#[derive(Default)]
struct Joined {
    name: String,
    delta: String,
}

/// The parts of a default subprotocol's message lent to the wire (`Encoder::event_parts`, `Wire::send_text_parts`).
pub const PARTS: usize = 6;

/// A default subprotocol's message, before and after the stream's token, up to the event's id.
const HEAD_OPEN: &str = "{\"type\":\"event\",\"stream\":\"";
const HEAD_CLOSE: &str = "\",\"id\":";

/// What comes between an event's id and its envelope.
const ENVELOPE: &[u8] = b",\"envelope\":";

/// Turns one stream's events into one subprotocol's messages.
pub struct Encoder {
    proto: Subprotocol,
    /// The default subprotocol's message up to the event's id (the same for every event of the stream), which
    /// holds the stream's token.
    head: Box<str>,
    /// agent-sdk: blocks split over envelopes, by kind and id; at most `max_joined` bytes in all.
    joined: HashMap<(String, String), Joined>,
    joined_bytes: usize,
    max_joined: usize,
    /// agent-sdk: the last `meta_final`'s payload, for `agent:complete`.
    complete: Option<String>,
    meta_final: String,
}

impl Encoder {
    pub fn new(proto: Subprotocol, token: &str, max_joined: usize) -> Self {
        Self {
            proto,
            head: [HEAD_OPEN, token, HEAD_CLOSE].concat().into_boxed_str(),
            joined: HashMap::new(),
            joined_bytes: 0,
            max_joined,
            complete: None,
            meta_final: String::new(),
        }
    }

    fn token(&self) -> &str {
        &self.head[HEAD_OPEN.len()..self.head.len() - HEAD_CLOSE.len()]
    }

    /// The default subprotocol's message for `ev` as its parts, borrowed from the encoder and the event: the
    /// envelope's bytes are embedded as they are (the gateway's own encoder wrote them, one JSON object per
    /// `data:` line). `None` for agent-sdk, and for an id that needs escaping (the gateway's own, `sg1-<hex>-<seq>`,
    /// never does).
    pub fn event_parts<'a>(&'a self, ev: &Event<'a>) -> Option<[&'a [u8]; PARTS]> {
        if self.proto != Subprotocol::Gateway {
            return None;
        }
        let (open, id, close): (&[u8], &[u8], &[u8]) = match ev.id {
            Some(id) if self.plain(id) => (b"\"", id, b"\",\"envelope\":"),
            Some(_) if ev.id_str().is_some() => return None,
            // Not UTF-8: no id, as before the stream's id was read as text.
            _ => (b"null", b"", ENVELOPE),
        };
        Some([self.head.as_bytes(), open, id, close, ev.data, b"}"])
    }

    /// Whether `id` goes into JSON as it is: the stream's own (`sg1-<its token>-<seq>`) is known by its prefix,
    /// which saves walking every byte of every event's id; any other is checked byte by byte.
    fn plain(&self, id: &[u8]) -> bool {
        let seq = id
            .strip_prefix(PREFIX.as_bytes())
            .and_then(|r| r.strip_prefix(self.token().as_bytes()))
            .and_then(|r| r.strip_prefix(b"-"));
        match seq {
            Some(seq) if seq.iter().all(u8::is_ascii_digit) => true,
            _ => id.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'-'),
        }
    }

    /// Appends the message (a JSON object) `ev` makes to `out`; false when it makes none.
    pub fn event(&mut self, ev: &Event<'_>, out: &mut BytesMut) -> bool {
        match self.proto {
            Subprotocol::Gateway => {
                match self.event_parts(ev) {
                    Some(parts) => parts.iter().for_each(|p| out.extend_from_slice(p)),
                    // An id that needs escaping.
                    None => {
                        out.extend_from_slice(self.head.as_bytes());
                        push_str(out, ev.id_str().unwrap_or_default());
                        out.extend_from_slice(ENVELOPE);
                        out.extend_from_slice(ev.data);
                        out.put_u8(b'}');
                    }
                }
                true
            }
            Subprotocol::AgentSdk => self.sdk_event(ev, out),
        }
    }

    fn sdk_event(&mut self, ev: &Event<'_>, out: &mut BytesMut) -> bool {
        let Ok(env) = serde_json::from_slice::<Envelope<'_>>(ev.data) else {
            return false;
        };
        match env.ty.as_ref() {
            "text" if !env.delta.is_empty() => {
                let payload = serde_json::json!({"text": env.delta});
                self.sdk_message("agent:stream", &payload.to_string(), ev.id_str(), out);
                true
            }
            "tool_call" | "server_tool_call" | "tool_result" | "server_tool_result" | "meta_final" => {
                let key = (env.ty.to_string(), env.id.as_deref().unwrap_or("").to_owned());
                let room = self.max_joined.saturating_sub(self.joined_bytes);
                let part = self.joined.entry(key.clone()).or_default();
                if env.delta.len() > room {
                    // Past the bound: the block is not sent (the UI would get a cut input); counted nowhere but
                    // the envelope stream, which SSE and the default subprotocol carry whole.
                    self.joined_bytes -= part.delta.len();
                    self.joined.remove(&key);
                    return false;
                }
                part.delta.push_str(&env.delta);
                if let Some(n) = &env.name {
                    part.name = n.to_string();
                }
                self.joined_bytes += env.delta.len();
                if !env.last {
                    return false;
                }
                let Some(whole) = self.joined.remove(&key) else {
                    return false;
                };
                self.joined_bytes -= whole.delta.len();
                let value = |text: &str| serde_json::from_str::<Value>(text).unwrap_or_else(|_| Value::from(text));
                let (ty, payload) = match env.ty.as_ref() {
                    "tool_call" | "server_tool_call" => (
                        "agent:tool_use",
                        serde_json::json!({"tool": {"id": key.1, "name": whole.name, "input": value(&whole.delta)}}),
                    ),
                    "meta_final" => {
                        self.meta_final = whole.delta;
                        self.complete = Some(self.meta_final.clone());
                        return false;
                    }
                    _ => (
                        "agent:tool_result",
                        serde_json::json!({"result": {"tool_use_id": key.1, "name": whole.name, "content": whole.delta}}),
                    ),
                };
                self.sdk_message(ty, &payload.to_string(), ev.id_str(), out);
                true
            }
            "error" => {
                let delta: Value = serde_json::from_str(&env.delta).unwrap_or_else(|_| Value::from(env.delta.as_ref()));
                if delta.get("type").and_then(Value::as_str) == Some("stream_cancelled") {
                    self.sdk_message("agent:cancelled", "{}", ev.id_str(), out);
                } else {
                    let message = delta
                        .get("message")
                        .and_then(Value::as_str)
                        .map_or_else(|| delta.to_string(), str::to_owned);
                    let payload = serde_json::json!({"message": message});
                    self.sdk_message("agent:error", &payload.to_string(), ev.id_str(), out);
                }
                true
            }
            _ => false,
        }
    }

    /// The message that ends a stream that completed (agent-sdk: `agent:complete`); false when there is none.
    pub fn completed(&mut self, out: &mut BytesMut) -> bool {
        if self.proto != Subprotocol::AgentSdk {
            return false;
        }
        let result = self
            .complete
            .take()
            .filter(|r| serde_json::from_str::<Value>(r).is_ok_and(|v| v.is_object()))
            .unwrap_or_else(|| "{}".to_owned());
        let payload = format!("{{\"result\":{result}}}");
        self.sdk_message("agent:complete", &payload, None, out);
        true
    }

    fn sdk_message(&self, ty: &str, payload: &str, id: Option<&str>, out: &mut BytesMut) {
        out.extend_from_slice(b"{\"type\":");
        push_str(out, ty);
        out.extend_from_slice(b",\"payload\":");
        out.extend_from_slice(payload.as_bytes());
        out.extend_from_slice(format!(",\"timestamp\":{},\"sessionId\":", now_ms()).as_bytes());
        push_str(out, self.token());
        if let Some(id) = id {
            out.extend_from_slice(b",\"id\":");
            push_str(out, id);
        }
        out.put_u8(b'}');
    }
}

/// A session's word that a stream starts (default subprotocol only: seed 004 has none).
pub fn stream_start(proto: Subprotocol, token: &str, url: &str, out: &mut BytesMut) -> bool {
    if proto != Subprotocol::Gateway {
        return false;
    }
    out.extend_from_slice(b"{\"type\":\"stream_start\",\"stream\":");
    push_str(out, token);
    out.extend_from_slice(b",\"url\":");
    push_str(out, url);
    out.put_u8(b'}');
    true
}

/// A session's word that a stream ended.
pub fn stream_end(proto: Subprotocol, token: &str, outcome: Outcome, out: &mut BytesMut) -> bool {
    if proto != Subprotocol::Gateway {
        return false;
    }
    out.extend_from_slice(b"{\"type\":\"stream_end\",\"stream\":");
    push_str(out, token);
    out.extend_from_slice(b",\"outcome\":\"");
    out.extend_from_slice(outcome.as_str().as_bytes());
    out.extend_from_slice(b"\"}");
    true
}

/// Messages waiting to be written, each a JSON object: one at a time while the socket keeps up, all together as
/// one batch when they queued behind a pending write. A message is written from the queue's buffer, lent
/// (`messages`), not split off or copied.
pub struct Queue {
    proto: Subprotocol,
    /// The messages, separated by commas (so the batch is their bytes as they are).
    bytes: BytesMut,
    /// Bytes taken from the front of `bytes` since it was last empty: `ends` count from there.
    taken: usize,
    /// Where each message ends.
    ends: std::collections::VecDeque<usize>,
}

impl Queue {
    pub fn new(proto: Subprotocol) -> Self {
        Self {
            proto,
            bytes: BytesMut::new(),
            taken: 0,
            ends: std::collections::VecDeque::new(),
        }
    }

    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Appends one message with `write` (which returns false when it wrote none).
    pub fn push(&mut self, write: impl FnOnce(&mut BytesMut) -> bool) {
        let mark = self.bytes.len();
        if !self.ends.is_empty() {
            self.bytes.put_u8(b',');
        }
        if write(&mut self.bytes) {
            self.ends.push_back(self.taken + self.bytes.len());
        } else {
            self.bytes.truncate(mark);
        }
    }

    /// The queued messages, in order.
    pub fn messages(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let end = end - self.taken;
            let message = &self.bytes[start..end];
            // Past the comma before the next one.
            start = end + 1;
            message
        })
    }

    /// Drops the first `n` messages (once written).
    pub fn pop(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        if n >= self.ends.len() {
            self.clear();
        } else {
            let end = self.ends[n - 1];
            self.ends.drain(..n);
            // The messages and the comma before the next one.
            let taken = end - self.taken + 1;
            self.bytes.advance(taken);
            self.taken += taken;
        }
    }

    /// Every queued message as one batch, and how many it holds; `None` unless there are two or more.
    pub fn take_batch(&mut self, session: &str) -> Option<(Bytes, usize)> {
        let count = self.ends.len();
        if count <= 1 {
            return None;
        }
        let mut out = BytesMut::with_capacity(self.len_bytes() + 64);
        out.extend_from_slice(b"{\"type\":\"batch\",\"messages\":[");
        out.extend_from_slice(&self.bytes);
        out.put_u8(b']');
        if self.proto == Subprotocol::AgentSdk {
            out.extend_from_slice(format!(",\"timestamp\":{},\"sessionId\":", now_ms()).as_bytes());
            push_str(&mut out, session);
        }
        out.put_u8(b'}');
        self.clear();
        Some((out.freeze(), count))
    }

    fn clear(&mut self) {
        self.ends.clear();
        self.taken = 0;
        self.bytes.clear();
        // A burst's buffer is not kept by an idle socket.
        if self.bytes.capacity() > 64 << 10 {
            self.bytes = BytesMut::new();
        }
    }
}

/// A client's message.
#[derive(Debug, PartialEq, Eq)]
pub enum FromClient {
    /// Cancel the socket's stream, or the session's stream named.
    Cancel(Option<String>),
    Ping,
    /// The credential of a stream bound to `Authorization`.
    Auth(String),
}

/// Reads a client's text message; `None` for anything else.
pub fn from_client(text: &str) -> Option<FromClient> {
    #[derive(Deserialize)]
    struct Msg {
        #[serde(rename = "type")]
        ty: String,
        #[serde(default)]
        stream: Option<String>,
        #[serde(default)]
        authorization: Option<String>,
    }
    let m: Msg = serde_json::from_str(text).ok()?;
    match m.ty.as_str() {
        "cancel" => Some(FromClient::Cancel(m.stream)),
        "ping" => Some(FromClient::Ping),
        "auth" => m.authorization.map(FromClient::Auth),
        _ => None,
    }
}

/// Whether `hay` holds `needle` (for the tests).
#[cfg(test)]
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FRAME: &[u8] = b"data: {\"type\":\"text\",\"agent\":\"a\",\"final\":false,\"delta\":\"Hel\"}\nid: sg1-ab-1\nretry: 1000\n\nid: sg1-ab-2\ndata: {\"type\":\"text\",\"agent\":\"a\",\"final\":true,\"delta\":\"\"}\n\n";

    proptest::proptest! {
        #[test]
        fn lines_are_what_a_split_at_each_newline_gives(s in proptest::collection::vec(
            proptest::sample::select(vec![b'\n', b'a', b':', b' ']), 0..64)) {
            let split: Vec<&[u8]> = s.split(|&b| b == b'\n').collect();
            proptest::prop_assert_eq!(lines(&s).collect::<Vec<_>>(), split);
        }
    }

    #[test]
    fn the_held_events_are_read_back_with_their_ids() {
        let evs: Vec<_> = events(FRAME).collect();
        assert_eq!(evs.len(), 2);
        assert_eq!(evs[0].id, Some(&b"sg1-ab-1"[..]));
        assert!(evs[0].data.starts_with(b"{\"type\":\"text\""));
        assert_eq!(evs[1].id, Some(&b"sg1-ab-2"[..]));
        let no_id: Vec<_> = events(b"data: {\"x\":1}\n\n").collect();
        assert_eq!(
            no_id,
            [Event {
                id: None,
                data: b"{\"x\":1}"
            }]
        );
    }

    #[test]
    fn the_default_subprotocol_embeds_the_envelope_byte_for_byte() {
        let mut enc = Encoder::new(Subprotocol::Gateway, "ab", 1 << 20);
        let ev = events(FRAME).next().unwrap();
        let mut out = BytesMut::new();
        assert!(enc.event(&ev, &mut out));
        assert!(contains(&out, ev.data));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], "sg1-ab-1");
        assert_eq!(v["stream"], "ab");
        assert_eq!(v["envelope"]["delta"], "Hel");
    }

    /// The parts lent to the wire join to docs/WEBSOCKET.md's message, byte for byte, and so does what the queue
    /// holds; an id that needs escaping and seed 004's messages have no parts (they are queued).
    #[test]
    fn a_default_message_in_parts_is_the_documented_message() {
        let mut enc = Encoder::new(Subprotocol::Gateway, "ab", 1 << 20);
        for (frame, want) in [
            (
                &b"data: {\"x\":1}\nid: sg1-0f-12\n\n"[..],
                &br#"{"type":"event","stream":"ab","id":"sg1-0f-12","envelope":{"x":1}}"#[..],
            ),
            (
                b"data: {\"x\":1}\n\n",
                br#"{"type":"event","stream":"ab","id":null,"envelope":{"x":1}}"#,
            ),
        ] {
            let ev = events(frame).next().unwrap();
            let joined = enc
                .event_parts(&ev)
                .expect("an id of ours, or none, needs no escaping")
                .concat();
            assert_eq!(String::from_utf8_lossy(&joined), String::from_utf8_lossy(want));
            let mut queued = BytesMut::new();
            assert!(enc.event(&ev, &mut queued));
            assert_eq!(&queued[..], want);
        }
        let escaped = events(b"data: {}\nid: a\"b\n\n").next().unwrap();
        assert!(enc.event_parts(&escaped).is_none());
        let sdk = Encoder::new(Subprotocol::AgentSdk, "ab", 1 << 20);
        assert!(sdk.event_parts(&events(FRAME).next().unwrap()).is_none());
    }

    #[test]
    fn an_id_not_of_ours_is_escaped_and_ours_is_copied() {
        let mut enc = Encoder::new(Subprotocol::Gateway, "ab", 1 << 20);
        for (frame, id) in [
            (&b"data: {}\nid: a\"b\\c\x01\n\n"[..], "a\"b\\c\u{1}"),
            (b"data: {}\nid: sg1-0f-12\n\n", "sg1-0f-12"),
            (b"data: {}\nid: \n\n", ""),
        ] {
            let ev = events(frame).next().unwrap();
            let mut out = BytesMut::new();
            assert!(enc.event(&ev, &mut out));
            let v: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["id"], id);
        }
    }

    /// The stream's own ids are known by their prefix; whatever follows it, or any other id, is copied only when
    /// it needs no escaping, and an id that is not text is none, as when ids were read as text first.
    #[test]
    fn an_id_is_copied_only_when_it_needs_no_escaping() {
        let enc = Encoder::new(Subprotocol::Gateway, "ab", 1 << 20);
        for (id, plain) in [
            (&b"sg1-ab-12"[..], true),
            (b"sg1-ab-", true),
            (b"sg1-ab-1\"2", false),
            (b"sg1-ab-1\\", false),
            (b"sg1-abc-1", true),
            (b"sg1-ab-1 2", false),
            (b"other-id-7", true),
            (b"a/b", false),
        ] {
            assert_eq!(enc.plain(id), plain, "{}", String::from_utf8_lossy(id));
            let ev = Event {
                id: Some(id),
                data: b"{}",
            };
            assert_eq!(enc.event_parts(&ev).is_some(), plain, "{}", String::from_utf8_lossy(id));
        }
        let not_text = Event {
            id: Some(b"sg1-\xff-1"),
            data: b"{}",
        };
        let joined = enc.event_parts(&not_text).expect("no id: nothing to escape").concat();
        let v: Value = serde_json::from_slice(&joined).unwrap();
        assert!(v["id"].is_null());
    }

    #[test]
    fn seed_004_gets_text_tool_use_result_and_complete() {
        let mut enc = Encoder::new(Subprotocol::AgentSdk, "ab", 1 << 20);
        let mut msgs = Vec::new();
        let frames: [&[u8]; 5] = [
            b"id: i1\ndata: {\"type\":\"text\",\"agent\":\"a\",\"final\":false,\"delta\":\"Hi\"}\n\n",
            b"id: i2\ndata: {\"type\":\"tool_call\",\"agent\":\"a\",\"final\":false,\"delta\":\"{\\\"q\\\":\",\"id\":\"t1\",\"name\":\"search\"}\n\n",
            b"id: i3\ndata: {\"type\":\"tool_call\",\"agent\":\"a\",\"final\":true,\"delta\":\"1}\",\"id\":\"t1\",\"name\":\"search\"}\n\n",
            b"id: i4\ndata: {\"type\":\"tool_result\",\"agent\":\"a\",\"final\":true,\"delta\":\"ok\",\"id\":\"t1\",\"name\":\"search\"}\n\n",
            b"id: i5\ndata: {\"type\":\"meta_final\",\"agent\":\"a\",\"final\":true,\"delta\":\"{\\\"stop_reason\\\":\\\"end_turn\\\"}\"}\n\n",
        ];
        for f in frames {
            for ev in events(f) {
                let mut out = BytesMut::new();
                if enc.event(&ev, &mut out) {
                    msgs.push(serde_json::from_slice::<Value>(&out).unwrap());
                }
            }
        }
        let mut out = BytesMut::new();
        assert!(enc.completed(&mut out));
        msgs.push(serde_json::from_slice(&out).unwrap());
        let types: Vec<&str> = msgs.iter().map(|m| m["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            ["agent:stream", "agent:tool_use", "agent:tool_result", "agent:complete"]
        );
        assert_eq!(msgs[0]["payload"]["text"], "Hi");
        assert_eq!(msgs[1]["payload"]["tool"]["input"]["q"], 1);
        assert_eq!(msgs[1]["payload"]["tool"]["name"], "search");
        assert_eq!(msgs[2]["payload"]["result"]["tool_use_id"], "t1");
        assert_eq!(msgs[3]["payload"]["result"]["stop_reason"], "end_turn");
        assert!(msgs.iter().all(|m| m["sessionId"] == "ab" && m["timestamp"].is_u64()));
    }

    #[test]
    fn a_cancelled_run_is_agent_cancelled_and_its_outcome_says_so() {
        let data = br#"{"type":"error","agent":"a","final":true,"delta":"{\"type\":\"stream_cancelled\",\"message\":\"the run was cancelled\"}"}"#;
        assert_eq!(Outcome::of_error(data), Some(Outcome::Cancelled));
        let mut enc = Encoder::new(Subprotocol::AgentSdk, "ab", 1 << 20);
        let mut out = BytesMut::new();
        assert!(enc.event(&Event { id: None, data }, &mut out));
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["type"], "agent:cancelled");
        assert_eq!(Outcome::of_error(br#"{"type":"text"}"#), None);
    }

    #[test]
    fn one_queued_message_goes_alone_and_more_go_as_one_batch() {
        let mut q = Queue::new(Subprotocol::Gateway);
        let push = |q: &mut Queue, v: u8| {
            q.push(|o| {
                o.extend_from_slice(format!("{{\"a\":{v}}}").as_bytes());
                true
            })
        };
        push(&mut q, 1);
        assert_eq!(q.take_batch("s"), None, "one message is no batch");
        assert_eq!(q.messages().collect::<Vec<_>>(), [&b"{\"a\":1}"[..]]);
        q.pop(1);
        assert!(q.is_empty() && q.messages().next().is_none());
        push(&mut q, 1);
        q.push(|_| false);
        push(&mut q, 2);
        push(&mut q, 3);
        let all: Vec<&[u8]> = vec![b"{\"a\":1}", b"{\"a\":2}", b"{\"a\":3}"];
        assert_eq!(q.messages().collect::<Vec<_>>(), all);
        q.pop(0);
        q.pop(2);
        // The comma before the next message is dropped too.
        assert_eq!(q.messages().collect::<Vec<_>>(), all[2..]);
        push(&mut q, 5);
        let (text, n) = q.take_batch("s").unwrap();
        assert_eq!(n, 2);
        let v: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(v["type"], "batch");
        assert_eq!(v["messages"][0]["a"], 3);
        assert_eq!(v["messages"][1]["a"], 5);
        assert!(q.take_batch("s").is_none() && q.is_empty() && q.len_bytes() == 0);
    }

    #[test]
    fn offers_pick_the_first_spoken_subprotocol() {
        assert_eq!(
            Subprotocol::choose(["x, agent-sdk.v1", "sse-gateway.v1"].into_iter()),
            Ok(Some(Subprotocol::AgentSdk))
        );
        assert_eq!(Subprotocol::choose(std::iter::empty()), Ok(None));
        assert_eq!(Subprotocol::choose(["chat"].into_iter()), Err(NotSpoken));
        assert_eq!(Subprotocol::choose(["sse-gateway.auth"].into_iter()), Ok(None));
        assert!(Subprotocol::auth_offered(
            ["agent-sdk.v1, sse-gateway.auth"].into_iter()
        ));
        assert!(!Subprotocol::auth_offered(["agent-sdk.v1"].into_iter()));
    }

    #[test]
    fn client_messages_are_read_and_anything_else_is_not() {
        assert_eq!(from_client(r#"{"type":"cancel"}"#), Some(FromClient::Cancel(None)));
        assert_eq!(
            from_client(r#"{"type":"cancel","stream":"ab"}"#),
            Some(FromClient::Cancel(Some("ab".into())))
        );
        assert_eq!(from_client(r#"{"type":"ping"}"#), Some(FromClient::Ping));
        assert_eq!(
            from_client(r#"{"type":"auth","authorization":"Bearer x"}"#),
            Some(FromClient::Auth("Bearer x".into()))
        );
        assert_eq!(from_client("nonsense"), None);
        assert_eq!(from_client(r#"{"type":"other"}"#), None);
    }
}
