//! Prometheus metrics of the controller (text exposition format via `prometheus-client`), and the
//! `/metrics`, `/healthz`, `/readyz` and `/.well-known/jwks.json` endpoints.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use kube::runtime::reflector::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::owned::Owned;
use crate::crd::{AgentRun, AgentRunPhase, ApprovalPhase, ApprovalRequest, Reason};

/// Labels of the reconcile counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or the error's metric label.
    pub result: String,
}

/// Labels of the runs-by-phase gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The run phase.
    pub phase: String,
}

/// The controller's metrics.
pub struct Metrics {
    registry: Registry,
    /// Reconciles by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Reconcile duration.
    pub reconcile_duration: Histogram,
    /// Runs by phase (set at scrape time from the cache).
    pub runs: Family<PhaseLabels, Gauge>,
    /// ApprovalRequests of runs in progress waiting for a decision (set at scrape time).
    pub pending_approvals: Gauge,
    /// Seconds from an ApprovalRequest's creation to its decision.
    pub approval_wait: Histogram,
    /// Seconds from a decision to the next worker Pod's creation.
    pub resume_latency: Histogram,
    /// Worker Pods that failed.
    pub worker_failures: Counter,
    /// Refusals by reason: tampered states, decisions not applied.
    pub refusals: Family<ReasonLabels, Counter>,
    /// Notifications: deliveries, failures, drops and what waits, per sink.
    pub notifications: crate::notify::metrics::NotifyMetrics,
    /// Events waiting to be published ([`super::event_queue`]).
    pub events_queued: Gauge,
    /// Events dropped because the queue was full.
    pub events_dropped: Counter,
}

/// Labels of the refusals counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The condition reason (`TamperedState`, `UnverifiedDecision`, `SeparationOfDuties`).
    pub reason: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("agentrun");
        let reconciles = Family::<ResultLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles of AgentRuns by result",
            reconciles.clone(),
        );
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one AgentRun reconcile",
            reconcile_duration.clone(),
        );
        let runs = Family::<PhaseLabels, Gauge>::default();
        registry.register("runs", "AgentRuns by phase", runs.clone());
        let pending_approvals = Gauge::default();
        registry.register(
            "pending_approvals",
            "ApprovalRequests of runs in progress waiting for a decision",
            pending_approvals.clone(),
        );
        let approval_wait = Histogram::new(exponential_buckets(1.0, 2.0, 18));
        registry.register(
            "approval_wait_seconds",
            "Time from an ApprovalRequest's creation to its decision",
            approval_wait.clone(),
        );
        let resume_latency = Histogram::new(exponential_buckets(0.01, 2.0, 14));
        registry.register(
            "resume_latency_seconds",
            "Time from a decision to the next worker Pod's creation",
            resume_latency.clone(),
        );
        let worker_failures = Counter::default();
        registry.register(
            "worker_failures",
            "Worker Pods that failed",
            worker_failures.clone(),
        );
        let refusals = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "refusals",
            "Runs failed for a tampered state and decisions not applied, by reason",
            refusals.clone(),
        );
        let notifications = crate::notify::metrics::NotifyMetrics::register(&mut registry);
        let events_queued = Gauge::default();
        registry.register(
            "events_queued",
            "Events waiting to be published",
            events_queued.clone(),
        );
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            "Events dropped unpublished because the queue was full",
            events_dropped.clone(),
        );
        Metrics {
            events_queued,
            events_dropped,
            registry,
            notifications,
            refusals,
            reconciles,
            reconcile_duration,
            runs,
            pending_approvals,
            approval_wait,
            resume_latency,
            worker_failures,
        }
    }
}

impl Metrics {
    /// Records one reconcile.
    pub fn reconciled(&self, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// Counts one refusal.
    pub fn refused(&self, reason: Reason) {
        self.refusals
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Sets the gauges from the caches and renders the registry.
    pub fn render(&self, runs: &Store<AgentRun>, requests: &Owned<ApprovalRequest>) -> String {
        for &phase in <AgentRunPhase as strum::VariantArray>::VARIANTS {
            let count = runs
                .state()
                .iter()
                .filter(|r| r.status.as_ref().and_then(|s| s.phase).unwrap_or_default() == phase)
                .count();
            self.runs
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().to_owned(),
                })
                .set(count as i64);
        }
        let pending = requests
            .state()
            .iter()
            .filter(|r| {
                r.spec.decision.is_none()
                    && r.status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .unwrap_or(ApprovalPhase::Pending)
                        == ApprovalPhase::Pending
            })
            .count();
        self.pending_approvals.set(pending as i64);
        self.encode()
    }

    /// The registry in the text exposition format, as it is (no gauge set from the caches).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The caches the metrics count: runs and ApprovalRequests.
pub type Caches = (Store<AgentRun>, Arc<Owned<ApprovalRequest>>);

/// What the HTTP endpoints read.
#[derive(Clone)]
pub struct Probe {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Set once this replica leads and its caches are synced, or while it stands by.
    pub ready: Arc<AtomicBool>,
    /// Which caches have synced (one bit each).
    pub synced: Arc<std::sync::atomic::AtomicU8>,
    /// The caches, once the controller runs.
    pub caches: Arc<std::sync::OnceLock<Caches>>,
    /// The JWKS of the approval assertions' public keys, when the controller signs them.
    pub jwks: Option<Arc<str>>,
}

async fn metrics(State(probe): State<Probe>) -> impl IntoResponse {
    let body = match probe.caches.get() {
        Some((runs, requests)) => probe.metrics.render(runs, requests),
        None => {
            let mut out = String::new();
            let _ = prometheus_client::encoding::text::encode(&mut out, &probe.metrics.registry);
            out
        }
    };
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
}

async fn readyz(State(probe): State<Probe>) -> impl IntoResponse {
    if probe.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}

/// The public keys of the approval assertions (404 when the controller does not sign them).
async fn jwks(State(probe): State<Probe>) -> impl IntoResponse {
    match probe.jwks {
        Some(jwks) => (
            StatusCode::OK,
            [
                (axum::http::header::CONTENT_TYPE, "application/jwk-set+json"),
                (axum::http::header::CACHE_CONTROL, "max-age=300"),
            ],
            jwks.to_string(),
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "approval assertions are not signed").into_response(),
    }
}

/// Serves `/metrics`, `/healthz`, `/readyz` and the assertions' JWKS
/// ([`JWKS_PATH`](super::signing::JWKS_PATH)) on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, probe: Probe) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route(super::signing::JWKS_PATH, get(jwks))
        .with_state(probe);
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_renders_every_metric() {
        let metrics = Metrics::default();
        metrics.reconciled("ok", Duration::from_millis(3));
        metrics.approval_wait.observe(12.0);
        metrics.resume_latency.observe(0.2);
        metrics.worker_failures.inc();
        metrics.refused(Reason::TamperedState);
        let (runs, _) = kube::runtime::reflector::store::<AgentRun>();
        let requests = Owned::<ApprovalRequest>::new();
        let text = metrics.render(&runs, &requests);
        for name in [
            "agentrun_reconciles_total{result=\"ok\"} 1",
            "agentrun_reconcile_duration_seconds_count 1",
            "agentrun_runs{phase=\"AwaitingApproval\"} 0",
            "agentrun_pending_approvals 0",
            "agentrun_approval_wait_seconds_count 1",
            "agentrun_resume_latency_seconds_count 1",
            "agentrun_worker_failures_total 1",
            "agentrun_refusals_total{reason=\"TamperedState\"} 1",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
