//! The byte budget: how many bytes a delta takes once JSON-escaped, and where
//! to cut a delta so that each envelope stays within the budget.
//!
//! Escaping follows serde_json exactly (short escapes for `\b \t \n \f \r`,
//! `\u00XX` for other control characters, `\"` and `\\`, everything else
//! including non-ASCII written raw), so a cut never falls inside a UTF-8
//! character and no `\u` surrogate escapes exist to split.

/// Escaped size of each ASCII byte; non-ASCII bytes are written raw (1 each).
const ESCAPED_LEN: [u8; 256] = {
    let mut t = [1u8; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = 6;
        b += 1;
    }
    t[0x08] = 2;
    t[0x09] = 2;
    t[0x0a] = 2;
    t[0x0c] = 2;
    t[0x0d] = 2;
    t[b'"' as usize] = 2;
    t[b'\\' as usize] = 2;
    t
};

/// The most bytes one character can take once escaped (`\u0001`).
pub const MAX_CHAR_ESCAPED: usize = 6;

/// Bytes `s` takes inside a JSON string literal, quotes excluded.
pub fn escaped_len(s: &str) -> usize {
    s.bytes().map(|b| ESCAPED_LEN[b as usize] as usize).sum()
}

/// Writes `s` as a JSON string literal, quotes included.
pub fn write_escaped(out: &mut Vec<u8>, s: &str) {
    // serde_json's serializer writes into a Vec without failing.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Writes the longest prefix of `s` whose escaped size is at most `room` as
/// a JSON string literal (quotes included); returns that prefix's length,
/// the same as [`fitting_prefix`]. Escapes a first `guess` of bytes, then
/// trims the overshoot or measures on from there, so only the bytes near the
/// cut are measured, not the whole prefix. A good guess (the last chunk's
/// length) saves work; any guess gives the same result.
pub fn write_escaped_fitting(out: &mut Vec<u8>, s: &str, room: usize, guess: usize) -> usize {
    let bytes = s.as_bytes();
    // Every byte takes at least one: no more than `room` bytes can fit.
    let mut end = s.len().min(room).min(guess.max(1));
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let start = out.len();
    write_escaped(out, &s[..end]);
    let written = out.len() - start - 2;
    if written > room {
        // Drop bytes from the end until the rest fits, then back to a
        // character boundary; their escapes are the output's last bytes.
        let mut dropped = 0;
        while written - dropped > room {
            // A whole word at a time while the cut is surely before it.
            if let Some(word) = end.checked_sub(8).and_then(|w| bytes.get(w..end)) {
                let len = word_escaped_len(load(word));
                if written - dropped - len > room {
                    end -= 8;
                    dropped += len;
                    continue;
                }
            }
            end -= 1;
            dropped += ESCAPED_LEN[bytes[end] as usize] as usize;
        }
        while !s.is_char_boundary(end) {
            end -= 1;
            dropped += ESCAPED_LEN[bytes[end] as usize] as usize;
        }
        out.truncate(out.len() - 1 - dropped);
        out.push(b'"');
    } else if end < s.len() && written < room {
        // Short of the room (a low guess, or a character boundary): more may fit.
        let more = fitting_prefix(&s[end..], room - written);
        if more > 0 {
            out.pop();
            let at = out.len();
            write_escaped(out, &s[end..end + more]);
            out.remove(at);
            end += more;
        }
    }
    end
}

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

/// Eight bytes as one little-endian word (`word` is 8 bytes long).
#[inline]
fn load(word: &[u8]) -> u64 {
    u64::from_le_bytes(word.try_into().unwrap_or([0; 8]))
}

/// The high bit of each byte of `x` that is zero, and no other bit (exact per
/// byte: the addition never carries from one byte into the next).
#[inline]
fn zero_bytes(x: u64) -> u64 {
    const LOW7: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    !(((x & LOW7) + LOW7) | x) & HI
}

/// Bytes that the eight bytes of `w` take once escaped, exactly.
#[inline]
fn word_escaped_len(w: u64) -> usize {
    let control = zero_bytes(w & (LO * 0xE0)); // bytes below 0x20
    let quote = zero_bytes(w ^ (LO * u64::from(b'"')));
    let backslash = zero_bytes(w ^ (LO * u64::from(b'\\')));
    if control != 0 {
        let short = zero_bytes(w ^ (LO * 0x0A)) | zero_bytes(w ^ (LO * 0x0D)) | zero_bytes(w ^ (LO * 0x09));
        if control & !short != 0 {
            // Rarer control characters (`\u00XX`, `\b`, `\f`): per byte.
            return w.to_le_bytes().iter().map(|&b| ESCAPED_LEN[b as usize] as usize).sum();
        }
    }
    // `\n`, `\r`, `\t`, `\"`, `\\`: one extra byte each. The multiply sums the
    // per-byte flags into the top byte (at most 8, so no overflow).
    let flags = (control | quote | backslash) >> 7;
    8 + (flags.wrapping_mul(LO) >> 56) as usize
}

/// The longest prefix of `s` (ending on a char boundary) whose escaped size
/// is at most `room`. Returns `s.len()` when all of it fits; may return 0 when
/// not even the first character fits.
pub fn fitting_prefix(s: &str, room: usize) -> usize {
    // Fast path: even at the worst escape ratio it fits.
    if s.len().saturating_mul(MAX_CHAR_ESCAPED) <= room {
        return s.len();
    }
    measure(s, room).0
}

/// Like [`fitting_prefix`], and also the escaped size of that prefix, so a
/// caller whose content grows can resume measuring where it stopped.
pub fn measure(s: &str, room: usize) -> (usize, usize) {
    let bytes = s.as_bytes();
    let mut used = 0usize;
    let mut i = 0usize;
    // Whole words while the next one fits (its escaped size is exact), then bytes.
    for word in bytes.chunks_exact(8) {
        let len = word_escaped_len(load(word));
        if used + len > room {
            break;
        }
        used += len;
        i += 8;
    }
    while i < bytes.len() {
        let len = ESCAPED_LEN[bytes[i] as usize] as usize;
        if used + len > room {
            let mut cut = i;
            while !s.is_char_boundary(cut) {
                cut -= 1;
                used -= ESCAPED_LEN[bytes[cut] as usize] as usize;
            }
            return (cut, used);
        }
        used += len;
        i += 1;
    }
    (s.len(), used)
}

/// How many trailing bytes of `b` form an incomplete UTF-8 character that
/// more input could complete (0 if none).
pub fn incomplete_utf8_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let byte = b[b.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // continuation byte: keep looking for the lead
        }
        let need = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_ascii_byte_is_counted_as_serde_json_writes_it() {
        for b in 0u8..0x80 {
            let s = (b as char).to_string();
            let mut out = Vec::new();
            write_escaped(&mut out, &s);
            assert_eq!(out.len() - 2, escaped_len(&s), "byte {b:#x}");
        }
    }

    #[test]
    fn a_cut_never_splits_a_character() {
        let s = "ab😀cd";
        assert_eq!(fitting_prefix(s, 3), 2);
        assert_eq!(fitting_prefix(s, 5), 2);
        assert_eq!(fitting_prefix(s, 6), 6);
        assert_eq!(fitting_prefix("\u{1}", 5), 0);
        assert_eq!(fitting_prefix("\u{1}", 6), 1);
    }

    #[test]
    fn the_word_length_is_exact_for_every_byte_at_every_position() {
        for b in 0u8..=255 {
            for pos in 0..8 {
                for fill in [b'a', b'"', b'\n', 0x01, 0xC3] {
                    let mut w = [fill; 8];
                    w[pos] = b;
                    let want: usize = w.iter().map(|&b| ESCAPED_LEN[b as usize] as usize).sum();
                    assert_eq!(
                        word_escaped_len(u64::from_le_bytes(w)),
                        want,
                        "byte {b:#x} at {pos} in {fill:#x}"
                    );
                }
            }
        }
    }

    proptest! {
        #[test]
        fn escaped_len_matches_serde_json(s in any::<String>()) {
            let mut out = Vec::new();
            write_escaped(&mut out, &s);
            prop_assert_eq!(out.len() - 2, escaped_len(&s));
        }

        #[test]
        fn word_length_matches_the_byte_table(w in any::<[u8; 8]>()) {
            let want: usize = w.iter().map(|&b| ESCAPED_LEN[b as usize] as usize).sum();
            prop_assert_eq!(word_escaped_len(u64::from_le_bytes(w)), want);
        }

        #[test]
        fn the_fitting_writer_cuts_where_fitting_prefix_does(s in any::<String>(), room in 0usize..256, guess in 0usize..300) {
            let mut out = b"x".to_vec();
            let cut = write_escaped_fitting(&mut out, &s, room, guess);
            prop_assert_eq!(cut, fitting_prefix(&s, room));
            let mut want = b"x".to_vec();
            write_escaped(&mut want, &s[..cut]);
            prop_assert_eq!(out, want);
        }

        #[test]
        fn the_fitting_writer_cuts_escape_dense_text_exactly(s in "[a\"\\\\\n\u{1}é😀]{0,700}", room in 0usize..2100, guess in 0usize..2100) {
            let mut out = Vec::new();
            let cut = write_escaped_fitting(&mut out, &s, room, guess);
            prop_assert_eq!(cut, fitting_prefix(&s, room));
            prop_assert_eq!(out.len() - 2, escaped_len(&s[..cut]));
        }

        #[test]
        fn fitting_prefix_is_maximal_and_within_room(s in any::<String>(), room in 0usize..256) {
            let cut = fitting_prefix(&s, room);
            prop_assert!(s.is_char_boundary(cut));
            prop_assert!(escaped_len(&s[..cut]) <= room);
            prop_assert_eq!(measure(&s, room), (cut, escaped_len(&s[..cut])));
            if cut < s.len() {
                let next = s[cut..].chars().next().unwrap().len_utf8();
                prop_assert!(escaped_len(&s[..cut + next]) > room);
            }
        }
    }

    #[test]
    fn incomplete_utf8_tails_are_found() {
        let s = "a😀".as_bytes();
        assert_eq!(incomplete_utf8_tail(s), 0);
        for cut in 2..s.len() {
            assert_eq!(incomplete_utf8_tail(&s[..cut]), cut - 1);
        }
        assert_eq!(incomplete_utf8_tail(b"\xff"), 0);
    }
}
