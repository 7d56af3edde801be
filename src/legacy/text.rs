//! Text and thinking blocks: model text streamed as it arrives.
//!
//! A text event goes out when it completes. Held back are only bytes that
//! could start the block's closing tag (or split an escape or a UTF-8
//! character) and, at the event level, the cases of DESIGN 3.6: an event
//! that is exactly one complete item, a sibling block's open tag (conflict),
//! and the backend failure JSON (held until we know it is the last event).

use super::kinds::ItemKind;
use crate::envelope::budget::incomplete_utf8_tail;
use crate::envelope::chunker::Sink;
use crate::envelope::{BlockHeader, EnvelopeKind};
use crate::pipeline::Observer;

pub(super) const TEXT_OPEN: &[u8] = b"<content-block-text>";
const TEXT_CLOSE: &[u8] = b"</content-block-text>";
pub(super) const THINKING_OPEN: &[u8] = b"<content-block-thinking>";
pub(super) const THINKING_CLOSE: &[u8] = b"</content-block-thinking>";

/// Size of the cuts an oversized text event is streamed in (bounds the
/// output written per read).
pub(super) const STREAM_CUT: usize = 16 << 10;

/// An open text or thinking block.
#[derive(Debug)]
pub struct Streamed {
    pub(super) header: BlockHeader,
    pub(super) chunks: u32,
    pub(super) invalid_utf8: bool,
}

impl Streamed {
    pub(super) fn close_tag(&self) -> &'static [u8] {
        match self.header.kind {
            EnvelopeKind::Thinking => THINKING_CLOSE,
            _ => TEXT_CLOSE,
        }
    }
}

/// Trailing bytes of `region` that cannot end a delta: an unpaired `\`
/// (its escape is incomplete) or an incomplete UTF-8 character.
pub(super) fn split_hold(region: &[u8]) -> usize {
    let backslashes = region.iter().rev().take_while(|&&b| b == b'\\').count();
    if backslashes % 2 == 1 {
        return 1;
    }
    incomplete_utf8_tail(region)
}

/// Writes unescaped text as `final:false` deltas of `block`.
pub(super) fn emit_delta(block: &mut Streamed, text: &[u8], sink: &mut Sink<impl Observer>) {
    let delta = match std::str::from_utf8(text) {
        Ok(t) => std::borrow::Cow::Borrowed(t),
        Err(_) => {
            block.invalid_utf8 = true;
            String::from_utf8_lossy(text)
        }
    };
    block.chunks += sink.streamed_delta(&block.header, &delta);
}

/// Whether `ev` is exactly one complete non-streamed item: `<name …>…</name>`.
pub(super) fn is_complete_item(ev: &[u8]) -> bool {
    let Some(inner) = ev.strip_prefix(b"<") else {
        return false;
    };
    let name_len = inner
        .iter()
        .position(|b| b.is_ascii_whitespace() || *b == b'>' || *b == b'/')
        .unwrap_or(inner.len());
    let name = &inner[..name_len];
    let known = std::str::from_utf8(name).is_ok_and(|n| ItemKind::of(n).stands_alone_in_text());
    if !known || ev.len() < name.len() * 2 + 5 {
        return false;
    }
    let close_at = ev.len() - name.len() - 3;
    ev.ends_with(b">") && &ev[close_at..close_at + 2] == b"</" && &ev[close_at + 2..ev.len() - 1] == name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_items_are_recognised_by_name_and_close_tag() {
        assert!(is_complete_item(
            b"<content-block-error><![CDATA[x]]></content-block-error>"
        ));
        assert!(is_complete_item(
            b"<content-block-web_search_tool_result id=\"1\"></content-block-web_search_tool_result>"
        ));
        assert!(!is_complete_item(b"<content-block-error>"));
        assert!(!is_complete_item(b"<chart>x</chart>"));
        assert!(!is_complete_item(b"<content-block-error>x</content-block-errors>"));
    }
}
