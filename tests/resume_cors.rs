//! Resumable streams for a page on another origin (DESIGN §5.1, issue 26 part 1), in the legacy web app's deployed
//! shape: the page on origin A (its own static server: the page, its scripts, the npm package, and `/report`), the
//! gateway on origin B, and behind it the legacy-backend emulator with CORS as the app's FastAPI backend has it
//! ([`Cors::legacy_app`]: Starlette's `CORSMiddleware` allowing exactly A, with credentials, every method, an
//! explicit header list, nothing exposed). The page (tests/external/browser/cross-origin.html) POSTs the paced run
//! to B with `@microsoft/fetch-event-source`, `credentials: 'include'` and a JSON body, in headless Chromium, and
//! reports what it saw to A. Its errors end the run as the legacy app's do (no retry).
//!
//! - an undisturbed run reads the whole answer;
//! - a run whose tab is hidden and shown twice reads the same answer, from one upstream request: the reconnect's
//!   preflight asks for `last-event-id`, which the backend's list refuses, and the gateway's own answer must carry
//!   the backend's CORS answer for A;
//! - the page reads `X-Gateway-Stream`, watches the stream and cancels it, all cross-origin;
//! - a page on origin C, which the backend does not allow, reads nothing: the gateway never widens the policy.
//!
//! Chromium and the npm package are installed by `.ci/external-clients.sh`; when either is missing the Chromium
//! tests are skipped with a note, except under `CI=true`, where they fail.

mod harness;

use std::path::PathBuf;
use std::time::Duration;

use harness::browser::{chromium_or_skip, npm_package_or_skip};
use harness::cors::Cors;
use harness::pages::{
    await_report, expected_text, id_problems, parse_id, run_items, runs_problem, static_answer, text_of, FES, PACE, RUN,
};
use harness::prelude::*;
use serde_json::{json, Value};

/// How long a page runs before it reports anyway (it reports at once on `[DONE]` or on an error).
const PAGE_TIMEOUT: Duration = Duration::from_secs(20);

/// One Chromium at a time: the machine has two cores, and the runs are paced in real time.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `http://<addr>`: the origin a browser sends for a page served from `addr`.
fn origin(addr: std::net::SocketAddr) -> String {
    format!("http://{addr}")
}

/// A page's origin: the pages and their scripts under `/app/`, and `204` to the page's `POST /report` (recorded).
async fn site() -> Emulator {
    Emulator::start(|req| {
        let path = req.target.split('?').next().unwrap_or("");
        if path == "/report" {
            return vec![Step::head(204, &[], false)];
        }
        static_answer(path)
    })
    .await
}

/// The page's origin A, the backend allowing exactly A, and the gateway (origin B, default settings) before it.
struct Setup {
    site: Emulator,
    backend: Emulator,
    gw: TestGateway,
    expected_text: String,
}

impl Setup {
    async fn start() -> Setup {
        let site = site().await;
        let cors = Cors::legacy_app(&origin(site.addr));
        let items = run_items();
        let expected_text = expected_text(&items);
        let backend = Emulator::start(move |req| {
            cors.apply(req, || {
                if req.target.split('?').next() == Some(RUN) {
                    paced(items.iter().map(|i| format!("data: {i}\n\n").into_bytes()), PACE)
                } else {
                    Step::answer(404, &[("Content-Length", "9")], b"not found")
                }
            })
        })
        .await;
        let gw = TestGateway::start(&backend.url(), |_| {}).await;
        Setup {
            site,
            backend,
            gw,
            expected_text,
        }
    }

    /// The requests for the run the backend was sent (its preflights aside).
    fn runs(&self) -> Vec<Recorded> {
        self.backend
            .recorded()
            .into_iter()
            .filter(|r| r.target.split('?').next() == Some(RUN) && r.method != "OPTIONS")
            .collect()
    }

    /// The one-upstream-request check: `want` requests for the run, or a line saying what the backend saw.
    fn runs_problem(&self, want: usize) -> Option<String> {
        runs_problem(&self.runs(), want)
    }

    /// Everything the backend was sent, for failure messages.
    fn backend_saw(&self) -> Vec<String> {
        self.backend
            .recorded()
            .iter()
            .map(|r| {
                let asked = r.header("access-control-request-headers").unwrap_or("-");
                format!(
                    "{} {} (Origin {:?}, asks headers {asked})",
                    r.method,
                    r.target,
                    r.header("origin")
                )
            })
            .collect()
    }
}

