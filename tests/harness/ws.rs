//! The WebSocket side of the tests (docs/WEBSOCKET.md): a `tokio-tungstenite` client (the crate's own client
//! handshake, over a socket whose receive buffer can be made small), what a socket got read back (messages with
//! batches unpacked, each event's envelope as the very bytes it carried, the close code), the runs the sockets
//! read, and what an SSE reader got of the same stream to compare with.

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use super::client::Client;
use super::legacy::text_block;
use super::upstream::{paced, sse_head, Recorded, Step};

/// A client socket.
pub type Ws = WebSocketStream<TcpStream>;

/// Opens a socket on `path` (with its query) of `addr`, with `headers` (`Sec-WebSocket-Protocol`, `Origin`,
/// `Cookie`, …) on the handshake; `rcvbuf` sets the client's receive buffer (a slow reader's). `Err` carries a
/// refused handshake's response (`WsError::Http`).
pub async fn connect_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    rcvbuf: Option<u32>,
) -> Result<(Ws, tokio_tungstenite::tungstenite::handshake::client::Response), WsError> {
    let mut req = format!("ws://{addr}{path}").into_client_request()?;
    for (k, v) in headers {
        let name = tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes()).expect("header name");
        req.headers_mut()
            .append(name, HeaderValue::from_str(v).expect("header value"));
    }
    let socket = tokio::net::TcpSocket::new_v4()?;
    if let Some(n) = rcvbuf {
        socket.set_recv_buffer_size(n)?;
    }
    let tcp = socket.connect(addr).await?;
    tokio_tungstenite::client_async(req, tcp).await
}

/// Opens a socket that must be accepted.
pub async fn connect(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Ws {
    match tokio::time::timeout(super::PATIENCE, connect_with(addr, path, headers, None)).await {
        Ok(Ok((ws, _))) => ws,
        Ok(Err(e)) => panic!("the socket on {path} was refused: {}", describe(&e)),
        Err(_) => panic!("no handshake answer on {path} in {:?}", super::PATIENCE),
    }
}

/// A handshake error, with a refused handshake's status and body.
pub fn describe(e: &WsError) -> String {
    match e {
        WsError::Http(resp) => format!(
            "HTTP {} {}",
            resp.status(),
            String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default())
        ),
        other => other.to_string(),
    }
}

/// One message a socket got: unpacked from a batch (`batched`) or alone.
#[derive(Debug, Clone)]
pub struct Msg {
    pub value: Value,
    /// For `{"type":"event"}`: the `envelope` as the message carried it, byte for byte.
    pub envelope: Option<String>,
    pub batched: bool,
}

impl Msg {
    pub fn kind(&self) -> &str {
        self.value["type"].as_str().unwrap_or("")
    }

    pub fn id(&self) -> Option<&str> {
        self.value["id"].as_str()
    }
}

/// Everything a socket got, until its close or the end of the wait.
#[derive(Debug, Default)]
pub struct Got {
    pub msgs: Vec<Msg>,
    /// Text frames (a batch counts once), and how many were batches.
    pub frames: usize,
    pub batches: usize,
    /// The close frame's code, when one came.
    pub close: Option<u16>,
    /// How the connection ended without a close frame (an error, or EOF), if it did.
    pub dropped: Option<String>,
    /// The wait ran out with the socket still open.
    pub timed_out: bool,
}

impl Got {
    /// The `event` messages.
    pub fn events(&self) -> Vec<&Msg> {
        self.msgs.iter().filter(|m| m.kind() == "event").collect()
    }

    /// The ids of the `event` messages, in order.
    pub fn ids(&self) -> Vec<String> {
        self.events().iter().map(|m| m.id().unwrap_or("").to_owned()).collect()
    }

    /// The last event id received.
    pub fn last_id(&self) -> Option<String> {
        self.ids().pop()
    }

    /// One line on how it ended, for failure messages.
    pub fn ending(&self) -> String {
        format!(
            "{} messages in {} frames ({} batches), close {:?}, dropped {:?}, timed out {}",
            self.msgs.len(),
            self.frames,
            self.batches,
            self.close,
            self.dropped,
            self.timed_out
        )
    }

