//! Why an exchange with the upstream failed, as `upstream_errors_total{kind}` counts it.

label_enum! {
    /// The `kind` label of `upstream_errors_total`.
    pub enum UpstreamErrorKind {
        /// TCP connect failed or timed out.
        Connect = "connect",
        /// No response head within `upstream.response_timeout_secs`.
        Timeout = "timeout",
        /// The response body failed mid-stream.
        Reset = "reset",
        /// Any other HTTP-level failure before the response head.
        Protocol = "protocol",
        /// The upstream answered with a 5xx status.
        Status = "status",
        /// An event stream ended without `[DONE]` or the backend's failure JSON.
        Truncated = "truncated",
    }
}
