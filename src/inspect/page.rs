//! The inspector's pages and their assets, all served from the binary (no CDN, no external asset): the list,
//! one stream's two columns, the token form. Their script and style are same-origin files, so the CSP allows no
//! inline script or style at all.

/// The pages' CSP: nothing but same-origin scripts, styles, images and fetches; forms post only here.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                       connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

pub const SCRIPT: &str = include_str!("assets/inspector.js");
pub const STYLE: &str = include_str!("assets/inspector.css");
pub const ICON: &str = include_str!("assets/icon.svg");

const HEAD: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<meta name="referrer" content="no-referrer">
<link rel="icon" href="/debug/assets/icon.svg"><link rel="stylesheet" href="/debug/assets/inspector.css">
<script src="/debug/assets/inspector.js" defer></script>"#;

/// `/debug/streams`: the streams, live and recently finished (filled by the script from `streams.json`).
pub fn list() -> String {
    format!(
        r#"{HEAD}<title>Streams · sse-gateway</title></head>
<body data-view="list"><h1>Streams</h1>
<p class="meta">Live and recently finished translated streams; open one to see its legacy events beside its envelopes.</p>
<table><thead><tr><th>id</th><th>state</th><th>path</th><th>dialect</th><th>encoder</th><th>envelopes</th>
<th>bytes in / out</th><th>readers</th></tr></thead><tbody id="streams"></tbody></table></body></html>
"#
    )
}

/// `/debug/streams/{id}`: one stream, its legacy events and its envelopes side by side.
pub fn stream() -> String {
    format!(
        r#"{HEAD}<title>Stream · sse-gateway</title></head>
<body data-view="stream"><h1 id="title">Stream</h1>
<p><a href="/debug/streams">All streams</a> · <a id="capture">capture.ndjson</a></p>
<div id="summary" class="meta"></div>
<div class="cols"><section class="col" id="raw"><h2>Legacy events</h2></section>
<section class="col" id="env"><h2>Envelopes</h2></section></div></body></html>
"#
    )
}

/// The form a browser gives the token in once; the answer keeps it in a cookie for `/debug/`.
pub fn login(failed: bool) -> String {
    let note = if failed {
        r#"<p class="state-failed">That is not the token.</p>"#
    } else {
        ""
    };
    format!(
        r#"{HEAD}<title>Token · sse-gateway</title></head>
<body data-view="login"><h1>Stream inspector</h1>{note}
<form method="post" action="/debug/login"><label>debug.token<input type="password" name="token" autocomplete="off"
required minlength="32"></label><button type="submit">Open</button></form></body></html>
"#
    )
}
