//! The identifiers every envelope repeats (agent ids, tool ids and names): a length bound and a character set.
//!
//! Every envelope carries its agent, and tool envelopes their id and name, so an unbounded identifier multiplies
//! the output by its length (DESIGN 4's budget cannot hold). The legacy backends send UUIDs (36 bytes), API tool ids
//! (`toolu_…`, ~30 bytes) and tool names of at most 64 bytes; the bound leaves room for far more.

/// Longest identifier accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Whether `b` may appear in an identifier: printable ASCII except the characters that JSON, HTML or a log line
/// would escape or read specially (`"` `\` `<` `>` `&` `'` `` ` ``). Each allowed byte takes one byte in JSON.
const fn allowed(b: u8) -> bool {
    matches!(b, 0x21..=0x7E) && !matches!(b, b'"' | b'\\' | b'<' | b'>' | b'&' | b'\'' | b'`')
}

/// Whether `id` is an acceptable identifier: at most [`MAX_ID_BYTES`] bytes, every byte allowed. The empty string
/// passes (a missing attribute is not an attack); callers that need an id treat empty as absent.
pub fn is_valid(id: &str) -> bool {
    id.len() <= MAX_ID_BYTES && id.bytes().all(allowed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_identifiers_pass() {
        for id in [
            "",
            "3f2b8c1e-9d4a-4e6b-8f0a-1c2d3e4f5a6b",
            "toolu_01A09q90qw90lq917835lq9",
            "srvtoolu_014hJH82Qum7Td6UV8gDXThB",
            "mcp__github__create_issue",
            "web_search_tool_result",
            "agent-child-3-1",
        ] {
            assert!(is_valid(id), "{id}");
        }
    }

    #[test]
    fn long_or_escaping_identifiers_fail() {
        assert!(is_valid(&"a".repeat(MAX_ID_BYTES)));
        assert!(!is_valid(&"a".repeat(MAX_ID_BYTES + 1)));
        for bad in [
            "a b", "a\"b", "a\\b", "a\nb", "a\u{1}b", "<x>", "a&b", "é", "a'b", "tab\t",
        ] {
            assert!(!is_valid(bad), "{bad:?}");
        }
    }

    #[test]
    fn an_allowed_byte_is_one_byte_of_json() {
        for b in 0u8..=0x7F {
            if allowed(b) {
                let s = (b as char).to_string();
                assert_eq!(serde_json::to_string(&s).unwrap().len(), 3, "{b:#x}");
            }
        }
    }
}
