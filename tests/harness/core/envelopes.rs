//! The translator's output side: parse `data: <json>\n\n` events, check the
//! envelope shape and the byte budget, group envelopes into blocks and
//! compare them with an emitter's expectation.

use serde_json::Value;
use sse_gateway::translate::{Options, Stats, Translator};

use super::super::sse::events;
use super::emitter::{is_native_split, native_split, Block, Expect};

pub const FALLBACK: &str = "fallback-agent";

/// One parsed output event.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    Env(Envelope),
    Done,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub kind: String,
    pub agent: String,
    pub fin: bool,
    pub delta: String,
    pub extras: Vec<(String, Value)>,
    /// Byte length of the JSON object (what the budget bounds).
    pub len: usize,
    /// The JSON object as sent.
    pub json: String,
}

/// Runs the translator over `input` cut at `cuts` (sorted offsets), then
/// finishes.
pub fn run(opts: &Options, input: &[u8], cuts: &[usize]) -> (Vec<u8>, Stats) {
    let mut t = Translator::new(opts.clone(), FALLBACK);
    let mut out = Vec::new();
    let mut from = 0;
    for &c in cuts {
        t.feed(&input[from..c], &mut out);
        from = c;
    }
    t.feed(&input[from..], &mut out);
    t.finish(&mut out);
    (out, t.observer().clone())
}

/// Feeds `input` in one-byte pieces.
pub fn run_bytewise(opts: &Options, input: &[u8]) -> Vec<u8> {
    let mut t = Translator::new(opts.clone(), FALLBACK);
    let mut out = Vec::new();
    for b in input.chunks(1) {
        t.feed(b, &mut out);
    }
    t.finish(&mut out);
    out
}

/// Parses the output stream strictly: every event is `data: <line>\n\n`,
/// the line is `[DONE]` or a compact JSON object whose first keys are
/// `type, agent, final, delta` (a string).
pub fn parse(out: &[u8]) -> Result<Vec<Out>, String> {
    let text = std::str::from_utf8(out).map_err(|e| format!("output is not UTF-8: {e}"))?;
    let mut res = Vec::new();
    for event in events(text) {
        let event = event?;
        let Some(line) = event.strip_prefix("data: ") else {
            return Err(format!("event does not start with `data: `: {:?}", head(event)));
        };
        if line.contains('\n') || line.contains('\r') {
            return Err(format!("line break inside an event: {:?}", head(line)));
        }
        if line == "[DONE]" {
            res.push(Out::Done);
            continue;
        }
        res.push(Out::Env(envelope(line)?));
    }
    Ok(res)
}

fn envelope(line: &str) -> Result<Envelope, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e}): {:?}", head(line)))?;
    let Value::Object(m) = &v else {
        return Err(format!("not an object: {:?}", head(line)));
    };
    let keys: Vec<&str> = m.keys().map(String::as_str).take(4).collect();
    if keys != ["type", "agent", "final", "delta"] {
        return Err(format!(
            "first keys are {keys:?}, not type, agent, final, delta: {:?}",
            head(line)
        ));
    }
    // Compact: exactly what a compact serializer writes.
    if serde_json::to_string(&v).map_err(|e| e.to_string())? != line {
        return Err(format!("not compact JSON: {:?}", head(line)));
    }
    let s = |k: &str| {
        m[k].as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("`{k}` is not a string: {line:?}"))
    };
    let kind = s("type")?;
    if sse_gateway::envelope::EnvelopeKind::parse(&kind).is_none() {
        return Err(format!("unknown type {kind:?}"));
    }
    Ok(Envelope {
        kind,
        agent: s("agent")?,
        fin: m["final"]
            .as_bool()
            .ok_or_else(|| format!("`final` is not a bool: {line:?}"))?,
        delta: s("delta")?,
        extras: m.iter().skip(4).map(|(k, v)| (k.clone(), v.clone())).collect(),
        len: line.len(),
        json: line.to_owned(),
    })
}

