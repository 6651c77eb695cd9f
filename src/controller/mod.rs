//! The controller: reconciles `AgentRun`s. It starts worker Pods, turns halts into
//! `ApprovalRequest`s, applies decisions to the RunState with their audit metadata, and resumes
//! approved runs in a new worker Pod.
//!
//! A reconcile ([`reconcile`]) has three named steps:
//!
//! 1. [`observe`]: what the caches say about the run (its Agent, Pods and requests), and its
//!    RunState only when the next action depends on it;
//! 2. [`plan`] (pure, on top of [`decide`]): the [`Plan`](plan::Plan) carrying everything the
//!    next action writes — typed status patches, the objects to create, the RunState with the
//!    decisions applied, Events, the resolutions to record;
//! 3. [`execute`]: the writes, with the `agentrun-controller` field manager.
//!
//! [`runtime`] wires the watches, caches, leader election and probes; [`agent_status`] and
//! [`policy_status`] are two more controllers, keeping each Agent's and each ApprovalPolicy's
//! status.

pub mod agent_status;
pub mod assertions;
pub mod cached_pod;
pub mod children;
pub mod decide;
pub mod event_queue;
pub mod execute;
pub mod memory;
pub mod metrics;
pub mod observe;
pub mod owned;
pub mod plan;
pub mod policy_status;
pub mod reconcile;
pub mod resolutions;
pub mod runtime;
pub mod shared_snapshots;
pub mod signing;
pub mod state_cache;
pub mod verify;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};

use crate::approval_policy::CompiledPolicy;
use crate::crd::stored_state::StoredStateError;
use crate::crd::{Agent, ApprovalPolicy, ApprovalRequest};
pub use children::{WorkerPodDeletion, WorkerSettings};
pub use decide::Policy;
pub use plan::{EXPIRED_MESSAGE, SUPERSEDED_MESSAGE};
pub use reconcile::{error_policy, reconcile};
pub use runtime::run;
pub use signing::{Issuer, SigningConfig};
pub use verify::DecisionRules;

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
    /// Writing the run's offloaded state failed.
    #[error("storing the run's state: {0}")]
    State(#[from] StoredStateError),
    /// The object has no namespace (the resources are namespaced).
    #[error("object has no namespace")]
    NoNamespace,
}

impl ReconcileError {
    /// A low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            ReconcileError::Kube(_) => "kube",
            ReconcileError::Finalizer(_) => "finalizer",
            ReconcileError::State(_) => "state",
            ReconcileError::NoNamespace => "no_namespace",
        }
    }
}

