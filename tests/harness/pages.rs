//! What the real-browser tests (tests/resume_clients.rs, tests/resume_cors.rs) serve and check: the paced agent
//! run of the legacy backend, the pages and scripts under [`PAGES`] with the npm package's ESM build, the text a
//! page assembles, and the ids it saw (`sg1-<32 hex>-<seq>` of one stream, seq 1, 2, 3, …).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use sse_gateway::translate::{translate_all, Options};

use super::browser::NODE_MODULES;
use super::legacy::{attr, fmt_escape};
use super::sse::{delta, kind, sse_data};
use super::upstream::{Recorded, Step};

/// The agent run's path.
pub const RUN: &str = "/agent/run";
/// Where the pages and their scripts are.
pub const PAGES: &str = "tests/external/browser";
/// The npm package the pages run.
pub const FES: &str = "@microsoft/fetch-event-source";
/// Events per run, and the pause after each.
pub const PIECES: usize = 90;
pub const PACE: Duration = Duration::from_millis(55);

/// The legacy backend's run: `meta_init`, one text block of [`PIECES`] deltas (with multi-byte characters, so that
/// cuts land inside them too), `meta_final`, `[DONE]`; one SSE event per item.
pub fn run_items() -> Vec<String> {
    let meta = json!({"format": "xml", "user_query": "write a long answer", "agent_uuid": "agent-resume",
                      "parent_agent_uuid": null, "model": "m"});
    let mut items = vec![
        format!("<meta_init data=\"{}\"></meta_init>", attr(&meta.to_string())),
        "<content-block-text>".to_owned(),
    ];
    for i in 0..PIECES {
        let piece = match i % 10 {
            3 => format!("word{i} 😀 "),
            6 => format!("字{i}\n"),
            8 => format!("\"q{i}\" <&> "),
            _ => format!("word{i} "),
        };
        items.push(fmt_escape(&piece));
    }
    items.push("</content-block-text>".to_owned());
    let fin = json!({"stop_reason": "end_turn", "total_steps": 1});
    items.push(format!("<meta_final data=\"{}\"></meta_final>", attr(&fin.to_string())));
    items.push("[DONE]".to_owned());
    items
}

/// The text of the uninterrupted, translated run of `items`.
pub fn expected_text(items: &[String]) -> String {
    let legacy: Vec<u8> = items
        .iter()
        .flat_map(|i| format!("data: {i}\n\n").into_bytes())
        .collect();
    let translated = translate_all(Options::default(), "unused", &legacy).0;
    let text = text_of(sse_data(&translated).iter().map(String::as_str));
    assert!(text.contains("word89"), "the run's text: {text:?}");
    text
}

/// The text of the `text` envelopes of a translated stream's `data:` payloads, in order.
pub fn text_of<'a>(payloads: impl IntoIterator<Item = &'a str>) -> String {
    payloads
        .into_iter()
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| kind(v) == "text")
        .map(|v| delta(&v).to_owned())
        .collect()
}

/// `sg1-<32 lowercase hex>-<seq>` → (token, seq).
pub fn parse_id(id: &str) -> Option<(&str, u64)> {
    let rest = id.strip_prefix("sg1-")?;
    let (token, seq) = rest.split_once('-')?;
    let hex = token.len() == 32 && token.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let digits = !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit());
    (hex && digits).then_some(())?;
    Some((token, seq.parse().ok()?))
}

/// What breaks "one stream, seq 1, 2, 3, … (no duplicate, no gap)" in `ids`, as one line (none when all is well);
/// and the stream's token (the first id's).
pub fn id_problems<'a>(ids: &[&'a str]) -> (Option<String>, Option<&'a str>) {
    let mut token: Option<&str> = None;
    let mut problems = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let want_seq = i as u64 + 1;
        match parse_id(id) {
            None => problems.push(format!("event {want_seq} has id {id:?}, not sg1-<32 hex>-<seq>")),
            Some((t, seq)) => {
                if *token.get_or_insert(t) != t {
                    problems.push(format!("event {want_seq} ({id}) is of another stream"));
                }
                if seq < want_seq {
                    problems.push(format!("event {want_seq} has seq {seq}: a duplicate"));
                } else if seq > want_seq {
                    problems.push(format!("event {want_seq} has seq {seq}: a gap"));
                }
            }
        }
    }
    if problems.is_empty() {
        return (None, token);
    }
    let n = problems.len();
    problems.truncate(3);
    let line = format!(
        "{n} of {} events break the id sequence, e.g. {}",
        ids.len(),
        problems.join("; ")
    );
    (Some(line), token)
}

