//! Adversarial content and seeded scenario generation for the emitter.

use serde_json::{json, Value};

use super::super::rng::Rng;
use super::emitter::{Args, Attr, Citation, ClientContent, Format, Image, Item, MetaInit, ServerContent};

/// Pieces that each break some naive reading of the legacy format.
pub const NASTY: &[&str] = &[
    "\n",
    "\r\n",
    "a\rb",
    "\\",
    "\\n",
    "\\\\n",
    "C:\\new\\table",
    "\\u0041",
    "\"",
    "'",
    "\"quoted\" 'single'",
    "<",
    ">",
    "&",
    "&amp;",
    "&lt;not an entity&gt;",
    "&#x27;",
    "&nbsp;",
    "]]>",
    "]]",
    "<![CDATA[",
    "</content-block-text>",
    "<content-block-text>",
    "</content-block-thinking>",
    "<content-block-error><![CDATA[boom]]></content-block-error>",
    "<chart>",
    "<table><tr><td>1</td></tr></table>",
    "a < b && c > d",
    "[DONE]",
    "data: fake",
    ":comment",
    "😀",
    "👩‍👩‍👧",
    "漢字テスト",
    "e\u{301}",
    "Z\u{324}\u{308}",
    "\u{0}",
    "\u{1}",
    "\u{7}",
    "\u{8}",
    "\t",
    "\u{b}",
    "\u{c}",
    "\u{1b}[31m",
    "\u{7f}",
    "\u{85}",
    "\u{2028}",
    "\u{feff}",
    "{\"error\": \"x\"}",
    "\u{10ffff}",
];

const WORDS: &[&str] = &[
    "the",
    "agent",
    "said",
    "hello",
    "world",
    "streaming",
    "tokens",
    "fine",
    "ok",
    "result",
    "λ",
    "naïve",
    "café",
];

/// A random mix of nasty pieces and words, `n` parts.
pub fn text(rng: &mut Rng, n: usize) -> String {
    let mut s = String::new();
    for _ in 0..n {
        if rng.chance(0.5) {
            s.push_str(rng.pick::<&str>(NASTY));
        } else {
            s.push_str(rng.pick::<&str>(WORDS));
            s.push(' ');
        }
    }
    s
}

/// Legacy tag names: an event that is (or ends with) one of these is an
/// item or a close, by DESIGN 3.6, not model text.
const LEGACY_TAGS: &[&str] = &[
    "content-block-",
    "meta_init",
    "meta_final",
    "awaiting_frontend_tools",
    "citations",
];

/// Whether `d` can be a model delta in the XML dialect without being
/// ambiguous by DESIGN 3.6: not empty, not ending with its block's closing tag,
/// not a whole legacy item, not JSON-looking (the failure shape, raw events).
pub fn xml_delta_ok(d: &str, kind: &str) -> bool {
    let t = d.trim();
    let whole_item = t.starts_with('<') && t.ends_with('>') && LEGACY_TAGS.iter().any(|g| t.contains(g));
    let ambiguous =
        d.is_empty() || d.ends_with(&format!("</content-block-{kind}>")) || whole_item || t.starts_with('{');
    !ambiguous
}

/// `n` deltas for a streamed block.
pub fn deltas(rng: &mut Rng, n: usize, kind: &str, raw: bool) -> Vec<String> {
    let mut v = Vec::new();
    while v.len() < n {
        let parts = rng.range(1, 4);
        let d = text(rng, parts);
        if raw || xml_delta_ok(&d, kind) {
            v.push(d);
        }
    }
    v
}

/// Content that must not contain `]]>` directly followed by `closing`.
pub fn cdata_text(rng: &mut Rng, n: usize, closing: &str) -> String {
    loop {
        let s = text(rng, n);
        if !s.contains(&format!("]]>{closing}")) {
            return s;
        }
    }
}

pub fn citation(rng: &mut Rng, kind: usize, raw: bool) -> Citation {
    let num = |rng: &mut Rng, n: u64| {
        if raw || rng.chance(0.5) {
            Attr::Num(n)
        } else {
            Attr::Str(n.to_string())
        }
    };
    let cited = if raw {
        text(rng, 3)
    } else {
        cdata_text(rng, 3, "</citation>")
    };
    let title = if rng.chance(0.25) {
        String::new()
    } else {
        format!("Doc \"{}\" & <co>", rng.pick(WORDS))
    };
    match kind % 3 {
        0 => {
            let (index, start, end) = (num(rng, 0), num(rng, 12), num(rng, 345));
            Citation::char_location(index, &title, start, end, cited)
        }
        1 => {
            let (index, start, end) = (num(rng, 2), num(rng, 3), num(rng, 4));
            Citation::page_location(index, &title, start, end, cited)
        }
        _ => {
            let title = format!("It's <b>{}</b>", rng.pick(WORDS));
            let url = "https://example.com/a?b=1&c=\"2\"";
            Citation::web_location(url, &title, "Eo8BCioIAhgBIiQ0NjRiZDc0Zi1i==", cited)
        }
    }
}

