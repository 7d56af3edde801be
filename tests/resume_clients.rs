//! Resumable streams (issue 15, docs/RESUME.md) with real clients: headless Chromium's own `EventSource`, and the
//! npm package `@microsoft/fetch-event-source` (as the legacy web app uses it, a `POST`) running in Chromium.
//!
//! Each test serves a page and one agent run, same-origin: the legacy-backend emulator serves the page, its scripts
//! and the run, and the browser reaches it through a [`CuttingRelay`] in front of the gateway (the gateway proxies
//! the page through as it would the legacy web app's). The run is paced (about 90 events over about 5 s), so that
//! the relay's cuts, or the page hiding its tab, land in the middle of it. The page assembles the text of the
//! `text` envelopes and POSTs everything it saw to `/report`, which the emulator records. Every test asserts:
//!
//! - the page saw `[DONE]`, and its text equals the uninterrupted stream's text;
//! - every event carried an id `sg1-<32 hex>-<seq>` of one stream, seq 1, 2, 3, … in order: no duplicate, no gap;
//! - the emulator saw exactly one request for the run (the reconnects were answered by the gateway);
//! - the relay made every planned cut (otherwise the test would not have tested anything).
//!
//! They fail on a gateway without resumption: the stream carries no ids, a reconnect is forwarded, and the agent runs
//! again from the start.
//!
//! What they assume of the implementation (docs/RESUME.md), beyond ids, replay and one upstream request: the default
//! settings (`TestGateway` with no resume keys set) resume; the first response carries
//! `X-Gateway-Stream: /_gateway/streams/<token>` and the event of seq 1 carries `retry: 1000`; the page, its scripts
//! and `POST /report` are proxied to the backend as any request; a reconnect's `Last-Event-ID` comes with the same
//! method, path and body (`POST` for fetch-event-source, `GET` for EventSource) and no bound header (no cookie, no
//! authorization).
//!
//! And one thing about the event layout: fetch-event-source 2.0.1 sets its `Last-Event-ID` as soon as it parses an
//! `id:` line (`getMessages` in its `parse.js`), before the blank line that dispatches the event. With the `id:` line
//! first, a cut inside an event loses that event on resume: the client asks for the events after it. The `id:` line
//! must be the event's last field (`data: …\nid: …\n\n`), which leaves only the final newline as a window.
//!
//! Chromium (`chromium`, a Debian package) and the npm package are installed by `.ci/external-clients.sh`; when either
//! is missing the tests are skipped with a note, except under `CI=true`, where they fail.

mod harness;

use std::path::Path;
use std::time::Duration;

use harness::browser::{chromium_or_skip, npm_package_or_skip};
use harness::pages::{
    await_report, expected_text, id_problems, parse_id, run_items, runs_problem, static_answer, text_of, FES, PACE, RUN,
};
use harness::prelude::*;
use harness::relay::CuttingRelay;
use serde_json::{json, Value};

/// How long a page runs before it reports anyway (it reports at once on `[DONE]`).
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// One Chromium at a time: the machine has two cores, and the runs are paced in real time.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The emulator's answer to each request: the paced run on [`RUN`], static files under `/app/`, `204` to the
/// page's `POST /report` (recorded, as every request), `404` otherwise.
fn answer(req: &Recorded, items: &[String]) -> Vec<Step> {
    let path = req.target.split('?').next().unwrap_or("");
    if path == RUN {
        return paced(items.iter().map(|i| format!("data: {i}\n\n").into_bytes()), PACE);
    }
    if path == "/report" {
        return vec![Step::head(204, &[], false)];
    }
    static_answer(path)
}

/// The emulator, the gateway (default settings), and the relay in front of it with its plan of cuts.
struct Setup {
    up: Emulator,
    gw: TestGateway,
    relay: CuttingRelay,
    /// The text of the uninterrupted stream.
    expected_text: String,
    planned_cuts: usize,
}

impl Setup {
    async fn start(cuts: &[usize]) -> Setup {
        let items = run_items();
        let expected_text = expected_text(&items);
        let up = Emulator::start(move |req| answer(req, &items)).await;
        let gw = TestGateway::start(&up.url(), |_| {}).await;
        let relay = CuttingRelay::start(gw.addr, cuts).await;
        Setup {
            up,
            gw,
            relay,
            expected_text,
            planned_cuts: cuts.len(),
        }
    }

    /// Opens `page` (a path under `/app/`) in headless Chromium through the relay and waits (bounded) for its
    /// report; panics with Chromium's console when none comes.
    async fn run_page(&self, chromium: &Path, page: &str) -> Value {
        let sep = if page.contains('?') { '&' } else { '?' };
        let url = self
            .relay
            .url(&format!("/app/{page}{sep}timeout_ms={}", PAGE_TIMEOUT.as_millis()));
        await_report(chromium, &url, &self.up, PAGE_TIMEOUT, page).await
    }