/// The one-upstream-request check: `want` requests for the run among `runs`, or a line saying what the backend
/// saw (each request with its `Last-Event-ID`).
pub fn runs_problem(runs: &[Recorded], want: usize) -> Option<String> {
    (runs.len() != want).then(|| {
        let each: Vec<String> = runs
            .iter()
            .map(|r| {
                format!(
                    "{} {} (Last-Event-ID: {:?})",
                    r.method,
                    r.target,
                    r.header("last-event-id")
                )
            })
            .collect();
        format!(
            "the backend saw {} requests for the run, want {want} (the agent ran again): {each:?}",
            runs.len()
        )
    })
}

/// A static file's bytes and content type, for a request path under `/app/`: a page or `common.js` from [`PAGES`],
/// or under `/app/fes/` a file of the package's ESM build (whose imports name no extension: `./fetch`).
pub fn static_file(path: &str) -> Option<(Vec<u8>, &'static str)> {
    let file: PathBuf = if let Some(f) = path.strip_prefix("/app/fes/") {
        let f = if f.ends_with(".js") {
            f.to_owned()
        } else {
            format!("{f}.js")
        };
        Path::new(NODE_MODULES).join(FES).join("lib/esm").join(f)
    } else {
        Path::new(PAGES).join(path.strip_prefix("/app/")?)
    };
    if file.components().any(|c| c == std::path::Component::ParentDir) {
        return None;
    }
    let bytes = std::fs::read(&file).ok()?;
    let ty = match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        _ => "application/octet-stream",
    };
    Some((bytes, ty))
}

/// The answer to a `GET` of `path` on a page's origin: the [`static_file`] (`no-store`, so that every run loads
/// what is on disk), else `404`.
pub fn static_answer(path: &str) -> Vec<Step> {
    match static_file(path) {
        Some((bytes, ty)) => {
            let len = bytes.len().to_string();
            vec![
                Step::head(
                    200,
                    &[
                        ("Content-Type", ty),
                        ("Content-Length", &len),
                        ("Cache-Control", "no-store"),
                    ],
                    false,
                ),
                Step::WriteAll(bytes),
            ]
        }
        None => vec![
            Step::head(404, &[("Content-Length", "9")], false),
            Step::write_all(b"not found"),
        ],
    }
}

/// Opens `url` in headless Chromium and waits (at most `page_timeout` plus [`PATIENCE`](super::PATIENCE)) for the
/// page's `POST /report` to reach `site` (the emulator serving the page's origin); returns the report with
/// Chromium's console under `"console"`. Panics, with the requests `site` saw and the console, when none comes.
pub async fn await_report(
    chromium: &Path,
    url: &str,
    site: &super::upstream::Upstream,
    page_timeout: Duration,
    what: &str,
) -> Value {
    let browser = super::browser::Chromium::open(chromium, url);
    let deadline = std::time::Instant::now() + page_timeout + super::PATIENCE;
    let report = loop {
        if let Some(r) = site.recorded().into_iter().find(|r| r.target == "/report") {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: no report from the page in {:?}; requests its origin saw: {:?}\nchromium:\n{}",
            page_timeout + super::PATIENCE,
            site.recorded()
                .iter()
                .map(|r| format!("{} {}", r.method, r.target))
                .collect::<Vec<_>>(),
            browser.console(40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A stray reconnect after the end would show up here.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let console = browser.console(20);
    drop(browser);
    let mut v: Value = serde_json::from_slice(&report.body).unwrap_or_else(|e| {
        panic!(
            "{what}: report is not JSON ({e}): {}",
            String::from_utf8_lossy(&report.body)
        )
    });
    v["console"] = console.into();
    v
}