pub fn image(rng: &mut Rng) -> Image {
    if rng.chance(0.5) {
        Image::new("https://img.example.com/p.png?w=1&h=2", "image/png")
    } else {
        Image::new("data:image/jpeg;base64,/9j/4AAQSkZJRgABAQ==", "image/jpeg")
    }
}

/// A plain client tool result that is not JSON (so the newline rule applies).
pub fn client_text(rng: &mut Rng, n: usize) -> String {
    loop {
        let s = format!("out: {}", text(rng, n));
        if serde_json::from_str::<Value>(&s).is_err() {
            return s;
        }
    }
}

pub fn structured(rng: &mut Rng) -> Value {
    if rng.chance(0.5) {
        json!({"stdout": text(rng, 4), "code": 0, "lines": [text(rng, 2), "a]]>b", "x\ny"], "ok": true})
    } else {
        json!([{"name": text(rng, 2), "size": 12}, {"path": "C:\\tmp\\new", "note": "line1\nline2\r\n"}])
    }
}

pub fn args(rng: &mut Rng) -> Args {
    match rng.below(4) {
        0 => Args::Empty,
        1 => Args::Json(json!({"query": text(rng, 3)})),
        2 => Args::Json(json!({"path": "C:\\new\\file.txt", "content": text(rng, 4), "n": 3, "flags": [true, null]})),
        _ => Args::Json(json!({"nested": {"q": "a\"b", "html": "<b>&amp;</b>"}, "emoji": "😀"})),
    }
}

pub fn meta_init(rng: &mut Rng, agent: &str, parent: Option<&str>, format: Format) -> MetaInit {
    let user_query = text(rng, 3);
    MetaInit::new(
        agent,
        parent,
        format,
        &user_query,
        rng.chance(0.3).then(
            || json!([{"role": "user", "content": text(rng, 3)}, {"role": "assistant", "content": text(rng, 3)}]),
        ),
    )
}

pub fn meta_final(rng: &mut Rng) -> Value {
    json!({
        "conversation_history": [{"role": "assistant", "content": text(rng, 2)}],
        "stop_reason": "end_turn",
        "total_steps": 3,
        "generated_files": ["out/a.txt"],
        "cost": 0.25,
        "cumulative_usage": {"input_tokens": 10, "output_tokens": 20}
    })
}

struct Gen<'a> {
    rng: &'a mut Rng,
    raw: bool,
    items: Vec<Item>,
    next_id: usize,
    next_agent: usize,
    /// Subagents only under a meta_init-named agent (see the fallback
    /// scenario in tests/scenarios.rs for the other case).
    subagents: bool,
}

