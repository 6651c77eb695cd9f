//! OpenTelemetry traces of runs, model requests, tool calls and approvals, exported over OTLP.
//!
//! - Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and
//!   `OTEL_SDK_DISABLED` is not `true`, `OTEL_TRACES_EXPORTER` not `none`); the exporter reads the
//!   other standard variables itself (`OTEL_EXPORTER_OTLP_HEADERS`, `..._TIMEOUT`,
//!   `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`). The protocol is
//!   OTLP/HTTP with protobuf (`http/protobuf`, port 4318).
//! - One trace per run: its trace id and the id of its root span are derived from the run's uid
//!   ([`run_span_context`]), so the controller (which emits the root span when the run ends, and
//!   one span per approval, see [`spans`]) and every worker Pod (which gets the context in
//!   `TRACEPARENT`) put their spans in the same trace without sharing any state.
//! - The worker's spans follow the GenAI semantic conventions (`invoke_agent`, `chat`,
//!   `execute_tool`); they are `tracing` spans of target [`TARGET`], exported by the
//!   `tracing-opentelemetry` layer, and their context goes to the model endpoint, HTTP tools and
//!   MCP servers in `traceparent` ([`current_headers`]).

pub mod spans;

use std::cell::Cell;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator, SdkTracerProvider};
use sha2::{Digest, Sha256};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of the spans exported as OpenTelemetry spans.
pub const TARGET: &str = "agentrun::trace";

/// The instrumentation scope of agentrun's spans.
pub const SCOPE: &str = "agentrun";

/// The environment variable carrying a trace context into a worker Pod (the OpenTelemetry
/// convention for environment-variable propagation).
pub const TRACEPARENT_ENV: &str = "TRACEPARENT";

/// Errors setting up the export.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// Only OTLP over HTTP with protobuf is built in.
    #[error(
        "{var}={value} is not supported: agentrun exports OTLP over HTTP (http/protobuf, usually port 4318)"
    )]
    Protocol {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// The exporter could not be built (e.g. an invalid endpoint).
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
}

/// Whether the standard environment asks for trace export.
pub fn configured() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"));
    let no_exporter =
        std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.trim().eq_ignore_ascii_case("none"));
    !disabled
        && !no_exporter
        && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The export pipeline of a process; [`Telemetry::shutdown`] flushes it.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sets up the export from the environment ([`configured`]), as the global tracer provider,
    /// with `service` as `service.name` unless `OTEL_SERVICE_NAME` says otherwise. Does nothing
    /// (and succeeds) when the environment does not ask for it.
    pub fn from_env(service: &str) -> Result<Telemetry, TelemetryError> {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        if !configured() {
            return Ok(Telemetry::default());
        }
        for var in [
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ] {
            if let Ok(value) = std::env::var(var)
                && !value.trim().is_empty()
                && value.trim() != "http/protobuf"
            {
                return Err(TelemetryError::Protocol { var, value });
            }
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let service = std::env::var("OTEL_SERVICE_NAME")
            .is_err()
            .then_some(service);
        Ok(Telemetry::install(exporter, service))
    }

    /// Exports to the OTLP/HTTP endpoint `endpoint` (e.g. `http://127.0.0.1:4318`; spans go to
    /// `{endpoint}/v1/traces`) as `service`, whatever the environment says, as the global tracer
    /// provider: for processes that cannot set their environment (tests).
    pub fn to_endpoint(endpoint: &str, service: &str) -> Result<Telemetry, TelemetryError> {
        use opentelemetry_otlp::WithExportConfig as _;
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        Ok(Telemetry::install(exporter, Some(service)))
    }

    fn install(exporter: opentelemetry_otlp::SpanExporter, service: Option<&str>) -> Telemetry {
        let mut resource = opentelemetry_sdk::Resource::builder();
        if let Some(service) = service {
            resource = resource.with_service_name(service.to_owned());
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_id_generator(RunIds)
            .with_resource(resource.build())
            .build();
        opentelemetry::global::set_tracer_provider(provider.clone());
        Telemetry {
            provider: Some(provider),
        }
    }

    /// Whether spans are exported.
    pub fn enabled(&self) -> bool {
        self.provider.is_some()
    }

    /// The `tracing` layer exporting the spans of target [`TARGET`], when enabled.
    pub fn layer<S>(&self) -> Option<impl tracing_subscriber::Layer<S> + use<S>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        let provider = self.provider.as_ref()?;
        let filter =
            tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE);
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(SCOPE))
                .with_filter(filter),
        )
    }

    /// Sends what is buffered (call before the process exits).
    pub fn flush(&self) {
        if let Some(provider) = &self.provider
            && let Err(e) = provider.force_flush()
        {
            tracing::warn!(error = %e, "could not export the last spans");
        }
    }

    /// Sends what is buffered and stops the export.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider {
            let _ = provider.force_flush();
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "could not stop the span export cleanly");
            }
        }
    }
}

