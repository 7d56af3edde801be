//! The dialect fixtures (`tests/fixtures/dialects/`, schema in its README): reading them, and reassembling a
//! translated stream's envelopes into the fixtures' block entries to compare with `<name>.expected.json`.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// The fixtures folder.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dialects")
}

/// Every fixture's name (`<name>.sse` with its `<name>.expected.json`), sorted.
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("fixtures folder")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".sse").map(str::to_owned))
        .collect();
    names.sort();
    assert!(names.len() >= 20, "fixtures missing: {names:?}");
    names
}

/// The upstream body of fixture `name`.
pub fn input(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(format!("{name}.sse"))).expect("fixture input")
}

/// The expected block entries of fixture `name`.
pub fn expected(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(dir().join(format!("{name}.expected.json"))).expect("fixture expectation");
    match serde_json::from_str(&text).expect("expected.json is JSON") {
        Value::Array(a) => a,
        other => panic!("{name}: expected an array, got {other}"),
    }
}

/// What tells one block's envelopes: type, agent, id.
type BlockKey = (String, String, Option<String>);

/// Reassembles envelopes (each a JSON object, or the string `[DONE]`) into the fixtures' entries: consecutive
/// envelopes of one block (type, agent, and id where there is one) up to its `final:true` are one entry, placed
/// where its first envelope was; a `tool_result_image` is an entry of its own. Each entry is
/// `{kind, agent, [id, name], [src, media_type], content}` with `content` the concatenated deltas. `[DONE]` is left
/// out; `done` says whether it came last.
pub fn reassemble(envs: &[Value]) -> (Vec<Value>, bool) {
    let mut entries: Vec<Map<String, Value>> = Vec::new();
    // Open blocks: (key, entry index).
    let mut open: Vec<(BlockKey, usize)> = Vec::new();
    let mut done = false;
    for e in envs {
        if e.as_str() == Some("[DONE]") {
            done = true;
            continue;
        }
        done = false;
        let obj = e.as_object().expect("an envelope is an object");
        let kind = obj["type"].as_str().expect("type").to_owned();
        let agent = obj["agent"].as_str().expect("agent").to_owned();
        let delta = obj["delta"].as_str().expect("delta is a string");
        let fin = obj["final"].as_bool().expect("final");
        let id = obj.get("id").and_then(Value::as_str).map(str::to_owned);
        let mut entry = Map::new();
        entry.insert("kind".into(), json!(kind));
        entry.insert("agent".into(), json!(agent));
        for k in ["id", "name", "src", "media_type"] {
            if let Some(v) = obj.get(k) {
                entry.insert(k.into(), v.clone());
            }
        }
        if kind == "tool_result_image" {
            entry.insert("content".into(), json!(delta));
            entries.push(entry);
            continue;
        }
        let key = (kind, agent, id);
        let at = match open.iter().position(|(k, _)| *k == key) {
            Some(p) => open[p].1,
            None => {
                entry.insert("content".into(), json!(""));
                entries.push(entry);
                open.push((key.clone(), entries.len() - 1));
                entries.len() - 1
            }
        };
        let content = entries[at].get_mut("content").expect("content");
        let joined = format!("{}{delta}", content.as_str().unwrap_or(""));
        *content = json!(joined);
        if fin {
            open.retain(|(k, _)| *k != key);
        }
    }
    (entries.into_iter().map(Value::Object).collect(), done)
}

/// Compares reassembled entries with a fixture's expectation: kinds, agents (`$root` is `root`), ids, names and
/// image fields exactly; `text` content byte for byte; `json` content as a JSON value; `gateway` entries must be
/// the gateway's own error (a JSON delta whose `type` is `parse_error` or `upstream_error`).
pub fn compare(name: &str, got: &[Value], want: &[Value], root: &str) -> Result<(), String> {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let field = |v: &Value, k: &str| v.get(k).cloned().unwrap_or(Value::Null);
        let want_agent = match w["agent"].as_str() {
            Some("$root") => root.to_owned(),
            Some(a) => a.to_owned(),
            None => return Err(format!("{name}: entry {i} has no agent")),
        };
        let same = field(g, "kind") == field(w, "kind")
            && g["agent"].as_str() == Some(want_agent.as_str())
            && ["id", "name", "src", "media_type"]
                .iter()
                .all(|k| field(g, k) == field(w, k));
        if !same {
            return Err(format!("{name}: entry {i} differs\n got {g}\nwant {w} (root {root})"));
        }
        let content = g["content"].as_str().unwrap_or("");
        let ok = match w["format"].as_str() {
            Some("text") => w["content"].as_str() == Some(content),
            Some("json") => serde_json::from_str::<Value>(content).ok().as_ref() == Some(&w["content"]),
            Some("gateway") => serde_json::from_str::<Value>(content)
                .ok()
                .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned))
                .is_some_and(|t| t == "parse_error" || t == "upstream_error"),
            other => return Err(format!("{name}: entry {i} has format {other:?}")),
        };
        if !ok {
            return Err(format!("{name}: entry {i} content differs\n got {g}\nwant {w}"));
        }
    }
    if got.len() != want.len() {
        return Err(format!(
            "{name}: {} entries, expected {}\n got {}\nwant {}",
            got.len(),
            want.len(),
            Value::Array(got.to_vec()),
            Value::Array(want.to_vec())
        ));
    }
    Ok(())
}

/// Whether a translation of fixture `name` must end with `[DONE]`: its run ended as the dialect ends one (its last
/// expected entry is `meta_final`, bad events after it aside: they do not undo an end).
pub fn ends_done(want: &[Value]) -> bool {
    want.iter()
        .rev()
        .find(|w| w["format"] != "gateway")
        .is_some_and(|w| w["kind"] == "meta_final")
}