/// Errors starting the controller.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The CRDs are not installed.
    #[error(
        "the agentrun.dev CustomResourceDefinitions are not installed (kubectl apply -f crds/): {0}"
    )]
    CrdsMissing(String),
    /// The API server could not be reached.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Leader election failed.
    #[error("leader election: {0}")]
    LeaderElection(#[from] kube_lease_manager::LeaseManagerError),
    /// This replica lost its lease: it stops so that only the new leader reconciles.
    #[error("lost the leader lease")]
    LostLeadership,
    /// The signing keys could not be read, made or published.
    #[error("approval assertion keys: {0}")]
    Signing(#[from] signing::SigningError),
    /// The metrics endpoint could not listen.
    #[error("metrics endpoint {addr}: {source}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Leader election on a Lease, so that several replicas are safe: only the leader reconciles.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This replica's identity (its Pod name in a cluster).
    pub identity: String,
    /// How long a lease holds without renewal.
    pub lease_duration: Duration,
    /// How long before expiry the holder renews.
    pub grace: Duration,
}

/// How the controller runs.
#[derive(Clone, Debug, Default)]
pub struct ControllerConfig {
    /// Watch only this namespace (all when `None`).
    pub namespace: Option<String>,
    /// Worker Pod settings.
    pub worker: WorkerSettings,
    /// Retries and rechecks.
    pub policy: Policy,
    /// The prefix of the admission policies' names, `agentrun` when `None` (see
    /// [`runtime::policy_names`]).
    pub admission_policy_prefix: Option<String>,
    /// Where to serve `/metrics`, `/healthz` and `/readyz` (none when `None`).
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Leader election (none when `None`: this replica always reconciles).
    pub leader_election: Option<LeaderElection>,
    /// How many runs are reconciled at once ([`DEFAULT_CONCURRENCY`] when `None`). Bounding it
    /// bounds the controller's memory and its share of the API server under a burst.
    pub concurrency: Option<u16>,
    /// Bytes of small RunStates kept in memory so that applying a decision needs no read
    /// ([`state_cache::DEFAULT_BUDGET_BYTES`] when `None`; 0 disables).
    pub state_cache_bytes: Option<usize>,
    /// Signed approval assertions: where the keys are kept and published, and how long an
    /// assertion is valid (none issued when `None`).
    pub signing: Option<SigningConfig>,
    /// How often Agents' MCP servers are listed again
    /// ([`agent_status::DEFAULT_REDISCOVERY`] when `None`).
    pub mcp_rediscovery: Option<Duration>,
    /// Notifications to the NotificationSinks (none sent when `None`; see [`crate::notify`]).
    pub notifications: Option<crate::notify::NotifyConfig>,
    /// Fill the caches from a watch that streams the existing objects one by one (Kubernetes
    /// "streaming lists", the `WatchList` feature, on by default from 1.34) instead of listing
    /// them in pages: the API server encodes while the controller decodes, and no page is held
    /// in memory at once. Needs an API server with `WatchList` enabled.
    pub streaming_lists: bool,
}

/// How many runs are reconciled at once unless configured.
///
/// A reconcile that applies a decision holds its slot for three sequential writes (resolution,
/// state, Pod), about a second when the API server is busy. When every slot is taken, kube-runtime
/// keeps the reconciles that are due in a set and starts them in no particular order, so a
/// backlog turns into a long tail: at 64, 1000 approvals in 17 s waited up to 23 s (p99) for
/// their state write. 256 keeps up with such a burst (docs/benchmark.md). Memory stays bounded:
/// large states are read a few at a time whatever the concurrency.
pub const DEFAULT_CONCURRENCY: u16 = 256;

/// One bit per cache the controller waits for (runs, Pods, ApprovalRequests, Agents,
/// ApprovalPolicies, Namespaces) and one for the first check of the admission policies.
const ALL_CACHES: u8 = 0b111_1111;

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Where the reconciles' Events wait to be published.
    pub events: event_queue::EventQueue,
    /// Settings.
    pub config: ControllerConfig,
    /// Metrics.
    pub metrics: Arc<metrics::Metrics>,
    /// Signs approval assertions, when configured.
    pub issuer: Option<Arc<Issuer>>,
    pods: Arc<owned::Owned<cached_pod::CachedPod>>,
    requests: Arc<owned::Owned<ApprovalRequest>>,
    agents: Store<Agent>,
    approval_policies: Store<ApprovalPolicy>,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    compiled: moka::sync::Cache<(String, i64), Arc<CompiledPolicy>>,
    synced: Arc<AtomicU8>,
    policies: Arc<AtomicBool>,
    memory: memory::Memory,
    states: Arc<state_cache::StateCache>,
    state_reads: Arc<tokio::sync::Semaphore>,
    pod_deletions: tokio::sync::Semaphore,
}

impl Context {
    /// Whether every cache has listed everything (deciding on a partial view could, e.g., call
    /// an existing Agent missing).
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed) == ALL_CACHES
    }

    /// Whether the admission policies that stamp and check decisions were found installed at the
    /// last check.
    pub fn policies_installed(&self) -> bool {
        self.policies.load(Ordering::Relaxed)
    }

    /// The ApprovalPolicies that select namespace `ns` (by its labels), compiled once per
    /// policy generation.
    pub fn policies_for(&self, ns: &str) -> Vec<Arc<CompiledPolicy>> {
        let labels = self
            .namespaces
            .get(&ObjectRef::new(ns))
            .and_then(|n| n.metadata.labels.clone())
            .unwrap_or_default();
        self.approval_policies
            .state()
            .iter()
            .map(|policy| {
                let key = (
                    policy.uid().unwrap_or_else(|| policy.name_any()),
                    policy.metadata.generation.unwrap_or_default(),
                );
                self.compiled
                    .get_with(key, || Arc::new(CompiledPolicy::compile(policy)))
            })
            .filter(|compiled| compiled.selects(&labels))
            .collect()
    }
}
