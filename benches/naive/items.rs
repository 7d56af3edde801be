//! Whole legacy items, parsed with a `quick_xml::Reader` and unescaped per item kind (DESIGN 3.3).

use quick_xml::events::{BytesStart, Event};
use quick_xml::Reader;
use serde_json::Value;

use super::Naive;

/// Citation attributes sent as JSON numbers (DESIGN 3.3).
const NUMERIC: &[&str] = &[
    "document_index",
    "start_char_index",
    "end_char_index",
    "start_page_number",
    "end_page_number",
    "start_block_index",
    "end_block_index",
];

/// The item's root tag name.
fn root_name(item: &str) -> &str {
    let rest = item.strip_prefix('<').unwrap_or("");
    let end = rest
        .find(|c: char| c.is_ascii_whitespace() || c == '>' || c == '/')
        .unwrap_or(rest.len());
    &rest[..end]
}

/// An event that is exactly the open tag of a streamed block.
pub fn opens_block(data: &str) -> Option<&'static str> {
    match data {
        "<content-block-text>" => Some("text"),
        "<content-block-thinking>" => Some("thinking"),
        _ => None,
    }
}

/// The item ends with its own closing tag (or is one self-closing tag).
pub fn is_complete(item: &str) -> bool {
    let name = root_name(item);
    if name.is_empty() {
        return false;
    }
    let close_at = item.len().checked_sub(name.len() + 3);
    let closed = close_at.is_some_and(|at| {
        item.is_char_boundary(at) && &item[at..at + 2] == "</" && &item[at + 2..item.len() - 1] == name
    }) && item.ends_with('>');
    closed || (item.ends_with("/>") && item.find('>') == Some(item.len() - 1))
}