/// Opens `cross-origin.html?mode=<mode>` from `site` in headless Chromium, reading the run from the gateway at
/// `gw`, and waits (bounded) for the page's report to `site`; panics with Chromium's console when none comes.
async fn run_page(chromium: &std::path::Path, site: &Emulator, gw: &TestGateway, mode: &str) -> Value {
    let url = format!(
        "{}/app/cross-origin.html?mode={mode}&gw={}&timeout_ms={}",
        origin(site.addr),
        origin(gw.addr),
        PAGE_TIMEOUT.as_millis()
    );
    await_report(chromium, &url, site, PAGE_TIMEOUT, mode).await
}

/// The page's events as (ids, data payloads).
fn events_of(report: &Value) -> (Vec<&str>, Vec<&str>) {
    let events = report["events"].as_array().map(Vec::as_slice).unwrap_or_default();
    events
        .iter()
        .map(|e| (e["id"].as_str().unwrap_or(""), e["data"].as_str().unwrap_or("")))
        .unzip()
}

/// What is wrong with a run the page should have read whole, opening `opens` responses: its end, its text, its ids,
/// the responses' statuses and the one upstream request.
fn run_problems(setup: &Setup, report: &Value, opens: usize) -> Vec<String> {
    let (ids, data) = events_of(report);
    let mut problems: Vec<String> = setup.runs_problem(1).into_iter().collect();
    if report["done"] != json!(true) {
        problems.push(format!("the page did not see [DONE]: {}", report["reason"]));
    }
    let text = text_of(data.iter().copied());
    if text != setup.expected_text {
        let (got, want): (Vec<char>, Vec<char>) = (text.chars().collect(), setup.expected_text.chars().collect());
        problems.push(format!(
            "the page's text differs from the uninterrupted stream's: {} chars, want {} (first difference at char {})",
            got.len(),
            want.len(),
            harness::diff::first_difference(&got, &want)
        ));
    }
    problems.extend(id_problems(&ids).0);
    let statuses: Vec<Value> = report["opens"]
        .as_array()
        .map(|o| o.iter().map(|o| o["status"].clone()).collect())
        .unwrap_or_default();
    if statuses != vec![json!(200); opens] {
        problems.push(format!(
            "the page opened responses with statuses {statuses:?}, want {opens} × 200"
        ));
    }
    problems
}

/// Panics with `problems` and the evidence, if there is any problem.
fn assert_none(what: &str, problems: &[String], setup: &Setup, report: &Value) {
    if problems.is_empty() {
        return;
    }
    panic!(
        "{what}:\n- {}\n\nthe page: {} events, opens {}, errors {}, notes {}, control {}\nthe backend saw: {:?}\n\
         chromium:\n{}",
        problems.join("\n- "),
        report["events"].as_array().map_or(0, Vec::len),
        report["opens"],
        report["errors"],
        report["notes"],
        report["control"],
        setup.backend_saw(),
        Some(report["console"].as_str().unwrap_or(""))
            .filter(|c| !c.is_empty())
            .unwrap_or("(nothing logged)")
    );
}

/// Chromium and the npm package, or `None` when the test is to be skipped (never under CI).
fn browser() -> Option<PathBuf> {
    let path = chromium_or_skip()?;
    npm_package_or_skip(FES).then_some(path)
}

/// Runs the page in `mode` against a fresh setup (one browser at a time) and asserts that `problems` finds none in
/// its report: `what` names the case in the failure.
async fn check_page(mode: &str, what: &str, problems: impl FnOnce(&Setup, &Value) -> Vec<String>) {
    let Some(chromium) = browser() else { return };
    let _one = ONE_BROWSER.lock().await;
    let setup = Setup::start().await;
    let report = run_page(&chromium, &setup.site, &setup.gw, mode).await;
    let problems = problems(&setup, &report);
    assert_none(what, &problems, &setup, &report);
    setup.gw.stop().await;
}

const UNDISTURBED: &str = "fetch-event-source POST from origin A to the gateway on B, undisturbed";
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_page_reads_an_undisturbed_run() {
    check_page("plain", UNDISTURBED, |setup, report| run_problems(setup, report, 1)).await;
}

