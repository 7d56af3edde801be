//! The identifiers every envelope repeats (agent ids, tool ids and names): a length bound and a character set.
//!
//! Every envelope carries its agent, and tool envelopes their id and name, so an unbounded identifier multiplies
//! the output by its length (DESIGN 4's budget cannot hold). The legacy backends send UUIDs (36 bytes), API tool ids
//! (`toolu_…`, ~30 bytes) and tool names of at most 64 bytes; the bound leaves room for far more. Control
//! characters are refused: they would cost six bytes each once JSON-escaped, and a line break forges log lines.

/// Longest identifier accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// Whether `id` is an acceptable identifier: at most [`MAX_ID_BYTES`] bytes and no control character (C0, DEL,
/// C1), so it takes at most twice its length in JSON (`"` and `\\`; never a 6-byte `\u00XX`) and cannot break a
/// log line. The empty string passes (a missing attribute is not an attack); callers that need an id treat empty
/// as absent.
pub fn is_valid(id: &str) -> bool {
    id.len() <= MAX_ID_BYTES && !id.chars().any(char::is_control)
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
    fn long_identifiers_and_control_characters_fail() {
        assert!(is_valid(&"a".repeat(MAX_ID_BYTES)));
        assert!(!is_valid(&"a".repeat(MAX_ID_BYTES + 1)));
        assert!(!is_valid(&"é".repeat(MAX_ID_BYTES / 2 + 1)));
        for bad in ["a\nb", "a\rb", "a\u{1}b", "tab\t", "del\u{7f}", "c1\u{85}"] {
            assert!(!is_valid(bad), "{bad:?}");
        }
        // Printable characters are fine, even those JSON or HTML escape: the legacy formatter escapes them.
        for ok in ["a b", "a&b \"tool\" <x>", "é", "a'b", "a\\b"] {
            assert!(is_valid(ok), "{ok:?}");
        }
    }

    #[test]
    fn a_valid_identifier_takes_at_most_twice_its_length_in_json() {
        for c in (0u32..0x3000).filter_map(char::from_u32) {
            let s = c.to_string().repeat(4);
            if is_valid(&s) {
                assert!(serde_json::to_string(&s).unwrap().len() - 2 <= 2 * s.len(), "{c:?}");
            }
        }
    }
}
