//! The web-platform-tests `eventsource/format-*` cases, replayed against the
//! SSE decoder with strict (WHATWG) line ends, plus split-read cases.
//!
//! Each WPT case's input is the `message` query parameter of the test file
//! followed by what `eventsource/resources/message.py` appends
//! (`message + newline + "\n"`, where `newline` is `"\n\n"` unless the test
//! passes `newline=none`), or the body `resources/last-event-id.py` writes.

use sse_gateway::sse::decoder::collect;
use sse_gateway::sse::{DecoderOptions, Framing, LineEnds};

const STRICT: DecoderOptions = DecoderOptions {
    line_ends: LineEnds::Strict,
    framing: Framing::Current,
};

/// One dispatched event, as an EventSource would surface it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Msg {
    /// `MessageEvent.type`: the event type buffer, `message` when empty.
    event_type: String,
    /// `MessageEvent.data`, UTF-8 decoded lossily (WHATWG: always UTF-8).
    data: String,
    last_event_id: String,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Decoded {
    msgs: Vec<Msg>,
    /// `SseEvent::Discard` reports (EOF inside an event).
    discards: usize,
    retry: Option<u64>,
}

/// Decodes `chunks` (one `feed` each) then `finish`es, joining the data lines of an event with LF as the WHATWG
/// algorithm does; an event without a type is a `message`.
fn decode_with(opts: DecoderOptions, chunks: &[&[u8]]) -> Decoded {
    let c = collect(opts, chunks);
    let msgs = c
        .events
        .into_iter()
        .map(|(event_type, data, last_event_id)| Msg {
            event_type: if event_type.is_empty() {
                "message".to_owned()
            } else {
                event_type
            },
            data,
            last_event_id,
        })
        .collect();
    Decoded {
        msgs,
        discards: c.discards,
        retry: c.retry,
    }
}

fn decode(chunks: &[&[u8]]) -> Decoded {
    decode_with(STRICT, chunks)
}

/// `resources/message.py`: `message + newline + "\n"`.
fn message_py(message: &[u8], newline_none: bool) -> Vec<u8> {
    let mut body = message.to_vec();
    if !newline_none {
        body.extend_from_slice(b"\n\n");
    }
    body.push(b'\n');
    body
}

/// `message` as `resources/message.py` serves it (see `message_py`), decoded by `decode_any_split`.
fn decode_message(message: &[u8], newline_none: bool) -> Decoded {
    decode_any_split(&message_py(message, newline_none))
}

/// The data of the events of `message` decoded by `decode_message`.
fn message_datas(message: &[u8], newline_none: bool) -> Vec<String> {
    datas(&decode_message(message, newline_none))
        .into_iter()
        .map(String::from)
        .collect()
}

fn msg(data: &str) -> Msg {
    Msg {
        event_type: "message".into(),
        data: data.into(),
        last_event_id: String::new(),
    }
}

fn datas(d: &Decoded) -> Vec<&str> {
    d.msgs.iter().map(|m| m.data.as_str()).collect()
}

