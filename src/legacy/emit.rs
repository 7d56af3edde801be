//! Writing blocks as envelopes within the byte budget: streamed blocks send
//! each delta at once; buffered blocks send full chunks as content arrives
//! and keep the last one back so that it can carry `final:true`.

use super::escape::incomplete_utf8_tail;
use crate::envelope::chunker::{fitting_prefix, MAX_CHAR_ESCAPED};
use crate::envelope::BlockHeader;
use crate::sse::encoder::write_envelope;
use crate::translate::Observer;

/// Writes one envelope, counting it (and counting it oversize if it is).
pub fn envelope(
    out: &mut Vec<u8>,
    obs: &mut impl Observer,
    budget: usize,
    header: &BlockHeader,
    is_final: bool,
    delta: &str,
) {
    let n = write_envelope(out, header, is_final, delta);
    obs.envelope(header.kind, n);
    if n > budget {
        obs.oversize(header.kind);
    }
}

/// Room for the escaped delta in one envelope of `header`, or `None` when
/// the fixed fields alone fill the budget (sent whole, DESIGN 4).
fn room(header: &BlockHeader, budget: usize) -> Option<usize> {
    budget.checked_sub(header.overhead()).filter(|&r| r > 0)
}

/// Where to cut `s` for one envelope: as much as fits, but at least one
/// character (an envelope whose fixed fields leave no room for it is
/// oversize, DESIGN 4), so that every envelope makes progress.
fn cut(s: &str, room: usize) -> usize {
    match fitting_prefix(s, room) {
        0 => s.chars().next().map_or(0, char::len_utf8),
        n => n,
    }
}

/// Writes `delta` as as many `final:false` envelopes as the budget needs;
/// returns how many were written.
pub fn streamed_delta(
    out: &mut Vec<u8>,
    obs: &mut impl Observer,
    budget: usize,
    header: &BlockHeader,
    mut delta: &str,
) -> u32 {
    let Some(room) = room(header, budget) else {
        envelope(out, obs, budget, header, false, delta);
        return 1;
    };
    let mut n = 0;
    while !delta.is_empty() {
        let at = cut(delta, room);
        envelope(out, obs, budget, header, false, &delta[..at]);
        delta = &delta[at..];
        n += 1;
    }
    n
}

/// A buffered block being written: content in, full chunks out.
#[derive(Debug)]
pub struct Chunked {
    pub header: BlockHeader,
    /// Content not yet written (UTF-8, perhaps ending mid-character).
    pending: Vec<u8>,
    chunks: u32,
    /// Bytes that were not UTF-8 were replaced.
    pub invalid_utf8: bool,
    /// Every chunk is `final:false` (a multimodal result's text part).
    never_final: bool,
}

impl Chunked {
    pub fn new(header: BlockHeader) -> Self {
        Self {
            header,
            pending: Vec::new(),
            chunks: 0,
            invalid_utf8: false,
            never_final: false,
        }
    }

    pub fn never_final(mut self) -> Self {
        self.never_final = true;
        self
    }

    pub fn buffered(&self) -> usize {
        self.pending.capacity()
    }