impl Gen<'_> {
    fn id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}_{:02}", self.next_id)
    }

    fn text_block(&mut self, open_end: bool) {
        let n = self.rng.range(0, 5);
        let raw = self.raw;
        let deltas = deltas(self.rng, n.max(usize::from(open_end)), "text", raw);
        let citations = if !open_end && self.rng.chance(0.3) {
            let k = self.rng.range(1, 3);
            let start = self.rng.below(3);
            (0..k).map(|i| citation(self.rng, start + i, raw)).collect()
        } else {
            vec![]
        };
        let one_event = !raw && !open_end && self.rng.chance(0.2);
        self.items.push(Item::Text {
            deltas,
            close: !open_end,
            one_event,
            citations,
        });
    }

    fn turn(&mut self, agent: &str, depth: usize) {
        if self.rng.chance(0.5) {
            let n = self.rng.range(1, 4);
            let raw = self.raw;
            let deltas = deltas(self.rng, n, "thinking", raw);
            self.items.push(Item::Thinking { deltas, close: true });
        }
        if self.raw && self.rng.chance(0.3) {
            self.items.push(Item::RawNoise);
        }
        self.text_block(false);
        for _ in 0..self.rng.range(0, 2) {
            let id = self.id("toolu");
            let name = self.rng.pick(&["search", "read_file", "a&b \"tool\" <x>"]).to_string();
            let a = args(self.rng);
            self.items.push(Item::call(false, &id, &name, a));
            let content = match self.rng.below(3) {
                0 => ClientContent::Text(client_text(self.rng, 5)),
                1 => ClientContent::Structured(structured(self.rng)),
                _ => {
                    let text = client_text(self.rng, 3);
                    let images = (0..self.rng.range(1, 2)).map(|_| image(self.rng)).collect();
                    ClientContent::Multimodal { text, images }
                }
            };
            self.items.push(Item::ToolResult { id, name, content });
        }
        if self.rng.chance(0.3) {
            let id = self.id("srvtoolu");
            let a = args(self.rng);
            self.items.push(Item::call(true, &id, "web_search", a));
            let tag = self
                .rng
                .pick(&[
                    "server_tool_result",
                    "web_search_tool_result",
                    "code_execution_tool_result",
                ])
                .to_string();
            let name = self.rng.chance(0.5).then(|| "web_search".to_owned());
            let content = if self.raw && self.rng.chance(0.6) {
                ServerContent::Json(json!([{"type": "web_search_result", "url": "https://e.com/?a=1&b=2",
                    "title": text(self.rng, 2), "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1="}]))
            } else {
                let closing = format!("</content-block-{tag}>");
                ServerContent::Text(cdata_text(self.rng, 5, &closing))
            };
            self.items.push(Item::ServerToolResult { tag, id, name, content });
        }
        if self.subagents && depth < 2 && self.rng.chance(0.35) {
            self.subagent(agent, depth);
        }
    }

    fn subagent(&mut self, parent: &str, depth: usize) {
        let spawn = self.id("toolu_spawn");
        let a = Args::Json(json!({"task": text(self.rng, 2)}));
        self.items.push(Item::call(false, &spawn, "spawn_subagent", a));
        self.next_agent += 1;
        let child = format!("agent-child-{}-{depth}", self.next_agent);
        let format = if self.raw { Format::Raw } else { Format::Xml };
        let mi = meta_init(self.rng, &child, Some(parent), format);
        self.items.push(Item::MetaInit(mi));
        for _ in 0..self.rng.range(1, 2) {
            self.turn(&child, depth + 1);
        }
        if self.rng.chance(0.4) {
            let v = meta_final(self.rng);
            self.items.push(Item::MetaFinal(v));
        }
        // The parent's spawn call returns: closes the child scope (and any
        // grandchild left open) if meta_final did not.
        let content = ClientContent::Text(client_text(self.rng, 2));
        self.items.push(Item::ToolResult {
            id: spawn,
            name: "spawn_subagent".into(),
            content,
        });
    }
}

/// A random scenario in the given dialect.
pub fn scenario(rng: &mut Rng, raw: bool) -> Vec<Item> {
    let mut g = Gen {
        rng,
        raw,
        items: Vec::new(),
        next_id: 0,
        next_agent: 0,
        subagents: true,
    };
    let top = "agent-top-0000";
    let format = if raw { Format::Raw } else { Format::Xml };
    // Resumed runs send no meta_init (DESIGN 3.6): the fallback agent.
    let has_meta = raw || g.rng.chance(0.85);
    g.subagents = has_meta;
    let agent = if has_meta {
        let mi = meta_init(g.rng, top, None, format);
        g.items.push(Item::MetaInit(mi));
        top.to_owned()
    } else {
        super::envelopes::FALLBACK.to_owned()
    };
    for _ in 0..g.rng.range(1, 3) {
        g.turn(&agent, 0);
    }
    if !raw {
        if g.rng.chance(0.3) {
            let c = cdata_text(g.rng, 3, "</content-block-error>");
            g.items.push(Item::ContentError(c));
        }
        if g.rng.chance(0.3) {
            let v = json!({"files": [{"name": text(g.rng, 2), "path": "/out/a]]>b.txt", "size": 10}]});
            g.items.push(Item::MetaFiles(v));
        }
    }
    if g.rng.chance(0.3) {
        let q = text(g.rng, 2);
        g.items.push(Item::AwaitingFrontendTools(
            json!([{"tool_use_id": "toolu_fe", "name": "ask_user", "input": {"q": q}}]),
        ));
    }
    match g.rng.below(10) {
        0 | 1 => {
            // The model stream fails inside an open text block (DESIGN 3.6).
            g.text_block(true);
            let message = text(g.rng, 2);
            g.items.push(Item::Failure {
                error: "APIError".into(),
                message,
                traceback: "Traceback (most recent call last):\n  File \"x.py\"".into(),
            });
        }
        2 => {
            g.items.push(Item::failure("RuntimeError", "boom", "tb"));
        }
        3 => g.items.push(Item::Done),
        _ => {
            let v = meta_final(g.rng);
            g.items.push(Item::MetaFinal(v));
            g.items.push(Item::Done);
        }
    }
    g.items
}