    /// Everything wrong with what the page saw, the relay did and the backend was asked.
    fn problems(&self, report: &Value, check_headers: bool) -> Vec<String> {
        let mut problems = Vec::new();
        let events = report["events"].as_array().cloned().unwrap_or_default();
        let ids: Vec<&str> = events.iter().map(|e| e["id"].as_str().unwrap_or("")).collect();
        let data: Vec<&str> = events.iter().map(|e| e["data"].as_str().unwrap_or("")).collect();

        // 1. One upstream request for the run: every reconnect was answered by the gateway.
        let runs: Vec<Recorded> = self
            .up
            .recorded()
            .into_iter()
            .filter(|r| r.target.split('?').next() == Some(RUN))
            .collect();
        problems.extend(runs_problem(&runs, 1));

        // 2. The page saw the end, and the uninterrupted stream's text.
        if report["done"] != json!(true) {
            problems.push(format!("the page did not see [DONE]: {}", report["reason"]));
        }
        let text = text_of(data.iter().copied());
        if text != self.expected_text {
            let (got, want): (Vec<char>, Vec<char>) = (text.chars().collect(), self.expected_text.chars().collect());
            let at = harness::diff::first_difference(&got, &want);
            let snippet = |c: &[char]| c[at.min(c.len())..(at + 40).min(c.len())].iter().collect::<String>();
            let restarts = text.matches("word0 ").count();
            problems.push(format!(
                "assembled text differs from the uninterrupted stream's: {} chars, want {}; first difference at char \
                 {at}: got {:?}, want {:?}; the text starts over {} time(s)",
                got.len(),
                want.len(),
                snippet(&got),
                snippet(&want),
                restarts.saturating_sub(1)
            ));
        }

        // 3. Ids: one stream, seq 1, 2, 3, … (no duplicate, no gap).
        let (id_problem, token) = id_problems(&ids);
        problems.extend(id_problem);

        // 4. What fetch-event-source can see of the contract: the stream's URL header and the first event's retry.
        if check_headers {
            let first = &report["opens"][0];
            let want = token.map(|t| format!("/_gateway/streams/{t}"));
            if first["stream"].as_str() != want.as_deref() || want.is_none() {
                problems.push(format!(
                    "the first response's X-Gateway-Stream is {}, want /_gateway/streams/<the ids' token>",
                    first["stream"]
                ));
            }
            if let Some(e) = events.first() {
                if parse_id(ids[0]).map(|(_, s)| s) == Some(1) && e["retry"] != json!(1000) {
                    problems.push(format!("the first event's retry is {}, want 1000", e["retry"]));
                }
            }
        }

        // 5. The test tested what it says.
        let cuts = self.relay.cuts();
        if cuts.len() != self.planned_cuts {
            problems.push(format!(
                "the relay made {} of {} planned cuts (unused: {:?}), so the stream was not cut as planned",
                cuts.len(),
                self.planned_cuts,
                self.relay.unused()
            ));
        }
        problems
    }

    /// Panics with every problem and the evidence, if there is any problem.
    fn assert_ok(&self, what: &str, report: &Value, check_headers: bool) {
        let problems = self.problems(report, check_headers);
        if problems.is_empty() {
            return;
        }
        let cuts: Vec<String> = self
            .relay
            .cuts()
            .iter()
            .map(|c| format!("connection {} after {} bytes", c.conn, c.after))
            .collect();
        panic!(
            "{what}:\n- {}\n\nthe page: {} events, opens {}, errors {}, notes {}\nrelay: {} connections, {} event \
             streams, cuts {cuts:?}\nchromium:\n{}",
            problems.join("\n- "),
            report["events"].as_array().map_or(0, Vec::len),
            report["opens"],
            report["errors"],
            report["notes"],
            self.relay.connections(),
            self.relay.streams(),
            Some(report["console"].as_str().unwrap_or(""))
                .filter(|c| !c.is_empty())
                .unwrap_or("(nothing logged)")
        );
    }
}

/// Response bytes after which the relay cuts each connection's stream, in order: mid-event and mid-run (the first
/// after about 10 events; each reconnection first replays what was missed). Different lengths, so the cuts land
/// at different places of the events.
const CUTS: [usize; 3] = [1450, 4100, 3333];

/// Runs `page` in headless Chromium (one browser at a time) through a relay that cuts the event streams after
/// `cuts` bytes, and checks its report as [`Setup::assert_ok`] does (`what`; with the request's headers when `fes`,
/// a page of fetch-event-source); returns the report, or `None` when skipped (no Chromium, or no fetch-event-source
/// for a `fes` page).
async fn run_checked(page: &str, cuts: &[usize], what: &str, fes: bool) -> Option<Value> {
    let chromium = chromium_or_skip()?;
    if fes && !npm_package_or_skip(FES) {
        return None;
    }
    let _one = ONE_BROWSER.lock().await;
    let setup = Setup::start(cuts).await;
    let report = setup.run_page(&chromium, page).await;
    setup.assert_ok(what, &report, fes);
    setup.gw.stop().await;
    Some(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_eventsource_resumes_a_run_cut_three_times() {
    let what = "EventSource in Chromium, through a relay that cuts it 3 times";
    run_checked("eventsource.html", &CUTS, what, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_event_source_post_resumes_a_run_cut_three_times() {
    let what = "@microsoft/fetch-event-source POST in Chromium, through a relay that cuts it 3 times";
    run_checked("fetch-event-source.html?mode=cut", &[1300, 3900, 2777], what, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_event_source_hidden_tab_resumes_the_same_run() {
    let what = "@microsoft/fetch-event-source POST in Chromium, its tab hidden and shown twice";
    let Some(report) = run_checked("fetch-event-source.html?mode=hidden", &[], what, true).await else {
        return;
    };
    // The library did abort and re-request: the page hid and showed its tab twice, and opened three responses.
    let notes = report["notes"].to_string();
    let opens = report["opens"].as_array().map_or(0, Vec::len);
    assert!(
        notes.matches("tab hidden").count() == 2 && notes.matches("tab shown").count() == 2 && opens == 3,
        "the page did not hide and show its tab twice, with a request each time: {opens} opens, notes {notes}"
    );
}
