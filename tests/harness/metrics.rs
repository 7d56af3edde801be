//! The one reader of the Prometheus text the admin port serves (`benches/load` includes this file by path).

#![allow(dead_code)]

/// Sum of a metric's samples whose line contains every given fragment (e.g. `mode="translate"`); `None` when no
/// sample matches.
pub fn metric_opt(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(None, |sum, v| Some(sum.unwrap_or(0.0) + v))
}

/// Sum of a metric's samples whose line contains every given fragment (e.g. `mode="translate"`); 0 when none.
pub fn metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    metric_opt(text, name, labels).unwrap_or(0.0)
}

/// Checks, in a `/metrics` text, how many requests went upstream on each kind of connection.
pub fn assert_upstream_connections(metrics: &str, pooled: usize, dedicated: usize) {
    let on = |c: &str| {
        metric(
            metrics,
            "sse_gateway_upstream_requests_total",
            &[&format!("connection=\"{c}\"")],
        )
    };
    assert_eq!(
        (on("pooled"), on("dedicated")),
        (pooled as f64, dedicated as f64),
        "requests on (pooled, dedicated) connections"
    );
}

/// `sse_gateway_resume_ended_total` of the held streams that ended `how` (completed, abandoned, cancelled, lost).
pub fn resume_ended(metrics: &str, how: &str) -> f64 {
    metric(metrics, "sse_gateway_resume_ended_total", &[&format!("how=\"{how}\"")])
}

/// `sse_gateway_resume_streams`, the held streams in `state` (live, grace, retained).
pub fn resume_streams(metrics: &str, state: &str) -> f64 {
    metric(metrics, "sse_gateway_resume_streams", &[&format!("state=\"{state}\"")])
}

/// `sse_gateway_resume_requests_total` of the resuming requests answered with `outcome` (replayed, gap, unknown,
/// denied).
pub fn resume_requests(metrics: &str, outcome: &str) -> f64 {
    metric(
        metrics,
        "sse_gateway_resume_requests_total",
        &[&format!("outcome=\"{outcome}\"")],
    )
}