    /// Unpacks one text frame into `msgs`.
    pub fn take_text(&mut self, text: &str) {
        self.frames += 1;
        #[derive(Deserialize)]
        struct Batch<'a> {
            #[serde(rename = "type")]
            ty: &'a str,
            #[serde(borrow, default)]
            messages: Vec<&'a RawValue>,
        }
        let b: Batch<'_> = serde_json::from_str(text).unwrap_or_else(|e| panic!("not a JSON message ({e}): {text}"));
        if b.ty == "batch" {
            self.batches += 1;
            for m in b.messages {
                self.msgs.push(msg(m.get(), true));
            }
        } else {
            self.msgs.push(msg(text, false));
        }
    }
}

fn msg(text: &str, batched: bool) -> Msg {
    #[derive(Deserialize)]
    struct Ev<'a> {
        #[serde(borrow, default)]
        envelope: Option<&'a RawValue>,
    }
    let envelope = serde_json::from_str::<Ev<'_>>(text)
        .ok()
        .and_then(|e| e.envelope.map(|r| r.get().to_owned()));
    Msg {
        value: serde_json::from_str(text).expect("JSON"),
        envelope,
        batched,
    }
}

/// Reads `ws` until its close (or EOF/error), at most `within`; stops early once `stop` says so of what came.
pub async fn read_until(ws: &mut Ws, within: Duration, mut stop: impl FnMut(&Got) -> bool) -> Got {
    let mut got = Got::default();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if stop(&got) {
            return got;
        }
        let next = match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => {
                got.timed_out = true;
                return got;
            }
            Ok(n) => n,
        };
        match next {
            None => {
                got.dropped.get_or_insert_with(|| "EOF".into());
                return got;
            }
            Some(Err(e)) => {
                if got.close.is_none() {
                    got.dropped = Some(e.to_string());
                }
                return got;
            }
            Some(Ok(Message::Text(t))) => got.take_text(t.as_str()),
            Some(Ok(Message::Close(frame))) => {
                got.close = Some(frame.map_or(1005, |f: CloseFrame| u16::from(f.code)));
            }
            Some(Ok(_)) => {}
        }
    }
}

/// Reads `ws` to its close, at most `within`.
pub async fn read_to_close(ws: &mut Ws, within: Duration) -> Got {
    read_until(ws, within, |_| false).await
}

/// Sends one text message.
pub async fn send_text(ws: &mut Ws, text: &str) {
    ws.send(Message::Text(text.to_owned().into())).await.expect("send");
}

// ---- the runs ----

/// The agent's id the runs are asked with.
pub const AGENT: &str = "agent-ws";
/// The pause between two events of a paced run.
pub const PACE: Duration = Duration::from_millis(15);

/// A run of `words` text pieces, each a legacy event, then a `meta_final` and `[DONE]`.
pub fn run_items(words: usize) -> Vec<Vec<u8>> {
    text_block(
        (0..words).map(|i| format!("word{i:03} ")),
        &[
            "<meta_final data=\"{&quot;stop_reason&quot;:&quot;end_turn&quot;}\"></meta_final>",
            "[DONE]",
        ],
    )
}

/// The run the seed-004 page shows: text, a tool call and its result, more text, `meta_final`, `[DONE]`.
pub fn tool_run_items() -> Vec<Vec<u8>> {
    let mut items: Vec<Vec<u8>> = text_block(
        ["Let me ", "search ", "for that."].map(String::from),
        &[
            concat!(
                "<content-block-tool_call id=\"toolu_1\" name=\"search\" ",
                "arguments=\"{&quot;q&quot;:&quot;rust websockets&quot;}\"></content-block-tool_call>"
            ),
            concat!(
                "<content-block-tool_result id=\"toolu_1\" name=\"search\">",
                "<![CDATA[3 results found]]></content-block-tool_result>"
            ),
        ],
    );
    items.extend(text_block(
        ["Found ", "three ", "answers."].map(String::from),
        &[
            concat!(
                "<meta_final data=\"{&quot;stop_reason&quot;:&quot;end_turn&quot;,",
                "&quot;total_steps&quot;:2}\"></meta_final>"
            ),
            "[DONE]",
        ],
    ));
    items
}

/// A run of `deltas` text deltas of about 1 KiB, then `[DONE]`, as one legacy body (written at once).
pub fn big_run(deltas: usize) -> Vec<u8> {
    let mut s = b"data: <content-block-text>\n\n".to_vec();
    for i in 0..deltas {
        s.extend_from_slice(format!("data: {i:06}{}\n\n", "y".repeat(1014)).as_bytes());
    }
    s.extend_from_slice(b"data: </content-block-text>\n\ndata: [DONE]\n\n");
    s
}

