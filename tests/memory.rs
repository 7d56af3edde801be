//! Per-stream memory of the translator, measured with a counting global allocator (issue 2, Performance).
//!
//! Each case feeds a large or never-ending item in 4 KiB pieces, clearing the output after every feed as
//! the proxy does, and asserts that the peak of live heap bytes above the baseline taken before the
//! translator was created stays under [`LIMIT`]. Accounting is per thread, so the tests may run in
//! parallel. Sizes: the client tool result is 100 MB in release builds and 20 MB in debug builds (see
//! [`big_mb`]), the never-ending cases a sixth of that; the bound does not depend on the size. The 100 MB
//! run: `cargo test --release --test memory -- --nocapture`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sse_gateway::translate::{Options, Translator};

/// The bound on per-stream state (issue 2).
const LIMIT: usize = 64 << 10;
/// Size of each feed.
const PIECE: usize = 4 << 10;
/// Capacity of the caller's output buffer, made before the baseline: it is the proxy's frame, not stream
/// state. Growth beyond it is counted.
const OUT_CAPACITY: usize = 16 << 10;

/// Counts the live heap bytes of the current thread and their peak.
struct Counting;

thread_local! {
    // Const-initialised cells without destructors: usable from inside the allocator at any time.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn account(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// Restarts peak tracking from the current live bytes.
fn reset_peak() {
    PEAK.with(|p| p.set(live()));
}

fn peak() -> isize {
    PEAK.with(Cell::get)
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the bookkeeping
// touches only thread-local integers and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            account(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            account(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        account(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            account(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Megabytes of the headline case: 100 MB in release builds, as issue 2 asks (about 0.3 s); 20 MB in
/// debug builds, where the core runs ~10× slower (100 MB took 10–15 s there) and the bound does not depend
/// on the size anyway. `MEMORY_TEST_MB` overrides.
fn big_mb() -> usize {
    match std::env::var("MEMORY_TEST_MB").ok().and_then(|v| v.parse().ok()) {
        Some(mb) => mb,
        None if cfg!(debug_assertions) => 20,
        None => 100,
    }
}

/// Megabytes of the other cases: the bound does not depend on the size, so they need not be as long.
fn other_mb() -> usize {
    (big_mb() / 6).max(1)
}

/// What one run measured.
#[derive(Debug)]
struct Report {
    /// Peak live bytes above the baseline while feeding.
    peak: usize,
    /// Largest `buffered_bytes()` seen after a feed.
    max_buffered: usize,
    /// Bytes fed as the repeated body.
    body_in: usize,
    /// Output produced while the body was fed.
    body_out: usize,
    /// Output of the suffix and `finish` (only when `close` is given).
    tail: Vec<u8>,
}

/// Feeds `prefix`, then `body` (exactly [`PIECE`] bytes, a valid continuation of itself) `repeat` times,
/// then `close` and `finish` if given. Memory is measured up to the end of the body.
fn run(opts: Options, prefix: &[u8], body: &[u8], repeat: usize, close: Option<&[u8]>) -> Report {
    assert_eq!(body.len(), PIECE);
    let mut out = Vec::with_capacity(OUT_CAPACITY);
    let base = live();
    reset_peak();
    let mut t = Translator::new(opts, "memory-test");
    let mut max_buffered = 0;
    for piece in prefix.chunks(PIECE) {
        t.feed(piece, &mut out);
        out.clear();
    }
    let mut body_out = 0;
    for _ in 0..repeat {
        t.feed(body, &mut out);
        body_out += out.len();
        out.clear();
        max_buffered = max_buffered.max(t.buffered_bytes());
    }
    let peak = (peak() - base).max(0) as usize;
    let mut tail = Vec::new();
    if let Some(close) = close {
        t.feed(close, &mut tail);
        t.finish(&mut tail);
    }
    Report {
        peak,
        max_buffered,
        body_in: body.len() * repeat,
        body_out,
        tail,
    }
}

fn event(s: &str) -> Vec<u8> {
    format!("data: {s}\n\n").into_bytes()
}

fn meta_init() -> Vec<u8> {
    event(
        "<meta_init data=\"{&quot;format&quot;:&quot;xml&quot;,&quot;user_query&quot;:&quot;q&quot;,\
         &quot;agent_uuid&quot;:&quot;agent-mem&quot;,&quot;parent_agent_uuid&quot;:null,&quot;model&quot;:&quot;m&quot;}\"></meta_init>",
    )
}

/// `PIECE` bytes of escaped text lines: `\n` escapes (which may straddle two pieces), quotes, `<`, `&`,
/// non-ASCII. Cut on an ASCII byte so the repetition stays valid UTF-8.
fn text_piece(escape_newline: &str) -> Vec<u8> {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < PIECE {
        s.push_str(&format!(
            "line {i}: let x = \"a < b && c\"; // café 你好 — ok{escape_newline}"
        ));
        i += 1;
    }
    let mut cut = PIECE;
    while !s.is_char_boundary(cut) || !s.as_bytes()[cut - 1].is_ascii() {
        cut -= 1;
    }
    let mut v = s.as_bytes()[..cut].to_vec();
    v.resize(PIECE, b'.');
    v
}

/// The stream so far: meta_init, then `open`, the start of an item.
fn opened(open: &[u8]) -> Vec<u8> {
    let mut prefix = meta_init();
    prefix.extend_from_slice(open);
    prefix
}

/// At least 90% of the bytes fed are out (`when`: by when).
fn assert_mostly_out(r: &Report, when: &str) {
    assert!(
        r.body_out >= r.body_in * 9 / 10,
        "only {} of {} bytes out{when}",
        r.body_out,
        r.body_in
    );
}

fn assert_bounded(name: &str, r: &Report, limit: usize) {
    eprintln!(
        "{name}: fed {} MiB in {PIECE}-byte pieces; peak live heap above baseline {} bytes ({:.1} KiB), \
         max buffered_bytes() {}, output {} MiB",
        r.body_in >> 20,
        r.peak,
        r.peak as f64 / 1024.0,
        r.max_buffered,
        r.body_out >> 20
    );
    assert!(r.peak < limit, "{name}: peak {} bytes >= limit {limit}", r.peak);
    assert!(
        r.max_buffered < limit,
        "{name}: buffered_bytes() {} >= limit {limit}",
        r.max_buffered
    );
}

/// 100 MB in release (`cargo test --release --test memory`), 20 MB in debug; see `big_mb`.
#[test]
fn a_large_client_tool_result_fed_in_4_kib_pieces_keeps_per_stream_state_under_64_kib() {
    let prefix = opened(b"data: <content-block-tool_result id=\"toolu_big\" name=\"read_file\"><![CDATA[");
    let body = text_piece("\\n");
    let repeat = (big_mb() << 20) / PIECE;
    let close = b"]]></content-block-tool_result>\n\ndata: [DONE]\n\n";
    let r = run(Options::default(), &prefix, &body, repeat, Some(close));
    assert_bounded("client tool_result", &r, LIMIT);
    // Emitted in chunks as it arrives, not collected: nearly all of it is out before the item ends.
    assert_mostly_out(&r, " before the close");
    let tail = String::from_utf8_lossy(&r.tail);
    assert!(
        tail.contains("\"type\":\"tool_result\"") && tail.contains("\"final\":true"),
        "no final tool_result chunk after the close: {tail}"
    );
}

/// A text block that is opened and then streams small deltas forever.
#[test]
fn a_never_closing_text_block_keeps_per_stream_state_under_64_kib() {
    let prefix = opened(&event("<content-block-text>"));
    // Whole events of 5–40 byte deltas, the last one padded so that the piece is exactly PIECE bytes.
    let mut body = Vec::new();
    let deltas = [
        "Hello",
        " world, this is",
        " a delta\\nwith a newline",
        " and \\\\ a backslash",
        " ok",
    ];
    let mut i = 0;
    while body.len() + 60 < PIECE {
        body.extend_from_slice(&event(deltas[i % deltas.len()]));
        i += 1;
    }
    let pad = PIECE - body.len() - "data: \n\n".len();
    body.extend_from_slice(&event(&"z".repeat(pad)));
    let repeat = (other_mb() << 20) / PIECE;
    let r = run(Options::default(), &prefix, &body, repeat, None);
    assert_bounded("never-closing text block", &r, LIMIT);
    assert!(
        r.body_out >= r.body_in,
        "text deltas held back: {} of {} bytes out",
        r.body_out,
        r.body_in
    );
}

/// One text event that never ends (no blank line). The core holds a text event until it completes, up to
/// `max_text_event_bytes` (to tell a complete item sent mid-block from text, DESIGN 3.6); past that it
/// streams. So the state is bounded by that setting, not by the input: we allow twice the setting (a
/// `Vec` doubles its capacity) plus the 64 KiB of any other stream state.
#[test]
fn a_never_ending_text_event_is_bounded_by_max_text_event_bytes() {
    let mut prefix = opened(&event("<content-block-text>"));
    prefix.extend_from_slice(b"data: ");
    let body = text_piece(" ");
    let repeat = (other_mb() << 20) / PIECE;
    for max in [Options::default().max_text_event_bytes, 16 << 10] {
        let opts = Options {
            max_text_event_bytes: max,
            ..Options::default()
        };
        let r = run(opts, &prefix, &body, repeat, None);
        assert_bounded(
            &format!("never-ending text event (max_text_event_bytes = {max})"),
            &r,
            2 * max + LIMIT,
        );
    }
}

/// A server tool result whose CDATA never closes; its content holds `]]>` (DESIGN 3.6: only the `]]>`
/// followed by the closing tag ends it), so the core cannot stop at the first one.
#[test]
fn a_never_closing_cdata_keeps_per_stream_state_under_64_kib() {
    let prefix = opened(b"data: <content-block-server_tool_result id=\"srv_1\" name=\"web_fetch\"><![CDATA[");
    let body = text_piece("]]>\\n");
    let repeat = (other_mb() << 20) / PIECE;
    let r = run(Options::default(), &prefix, &body, repeat, None);
    assert_bounded("never-closing server_tool_result CDATA", &r, LIMIT);
    assert_mostly_out(&r, "");

    // The same for a client tool result.
    let prefix = opened(b"data: <content-block-tool_result id=\"toolu_1\" name=\"read_file\"><![CDATA[");
    let body = text_piece("\\n");
    let r = run(Options::default(), &prefix, &body, repeat, None);
    assert_bounded("never-closing client tool_result CDATA", &r, LIMIT);
}