fn head(s: &str) -> String {
    let mut end = s.len().min(160);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// A received block, with the per-envelope facts the comparison checks.
#[derive(Debug, Clone)]
pub struct Got {
    pub block: Block,
    pub envelopes: usize,
    /// Non-final envelopes with an empty delta (pointless except images).
    pub empty_nonfinal: usize,
}

#[derive(Debug, Clone)]
pub enum GotItem {
    Block(Got),
    Done,
}

/// Groups envelopes into blocks: consecutive envelopes of the same type,
/// agent and extras, up to and including a `final:true` one. A citation and
/// a `tool_result_image` are always blocks of one envelope.
pub fn group(outs: &[Out]) -> Vec<GotItem> {
    let mut res = Vec::new();
    let mut open: Option<Got> = None;
    for o in outs {
        let e = match o {
            Out::Done => {
                if let Some(g) = open.take() {
                    res.push(GotItem::Block(g));
                }
                res.push(GotItem::Done);
                continue;
            }
            Out::Env(e) => e,
        };
        let single = e.kind == "citation" || e.kind == "tool_result_image";
        let same = open.as_ref().is_some_and(|g| {
            !single && g.block.kind == e.kind && g.block.agent == e.agent && g.block.extras == e.extras
        });
        if !same {
            if let Some(g) = open.take() {
                res.push(GotItem::Block(g));
            }
            open = Some(Got {
                block: Block {
                    kind: e.kind.clone(),
                    agent: e.agent.clone(),
                    extras: e.extras.clone(),
                    content: String::new(),
                    closed: false,
                    final_delta_empty: None,
                    pieces: Vec::new(),
                },
                envelopes: 0,
                empty_nonfinal: 0,
            });
        }
        let Some(g) = open.as_mut() else { continue };
        g.envelopes += 1;
        g.block.content.push_str(&e.delta);
        g.block.pieces.push(e.delta.clone());
        if !e.fin && e.delta.is_empty() && e.kind != "tool_result_image" {
            g.empty_nonfinal += 1;
        }
        if e.fin || single {
            g.block.closed = e.fin;
            g.block.final_delta_empty = e.fin.then_some(e.delta.is_empty());
            if let Some(g) = open.take() {
                res.push(GotItem::Block(g));
            }
        }
    }
    if let Some(g) = open.take() {
        res.push(GotItem::Block(g));
    }
    res
}

fn short(s: &str) -> String {
    if s.len() <= 200 {
        return format!("{s:?}");
    }
    let mut a = 100;
    while !s.is_char_boundary(a) {
        a -= 1;
    }
    let mut b = s.len() - 80;
    while !s.is_char_boundary(b) {
        b += 1;
    }
    format!("{:?}…({} bytes)…{:?}", &s[..a], s.len(), &s[b..])
}

fn describe(b: &Block) -> String {
    format!(
        "{} agent={} extras={} closed={} final_empty={:?} content={}",
        b.kind,
        b.agent,
        Value::Object(b.extras.iter().cloned().collect()),
        b.closed,
        b.final_delta_empty,
        short(&b.content)
    )
}

/// Why two contents differ, or `None`.
fn content_diff(exp: &Block, got: &Block) -> Option<String> {
    if exp.content == got.content {
        return None;
    }
    let at = exp
        .content
        .bytes()
        .zip(got.content.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(exp.content.len().min(got.content.len()));
    let mut from = at.saturating_sub(30);
    while !exp.content.is_char_boundary(from) || !got.content.is_char_boundary(from) {
        from -= 1;
    }
    let win = |s: &str| {
        let mut end = (from + 60).min(s.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{:?}", &s[from..end])
    };
    Some(format!(
        "content differs at byte {at} (lengths {} vs {}): expected …{}… got …{}…",
        exp.content.len(),
        got.content.len(),
        win(&exp.content),
        win(&got.content)
    ))
}

/// Compares block by block; `Err` names the first difference.
pub fn compare(expected: &[Expect], got: &[GotItem]) -> Result<(), String> {
    for (i, pair) in expected.iter().zip(got.iter()).enumerate() {
        match pair {
            (Expect::Done, GotItem::Done) => {}
            (Expect::Block(e), GotItem::Block(g)) => {
                let b = &g.block;
                let why = if e.kind != b.kind {
                    Some("type".to_owned())
                } else if e.agent != b.agent {
                    Some("agent".to_owned())
                } else if e.extras != b.extras {
                    Some("extras (values or order)".to_owned())
                } else if let Some(d) = content_diff(e, b) {
                    Some(d)
                } else if e.closed != b.closed {
                    Some("final marker".to_owned())
                } else if e.final_delta_empty != b.final_delta_empty {
                    Some("final envelope's delta (streamed: empty; buffered: carries content)".to_owned())
                } else if g.empty_nonfinal > 0 {
                    Some(format!("{} non-final envelopes with an empty delta", g.empty_nonfinal))
                } else {
                    None
                };
                if let Some(why) = why {
                    return Err(format!(
                        "block {i}: {why}\n  expected: {}\n  got:      {}",
                        describe(e),
                        describe(b)
                    ));
                }
            }
            (e, g) => {
                let ed = match e {
                    Expect::Done => "[DONE]".to_owned(),
                    Expect::Block(b) => describe(b),
                };
                let gd = match g {
                    GotItem::Done => "[DONE]".to_owned(),
                    GotItem::Block(b) => describe(&b.block),
                };
                return Err(format!("block {i}:\n  expected: {ed}\n  got:      {gd}"));
            }
        }
    }
    if expected.len() != got.len() {
        let extra: Vec<String> = if got.len() > expected.len() {
            got[expected.len()..]
                .iter()
                .take(3)
                .map(|g| match g {
                    GotItem::Done => "[DONE]".into(),
                    GotItem::Block(b) => describe(&b.block),
                })
                .collect()
        } else {
            expected[got.len()..]
                .iter()
                .take(3)
                .map(|e| match e {
                    Expect::Done => "[DONE]".into(),
                    Expect::Block(b) => describe(b),
                })
                .collect()
        };
        return Err(format!(
            "expected {} blocks, got {}; first unmatched: {extra:#?}",
            expected.len(),
            got.len()
        ));
    }
    Ok(())
}

/// Size of an envelope with an empty delta: its fixed fields.
pub fn fixed_len(e: &Envelope) -> usize {
    let escaped = serde_json::to_string(&e.delta).map(|s| s.len()).unwrap_or(2);
    e.len - (escaped - 2)
}

/// The native formatter's room for a delta's unescaped bytes.
fn native_room(fixed: usize, budget: usize) -> usize {
    match budget.saturating_sub(fixed) {
        r if r < 64 => budget,
        r => r,
    }
}

/// Size of the envelope's fixed fields as the native formatter measures them:
/// with an empty delta and `"final":false`.
fn native_fixed(e: &Envelope) -> usize {
    fixed_len(e) + usize::from(e.fin)
}

/// DESIGN 4: no line over the budget, except a citation, an envelope whose
/// fixed fields alone leave no room for one character, and an envelope of a
/// type read whole whose unescaped delta fits the native formatter's room.
/// Returns the number of oversize envelopes under the first two exceptions
/// (the third is checked by [`check_native_split`]).
pub fn check_budget(outs: &[Out], budget: usize) -> Result<usize, String> {
    let mut oversize = 0;
    for o in outs {
        let Out::Env(e) = o else { continue };
        if e.len <= budget {
            continue;
        }
        if is_native_split(&e.kind) && e.delta.len() <= native_room(native_fixed(e), budget) {
            continue;
        }
        // `\u0001` is the widest one character can be once escaped.
        if e.kind == "citation" || fixed_len(e) + 6 > budget {
            oversize += 1;
            continue;
        }
        return Err(format!(
            "{} envelope of {} bytes over the budget of {budget}: {}",
            e.kind,
            e.len,
            head(&e.json)
        ));
    }
    Ok(oversize)
}

/// DESIGN 4: every block of a type read whole is cut exactly where the
/// native formatter cuts its content.
pub fn check_native_split(outs: &[Out], budget: usize) -> Result<(), String> {
    let mut block: Vec<&Envelope> = Vec::new();
    for o in outs {
        let Out::Env(e) = o else { continue };
        if !is_native_split(&e.kind) {
            continue;
        }
        block.push(e);
        if !e.fin {
            continue;
        }
        let content: String = block.iter().map(|e| e.delta.as_str()).collect();
        let want = native_split(&content, native_fixed(e), budget);
        let got: Vec<&str> = block.iter().map(|e| e.delta.as_str()).collect();
        if got != want {
            let sizes = |v: &[&str]| v.iter().map(|d| d.len()).collect::<Vec<_>>();
            let want_ref: Vec<&str> = want.iter().map(String::as_str).collect();
            return Err(format!(
                "{} block cut as {:?} bytes, the native formatter cuts it as {:?}",
                e.kind,
                sizes(&got),
                sizes(&want_ref)
            ));
        }
        block.clear();
    }
    Ok(())
}

/// Parses, groups and compares; checks the budget and the native cuts.
/// Returns the parsed output.
pub fn check(expected: &[Expect], out: &[u8], budget: usize) -> Result<Vec<Out>, String> {
    let outs = parse(out)?;
    check_budget(&outs, budget)?;
    check_native_split(&outs, budget)?;
    compare(expected, &group(&outs))?;
    Ok(outs)
}