thread_local! {
    /// Ids the next span built on this thread must have (see [`RunIds`]).
    static NEXT_IDS: Cell<Option<(TraceId, SpanId)>> = const { Cell::new(None) };
}

/// Random ids, except for a span built by [`with_ids`] (a run's root span, whose ids are derived
/// from the run's uid).
#[derive(Debug)]
struct RunIds;

impl IdGenerator for RunIds {
    fn new_trace_id(&self) -> TraceId {
        NEXT_IDS
            .with(Cell::get)
            .map_or_else(|| RandomIdGenerator::default().new_trace_id(), |(t, _)| t)
    }

    fn new_span_id(&self) -> SpanId {
        NEXT_IDS
            .with(Cell::get)
            .map_or_else(|| RandomIdGenerator::default().new_span_id(), |(_, s)| s)
    }
}

/// Runs `build` (which must build exactly one span, without a parent) so that the span gets the
/// ids of `context`.
pub(crate) fn with_ids<T>(context: &SpanContext, build: impl FnOnce() -> T) -> T {
    NEXT_IDS.with(|ids| ids.set(Some((context.trace_id(), context.span_id()))));
    let built = build();
    NEXT_IDS.with(|ids| ids.set(None));
    built
}

/// The span context of run `uid`'s root span: its trace id is the first 16 bytes of
/// SHA-256(`agentrun.dev/run/<uid>`), the span id the next 8. Every process derives the same.
pub fn run_span_context(uid: &str) -> SpanContext {
    let digest = Sha256::digest(format!("agentrun.dev/run/{uid}").as_bytes());
    let mut trace = [0u8; 16];
    let mut span = [0u8; 8];
    trace.copy_from_slice(&digest[..16]);
    span.copy_from_slice(&digest[16..24]);
    SpanContext::new(
        TraceId::from_bytes(trace),
        SpanId::from_bytes(span),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    )
}

/// The W3C `traceparent` of run `uid`'s root span (what each of its worker Pods gets in
/// [`TRACEPARENT_ENV`]).
pub fn run_traceparent(uid: &str) -> String {
    let cx = run_span_context(uid);
    format!("00-{}-{}-01", cx.trace_id(), cx.span_id())
}

/// The context whose parent is run `uid`'s root span.
pub fn run_context(uid: &str) -> opentelemetry::Context {
    opentelemetry::Context::new().with_remote_span_context(run_span_context(uid))
}

/// The context a `traceparent` value (e.g. [`TRACEPARENT_ENV`]) describes, if it is valid.
pub fn context_from_traceparent(traceparent: &str) -> Option<opentelemetry::Context> {
    struct One<'a>(&'a str);
    impl Extractor for One<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            (key == "traceparent").then_some(self.0)
        }
        fn keys(&self) -> Vec<&str> {
            vec!["traceparent"]
        }
    }
    let cx = TraceContextPropagator::new().extract(&One(traceparent));
    cx.span().span_context().is_valid().then_some(cx)
}

/// Makes the current `tracing` span a child of `cx` (a remote parent).
pub fn set_parent(span: &tracing::Span, cx: opentelemetry::Context) {
    if let Err(e) = span.set_parent(cx) {
        tracing::debug!(error = %e, "span parent not set");
    }
}

/// The trace headers (`traceparent`, and `tracestate` when set) of the current `tracing` span,
/// for an outgoing request; empty when nothing is traced.
pub fn current_headers() -> Vec<(String, String)> {
    struct Headers(Vec<(String, String)>);
    impl Injector for Headers {
        fn set(&mut self, key: &str, value: String) {
            self.0.push((key.to_owned(), value));
        }
    }
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return vec![];
    }
    let mut headers = Headers(vec![]);
    TraceContextPropagator::new().inject_context(&cx, &mut headers);
    headers.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_has_one_trace_whatever_process_derives_it() {
        let a = run_traceparent("7b1c-uid");
        assert_eq!(a, run_traceparent("7b1c-uid"));
        assert_ne!(a, run_traceparent("other"));
        assert!(
            a.starts_with("00-") && a.ends_with("-01") && a.len() == 55,
            "{a}"
        );
        let cx = context_from_traceparent(&a).unwrap();
        let span = cx.span().span_context().clone();
        assert_eq!(span.trace_id(), run_span_context("7b1c-uid").trace_id());
        assert_eq!(span.span_id(), run_span_context("7b1c-uid").span_id());
        assert!(context_from_traceparent("garbage").is_none());
    }

    #[test]
    fn ids_are_random_unless_a_root_is_built() {
        let cx = run_span_context("u");
        let (t, s) = with_ids(&cx, || (RunIds.new_trace_id(), RunIds.new_span_id()));
        assert_eq!((t, s), (cx.trace_id(), cx.span_id()));
        assert_ne!(RunIds.new_trace_id(), cx.trace_id());
    }
}