const HIDDEN_TAB: &str = "fetch-event-source POST from origin A to the gateway on B, its tab hidden and shown twice";
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_hidden_tab_resumes_the_same_run() {
    check_page("hidden", HIDDEN_TAB, hidden_problems).await;
}

/// [`run_problems`] of a run read in three responses, and the page's tab hidden and shown twice.
fn hidden_problems(setup: &Setup, report: &Value) -> Vec<String> {
    let mut problems = run_problems(setup, report, 3);
    // The library did abort and re-request: the page hid and showed its tab twice.
    let notes = report["notes"].to_string();
    if notes.matches("tab hidden").count() != 2 || notes.matches("tab shown").count() != 2 {
        problems.push(format!("the page did not hide and show its tab twice: notes {notes}"));
    }
    problems
}

const CONTROL: &str = "from origin A: X-Gateway-Stream, a watcher and a DELETE on the gateway on B";
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_page_reads_the_stream_header_watches_and_cancels() {
    check_page("control", CONTROL, control_problems).await;
}

/// What is wrong with the control page's run: its ids and one upstream request, the stream header it read, its
/// watcher's events and its DELETE's end of the run.
fn control_problems(setup: &Setup, report: &Value) -> Vec<String> {
    let (ids, data) = events_of(report);
    let mut problems: Vec<String> = setup.runs_problem(1).into_iter().collect();
    problems.extend(id_problems(&ids).0);
    let token = ids.first().and_then(|id| parse_id(id)).map(|(t, _)| t);
    let control = &report["control"];

    // 1. The first response's X-Gateway-Stream, readable by the page.
    let want_url = token.map(|t| format!("/_gateway/streams/{t}"));
    if control["stream_header"].as_str() != want_url.as_deref() || want_url.is_none() {
        problems.push(format!(
            "the page read X-Gateway-Stream as {}, want {want_url:?} (the header is not exposed to origin A)",
            control["stream_header"]
        ));
    }

    // 2. The watcher: a readable 200 with the stream's events from the first, as the page itself saw them.
    let watcher = &control["watcher"];
    if watcher["status"] != json!(200) || !watcher["error"].is_null() {
        problems.push(format!(
            "the page's cross-origin watcher got status {} and error {}, want a readable 200",
            watcher["status"], watcher["error"]
        ));
    } else {
        let seen: Vec<(&str, &str)> = watcher["events"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|e| (e["id"].as_str().unwrap_or(""), e["data"].as_str().unwrap_or("")))
            .collect();
        let want: Vec<(&str, &str)> = ids.iter().copied().zip(data.iter().copied()).take(15).collect();
        if seen.len() != 15 || seen != want {
            problems.push(format!(
                "the watcher read {} events, want the stream's first 15 as the page saw them: {:?}",
                seen.len(),
                seen.iter().take(3).collect::<Vec<_>>()
            ));
        }
    }

    // 3. The DELETE: a readable 204, and the run ends cancelled on the page (without [DONE]).
    let delete = &control["delete"];
    if delete["status"] != json!(204) || !delete["error"].is_null() {
        problems.push(format!(
            "the page's cross-origin DELETE got status {} and error {}, want a readable 204",
            delete["status"], delete["error"]
        ));
    }
    let last = data.last().and_then(|d| serde_json::from_str::<Value>(d).ok());
    let cancelled = last
        .as_ref()
        .is_some_and(|v| kind(v) == "error" && error_type(v) == "stream_cancelled");
    if report["done"] == json!(true) || !cancelled {
        problems.push(format!(
            "the run did not end cancelled on the page (done {}, last event {:?})",
            report["done"],
            data.last()
        ));
    }
    problems
}