/// The upstream's answer for the runs the socket tests read: `/run/<words>[/…]` a paced run of that many words,
/// `/big/<n>` [`big_run`] at once, `/tools` the seed-004 page's run, `/hold` a run that never ends (waiting for the
/// gateway to close it).
pub fn run_answer(r: &Recorded) -> Option<Vec<Step>> {
    let path = r.target.split('?').next().unwrap_or("");
    if path == "/hold" || path.starts_with("/hold/") {
        return Some(vec![
            sse_head(),
            Step::write_all(b"data: <content-block-text>\n\ndata: one \n\ndata: two \n\n"),
            Step::AwaitClose,
        ]);
    }
    if let Some(n) = path.strip_prefix("/big/").and_then(|n| n.parse().ok()) {
        return Some(vec![sse_head(), Step::WriteAll(big_run(n)), Step::EndChunks]);
    }
    if path == "/tools" {
        return Some(paced(tool_run_items(), Duration::from_millis(60)));
    }
    let words = path.strip_prefix("/run/")?.split('/').next()?.parse().ok()?;
    Some(paced(run_items(words), PACE))
}

/// A run's request as a translating SSE client sends it, with `extra` headers.
pub fn run_request(path: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: gateway\r\nAccept: text/event-stream\r\nContent-Type: application/json\r\n\
         X-Agent-Id: {AGENT}\r\nX-Stream-Format: json\r\nConnection: close\r\nContent-Length: 2\r\n"
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n{}");
    head.into_bytes()
}

/// Starts a run (its response head read); returns the SSE client and the stream's URL (`X-Gateway-Stream`).
pub async fn start_run(addr: SocketAddr, path: &str, extra: &[(&str, &str)]) -> (Client, String) {
    let mut c = Client::write(addr, &run_request(path, extra)).await.expect("connect");
    tokio::time::timeout(super::PATIENCE, c.read_head())
        .await
        .expect("a response head in time")
        .expect("a response head");
    assert_eq!(c.status, 200, "{}", c.head);
    let url = super::client::header_value(&c.head, "x-gateway-stream")
        .unwrap_or_else(|| panic!("no X-Gateway-Stream in\n{}", c.head))
        .to_owned();
    (c, url)
}

/// The events an SSE reader got, as (id, data) with the data's bytes as written; `[DONE]` and comments left out.
pub fn sse_events(body: &[u8]) -> Vec<(String, String)> {
    let text = String::from_utf8_lossy(body);
    text.split("\n\n")
        .filter_map(|ev| {
            let mut id = None;
            let mut data = None;
            for l in ev.lines() {
                if let Some(v) = l.strip_prefix("id: ") {
                    id = Some(v.to_owned());
                } else if let Some(v) = l.strip_prefix("data: ") {
                    data = Some(v.to_owned());
                }
            }
            let data = data.filter(|d| d != "[DONE]")?;
            Some((id.unwrap_or_default(), data))
        })
        .collect()
}

/// The socket's events as (id, envelope bytes), to compare with [`sse_events`].
pub fn socket_events(got: &Got) -> Vec<(String, String)> {
    got.events()
        .iter()
        .map(|m| (m.id().unwrap_or("").to_owned(), m.envelope.clone().unwrap_or_default()))
        .collect()
}

/// What breaks "seq `from`, `from + 1`, … of one stream" in `ids` (none when all is well).
pub fn id_gaps(ids: &[String], token: &str, from: u64) -> Option<String> {
    let want: Vec<String> = (0..ids.len() as u64)
        .map(|i| format!("sg1-{token}-{}", from + i))
        .collect();
    (ids != want.as_slice()).then(|| format!("ids {ids:?}, want {want:?}"))
}

/// A stream URL's token.
pub fn token_of(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or("")
}

// ---- raw sockets: hand-written frames, for clients that break the protocol ----

