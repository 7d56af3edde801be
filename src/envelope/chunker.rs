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

/// Whether any byte of the word needs escaping (`< 0x20`, `"` or `\\`).
/// Exact for "is there such a byte" (the classic has-zero-byte trick).
#[inline]
fn word_needs_escape(w: u64) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let below_space = w.wrapping_sub(LO * 0x20) & !w & HI;
    let q = w ^ (LO * u64::from(b'"'));
    let quote = q.wrapping_sub(LO) & !q & HI;
    let b = w ^ (LO * u64::from(b'\\'));
    let backslash = b.wrapping_sub(LO) & !b & HI;
    (below_space | quote | backslash) != 0
}

/// The longest prefix of `s` (ending on a char boundary) whose escaped size
/// is at most `room`. Returns `s.len()` when all of it fits; may return 0 when
/// not even the first character fits.
pub fn fitting_prefix(s: &str, room: usize) -> usize {
    // Fast path: even at the worst escape ratio it fits.
    if s.len().saturating_mul(MAX_CHAR_ESCAPED) <= room {
        return s.len();
    }
    let bytes = s.as_bytes();
    let mut used = 0usize;
    let mut i = 0usize;
    while i < bytes.len() {
        // Eight plain bytes at a time: each costs exactly one.
        if used + 8 <= room {
            if let Some(word) = bytes.get(i..i + 8).and_then(|w| <[u8; 8]>::try_from(w).ok()) {
                if !word_needs_escape(u64::from_le_bytes(word)) {
                    used += 8;
                    i += 8;
                    continue;
                }
            }
        }
        used += ESCAPED_LEN[bytes[i] as usize] as usize;
        if used > room {
            let mut cut = i;
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            return cut;
        }
        i += 1;
    }
    s.len()
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
    fn the_word_test_finds_exactly_the_bytes_that_need_escaping() {
        for b in 0u8..=255 {
            for pos in 0..8 {
                let mut w = [b'a'; 8];
                w[pos] = b;
                let needs = b < 0x20 || b == b'"' || b == b'\\';
                assert_eq!(word_needs_escape(u64::from_le_bytes(w)), needs, "byte {b:#x} at {pos}");
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
        fn fitting_prefix_is_maximal_and_within_room(s in any::<String>(), room in 0usize..64) {
            let cut = fitting_prefix(&s, room);
            prop_assert!(s.is_char_boundary(cut));
            prop_assert!(escaped_len(&s[..cut]) <= room);
            if cut < s.len() {
                let next = s[cut..].chars().next().unwrap().len_utf8();
                prop_assert!(escaped_len(&s[..cut + next]) > room);
            }
        }
    }
}