/// A request written as given to the gateway at `addr`; returns the response head (the body is left unread).
async fn head_of(addr: std::net::SocketAddr, request: String) -> (u16, String) {
    let fut = async {
        let mut c = Client::write(addr, request.as_bytes())
            .await
            .expect("connect and write");
        c.read_head().await.expect("a response head");
        (c.status, c.head.clone())
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .expect("a response head in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_origin_policy_is_never_widened_to_another_origin() {
    let setup = Setup::start().await;
    let (a, b) = (origin(setup.site.addr), setup.gw.addr);
    let other_site = site().await;
    let c = origin(other_site.addr);

    // 1. In Chromium, the same page on origin C: the backend refuses C's preflight, so the first POST already
    //    fails; nothing is read, the run is never sent.
    if let Some(chromium) = browser() {
        let _one = ONE_BROWSER.lock().await;
        let report = run_page(&chromium, &other_site, &setup.gw, "plain").await;
        let mut problems = Vec::new();
        problems.extend(setup.runs_problem(0));
        let (ids, _) = events_of(&report);
        let opens = report["opens"].as_array().map_or(0, Vec::len);
        if !ids.is_empty() || opens != 0 || !report["reason"].to_string().contains("Failed to fetch") {
            problems.push(format!(
                "the page on origin C read {} events and {opens} responses (reason {}), want nothing readable",
                ids.len(),
                report["reason"]
            ));
        }
        let refused = setup
            .backend
            .recorded()
            .iter()
            .any(|r| r.method == "OPTIONS" && r.header("origin") == Some(c.as_str()));
        if !refused {
            problems.push("the backend saw no preflight from origin C".to_owned());
        }
        assert_none("the same page on origin C", &problems, &setup, &report);
    }

    // 2. Plain HTTP: a run started from origin A; then, with `Origin: C`, every request about it that the
    //    gateway answers itself. Each is answered (so the check reaches the gateway's own answers), none allows C.
    let start = format!(
        "POST {RUN} HTTP/1.1\r\nHost: gateway\r\nOrigin: {a}\r\nAccept: text/event-stream\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
    );
    let mut run = Client::write(b, start.as_bytes()).await.expect("start the run");
    run.read_head().await.expect("the run's head");
    run.read_until_contains(b"\nid: sg1-", PATIENCE)
        .await
        .expect("the run's first id");
    run.read_until_contains(b"\n\n", PATIENCE)
        .await
        .expect("the first event");
    let body = String::from_utf8_lossy(&run.body).into_owned();
    let token = body
        .split("id: ")
        .nth(1)
        .and_then(|rest| parse_id(rest.lines().next().unwrap_or("")))
        .map(|(t, _)| t.to_owned())
        .expect("the run's token");
    let url = format!("/_gateway/streams/{token}");
    let mut problems = Vec::new();
    // Only whether C is allowed is checked: whether the gateway serves or refuses C is not this test's business.
    let mut check = |what: &str, (status, head): (u16, String)| {
        if let Some(acao) = header_value(&head, "access-control-allow-origin") {
            problems.push(format!(
                "{what}: status {status} with Access-Control-Allow-Origin: {acao}, want none"
            ));
        }
    };
    let resume = |token: &str| {
        format!(
            "POST {RUN} HTTP/1.1\r\nHost: gateway\r\nOrigin: {c}\r\nLast-Event-ID: sg1-{token}-1\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}"
        )
    };
    let preflight = |path: &str, method: &str, headers: &str| {
        format!(
            "OPTIONS {path} HTTP/1.1\r\nHost: gateway\r\nOrigin: {c}\r\nAccess-Control-Request-Method: {method}\r\n\
             {headers}\r\n"
        )
    };
    let watch = format!("GET {url} HTTP/1.1\r\nHost: gateway\r\nOrigin: {c}\r\n\r\n");
    check("a watcher from C", head_of(b, watch).await);
    check("a resume from C", head_of(b, resume(&token)).await);
    check(
        "a resume of an unknown stream from C",
        head_of(b, resume(&"0".repeat(32))).await,
    );
    let asks = "Access-Control-Request-Headers: content-type,last-event-id\r\n";
    check(
        "a reconnect's preflight from C",
        head_of(b, preflight(RUN, "POST", asks)).await,
    );
    check(
        "a DELETE's preflight from C",
        head_of(b, preflight(&url, "DELETE", "")).await,
    );
    // Last, as it ends the run.
    let delete = format!("DELETE {url} HTTP/1.1\r\nHost: gateway\r\nOrigin: {c}\r\nContent-Length: 0\r\n\r\n");
    check("a DELETE from C", head_of(b, delete).await);
    drop(run);
    assert!(
        problems.is_empty(),
        "origin C, which the backend does not allow, was allowed by the gateway:\n- {}\nthe backend saw: {:?}",
        problems.join("\n- "),
        setup.backend_saw()
    );
    setup.gw.stop().await;
}
