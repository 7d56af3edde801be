//! The checks of the `translate` fuzz target, shared with `tests/fuzz_regressions.rs` (which includes this
//! file by path), so that a saved crash replays exactly as the fuzzer saw it.
//!
//! Input layout (so that seeds are easy to write by hand, see fuzz/README.md): byte 0 flags, byte 1
//! budget, byte 2 limits, end and `require_done`, byte 3 number of splits `k` (mod 17; its top bit also tells
//! the two JSON dialects apart), then `k` little-endian u16 split offsets, then the upstream stream itself.
//!
//! Asserts: no panic (and no hang: libFuzzer's timeout); the split input gives exactly the output of the
//! whole input (byte for byte); every output event of both is `data: <json>\n\n` with a JSON object
//! whose first keys are `type`, `agent`, `final`, `delta` (or `data: [DONE]`); every object is within the
//! budget unless it is a citation, its fixed fields leave no room for the first character of its delta, or
//! it is of a type read whole whose unescaped delta fits the native formatter's room (DESIGN 4).

#[path = "../tests/harness/diff.rs"]
mod diff;

use serde_json::Value;
use sse_gateway::envelope::budget::escaped_len;
use sse_gateway::envelope::{EnvelopeKind, Split};
use sse_gateway::sse::{Framing, LineEnds};
use sse_gateway::translate::{DataJoin, Dialect, Options, Translator, UnknownTags, MIN_BUDGET};

/// Header bytes before the split offsets.
pub const HEADER: usize = 4;
const MAX_SPLITS: usize = 16;

/// `set` when `flags` has the bit `mask`, else `unset`.
fn bit<T>(flags: u8, mask: u8, set: T, unset: T) -> T {
    if flags & mask != 0 {
        set
    } else {
        unset
    }
}

/// Options from the header's four bytes; `true` if the stream ends with `abort` rather than `finish`.
pub fn options(h: &[u8; HEADER]) -> (Options, bool) {
    let (flags, budget, limits, splits) = (h[0], h[1], h[2], h[3]);
    let d = Options::default();
    let pick = |sel: u8, small: [usize; 3], default: usize| match sel & 3 {
        0 => default,
        n => small[n as usize - 1],
    };
    let opts = Options {
        budget: MIN_BUDGET + 16 * budget as usize,
        // Five dialects in two bits: 3 stands for both JSON dialects of DESIGN 3.7, cogency or (byte 3's top
        // bit) agent_sdk. That bit was free in effect (the split count is taken mod 17), and 3 used to mean auto
        // as 0 does, which no saved input used: every one keeps its meaning.
        dialect: match flags & 3 {
            1 => Dialect::Xml,
            2 => Dialect::Raw,
            3 => bit(splits, 128, Dialect::AgentSdk, Dialect::Cogency),
            _ => Dialect::Auto,
        },
        line_ends: bit(flags, 4, LineEnds::Strict, LineEnds::Legacy),
        framing: bit(flags, 8, Framing::UnescapedNewlines, Framing::Current),
        data_join: bit(flags, 16, DataJoin::Newline, DataJoin::Concat),
        unknown_tags: bit(flags, 32, UnknownTags::Drop, UnknownTags::Text),
        rewrite_format: flags & 64 == 0,
        include_traceback: flags & 128 != 0,
        max_item_bytes: pick(limits, [256, 4096, 1 << 16], d.max_item_bytes),
        max_text_event_bytes: pick(limits >> 2, [64, 1024, 1 << 14], d.max_text_event_bytes),
        json_sniff_bytes: pick(limits >> 4, [16, 256, 4096], d.json_sniff_bytes),
        require_done: limits & 128 != 0,
    };
    (opts, limits & 64 != 0)
}

fn run(opts: &Options, pieces: &[&[u8]], abort: bool) -> Vec<u8> {
    let mut t = Translator::new(opts.clone(), "fuzz-agent");
    let mut out = Vec::new();
    for p in pieces {
        t.feed(p, &mut out);
    }
    if abort {
        t.abort("fuzz: upstream reset", &mut out);
    } else {
        t.finish(&mut out);
    }
    out
}

fn check_output(out: &[u8], budget: usize) {
    let text = std::str::from_utf8(out).expect("output is UTF-8");
    assert!(text.is_empty() || text.ends_with("\n\n"), "output ends inside an event");
    for ev in text.split_terminator("\n\n") {
        let json = ev
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("event without `data: `: {ev:?}"));
        if json == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("not JSON ({e}): {json}"));
        let m = v.as_object().unwrap_or_else(|| panic!("not an object: {json}"));
        let keys: Vec<&str> = m.keys().take(4).map(String::as_str).collect();
        assert_eq!(keys, ["type", "agent", "final", "delta"], "field order: {json}");
        let kind = m["type"].as_str().and_then(EnvelopeKind::parse);
        let kind = kind.unwrap_or_else(|| panic!("unknown type: {json}"));
        assert!(m["agent"].is_string() && m["final"].is_boolean(), "field types: {json}");
        let delta = m["delta"]
            .as_str()
            .unwrap_or_else(|| panic!("delta not a string: {json}"));
        if json.len() <= budget || kind == EnvelopeKind::Citation {
            continue;
        }
        // Over budget: allowed only if not even the first character of the delta fits beside the fixed
        // fields (DESIGN 4, the huge-fixed-fields exception). Splitting needs a `"final":false` piece first,
        // whose fixed fields are one byte longer than a final envelope's.
        let is_final = m["final"] == true;
        let fixed = json.len() - escaped_len(delta) + usize::from(is_final);
        if kind.split() == Split::Native {
            // Cut by unescaped bytes against the budget less the empty non-final envelope (all of it below 64).
            let room = budget.saturating_sub(fixed);
            let room = if room < 64 { budget } else { room };
            assert!(
                delta.len() <= room,
                "{} native delta over its room {room}: {json}",
                delta.len()
            );
            continue;
        }
        let first = delta
            .chars()
            .next()
            .map_or(0, |c| escaped_len(c.encode_utf8(&mut [0; 4])));
        assert!(
            fixed + first > budget,
            "{} bytes over the budget of {budget} (fixed fields {fixed}): {json}",
            json.len() - budget
        );
    }
}

/// Runs every check on one fuzz input; panics on a violation.
pub fn check(data: &[u8]) {
    let Some(header) = data.first_chunk::<HEADER>() else {
        return;
    };
    let (opts, abort) = options(header);
    let k = data[3] as usize % (MAX_SPLITS + 1);
    let Some(stream) = data.get(HEADER + 2 * k..) else {
        return;
    };
    let mut cuts: Vec<usize> = data[HEADER..HEADER + 2 * k]
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]) as usize % (stream.len() + 1))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut at = 0;
    for c in cuts {
        pieces.push(&stream[at..c]);
        at = c;
    }
    pieces.push(&stream[at..]);

    let whole = run(&opts, &[stream], abort);
    let split = run(&opts, &pieces, abort);
    if whole != split {
        let at = diff::first_difference(&whole, &split);
        let from = at.saturating_sub(200);
        panic!(
            "split input changed the output at byte {at} (pieces {:?}):\nwhole: {}\nsplit: {}",
            pieces.iter().map(|p| p.len()).collect::<Vec<_>>(),
            String::from_utf8_lossy(&whole[from..(at + 200).min(whole.len())]),
            String::from_utf8_lossy(&split[from..(at + 200).min(split.len())]),
        );
    }
    check_output(&whole, opts.budget);
    check_output(&split, opts.budget);
}