/// Undo the formatter's double escape in one left-to-right pass: `\\` → `\`, `\n` → newline, any other
/// `\x` kept.
pub fn formatter_unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// The root start tag and the offset of the byte after it.
fn start_tag(item: &str) -> Result<(BytesStart<'_>, usize), String> {
    let mut r = Reader::from_str(item);
    match r.read_event() {
        Ok(Event::Start(e)) | Ok(Event::Empty(e)) => {
            let end = r.buffer_position() as usize;
            Ok((e, end))
        }
        Ok(other) => Err(format!("expected a start tag, got {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Attributes as (name, HTML-unescaped value), in order.
fn attributes(tag: &BytesStart<'_>) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for a in tag.attributes() {
        let a = a.map_err(|e| e.to_string())?;
        let key = String::from_utf8_lossy(a.key.as_ref()).into_owned();
        let value = a.unescape_value().map_err(|e| e.to_string())?.into_owned();
        out.push((key, value));
    }
    Ok(out)
}

fn attr<'a>(attrs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// A CDATA body that may contain `]]>`: the section ends at the `]]>` that ends the body (DESIGN 3.6).
fn cdata_body(body: &str) -> &str {
    match body.strip_prefix("<![CDATA[").and_then(|b| b.strip_suffix("]]>")) {
        Some(inner) => inner,
        None => body,
    }
}

impl Naive {
    pub(super) fn on_item(&mut self, item: &str, out: &mut Vec<u8>) {
        if let Err(message) = self.try_item(item, out) {
            self.parse_error("syntax", &message, out);
        }
    }

    fn try_item(&mut self, item: &str, out: &mut Vec<u8>) -> Result<(), String> {
        let name = root_name(item).to_string();
        let (tag, body_start) = start_tag(item)?;
        let attrs = attributes(&tag)?;
        let body_end = item.len().saturating_sub(name.len() + 3).max(body_start);
        let body = &item[body_start..body_end];
        let id_name = |attrs: &[(String, String)], default_name: &str| -> Vec<(&'static str, Value)> {
            vec![
                ("id", attr(attrs, "id").unwrap_or_default().into()),
                ("name", attr(attrs, "name").unwrap_or(default_name).into()),
            ]
        };
        match name.as_str() {
            "meta_init" => {
                let data = attr(&attrs, "data").ok_or("meta_init without data")?;
                let mut v: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
                let agent = v.get("agent_uuid").and_then(Value::as_str).map(str::to_string);
                if self.opts.rewrite_format && matches!(v.get("format").and_then(Value::as_str), Some("xml" | "raw")) {
                    v["format"] = "json".into();
                }
                if let Some(agent) = agent {
                    self.agent = agent;
                }
                self.chunks(out, "meta_init", false, &v.to_string(), &[]);
            }
            "meta_final" | "awaiting_frontend_tools" => {
                let data = attr(&attrs, "data").ok_or("item without data")?;
                self.chunks(
                    out,
                    if name == "meta_final" {
                        "meta_final"
                    } else {
                        "awaiting_frontend_tools"
                    },
                    false,
                    data,
                    &[],
                );
            }
            "content-block-tool_call" | "content-block-server_tool_call" => {
                let args = formatter_unescape(attr(&attrs, "arguments").unwrap_or_default());
                let args = if args.is_empty() || args == "\"\"" {
                    "{}".to_string()
                } else {
                    args
                };
                let kind = if name == "content-block-tool_call" {
                    "tool_call"
                } else {
                    "server_tool_call"
                };
                self.chunks(out, kind, false, &args, &id_name(&attrs, ""));
            }
            "content-block-tool_result" => self.client_result(item, &attrs, out)?,
            "content-block-text" | "content-block-thinking" => {
                let kind = if name == "content-block-text" {
                    "text"
                } else {
                    "thinking"
                };
                self.delta(out, kind, body);
                self.envelope(out, kind, true, "", &[]);
            }
            "content-block-error" => {
                let text = formatter_unescape(cdata_body(body));
                self.chunks(out, "error", false, &text, &[]);
            }
            "content-block-meta_files" => self.chunks(out, "meta_files", false, cdata_body(body), &[]),
            "citations" => self.citations(body, out)?,
            n if n.starts_with("content-block-") && n.ends_with("_tool_result") => {
                let stem = &n["content-block-".len()..];
                let text = formatter_unescape(cdata_body(body));
                self.chunks(out, "server_tool_result", false, &text, &id_name(&attrs, stem));
            }
            other => return Err(format!("unknown item <{other}>")),
        }
        Ok(())
    }

    /// A client tool result: adjacent CDATA sections joined, `\n` turned into newlines unless the content
    /// is JSON as it stands; multimodal `<text>`/`<image/>` children as DESIGN 4 says.
    fn client_result(&mut self, item: &str, attrs: &[(String, String)], out: &mut Vec<u8>) -> Result<(), String> {
        let id = attr(attrs, "id").unwrap_or_default();
        let name = attr(attrs, "name").unwrap_or_default();
        let mut r = Reader::from_str(item);
        let mut content = String::new();
        let mut images = Vec::new();
        let mut multimodal = false;
        loop {
            match r.read_event().map_err(|e| e.to_string())? {
                Event::CData(c) => content.push_str(std::str::from_utf8(&c).map_err(|e| e.to_string())?),
                Event::Start(e) if e.name().as_ref() == b"text" => multimodal = true,
                Event::Empty(e) if e.name().as_ref() == b"image" => {
                    multimodal = true;
                    images.push(attributes(&e)?);
                }
                Event::Eof => break,
                _ => {}
            }
        }
        let text = if serde_json::from_str::<serde::de::IgnoredAny>(&content).is_ok() {
            content
        } else {
            content.replace("\\n", "\n")
        };
        let extras: [(&str, Value); 2] = [("id", id.into()), ("name", name.into())];
        if !multimodal {
            self.chunks(out, "tool_result", false, &text, &extras);
            return Ok(());
        }
        if !text.is_empty() {
            self.chunks(out, "tool_result", true, &text, &extras);
        }
        for img in &images {
            let img_extras: [(&str, Value); 3] = [
                ("id", id.into()),
                ("src", attr(img, "src").unwrap_or_default().into()),
                ("media_type", attr(img, "media_type").unwrap_or_default().into()),
            ];
            self.envelope(out, "tool_result_image", false, "", &img_extras);
        }
        self.envelope(out, "tool_result", true, "", &extras);
        Ok(())
    }

    /// `<citation …><![CDATA[…]]></citation>` children: one envelope each, the last final.
    fn citations(&mut self, body: &str, out: &mut Vec<u8>) -> Result<(), String> {
        let mut found = Vec::new();
        let mut rest = body;
        while let Some(at) = rest.find("<citation") {
            let (tag, end) = start_tag(&rest[at..])?;
            let attrs = attributes(&tag)?;
            let after = &rest[at + end..];
            let close = after.find("]]></citation>").ok_or("unterminated citation")?;
            let cdata = after[..close]
                .strip_prefix("<![CDATA[")
                .ok_or("citation without CDATA")?;
            found.push((attrs, formatter_unescape(cdata)));
            rest = &after[close + "]]></citation>".len()..];
        }
        let n = found.len();
        for (i, (attrs, text)) in found.into_iter().enumerate() {
            let mut extras: Vec<(&str, Value)> = Vec::new();
            let ctype = attr(&attrs, "type").unwrap_or_default().to_string();
            extras.push(("citation_type", ctype.into()));
            for (k, v) in &attrs {
                if k == "type" || v.is_empty() {
                    continue;
                }
                let value = match v.parse::<i64>() {
                    Ok(num) if NUMERIC.contains(&k.as_str()) => num.into(),
                    _ => v.as_str().into(),
                };
                extras.push((k.as_str(), value));
            }
            // One citation is one envelope: never split, even over budget.
            self.envelope(out, "citation", i + 1 == n, &text, &extras);
        }
        Ok(())
    }
}
