//! OpenTelemetry traces (DESIGN 6.1, docs/OBSERVABILITY.md): a SERVER span per request (`request`), an
//! `invoke_agent` CLIENT span per translated run with a child per subagent scope (`run`, a tap on the stream),
//! and the exporter (`export`), all started from `settings`. Off unless an endpoint is given: then nothing is
//! made, and the handler's only cost is one `Option` check.

pub mod export;
pub mod request;
pub mod run;
pub mod settings;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use opentelemetry::trace::SpanContext;
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use prometheus::Registry;

use crate::resume::id::Token;
use settings::{Asked, TraceSettings};

/// Held streams whose run span a reconnect can link to, at most (the oldest forgotten first).
pub const MAX_LINKED_RUNS: usize = 65_536;

/// The traces of one daemon.
pub struct Traces {
    tracer: SdkTracer,
    /// Kept: dropping the provider would stop the tracer.
    _provider: SdkTracerProvider,
    propagator: TraceContextPropagator,
    pub settings: TraceSettings,
    /// Each held stream's run span, for the link of a reconnect's or watcher's span.
    runs: Mutex<Linked>,
}

#[derive(Default)]
struct Linked {
    by_token: HashMap<Token, SpanContext>,
    order: VecDeque<Token>,
}

impl Traces {
    /// Reads the settings (the process environment and `[telemetry]`) and, when traces are asked for, starts the
    /// exporter on `rt`. `Ok(None)`: off.
    pub fn start(
        cfg: &crate::config::Telemetry,
        registry: &Registry,
        rt: &tokio::runtime::Handle,
    ) -> Result<Option<Arc<Traces>>, String> {
        let env: HashMap<String, String> = std::env::vars().collect();
        let settings = match settings::read(&env, cfg).map_err(|e| e.to_string())? {
            Asked::Off => return Ok(None),
            Asked::Export(s) => *s,
        };
        let drops = export::DropCounters::register(registry).map_err(|e| e.to_string())?;
        let named = env.get("OTEL_SERVICE_NAME").is_some_and(|v| !v.trim().is_empty())
            || env
                .get("OTEL_RESOURCE_ATTRIBUTES")
                .is_some_and(|v| v.split(',').any(|kv| kv.trim_start().starts_with("service.name=")));
        let mut resource = Resource::builder();
        if !named {
            resource = resource.with_service_name(env!("CARGO_PKG_NAME"));
        }
        let resource = resource.build();
        let queue = export::start(&settings, &resource, drops, rt);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(queue)
            .with_resource(resource)
            .build();
        let scope = InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        use opentelemetry::trace::TracerProvider as _;
        let tracer = provider.tracer_with_scope(scope);
        tracing::info!(
            endpoint = %settings.endpoint,
            capture_content = settings.capture_content,
            "OpenTelemetry traces exported (OTLP/HTTP protobuf)"
        );
        Ok(Some(Arc::new(Traces {
            tracer,
            _provider: provider,
            propagator: TraceContextPropagator::new(),
            settings,
            runs: Mutex::new(Linked::default()),
        })))
    }

    pub fn tracer(&self) -> &SdkTracer {
        &self.tracer
    }

    /// Remembers the run span of the held stream `token`.
    pub fn remember_run(&self, token: Token, run: SpanContext) {
        let Ok(mut l) = self.runs.lock() else { return };
        if l.by_token.insert(token, run).is_none() {
            l.order.push_back(token);
        }
        while l.order.len() > MAX_LINKED_RUNS {
            if let Some(old) = l.order.pop_front() {
                l.by_token.remove(&old);
            }
        }
    }

    /// The run span of the held stream `token`, if this instance made it and still remembers it.
    pub fn run_of(&self, token: &Token) -> Option<SpanContext> {
        self.runs.lock().ok()?.by_token.get(token).cloned()
    }
}