/// A client's handshake on `path`, written by hand with `extra` header lines (`"Name: value"`); returns the
/// connection once the `101` head is read, or the whole answer when it is not a `101`.
pub async fn raw_socket(
    addr: SocketAddr,
    path: &str,
    extra: &[&str],
    rcvbuf: Option<u32>,
) -> Result<TcpStream, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    if let Some(n) = rcvbuf {
        socket.set_recv_buffer_size(n).map_err(|e| e.to_string())?;
    }
    let mut tcp = socket.connect(addr).await.map_err(|e| e.to_string())?;
    let mut req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    );
    if !extra
        .iter()
        .any(|h| h.to_ascii_lowercase().starts_with("sec-websocket-version:"))
    {
        req.push_str("Sec-WebSocket-Version: 13\r\n");
    }
    for h in extra {
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
    // The head, one byte at a time: what follows it is the socket's.
    let mut head = Vec::new();
    let read = async {
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            if tcp.read(&mut b).await.map_err(|e| e.to_string())? == 0 {
                break;
            }
            head.push(b[0]);
        }
        Ok::<_, String>(())
    };
    tokio::time::timeout(super::PATIENCE, read)
        .await
        .map_err(|_| "no handshake answer".to_owned())??;
    if head.starts_with(b"HTTP/1.1 101") {
        Ok(tcp)
    } else {
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), tcp.read_to_end(&mut rest)).await;
        head.extend_from_slice(&rest);
        Err(String::from_utf8_lossy(&head).into_owned())
    }
}

/// One frame as a client writes it: `first` is the first byte (FIN, RSV bits, opcode), the payload masked unless
/// `masked` is false.
pub fn client_frame(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mask = [0x37u8, 0xfa, 0x21, 0x3d];
    let bit = if masked { 0x80 } else { 0 };
    let mut f = vec![first];
    match payload.len() {
        n @ 0..=125 => f.push(bit | n as u8),
        n @ 126..=0xffff => {
            f.push(bit | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(bit | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    } else {
        f.extend_from_slice(payload);
    }
    f
}

/// A client's close frame with `code` (and a short reason).
pub fn client_close(code: u16) -> Vec<u8> {
    let mut p = code.to_be_bytes().to_vec();
    p.extend_from_slice(b"bye");
    client_frame(0x88, &p, true)
}

/// What the server sent on a raw socket until it closed the connection.
#[derive(Debug, Default)]
pub struct RawEnd {
    /// The opcodes of the frames before the close frame (or the connection's end).
    pub opcodes: Vec<u8>,
    /// The payloads of its pongs.
    pub pongs: Vec<Vec<u8>>,
    /// The close frame's code (1005 when it carried none).
    pub close: Option<u16>,
    /// The connection ended after the close frame (EOF, or a reset).
    pub ended: bool,
    pub timed_out: bool,
}

/// Reads the server's frames on a raw socket until a close frame and the connection's end (at most `within`),
/// stopping early once `stop` says so of what came.
pub async fn raw_read(tcp: &mut TcpStream, within: Duration, mut stop: impl FnMut(&RawEnd) -> bool) -> RawEnd {
    use tokio::io::AsyncReadExt;
    let mut end = RawEnd::default();
    let mut buf: Vec<u8> = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        // Every whole frame in `buf` (the server's frames are not masked).
        while buf.len() >= 2 {
            let (len, at) = match buf[1] & 0x7f {
                126 if buf.len() >= 4 => (usize::from(u16::from_be_bytes([buf[2], buf[3]])), 4),
                127 if buf.len() >= 10 => (
                    usize::try_from(u64::from_be_bytes(buf[2..10].try_into().expect("8 bytes"))).expect("a length"),
                    10,
                ),
                126 | 127 => break,
                n => (usize::from(n), 2),
            };
            if buf.len() < at + len {
                break;
            }
            let opcode = buf[0] & 0x0f;
            let payload = buf[at..at + len].to_vec();
            buf.drain(..at + len);
            match opcode {
                0x8 => {
                    end.close = Some(if payload.len() >= 2 {
                        u16::from_be_bytes([payload[0], payload[1]])
                    } else {
                        1005
                    })
                }
                0xA => end.pongs.push(payload),
                _ => {}
            }
            end.opcodes.push(opcode);
        }
        if stop(&end) {
            return end;
        }
        let mut chunk = [0u8; 64 << 10];
        match tokio::time::timeout_at(deadline, tcp.read(&mut chunk)).await {
            Err(_) => {
                end.timed_out = true;
                return end;
            }
            Ok(Ok(0)) | Ok(Err(_)) => {
                end.ended = true;
                return end;
            }
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
