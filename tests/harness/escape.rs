//! The legacy backend's escapes (DESIGN 3.3), written from the design: shared by the emitter, the small legacy
//! corpus and the benches' inputs (which include this file by path).

#![allow(dead_code)]

/// Formatter items (DESIGN 3.3): every `\` doubled, then every newline
/// written as the two characters `\n`.
pub fn formatter_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Python's `html.escape(s, quote=True)`, or numeric references for quotes.
pub fn html_escape(s: &str, numeric_refs: bool) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' if numeric_refs => out.push_str("&#34;"),
            '"' => out.push_str("&quot;"),
            '\'' if numeric_refs => out.push_str("&#39;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
    out
}

/// Client tool results (DESIGN 3.3): CRLF and CR normalised to LF, LF
/// written as `\n`, backslashes left alone. Returns the escaped content
/// before the `]]>` split.
pub fn client_escape(s: &str) -> String {
    s.replace("\r\n", "\n").replace('\r', "\n").replace('\n', "\\n")
}

/// `]]>` inside a client tool result's CDATA, split across two sections.
pub fn cdata_split(s: &str) -> String {
    s.replace("]]>", "]]]]><![CDATA[>")
}
