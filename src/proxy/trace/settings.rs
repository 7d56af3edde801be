//! The exporter's settings, read once at start from the standard `OTEL_*` variables and `[telemetry]` (the
//! environment wins). Every value is checked here: a start with traces asked for and a bad value is refused,
//! naming the variable (never its value: headers carry credentials).

use std::collections::HashMap;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Uri};

use crate::config::{IncomingTrace, Telemetry};

/// What was asked for: nothing (no endpoint, or turned off), or export with these settings.
#[derive(Debug, Clone, PartialEq)]
pub enum Asked {
    Off,
    Export(Box<TraceSettings>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// The traces URL (plain `http`).
    pub endpoint: Uri,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub gzip: bool,
    /// One export request's deadline (`OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT`, default 10 s).
    pub request_timeout: Duration,
    /// `OTEL_BSP_SCHEDULE_DELAY` (5 s): how long a span waits for its batch at most.
    pub schedule_delay: Duration,
    /// `OTEL_BSP_EXPORT_TIMEOUT` (30 s): one batch's export, retries included.
    pub export_timeout: Duration,
    /// `OTEL_BSP_MAX_QUEUE_SIZE` (2,048): spans waiting; past it a span is dropped and counted.
    pub max_queue: usize,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512, at most the queue).
    pub max_batch: usize,
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`: prompts, tool arguments and results on spans.
    pub capture_content: bool,
    pub incoming: IncomingTrace,
    pub provider_name: Option<String>,
}

/// A setting that cannot be used; the start is refused with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct BadSetting {
    pub variable: &'static str,
    pub problem: String,
}

fn bad(variable: &'static str, problem: impl Into<String>) -> BadSetting {
    BadSetting {
        variable,
        problem: problem.into(),
    }
}

/// Reads the settings from `env` (the process environment in the daemon) and `[telemetry]`.
pub fn read(env: &HashMap<String, String>, cfg: &Telemetry) -> Result<Asked, BadSetting> {
    let get = |k: &str| env.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    // The signal-specific variable wins over the general one (the OTLP exporter spec).
    let either = |traces: &'static str, general: &'static str| match get(traces) {
        Some(v) => Some((traces, v)),
        None => get(general).map(|v| (general, v)),
    };
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(Asked::Off);
    }
    match get("OTEL_TRACES_EXPORTER") {
        Some(v) if v.eq_ignore_ascii_case("none") => return Ok(Asked::Off),
        Some(v) if !v.eq_ignore_ascii_case("otlp") => {
            return Err(bad("OTEL_TRACES_EXPORTER", "only \"otlp\" or \"none\" is supported"))
        }
        _ => {}
    }
    let (variable, endpoint) = if let Some(v) = get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", v.to_owned())
    } else if let Some(v) = get("OTEL_EXPORTER_OTLP_ENDPOINT") {
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!("{}/v1/traces", v.trim_end_matches('/')),
        )
    } else if !cfg.otlp_endpoint.trim().is_empty() {
        ("telemetry.otlp_endpoint", cfg.otlp_endpoint.trim().to_owned())
    } else {
        return Ok(Asked::Off);
    };
    let endpoint = parse_endpoint(&endpoint).map_err(|p| bad(variable, p))?;
    if let Some((name, v)) = either("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL") {
        if v != "http/protobuf" {
            return Err(bad(
                name,
                format!("{v:?} is not supported: the gateway exports OTLP/HTTP protobuf only (\"http/protobuf\")"),
            ));
        }
    }
    let headers = match either("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS") {
        Some((name, v)) => parse_headers(v).map_err(|p| bad(name, p))?,
        None => Vec::new(),
    };
    let gzip = match either(
        "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
    ) {
        None => false,
        Some((_, v)) if v.eq_ignore_ascii_case("none") => false,
        Some((_, v)) if v.eq_ignore_ascii_case("gzip") => true,
        Some((name, _)) => return Err(bad(name, "must be \"gzip\" or \"none\"")),
    };
    let millis = |name: &'static str, default: u64| -> Result<Duration, BadSetting> {
        match get(name) {
            None => Ok(Duration::from_millis(default)),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n > 0 && n <= 3_600_000 => Ok(Duration::from_millis(n)),
                _ => Err(bad(name, "must be a whole number of milliseconds, 1 to 3600000")),
            },
        }
    };
    let request_timeout = match either("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT") {
        Some((name, _)) => millis(name, 10_000)?,
        None => Duration::from_secs(10),
    };
    let count = |name: &'static str, default: usize| -> Result<usize, BadSetting> {
        match get(name) {
            None => Ok(default),
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=1 << 20).contains(&n) => Ok(n),
                _ => Err(bad(name, "must be a whole number, 1 to 1048576")),
            },
        }
    };
    let max_queue = count("OTEL_BSP_MAX_QUEUE_SIZE", 2_048)?;
    let max_batch = count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.min(max_queue);
    if let Some(v) = get("OTEL_TRACES_SAMPLER") {
        const KNOWN: [&str; 6] = [
            "always_on",
            "always_off",
            "traceidratio",
            "parentbased_always_on",
            "parentbased_always_off",
            "parentbased_traceidratio",
        ];
        if !KNOWN.contains(&v) {
            return Err(bad(
                "OTEL_TRACES_SAMPLER",
                format!("must be one of {}", KNOWN.join(", ")),
            ));
        }
        if v.ends_with("traceidratio") {
            let arg = get("OTEL_TRACES_SAMPLER_ARG").and_then(|a| a.parse::<f64>().ok());
            if !arg.is_some_and(|r| (0.0..=1.0).contains(&r)) {
                return Err(bad("OTEL_TRACES_SAMPLER_ARG", "must be a ratio from 0 to 1"));
            }
        }
    }
    Ok(Asked::Export(Box::new(TraceSettings {
        endpoint,
        headers,
        gzip,
        request_timeout,
        schedule_delay: millis("OTEL_BSP_SCHEDULE_DELAY", 5_000)?,
        export_timeout: millis("OTEL_BSP_EXPORT_TIMEOUT", 30_000)?,
        max_queue,
        max_batch,
        capture_content: get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        incoming: cfg.incoming_trace,
        provider_name: cfg.provider_name.clone(),
    })))
}

/// A plain-HTTP URL with a host: the gateway speaks no TLS (a collector on the host or a sidecar is the norm).
fn parse_endpoint(url: &str) -> Result<Uri, String> {
    let uri: Uri = url.parse().map_err(|_| "is not a URL".to_owned())?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(
                "https is not supported (the gateway speaks no TLS): point it at a collector over http, e.g. \
                 http://127.0.0.1:4318"
                    .into(),
            )
        }
        _ => return Err("needs an http:// URL".into()),
    }
    match uri.authority() {
        Some(a) if !a.host().is_empty() && !a.as_str().contains('@') => Ok(uri),
        Some(a) if a.as_str().contains('@') => {
            Err("must not carry credentials (use OTEL_EXPORTER_OTLP_HEADERS)".into())
        }
        _ => Err("needs a host".into()),
    }
}

/// `key=value,key2=value2`, values percent-decoded (the OTLP exporter spec's W3C Baggage-like format).
fn parse_headers(v: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::new();
    for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, val) = pair.split_once('=').ok_or("each header must be key=value")?;
        let name = HeaderName::from_bytes(k.trim().as_bytes()).map_err(|_| "a header name is not a valid name")?;
        let decoded = percent_decode(val.trim()).ok_or("a header value has a bad %-escape")?;
        let value = HeaderValue::from_bytes(&decoded).map_err(|_| "a header value is not a valid value")?;
        out.push((name, value));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn export(pairs: &[(&str, &str)]) -> TraceSettings {
        match read(&env(pairs), &Telemetry::default()) {
            Ok(Asked::Export(s)) => *s,
            other => panic!("expected export, got {other:?}"),
        }
    }

    #[test]
    fn without_an_endpoint_nothing_is_exported() {
        assert_eq!(
            read(&env(&[("OTEL_SERVICE_NAME", "x")]), &Telemetry::default()),
            Ok(Asked::Off)
        );
    }

    #[test]
    fn the_traces_endpoint_is_used_as_is_and_the_general_one_gets_v1_traces() {
        let s = export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")]);
        assert_eq!(s.endpoint, "http://c:4318/v1/traces");
        let s = export(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
        ]);
        assert_eq!(s.endpoint, "http://t:1/x");
    }

    #[test]
    fn the_environment_wins_over_the_config_endpoint() {
        let cfg = Telemetry {
            otlp_endpoint: "http://cfg:4318/v1/traces".into(),
            ..Telemetry::default()
        };
        let Ok(Asked::Export(s)) = read(&env(&[]), &cfg) else {
            panic!("config endpoint ignored")
        };
        assert_eq!(s.endpoint, "http://cfg:4318/v1/traces");
        let Ok(Asked::Export(s)) = read(&env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:1")]), &cfg) else {
            panic!("env endpoint ignored")
        };
        assert_eq!(s.endpoint, "http://env:1/v1/traces");
    }

    #[test]
    fn disabled_sdk_or_no_exporter_turns_it_off_even_with_an_endpoint() {
        for off in [("OTEL_SDK_DISABLED", "true"), ("OTEL_TRACES_EXPORTER", "none")] {
            let e = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), off]);
            assert_eq!(read(&e, &Telemetry::default()), Ok(Asked::Off), "{off:?}");
        }
    }

    #[test]
    fn grpc_and_json_are_refused_naming_the_variable() {
        for (var, v) in [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ] {
            let e = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"), (var, v)]);
            let err = read(&e, &Telemetry::default()).expect_err(v);
            assert_eq!(err.variable, var);
        }
    }

    #[test]
    fn headers_are_percent_decoded_and_bad_ones_refused_without_their_value() {
        let s = export(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s%20ecret, x-team=a"),
        ]);
        assert_eq!(s.headers.len(), 2);
        assert_eq!(s.headers[0].1, "s ecret");
        let e = env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=sec\nret"),
        ]);
        let err = read(&e, &Telemetry::default()).expect_err("bad header");
        assert!(!err.to_string().contains("sec"), "{err}");
    }

    #[test]
    fn https_credentials_and_bad_numbers_are_refused() {
        for (var, v) in [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://c:4318"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://u:p@c:4318"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
            ("OTEL_TRACES_SAMPLER", "sometimes"),
        ] {
            let mut e = env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]);
            e.insert(var.into(), v.into());
            let err = read(&e, &Telemetry::default()).expect_err(v);
            assert_eq!(err.variable, var, "{v}");
        }
    }

    #[test]
    fn batch_settings_and_content_capture_are_read() {
        let s = export(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "10"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "50"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
        ]);
        assert_eq!((s.max_queue, s.max_batch), (10, 10));
        assert_eq!(s.schedule_delay, Duration::from_millis(100));
        assert!(s.gzip && s.capture_content);
    }
}