    /// Adds content; writes every chunk that is surely not the last.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>, obs: &mut impl Observer, budget: usize) {
        self.pending.extend_from_slice(bytes);
        let Some(room) = room(&self.header, budget) else {
            return; // fixed fields over budget: the whole block goes in one envelope
        };
        // Cheap test first: content that fits even fully escaped stays.
        if self.pending.len() * MAX_CHAR_ESCAPED <= room {
            return;
        }
        let mut start = 0;
        loop {
            let valid = self.valid_prefix(start);
            let text = match std::str::from_utf8(&self.pending[start..start + valid]) {
                Ok(t) => t,
                Err(_) => return, // valid_prefix only returns UTF-8
            };
            let at = cut(text, room);
            // Keep at least the rest of the content back for the final chunk.
            if at == text.len() || at == 0 {
                break;
            }
            envelope(out, obs, budget, &self.header, false, &text[..at]);
            self.chunks += 1;
            start += at;
        }
        self.pending.drain(..start);
    }

    /// Length of the UTF-8 prefix of `pending[start..]`, replacing invalid
    /// bytes (not an incomplete tail) with U+FFFD first.
    fn valid_prefix(&mut self, start: usize) -> usize {
        match std::str::from_utf8(&self.pending[start..]) {
            Ok(_) => self.pending.len() - start,
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => {
                // Replace what is invalid, but keep an incomplete last
                // character raw: the next piece may complete it.
                self.invalid_utf8 = true;
                let end = self.pending.len() - incomplete_utf8_tail(&self.pending[start..]);
                let fixed = String::from_utf8_lossy(&self.pending[start..end]).into_owned();
                let tail = self.pending.split_off(end);
                self.pending.truncate(start);
                self.pending.extend_from_slice(fixed.as_bytes());
                let valid = self.pending.len() - start;
                self.pending.extend_from_slice(&tail);
                valid
            }
        }
    }

    /// Writes the rest with `final:true` (or `false` for a never-final
    /// part); returns the number of chunks the block took.
    pub fn finish(mut self, out: &mut Vec<u8>, obs: &mut impl Observer, budget: usize) -> u32 {
        let text = match String::from_utf8(std::mem::take(&mut self.pending)) {
            Ok(t) => t,
            Err(e) => {
                self.invalid_utf8 = true;
                String::from_utf8_lossy(e.as_bytes()).into_owned()
            }
        };
        let is_final = !self.never_final;
        match room(&self.header, budget) {
            Some(room) => {
                let mut rest = text.as_str();
                loop {
                    // The final envelope has one byte more room (`true` is shorter than `false`).
                    let fits_as_final = is_final && fitting_prefix(rest, room + 1) == rest.len();
                    let at = cut(rest, room);
                    if fits_as_final || at == rest.len() {
                        envelope(out, obs, budget, &self.header, is_final, rest);
                        self.chunks += 1;
                        break;
                    }
                    envelope(out, obs, budget, &self.header, false, &rest[..at]);
                    self.chunks += 1;
                    rest = &rest[at..];
                }
            }
            None => {
                envelope(out, obs, budget, &self.header, is_final, &text);
                self.chunks += 1;
            }
        }
        obs.block_closed(self.header.kind, self.chunks);
        self.chunks
    }
}

/// Writes a complete payload as one buffered block.
pub fn whole(out: &mut Vec<u8>, obs: &mut impl Observer, budget: usize, header: BlockHeader, content: &str) {
    let mut c = Chunked::new(header);
    c.pending = content.as_bytes().to_vec();
    c.finish(out, obs, budget);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{EnvelopeKind, Extras};
    use crate::translate::Stats;

    fn lines(out: &[u8]) -> Vec<serde_json::Value> {
        std::str::from_utf8(out)
            .unwrap()
            .split("\n\n")
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn buffered_content_is_chunked_within_budget_and_final_on_the_last() {
        let budget = 256;
        let content: String = "ab\"\\\u{1}é😀\n".repeat(200);
        let bytes = content.as_bytes();
        let mut out = Vec::new();
        let mut stats = Stats::default();
        let mut c = Chunked::new(BlockHeader::new(
            EnvelopeKind::ToolResult,
            "a",
            Extras::new().str("id", "1"),
        ));
        // Feed in odd-sized pieces that split characters.
        for piece in bytes.chunks(7) {
            c.push(piece, &mut out, &mut stats, budget);
        }
        let chunks = c.finish(&mut out, &mut stats, budget);
        let got = lines(&out);
        assert_eq!(got.len() as u32, chunks);
        assert!(chunks > 10);
        for (i, v) in got.iter().enumerate() {
            assert_eq!(v["final"], i + 1 == got.len());
            assert!(!v["delta"].as_str().unwrap().is_empty());
        }
        for l in std::str::from_utf8(&out)
            .unwrap()
            .split("\n\n")
            .filter(|l| !l.is_empty())
        {
            assert!(l.len() - "data: ".len() <= budget, "{}", l.len());
        }
        let joined: String = got.iter().map(|v| v["delta"].as_str().unwrap()).collect();
        assert_eq!(joined, content);
        assert_eq!(stats.oversize, 0);
    }

    #[test]
    fn fixed_fields_over_budget_send_the_block_whole_and_count_it() {
        let mut out = Vec::new();
        let mut stats = Stats::default();
        let src = "x".repeat(400);
        let header = BlockHeader::new(EnvelopeKind::ToolResultImage, "a", Extras::new().str("src", &src));
        whole(&mut out, &mut stats, 256, header, "");
        assert_eq!(lines(&out).len(), 1);
        assert_eq!(stats.oversize, 1);
    }
}