/// Decodes `input` whole, then split once at every byte offset and split into
/// single bytes, and checks that every split decodes alike.
fn decode_any_split(input: &[u8]) -> Decoded {
    let whole = decode(&[input]);
    for i in 0..=input.len() {
        let got = decode(&[&input[..i], &input[i..]]);
        assert_eq!(got, whole, "split at {i} of {:?}", String::from_utf8_lossy(input));
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    assert_eq!(decode(&bytes), whole, "byte by byte");
    whole
}

// ---- format-field-parsing.htm ----

#[test]
fn wpt_format_field_parsing_nul_kept_one_space_stripped_names_case_sensitive() {
    // format-field-parsing.htm, newline=none.
    let message =
        b"data:\0\ndata:  2\rData:1\ndata\0:2\ndata:1\r\0data:4\nda-ta:3\rdata_5\ndata:3\rdata:\r\n data:32\ndata:4\n";
    assert_eq!(message_datas(message, true), ["\0\n 2\n1\n3\n\n4"]);
}

// ---- format-field-unknown.htm ----

#[test]
fn wpt_format_field_unknown_leading_space_line_and_unknown_fields_ignored() {
    assert_eq!(
        message_datas(
            b"data:test\n data\ndata\nfoobar:xxx\njustsometext\n:thisisacommentyay\ndata:test",
            false,
        ),
        ["test\n\ntest"]
    );
}

// ---- format-leading-space.htm ----

#[test]
fn wpt_format_leading_space_tab_not_stripped() {
    assert_eq!(
        message_datas(b"data:\ttest\rdata: \ndata:test", false),
        ["\ttest\n\ntest"]
    );
}

// ---- format-newlines.htm ----

#[test]
fn wpt_format_newlines_mixed_cr_lf_crlf_and_bare_data() {
    assert_eq!(
        message_datas(b"data:test\r\ndata\ndata:test\r\n\r", true),
        ["test\n\ntest"]
    );
}

// ---- format-bom.htm / format-bom-2.htm ----

#[test]
fn wpt_format_bom_stripped_once_at_stream_start_only() {
    // format-bom.htm: the BOM before the second event is part of its field
    // name, which makes an unknown field.
    assert_eq!(
        message_datas(b"\xEF\xBB\xBFdata:1\n\n\xEF\xBB\xBFdata:2\n\ndata:3", false),
        ["1", "3"]
    );
}

#[test]
fn wpt_format_bom_2_second_bom_makes_an_unknown_field() {
    assert_eq!(
        message_datas(b"\xEF\xBB\xBF\xEF\xBB\xBFdata:1\n\ndata:2\n\ndata:3", false),
        ["2", "3"]
    );
}

// ---- format-comments.htm ----

#[test]
fn wpt_format_comments_with_cr_nul_and_2kb_bodies() {
    let long = "x".repeat(2 * 1024);
    let message = format!("data:1\r:\0\n:\r\ndata:2\n:{long}\rdata:3\n:data:fail\r:{long}\ndata:4\n");
    assert_eq!(message_datas(message.as_bytes(), true), ["1\n2\n3\n4"]);
}

// ---- format-data-before-final-empty-line.htm ----

#[test]
fn wpt_format_data_before_final_empty_line_is_not_dispatched() {
    let d = decode_message(b"retry:1000\ndata:test1\n\nid:test\ndata:test2", true);
    assert_eq!(d.msgs, [msg("test1")]);
    assert_eq!(d.discards, 1, "the unfinished event is discarded at EOF");
    assert_eq!(d.retry, Some(1000));
}

// ---- format-field-data.htm ----

#[test]
fn wpt_format_field_data_empty_value_and_bare_names() {
    // format-field-data.htm: `data:` alone dispatches "" (the buffer is "\n"
    // before its last LF is removed), two bare `data` lines dispatch "\n".
    assert_eq!(
        message_datas(b"data:\n\ndata\ndata\n\ndata:test", false),
        ["", "\n", "test"]
    );
}

// ---- format-field-event.htm / format-field-event-empty.htm ----

#[test]
fn wpt_format_field_event_sets_the_type_of_one_event_only() {
    let d = decode_message(b"event:test\ndata:x\n\ndata:x", false);
    let types: Vec<&str> = d.msgs.iter().map(|m| m.event_type.as_str()).collect();
    assert_eq!(types, ["test", "message"]);
    assert_eq!(datas(&d), ["x", "x"]);
}

#[test]
fn wpt_format_field_event_empty_means_message() {
    // `event: ` with the one space stripped is the empty type: "message".
    let d = decode_message(b"event: \ndata:data", false);
    assert_eq!(d.msgs, [msg("data")]);
}

// ---- format-field-id.htm / -id-2.htm / -id-null.htm (last-event-id.py) ----

#[test]
fn wpt_format_field_id_sets_last_event_id() {
    // last-event-id.py with no Last-Event-ID header.
    let body = "id: …\nretry: 200\ndata: hello\n\n";
    let d = decode_any_split(body.as_bytes());
    assert_eq!(d.msgs.len(), 1);
    assert_eq!(d.msgs[0].data, "hello");
    assert_eq!(d.msgs[0].last_event_id, "…");
    assert_eq!(d.retry, Some(200));
}

#[test]
fn wpt_format_field_id_2_last_event_id_persists_across_events() {
    let body = "id: …\nretry: 200\ndata: hello\n\ndata: …\n\ndata: …\n\n";
    let d = decode_any_split(body.as_bytes());
    let ids: Vec<&str> = d.msgs.iter().map(|m| m.last_event_id.as_str()).collect();
    assert_eq!(ids, ["…", "…", "…"]);
    assert_eq!(datas(&d), ["hello", "…", "…"]);
}

#[test]
fn wpt_format_field_id_null_id_with_nul_is_ignored() {
    // last-event-id.py?idvalue=%00%00
    let d = decode_any_split(b"id: \0\0\nretry: 200\ndata: hello\n\n");
    assert_eq!(d.msgs, [msg("hello")]);
    // And an id with a NUL does not replace an earlier valid id.
    let d = decode_any_split(b"id: 1\ndata: a\n\nid: x\0y\ndata: b\n\n");
    let ids: Vec<&str> = d.msgs.iter().map(|m| m.last_event_id.as_str()).collect();
    assert_eq!(ids, ["1", "1"]);
}

// ---- format-field-retry.htm / -retry-bogus.htm / -retry-empty.htm ----

#[test]
fn wpt_format_field_retry_is_decimal_with_leading_zero() {
    let d = decode_message(b"retry:03000\ndata:x", false);
    assert_eq!(d.retry, Some(3000));
    assert_eq!(datas(&d), ["x"]);
}

#[test]
fn wpt_format_field_retry_bogus_value_is_ignored() {
    let d = decode_message(b"retry:3000\nretry:1000x\ndata:x", false);
    assert_eq!(d.retry, Some(3000));
    assert_eq!(datas(&d), ["x"]);
}

#[test]
fn wpt_format_field_retry_empty_is_ignored() {
    let d = decode_message(b"retry\ndata:test", false);
    assert_eq!(d.retry, None);
    assert_eq!(datas(&d), ["test"]);
}

// ---- format-null-character.html ----

#[test]
fn wpt_format_null_character_in_data_is_kept() {
    assert_eq!(message_datas(b"data:\0\n\n", false), ["\0"]);
}

// ---- format-utf-8.htm ----

#[test]
fn wpt_format_utf_8_data_is_always_utf8() {
    // Served as windows-1252, decoded as UTF-8 all the same.
    let d = decode_message(b"data:ok\xE2\x80\xA6", false);
    assert_eq!(datas(&d), ["ok…"]);
    // Invalid UTF-8 decodes lossily (U+FFFD), it does not end the stream.
    let d = decode_any_split(b"data:\xFFok\xE2\x80\n\ndata:next\n\n");
    assert_eq!(datas(&d), ["\u{FFFD}ok\u{FFFD}", "next"]);
}

// ---- split reads ----

#[test]
fn crlf_split_across_reads_is_one_line_end() {
    // If the LF after a CR in the previous read counted as a second line
    // end, "a" would be dispatched alone.
    let d = decode(&[b"data:a\r", b"\ndata:b\r", b"\n\r", b"\n"]);
    assert_eq!(datas(&d), ["a\nb"]);
    let d = decode(&[b"data:a\r", b"\n", b"\r", b"\n"]);
    assert_eq!(datas(&d), ["a"]);
}

#[test]
fn cr_cr_split_across_reads_is_a_line_end_then_a_blank_line() {
    let d = decode(&[b"data:a\r", b"\rdata:b\r", b"\r"]);
    assert_eq!(datas(&d), ["a", "b"]);
    let d = decode(&[b"data:a\r", b"\r", b"data:b\r\r"]);
    assert_eq!(datas(&d), ["a", "b"]);
}

#[test]
fn bom_split_byte_by_byte_is_stripped() {
    let d = decode(&[b"\xEF", b"\xBB", b"\xBF", b"data:x\n\n"]);
    assert_eq!(datas(&d), ["x"]);
    // A second BOM fed byte by byte is still a field-name byte sequence.
    let d = decode(&[
        b"\xEF",
        b"\xBB",
        b"\xBF",
        b"\xEF",
        b"\xBB",
        b"\xBF",
        b"data:x\n\ndata:y\n\n",
    ]);
    assert_eq!(datas(&d), ["y"]);
}

#[test]
fn empty_chunks_before_the_bom_do_not_end_bom_detection() {
    let d = decode(&[b"", b"", b"\xEF\xBB", b"", b"\xBFdata:x\n\n"]);
    assert_eq!(datas(&d), ["x"]);
}

#[test]
fn a_partial_bom_is_input_not_dropped() {
    // EF BB followed by `data`: not a BOM, so the bytes belong to the field
    // name, which becomes unknown; dropping them would dispatch "x".
    let d = decode(&[b"\xEF\xBB", b"data:x\n\ndata:y\n\n"]);
    assert_eq!(datas(&d), ["y"]);
    let d = decode(&[b"\xEF", b"data:x\n\ndata:y\n\n"]);
    assert_eq!(datas(&d), ["y"]);
}

#[test]
fn u2028_and_nel_are_not_line_breaks() {
    let d = decode_any_split("data:a\u{2028}b\u{2029}c\u{85}d\n\n".as_bytes());
    assert_eq!(datas(&d), ["a\u{2028}b\u{2029}c\u{85}d"]);
}

#[test]
fn legacy_line_ends_keep_lone_cr_where_strict_splits() {
    // The same bytes under both modes: strict ends the line at the CR
    // (`b` becomes an unknown field), legacy keeps the CR as content.
    let input = b"data:a\rb\n\n";
    assert_eq!(datas(&decode(&[input])), ["a"]);
    let legacy = DecoderOptions {
        line_ends: LineEnds::Legacy,
        framing: Framing::Current,
    };
    assert_eq!(datas(&decode_with(legacy, &[input])), ["a\rb"]);
}
