//! The controller: reconciles `AgentRun`s. It starts worker Pods, turns halts into
//! `ApprovalRequest`s, applies decisions to the RunState with their audit metadata, and resumes
//! approved runs in a new worker Pod.
//!
//! A reconcile is split into a pure step ([`decide`]: from the observed objects to one action) and
//! I/O steps here (fetch, server-side apply with the `agentrun-controller` field manager, status
//! patches). The cache holds runs without their `status.runState`; it is read only when needed.

pub mod agent_status;
pub mod decide;
pub mod metrics;
pub mod state_cache;
pub mod worker_pod;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{Instrument, info, info_span, warn};

use crate::crd::{
    Agent, AgentRun, AgentRunPhase, AgentRunRef, ApprovalPhase, ApprovalRequest,
    ApprovalRequestSpec, ConditionStatus, new_condition, set_condition,
};
use crate::run_status::{self, StoredState};
use crate::state::{Approval, Rejection};
use decide::{Action, NewRequest, Observed, Policy, ResolvedDecision, ResolvedKind};
use worker_pod::{MANAGED_BY, RUN_LABEL, WorkerSettings};

/// The field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "agentrun-controller";
/// The finalizer on AgentRuns: cleanup releases the run's ApprovalRequests.
pub const RUN_FINALIZER: &str = "agentrun.dev/cleanup";
/// The finalizer on ApprovalRequests that keeps each one (the decision record) as long as its run.
pub const AUDIT_FINALIZER: &str = "agentrun.dev/keep-with-run";
/// The annotation holding the verified identity of a run's creator (stamped at creation by the
/// admission policy); the controller copies it to `status.createdBy`.
pub const CREATED_BY_ANNOTATION: &str = "agentrun.dev/created-by";
/// The annotation the admission policy stamps on an ApprovalRequest when a decision is set: the
/// authenticated identity of who set it, as JSON `{"username", "uid", "groups"}`.
pub const DECIDED_BY_ANNOTATION: &str = "agentrun.dev/decided-by";
/// The annotation naming the commit of a GitOps decision.
pub const GITOPS_COMMIT_ANNOTATION: &str = "agentrun.dev/gitops-commit";
/// The condition type summarizing a run.
pub const READY: &str = "Ready";
/// The message a model gets for a call whose approval timed out.
pub const EXPIRED_MESSAGE: &str = "approval timed out";
/// The message a model gets for a call whose approval request no longer matched it.
pub const SUPERSEDED_MESSAGE: &str =
    "The approval request no longer matched this call, so it was not executed.";

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<ReconcileError>>),
    /// Applying a decision to the RunState failed.
    #[error("applying the decision on {request}: {message}")]
    Decision {
        /// The ApprovalRequest.
        request: String,
        /// Why.
        message: String,
    },
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
            ReconcileError::Decision { .. } => "decision",
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
}

/// How many runs are reconciled at once unless configured.
pub const DEFAULT_CONCURRENCY: u16 = 64;

/// The runs' cache lists this many at a time, so that the initial list of many large runs never
/// sits in memory at once (each run is stripped of its state as it arrives).
const RUN_LIST_PAGE_SIZE: u32 = 100;

/// How many reconciles read a RunState from the API server at once (each may hold a large state
/// while it decides and writes).
const STATE_READS_AT_ONCE: usize = 8;

/// One bit per cache the controller waits for: runs, Pods, ApprovalRequests, Agents.
const ALL_CACHES: u8 = 0b1111;

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Settings.
    pub config: ControllerConfig,
    /// Metrics.
    pub metrics: Arc<metrics::Metrics>,
    pods: Store<Pod>,
    requests: Store<ApprovalRequest>,
    agents: Store<Agent>,
    synced: Arc<std::sync::atomic::AtomicU8>,
    recorded: RecentlyRecorded,
    states: Arc<state_cache::StateCache>,
    written: WrittenVersions,
    state_reads: tokio::sync::Semaphore,
}

/// Checks the CRDs are served, serves metrics and probes, takes the leader lease when configured,
/// then runs the controller until a shutdown signal (or until it loses the lease).
pub async fn run(client: Client, config: ControllerConfig) -> Result<(), StartError> {
    let runs: Api<AgentRun> = scoped(&client, &config.namespace);
    if let Err(e) = runs.list(&ListParams::default().limit(1)).await {
        return Err(match e {
            kube::Error::Api(s) if s.code == 404 => StartError::CrdsMissing(s.message),
            other => StartError::Kube(other),
        });
    }
    let probe = metrics::Probe {
        metrics: Arc::default(),
        ready: Arc::default(),
        synced: Arc::default(),
        caches: Arc::default(),
    };
    let _server = match config.metrics_addr {
        Some(addr) => {
            let listener_probe = probe.clone();
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Metrics { addr, source })?;
            info!(%addr, "serving /metrics, /healthz and /readyz");
            Some(AbortOnDrop(tokio::spawn(async move {
                if let Err(error) = metrics::serve(listener, listener_probe).await {
                    warn!(%error, "metrics endpoint stopped");
                }
            })))
        }
        None => None,
    };
    let Some(election) = config.leader_election.clone() else {
        run_controller(client, config, probe).await;
        return Ok(());
    };
    let manager =
        kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &election.lease_name)
            .with_namespace(&election.namespace)
            .with_identity(&election.identity)
            .with_duration(election.lease_duration.as_secs().max(2))
            .with_grace(
                election
                    .grace
                    .as_secs()
                    .clamp(1, election.lease_duration.as_secs().max(2) - 1),
            )
            .build()
            .await?;
    let (mut leader, lease_task) = manager.watch().await;
    // A standby replica is healthy and ready: it only waits for the lease.
    probe
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);
    info!(identity = %election.identity, lease = %election.lease_name, "waiting for the leader lease");
    while !*leader.borrow_and_update() {
        if leader.changed().await.is_err() {
            return Err(StartError::LostLeadership);
        }
    }
    info!(identity = %election.identity, "acquired the leader lease");
    probe
        .ready
        .store(false, std::sync::atomic::Ordering::Relaxed);
    let lost = async {
        loop {
            if leader.changed().await.is_err() || !*leader.borrow_and_update() {
                return;
            }
        }
    };
    let result = tokio::select! {
        () = run_controller(client, config, probe) => Ok(()),
        () = lost => Err(StartError::LostLeadership),
    };
    // Closing the channel releases the lease for the next leader.
    drop(leader);
    let _ = lease_task.await;
    result
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn run_controller(client: Client, config: ControllerConfig, probe: metrics::Probe) {
    let runs: Api<AgentRun> = scoped(&client, &config.namespace);
    let pods: Api<Pod> = scoped(&client, &config.namespace);
    let requests: Api<ApprovalRequest> = scoped(&client, &config.namespace);

    let agents: Api<Agent> = scoped(&client, &config.namespace);

    let states = Arc::new(state_cache::StateCache::new(
        config
            .state_cache_bytes
            .unwrap_or(state_cache::DEFAULT_BUDGET_BYTES),
        state_cache::MAX_ENTRY_BYTES,
    ));
    let (run_reader, run_writer) = reflector::store();
    let observed_states = states.clone();
    let run_stream = watcher(
        runs,
        watcher::Config::default().page_size(RUN_LIST_PAGE_SIZE),
    )
    .default_backoff()
    .inspect_ok(move |event| observed_states.observe_event(event))
    .modify(strip_run)
    .reflect(run_writer)
    .inspect_ok(synced(&probe, 0b001))
    .touched_objects();
    let (pod_reader, pod_writer) = reflector::store();
    let pod_stream = watcher(
        pods,
        watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)),
    )
    .default_backoff()
    .modify(|p: &mut Pod| p.managed_fields_mut().clear())
    .reflect(pod_writer)
    .inspect_ok(synced(&probe, 0b010))
    .touched_objects();
    let (request_reader, request_writer) = reflector::store();
    let request_stream = watcher(requests, watcher::Config::default())
        .default_backoff()
        .modify(|r: &mut ApprovalRequest| strip_request(r))
        .reflect(request_writer)
        .inspect_ok(synced(&probe, 0b100))
        .touched_objects();

    let (agent_reader, agent_writer) = reflector::store();
    let (agent_status_tx, agent_status_task) = agent_status::spawn_writer(client.clone());
    let _agent_status_task = AbortOnDrop(agent_status_task);
    let agent_stream = watcher(agents, watcher::Config::default())
        .default_backoff()
        .modify(|a: &mut Agent| a.managed_fields_mut().clear())
        .reflect(agent_writer)
        .inspect_ok(synced(&probe, 0b1000))
        .touched_objects()
        .inspect_ok(move |agent: &Agent| {
            if agent_status::needs_update(agent) {
                let _ = agent_status_tx.send(agent.clone());
            }
        });
    // A run that waits for its Agent is looked at again as soon as the Agent appears.
    let waiting_for_agent = run_reader.clone();
    let agent_mapper = move |agent: Agent| {
        let ns = agent.namespace();
        let name = agent.name_any();
        waiting_for_agent
            .state()
            .into_iter()
            .filter(|run| run.namespace() == ns && run.spec.agent_ref.name == name)
            .filter(|run| {
                run.status
                    .as_ref()
                    .and_then(|s| crate::crd::find_condition(&s.conditions, READY))
                    .is_some_and(|c| c.reason == "AgentNotFound")
            })
            .map(|run| reflector::ObjectRef::from_obj(&*run))
            .collect::<Vec<_>>()
    };

    let _ = probe
        .caches
        .set((run_reader.clone(), request_reader.clone()));

    let reporter = Reporter {
        controller: FIELD_MANAGER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let context = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        config,
        metrics: probe.metrics.clone(),
        pods: pod_reader,
        requests: request_reader,
        agents: agent_reader,
        synced: probe.synced.clone(),
        recorded: RecentlyRecorded::default(),
        states,
        written: WrittenVersions::default(),
        state_reads: tokio::sync::Semaphore::new(STATE_READS_AT_ONCE),
    });
    let controller_config = kube::runtime::controller::Config::default()
        .concurrency(context.config.concurrency.unwrap_or(DEFAULT_CONCURRENCY));
    info!("agentrun controller started");
    Controller::for_stream(run_stream, run_reader)
        .owns_stream(pod_stream)
        .owns_stream(request_stream)
        .watches_stream(agent_stream, agent_mapper)
        .with_config(controller_config)
        .shutdown_on_signal()
        .run(reconcile, error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile failed");
            }
        })
        .await;
    info!("agentrun controller stopped");
}

/// Marks one cache as synced when its watch has listed everything; the replica is ready once all
/// three are. (Store::wait_until_ready wakes a single waiter, which the controller itself uses.)
fn synced<K>(probe: &metrics::Probe, bit: u8) -> impl Fn(&watcher::Event<K>) + use<K> {
    let mask = probe.synced.clone();
    let ready = probe.ready.clone();
    move |event| {
        if matches!(event, watcher::Event::InitDone) {
            let all = mask.fetch_or(bit, std::sync::atomic::Ordering::Relaxed) | bit;
            if all == ALL_CACHES && !ready.swap(true, std::sync::atomic::Ordering::Relaxed) {
                info!("caches synced");
            }
        }
    }
}

fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The cache keeps runs without their RunState (and managed fields): its memory does not grow
/// with the size of the runs' conversations.
fn strip_run(run: &mut AgentRun) {
    run.managed_fields_mut().clear();
    if let Some(status) = run.status.as_mut() {
        status.run_state = None;
    }
}

/// The cache keeps ApprovalRequests without their managed fields' field sets (only who wrote and
/// when, which dates a decision).
fn strip_request(request: &mut ApprovalRequest) {
    for entry in request.managed_fields_mut() {
        entry.fields_v1 = None;
    }
}

/// Requeues a failed reconcile with a delay (conflicts quickly, others slower).
pub fn error_policy(run: Arc<AgentRun>, error: &ReconcileError, _: Arc<Context>) -> Requeue {
    warn!(run = %run.name_any(), error = %error, label = error.metric_label(), "reconcile error");
    match error {
        ReconcileError::Kube(kube::Error::Api(s)) if s.code == 409 => {
            Requeue::requeue(Duration::from_millis(200))
        }
        _ => Requeue::requeue(Duration::from_secs(5)),
    }
}

/// Reconciles one run.
pub async fn reconcile(run: Arc<AgentRun>, ctx: Arc<Context>) -> Result<Requeue, ReconcileError> {
    let ns = run.namespace().ok_or(ReconcileError::NoNamespace)?;
    if ctx.synced.load(std::sync::atomic::Ordering::Relaxed) != ALL_CACHES {
        // Deciding on a partial view could, e.g., call an existing Agent missing.
        return Ok(Requeue::requeue(Duration::from_millis(500)));
    }
    let span = info_span!("reconcile", run = %run.name_any(), namespace = %ns);
    let started = std::time::Instant::now();
    let result = async {
        let api: Api<AgentRun> = Api::namespaced(ctx.client.clone(), &ns);
        finalizer(&api, RUN_FINALIZER, run, |event| async {
            match event {
                FinalizerEvent::Apply(run) => apply(run, &ctx).await,
                FinalizerEvent::Cleanup(run) => cleanup(run, &ctx).await,
            }
        })
        .await
        .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
    }
    .instrument(span)
    .await;
    let label = match &result {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    ctx.metrics.reconciled(label, started.elapsed());
    result
}

fn of_run<K: Resource + Clone>(run: &AgentRun, objects: Vec<Arc<K>>) -> Vec<K> {
    let ns = run.namespace();
    let uid = run.uid();
    objects
        .into_iter()
        .filter(|o| {
            o.namespace() == ns
                && o.owner_references()
                    .iter()
                    .any(|r| Some(&r.uid) == uid.as_ref())
        })
        .map(|o| (*o).clone())
        .collect()
}

async fn apply(run: Arc<AgentRun>, ctx: &Arc<Context>) -> Result<Requeue, ReconcileError> {
    let ns = run.namespace().ok_or(ReconcileError::NoNamespace)?;
    let requests = of_run(&run, ctx.requests.state());
    record_decisions(ctx, &run, &ns, &requests).await?;
    if run
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(AgentRunPhase::is_terminal)
    {
        return Ok(Requeue::await_change());
    }
    if ctx.written.is_stale(&run) {
        // This replica already wrote over this version: act on what it wrote, which the watch
        // brings next (acting now would repeat a step, or fail a guarded write).
        return Ok(Requeue::requeue(Duration::from_secs(1)));
    }
    let agent = ctx
        .agents
        .get(&reflector::ObjectRef::new(&run.spec.agent_ref.name).within(&ns));
    let pods = of_run(&run, ctx.pods.state());
    let now = Utc::now();
    let timeouts: std::collections::BTreeMap<String, Duration> = agent
        .iter()
        .flat_map(|a| a.spec.tools.iter())
        .filter_map(|t| {
            let timeout = crate::agent::tool::parse_duration(t.approval_timeout.as_deref()?)?;
            Some((t.name.clone(), timeout))
        })
        .collect();

    let mut full: Option<AgentRun> = None;
    let mut _state_read: Option<tokio::sync::SemaphorePermit<'_>> = None;
    let mut state = None;
    if decide::needs_state(&run, &pods, &requests, now) {
        // Only a decision's application may use a cached state: it is guarded by the same
        // resourceVersion. A finished step must be read fresh, as the worker's last write may
        // not have reached the cache yet when its Pod's success does.
        let cached = (run.status.as_ref().and_then(|s| s.phase)
            == Some(AgentRunPhase::AwaitingApproval))
        .then(|| ctx.states.restore(&run))
        .flatten();
        let fresh = match cached {
            Some(run) => run,
            None => {
                // A state read from the API server can be large: few at once bound the memory
                // they take, whatever the reconcile concurrency.
                _state_read = ctx.state_reads.acquire().await.ok();
                let api: Api<AgentRun> = Api::namespaced(ctx.client.clone(), &ns);
                api.get(&run.name_any()).await?
            }
        };
        state = Some(match run_status::load(&ctx.client, &fresh).await {
            Ok(Some(state)) => Ok(state),
            Ok(None) => Err("status.runState is missing".to_owned()),
            // An API failure reading chunks is retried; anything else is a bad state.
            Err(run_status::StoredStateError::Kube(e)) => return Err(e.into()),
            Err(e) => Err(e.to_string()),
        });
        full = Some(fresh);
    }
    let observed_run = full.as_ref().unwrap_or(&run);
    let observed = Observed {
        run: observed_run,
        agent_found: agent.is_some(),
        approval_timeouts: &timeouts,
        pods: &pods,
        requests: &requests,
        state: state.as_ref().map(|s| s.as_ref().map_err(Clone::clone)),
        now,
    };
    if report_unknown_outcomes(ctx, observed_run, &ns).await? {
        // Later status patches start from the cached conditions: act once the cache has it.
        return Ok(Requeue::await_change());
    }
    let action = decide::decide(&observed, &ctx.config.policy);
    tracing::debug!(?action, "decided");
    let io = Io {
        ctx,
        run: observed_run,
        ns: &ns,
        observed_requests: &requests,
        allow_self_approval: agent
            .as_ref()
            .is_some_and(|a| a.spec.approvals.allow_self_approval),
    };
    if matches!(
        action,
        Action::StartStep { attempt: 1.., .. }
            | Action::Fail {
                reason: "WorkerFailed",
                ..
            }
    ) {
        ctx.metrics.worker_failures.inc();
    }
    match action {
        Action::Wait => Ok(Requeue::await_change()),
        Action::Recheck(after) => Ok(Requeue::requeue(after)),
        Action::AgentMissing => io.agent_missing().await,
        Action::StartStep { step, attempt } => {
            let agent = agent.expect("decide starts a step only when the Agent exists");
            io.start_step(&agent, step, attempt).await
        }
        Action::CreatePod { step, attempt } => {
            io.create_pod(step, attempt, true).await?;
            Ok(Requeue::await_change())
        }
        Action::RequestApprovals { create, pending } => io.request_approvals(create, pending).await,
        Action::Resume { decisions } => {
            let state = match state {
                Some(Ok(s)) => s,
                _ => unreachable!("decide resumes only with a state"),
            };
            io.resume(state, decisions).await
        }
        Action::Succeed { output } => io.succeed(output).await,
        Action::Fail { reason, message } => io.fail(reason, &message).await,
    }
}

/// The I/O steps of one reconcile of one run.
struct Io<'a> {
    ctx: &'a Arc<Context>,
    run: &'a AgentRun,
    ns: &'a str,
    observed_requests: &'a [ApprovalRequest],
    allow_self_approval: bool,
}

impl Io<'_> {
    fn runs(&self) -> Api<AgentRun> {
        Api::namespaced(self.ctx.client.clone(), self.ns)
    }

    fn requests(&self) -> Api<ApprovalRequest> {
        Api::namespaced(self.ctx.client.clone(), self.ns)
    }

    async fn event(&self, type_: EventType, reason: &str, note: String) {
        publish(
            self.ctx,
            self.run.object_ref(&()),
            None,
            type_,
            reason,
            note,
        )
        .await;
    }

    /// An Event about the run that concerns one of its ApprovalRequests (its `related` object), so
    /// that `kubectl describe agentrun` tells the whole story, one Event per decision.
    async fn event_about(
        &self,
        related: k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        publish(
            self.ctx,
            self.run.object_ref(&()),
            Some(related),
            type_,
            reason,
            note,
        )
        .await;
    }

    /// Merge-patches the run's status; with `guard`, only if the run is unchanged since it was read.
    async fn patch_status(
        &self,
        mut patch: serde_json::Value,
        guard: bool,
    ) -> Result<(), ReconcileError> {
        if guard {
            patch["metadata"] = json!({"resourceVersion": self.run.resource_version()});
        }
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        self.runs()
            .patch_status(&self.run.name_any(), &params, &Patch::Merge(&patch))
            .await?;
        self.ctx.written.wrote_over(self.run);
        Ok(())
    }

    fn conditions_with(
        &self,
        status: ConditionStatus,
        reason: &str,
        message: &str,
    ) -> serde_json::Value {
        let mut conditions = self
            .run
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        set_condition(
            &mut conditions,
            new_condition(
                READY,
                status,
                reason,
                message,
                self.run.metadata.generation,
                Time(k8s_openapi::jiff::Timestamp::now()),
            ),
        );
        json!(conditions)
    }

    async fn agent_missing(&self) -> Result<Requeue, ReconcileError> {
        let message = format!(
            "Agent {} not found in namespace {}",
            self.run.spec.agent_ref.name, self.ns
        );
        let already = self
            .run
            .status
            .as_ref()
            .and_then(|s| crate::crd::find_condition(&s.conditions, READY))
            .is_some_and(|c| c.reason == "AgentNotFound");
        if !already {
            let mut patch = json!({"status": {
                "conditions": self.conditions_with(ConditionStatus::False, "AgentNotFound", &message),
                "observedGeneration": self.run.metadata.generation,
            }});
            if self.run.status.as_ref().and_then(|s| s.phase).is_none() {
                patch["status"]["phase"] = json!(AgentRunPhase::Pending);
            }
            self.patch_status(patch, false).await?;
            self.event(EventType::Warning, "AgentNotFound", message)
                .await;
        }
        Ok(Requeue::requeue(self.ctx.config.policy.recheck))
    }

    async fn ensure_worker_identity(&self, agent: &Agent) -> Result<(), ReconcileError> {
        if self
            .run
            .spec
            .worker
            .as_ref()
            .and_then(|w| w.service_account_name.as_ref())
            .is_some()
        {
            return Ok(());
        }
        let (account, role, binding) = worker_pod::worker_identity(self.run, agent);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let client = &self.ctx.client;
        let name = account.name_any();
        Api::<ServiceAccount>::namespaced(client.clone(), self.ns)
            .patch(
                &name,
                &params,
                &Patch::Apply(typed(&account, "v1", "ServiceAccount")),
            )
            .await?;
        Api::<Role>::namespaced(client.clone(), self.ns)
            .patch(
                &name,
                &params,
                &Patch::Apply(typed(&role, "rbac.authorization.k8s.io/v1", "Role")),
            )
            .await?;
        Api::<RoleBinding>::namespaced(client.clone(), self.ns)
            .patch(
                &name,
                &params,
                &Patch::Apply(typed(
                    &binding,
                    "rbac.authorization.k8s.io/v1",
                    "RoleBinding",
                )),
            )
            .await?;
        Ok(())
    }

    async fn start_step(
        &self,
        agent: &Agent,
        step: u32,
        attempt: u32,
    ) -> Result<Requeue, ReconcileError> {
        if step == 0 && attempt == 0 {
            self.ensure_worker_identity(agent).await?;
        }
        let pod = decide::worker_pod_name(&self.run.name_any(), step, attempt);
        let status = self.run.status.clone().unwrap_or_default();
        let mut patch = json!({"status": {
            "phase": AgentRunPhase::Running,
            "step": step,
            "retries": attempt,
            "workerPod": pod,
            "pendingApprovals": 0,
            "observedGeneration": self.run.metadata.generation,
            "conditions": self.conditions_with(ConditionStatus::False, "Running", &format!("worker Pod {pod} runs step {step}")),
        }});
        if status.started_at.is_none() {
            patch["status"]["startedAt"] = json!(Time(k8s_openapi::jiff::Timestamp::now()));
        }
        if status.created_by.is_none()
            && let Some(creator) = self.run.annotations().get(CREATED_BY_ANNOTATION)
        {
            patch["status"]["createdBy"] = json!(creator);
        }
        self.patch_status(patch, true).await?;
        self.create_pod(step, attempt, true).await?;
        Ok(Requeue::await_change())
    }

    /// Creates the worker Pod of a step's attempt; `announce` publishes a `WorkerStarted` Event
    /// (a resume is announced by its decisions' Events instead).
    async fn create_pod(
        &self,
        step: u32,
        attempt: u32,
        announce: bool,
    ) -> Result<(), ReconcileError> {
        let pod = worker_pod::worker_pod(self.run, step, attempt, &self.ctx.config.worker);
        let name = pod.name_any();
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), self.ns);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match pods.create(&params, &pod).await {
            Ok(_) => {
                let what = if attempt == 0 {
                    format!("Started worker Pod {name} for step {step}")
                } else {
                    format!("Started worker Pod {name} for step {step} (retry {attempt})")
                };
                info!(pod = %name, step, attempt, "worker pod created");
                if announce {
                    self.event(EventType::Normal, "WorkerStarted", what).await;
                }
                Ok(())
            }
            // Deterministic names make a repeated create a no-op.
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn request_approvals(
        &self,
        create: Vec<NewRequest>,
        pending: u32,
    ) -> Result<Requeue, ReconcileError> {
        let run_name = self.run.name_any();
        // With self-approval allowed the creator is not copied, so the policy does not refuse it.
        let creator = if self.allow_self_approval {
            None
        } else {
            self.run.status.as_ref().and_then(|s| s.created_by.clone())
        };
        let params = PatchParams::apply(FIELD_MANAGER).force();
        for new in &create {
            let mut request = ApprovalRequest::new(
                &new.name,
                ApprovalRequestSpec {
                    agent_run_ref: AgentRunRef {
                        name: run_name.clone(),
                        uid: self.run.uid().unwrap_or_default(),
                    },
                    step: self.run.status.as_ref().and_then(|s| s.step).unwrap_or(0),
                    tool_call_id: new.call.tool_call_id.clone(),
                    tool_name: new.call.tool_name.clone(),
                    arguments_digest: crate::crd::arguments_digest(&new.arguments),
                    arguments: new.arguments.clone(),
                    run_creator: creator.clone(),
                    decision: None,
                    approver_id: None,
                    reason: None,
                    message: None,
                },
            );
            request.metadata.namespace = Some(self.ns.to_owned());
            request.metadata.labels =
                Some([(RUN_LABEL.to_owned(), worker_pod::label_value(&run_name))].into());
            request.metadata.owner_references = self.run.controller_owner_ref(&()).map(|o| vec![o]);
            request.metadata.finalizers = Some(vec![AUDIT_FINALIZER.to_owned()]);
            let created = self
                .requests()
                .patch(
                    &new.name,
                    &params,
                    &Patch::Apply(typed(&request, crate::crd::API_VERSION, "ApprovalRequest")),
                )
                .await?;
            let mut status = json!({"status": {"phase": ApprovalPhase::Pending}});
            if let Some(at) = new.expires_at {
                status["status"]["expiresAt"] =
                    json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            }
            self.requests()
                .patch_status(
                    &new.name,
                    &PatchParams {
                        field_manager: Some(FIELD_MANAGER.into()),
                        ..Default::default()
                    },
                    &Patch::Merge(&status),
                )
                .await?;
            self.event_about(
                created.object_ref(&()),
                EventType::Normal,
                "ApprovalRequested",
                format!(
                    "Tool call {} ({}) of run {run_name} awaits a decision: kubectl patch apr {} --type merge -p '{{\"spec\":{{\"decision\":\"Approved\",\"approverId\":\"<you>\",\"reason\":\"<why>\"}}}}'",
                    new.call.tool_name, new.call.tool_call_id, new.name
                ),
            )
            .await;
        }
        let status = self.run.status.clone().unwrap_or_default();
        if status.phase != Some(AgentRunPhase::AwaitingApproval)
            || status.pending_approvals != Some(pending)
        {
            let patch = json!({"status": {
                "phase": AgentRunPhase::AwaitingApproval,
                "pendingApprovals": pending,
                "observedGeneration": self.run.metadata.generation,
                "conditions": self.conditions_with(ConditionStatus::False, "AwaitingApproval", &format!("{pending} tool call(s) await a decision")),
            }});
            // The ApprovalRequested Events say what awaits a decision: no Event of its own.
            self.patch_status(patch, false).await?;
        }
        Ok(Requeue::await_change())
    }

    async fn resume(
        &self,
        mut state: crate::state::RunState,
        decisions: Vec<ResolvedDecision>,
    ) -> Result<Requeue, ReconcileError> {
        let now = Utc::now();
        let mut decided_times = Vec::new();
        let mut announcements = Vec::new();
        // People's decisions are recorded on their requests after the next Pod exists, off the
        // path from decision to Pod (a crash in between is repaired from the request alone, see
        // `record_decisions`); expiries and refusals first, as only this step knows them.
        let mut record_after = Vec::new();
        for decision in &decisions {
            let observed = self
                .observed_requests
                .iter()
                .find(|r| r.name_any() == decision.request);
            let decided_at = observed.and_then(decision_time).unwrap_or(now);
            if let Some(created) = observed.and_then(|r| r.meta().creation_timestamp.as_ref()) {
                let created =
                    chrono::DateTime::from_timestamp(created.0.as_second(), 0).unwrap_or(now);
                self.ctx
                    .metrics
                    .approval_wait
                    .observe((decided_at - created).num_milliseconds().max(0) as f64 / 1000.0);
            }
            decided_times.push(decided_at);
            let at = decided_at;
            let (result, phase) = match &decision.kind {
                ResolvedKind::Approved {
                    approver_id,
                    reason,
                } => {
                    let mut a = Approval::new().at(at);
                    a.approver_id = approver_id.clone();
                    a.reason = reason.clone();
                    (
                        state.approve(&decision.tool_call_id, a),
                        ApprovalPhase::Approved,
                    )
                }
                ResolvedKind::Rejected {
                    approver_id,
                    reason,
                    message,
                } => {
                    let mut r = Rejection::new().at(at);
                    r.approver_id = approver_id.clone();
                    r.reason = reason.clone();
                    r.message = message.clone();
                    (
                        state.reject(&decision.tool_call_id, r),
                        ApprovalPhase::Rejected,
                    )
                }
                ResolvedKind::Expired => (
                    state.reject(
                        &decision.tool_call_id,
                        Rejection::new()
                            .message(EXPIRED_MESSAGE)
                            .reason("expired")
                            .at(at),
                    ),
                    ApprovalPhase::Expired,
                ),
                ResolvedKind::Superseded { why } => (
                    state.reject(
                        &decision.tool_call_id,
                        Rejection::new()
                            .message(SUPERSEDED_MESSAGE)
                            .reason(format!("superseded: {why}"))
                            .at(at),
                    ),
                    ApprovalPhase::Superseded,
                ),
            };
            result.map_err(|e| ReconcileError::Decision {
                request: decision.request.clone(),
                message: e.to_string(),
            })?;
            let resolution = Resolution {
                request: decision.request.clone(),
                phase,
                decided_at: at,
                identity: observed.and_then(verified_identity_or_claimed),
            };
            // A retry after a failed run patch finds the request already resolved.
            let resolved = observed
                .and_then(|r| r.status.as_ref())
                .is_some_and(|s| s.phase == Some(phase) && s.decided_at.is_some());
            match phase {
                _ if resolved => {}
                ApprovalPhase::Approved | ApprovalPhase::Rejected => record_after.push(resolution),
                _ => record_resolution(self.ctx, self.ns, &resolution).await?,
            }
            let (type_, reason, note) = decision_event(decision);
            let related = observed.map(|r| r.object_ref(&())).unwrap_or_else(|| {
                ApprovalRequest::new(&decision.request, Default::default()).object_ref(&())
            });
            announcements.push((
                related,
                type_,
                reason,
                format!("{note} ({})", decision.tool_call_id),
            ));
        }
        let step = self.run.status.as_ref().and_then(|s| s.step).unwrap_or(0) + 1;
        let pod = decide::worker_pod_name(&self.run.name_any(), step, 0);
        let stored = StoredState::encode(&state);
        let mut status = stored.status_fields();
        status["phase"] = json!(AgentRunPhase::Running);
        status["step"] = json!(step);
        status["retries"] = json!(0);
        status["pendingApprovals"] = json!(0);
        status["workerPod"] = json!(pod);
        status["observedGeneration"] = json!(self.run.metadata.generation);
        status["conditions"] = self.conditions_with(
            ConditionStatus::False,
            "Running",
            &format!("resumed in worker Pod {pod} at step {step}"),
        );
        stored
            .write_chunks(&self.ctx.client, self.run)
            .await
            .map_err(|e| ReconcileError::Decision {
                request: "the run's state".into(),
                message: e.to_string(),
            })?;
        // Guarded by resourceVersion: a decision is applied to exactly the state it was made on.
        self.patch_status(json!({"status": status}), true).await?;
        if !stored.chunks.is_empty()
            || self
                .run
                .status
                .as_ref()
                .and_then(|s| s.run_state_chunks)
                .is_some()
        {
            run_status::prune_chunks(&self.ctx.client, self.run, &stored.digest).await;
        }
        self.create_pod(step, 0, false).await?;
        let created = Utc::now();
        for decided_at in decided_times {
            self.ctx
                .metrics
                .resume_latency
                .observe((created - decided_at).num_milliseconds().max(0) as f64 / 1000.0);
        }
        // The reconcile is done once the Pod exists; recording and announcing the decisions
        // happen beside the next reconciles. They are marked recorded now, so that a reconcile
        // meanwhile does not repeat them; one that fails is unmarked and repaired later.
        for resolution in &record_after {
            self.ctx.recorded.remember(self.ns, &resolution.request);
        }
        let ctx = Arc::clone(self.ctx);
        let ns = self.ns.to_owned();
        let regarding = self.run.object_ref(&());
        tokio::spawn(
            async move {
                for resolution in &record_after {
                    if let Err(error) = record_resolution(&ctx, &ns, resolution).await {
                        ctx.recorded.forget(&ns, &resolution.request);
                        warn!(request = %resolution.request, %error, "could not record a decision; retried at the run's next reconcile");
                    }
                }
                for (related, type_, reason, note) in announcements {
                    let note = format!("{note}; resumed at step {step}");
                    publish(&ctx, regarding.clone(), Some(related), type_, reason, note).await;
                }
            }
            .in_current_span(),
        );
        Ok(Requeue::await_change())
    }

    async fn succeed(&self, output: String) -> Result<Requeue, ReconcileError> {
        let patch = json!({"status": {
            "phase": AgentRunPhase::Succeeded,
            "finalOutput": truncate(&output, crate::crd::agent_run::MAX_FINAL_OUTPUT_LENGTH),
            "completedAt": Time(k8s_openapi::jiff::Timestamp::now()),
            "pendingApprovals": 0,
            "observedGeneration": self.run.metadata.generation,
            "conditions": self.conditions_with(ConditionStatus::True, "Succeeded", "the run finished"),
        }});
        self.patch_status(patch, false).await?;
        self.event(
            EventType::Normal,
            "Succeeded",
            format!("Run finished: {}", truncate(&output, 200)),
        )
        .await;
        Ok(Requeue::await_change())
    }

    async fn fail(&self, reason: &str, message: &str) -> Result<Requeue, ReconcileError> {
        let patch = json!({"status": {
            "phase": AgentRunPhase::Failed,
            "completedAt": Time(k8s_openapi::jiff::Timestamp::now()),
            "observedGeneration": self.run.metadata.generation,
            "conditions": self.conditions_with(ConditionStatus::False, reason, message),
        }});
        self.patch_status(patch, false).await?;
        self.event(EventType::Warning, "Failed", format!("{reason}: {message}"))
            .await;
        Ok(Requeue::await_change())
    }
}

/// The condition type saying a tool call's outcome is unknown (at-most-once execution).
pub const TOOL_OUTCOME_UNKNOWN: &str = "ToolOutcomeUnknown";

/// Surfaces, once, the tool calls a worker recorded as `Unknown` (a non-idempotent call that a
/// stopped worker may have sent) in a condition and a Warning Event.
async fn report_unknown_outcomes(
    ctx: &Context,
    run: &AgentRun,
    ns: &str,
) -> Result<bool, ReconcileError> {
    let status = run.status.clone().unwrap_or_default();
    let unknown: Vec<String> = status
        .tool_calls
        .iter()
        .filter(|r| r.outcome.as_deref() == Some("Unknown"))
        .map(|r| format!("{} ({})", r.tool_call_id, r.tool_name))
        .collect();
    if unknown.is_empty()
        || crate::crd::find_condition(&status.conditions, TOOL_OUTCOME_UNKNOWN).is_some()
    {
        return Ok(false);
    }
    let message = format!(
        "the outcome of {} is unknown: a worker stopped after sending it and the tool is not idempotent, so it was not sent again; the model was told",
        unknown.join(", ")
    );
    let mut conditions = status.conditions.clone();
    set_condition(
        &mut conditions,
        new_condition(
            TOOL_OUTCOME_UNKNOWN,
            ConditionStatus::True,
            "NotResent",
            &message,
            run.metadata.generation,
            Time(k8s_openapi::jiff::Timestamp::now()),
        ),
    );
    let api: Api<AgentRun> = Api::namespaced(ctx.client.clone(), ns);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch_status(
        &run.name_any(),
        &params,
        &Patch::Merge(&json!({"status": {"conditions": conditions}})),
    )
    .await?;
    let event = Event {
        type_: EventType::Warning,
        reason: TOOL_OUTCOME_UNKNOWN.into(),
        note: Some(truncate(&message, 1000)),
        action: "RecordToolOutcome".into(),
        secondary: None,
    };
    let _ = ctx.recorder.publish(&event, &run.object_ref(&())).await;
    Ok(true)
}

/// Publishes an Event about `regarding` (a run), best effort: a failure is logged, never retried.
async fn publish(
    ctx: &Context,
    regarding: k8s_openapi::api::core::v1::ObjectReference,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(truncate(&note, 1000)),
        action: reason.into(),
        secondary: related,
    };
    if let Err(error) = ctx.recorder.publish(&event, &regarding).await {
        warn!(%error, reason, "could not publish an Event");
    }
}

/// How the controller resolved one ApprovalRequest: what its status records.
#[derive(Clone, Debug, PartialEq)]
struct Resolution {
    request: String,
    phase: ApprovalPhase,
    decided_at: chrono::DateTime<Utc>,
    identity: Option<crate::crd::VerifiedIdentity>,
}

/// Records a resolution in the request's status (phase, decision time, verified identity), and
/// remembers it so that [`record_decisions`] does not write it again from a lagging cache.
async fn record_resolution(
    ctx: &Context,
    ns: &str,
    resolution: &Resolution,
) -> Result<(), ReconcileError> {
    let mut patch = json!({"status": {
        "phase": resolution.phase,
        "decidedAt": resolution.decided_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    }});
    if let Some(identity) = &resolution.identity {
        patch["status"]["verifiedIdentity"] = json!(identity);
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    Api::<ApprovalRequest>::namespaced(ctx.client.clone(), ns)
        .patch_status(&resolution.request, &params, &Patch::Merge(&patch))
        .await?;
    ctx.recorded.remember(ns, &resolution.request);
    Ok(())
}

/// Repairs what a crash between a resume and its deferred request writes left behind: a
/// request of an earlier step that a person decided, whose status still says Pending. Everything
/// its status needs is on the request itself.
async fn record_decisions(
    ctx: &Context,
    run: &AgentRun,
    ns: &str,
    requests: &[ApprovalRequest],
) -> Result<(), ReconcileError> {
    for request in decide::unrecorded_decisions(run, requests) {
        if ctx.recorded.contains(ns, &request.name_any()) {
            continue;
        }
        let phase = match request.spec.decision {
            Some(crate::crd::Decision::Approved) => ApprovalPhase::Approved,
            Some(crate::crd::Decision::Rejected) => ApprovalPhase::Rejected,
            None => continue,
        };
        let resolution = Resolution {
            request: request.name_any(),
            phase,
            decided_at: decision_time(request).unwrap_or_else(Utc::now),
            identity: verified_identity_or_claimed(request),
        };
        warn!(request = %resolution.request, "recording a decision a stopped controller applied but did not record");
        record_resolution(ctx, ns, &resolution).await?;
    }
    Ok(())
}

/// The identity the stamping policy recorded; on servers without it, the approverId the
/// validating policy checked against the authenticated user.
fn verified_identity_or_claimed(request: &ApprovalRequest) -> Option<crate::crd::VerifiedIdentity> {
    verified_identity(request).or_else(|| {
        request
            .spec
            .approver_id
            .clone()
            .map(|username| crate::crd::VerifiedIdentity {
                username,
                uid: None,
                groups: vec![],
            })
    })
}

/// The Event that announces a decision.
fn decision_event(decision: &ResolvedDecision) -> (EventType, &'static str, String) {
    match &decision.kind {
        ResolvedKind::Approved {
            approver_id,
            reason,
        } => (
            EventType::Normal,
            "Approved",
            format!(
                "Approved by {}: {}",
                approver_id.as_deref().unwrap_or("unknown"),
                reason.as_deref().unwrap_or("no reason given")
            ),
        ),
        ResolvedKind::Rejected {
            approver_id,
            reason,
            ..
        } => (
            EventType::Normal,
            "Rejected",
            format!(
                "Rejected by {}: {}",
                approver_id.as_deref().unwrap_or("unknown"),
                reason.as_deref().unwrap_or("no reason given")
            ),
        ),
        ResolvedKind::Expired => (
            EventType::Warning,
            "Expired",
            format!(
                "Approval of {} timed out; treated as rejected",
                decision.tool_call_id
            ),
        ),
        ResolvedKind::Superseded { why } => (
            EventType::Warning,
            "Superseded",
            format!("Decision on {} refused: {why}", decision.request),
        ),
    }
}

/// The run versions this replica has written over, by run uid: a reconcile that still sees such a
/// version in the cache (the watch has not delivered the write yet) waits for it instead of acting
/// on an outdated run. Versions are compared for equality only, as API conventions require.
#[derive(Default)]
struct WrittenVersions(
    std::sync::Mutex<std::collections::HashMap<String, (String, std::time::Instant)>>,
);

impl WrittenVersions {
    const KEEP: Duration = Duration::from_secs(300);

    fn wrote_over(&self, run: &AgentRun) {
        if let (Some(uid), Some(rv)) = (run.uid(), run.resource_version()) {
            let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let now = std::time::Instant::now();
            if map.len() >= 1024 {
                map.retain(|_, (_, at)| now.duration_since(*at) < Self::KEEP);
            }
            map.insert(uid, (rv, now));
        }
    }

    /// Whether `run` is a version this replica wrote over.
    fn is_stale(&self, run: &AgentRun) -> bool {
        let (Some(uid), Some(rv)) = (run.uid(), run.resource_version()) else {
            return false;
        };
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&uid).is_some_and(|(written, _)| *written == rv)
    }
}

/// The requests whose resolution this process wrote recently, by `namespace/name`: a reconcile
/// that sees them still Pending in a lagging cache does not write them again.
#[derive(Default)]
pub struct RecentlyRecorded(
    std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
);

impl RecentlyRecorded {
    const KEEP: Duration = Duration::from_secs(600);

    fn remember(&self, ns: &str, name: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        if map.len() >= 1024 {
            map.retain(|_, at| now.duration_since(*at) < Self::KEEP);
        }
        map.insert(format!("{ns}/{name}"), now);
    }

    fn forget(&self, ns: &str, name: &str) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(&format!("{ns}/{name}"));
    }

    fn contains(&self, ns: &str, name: &str) -> bool {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&format!("{ns}/{name}"))
            .is_some_and(|at| at.elapsed() < Self::KEEP)
    }
}

/// When a person set the decision: the latest write to the request's spec by anyone but the
/// controller (from its managed fields).
fn decision_time(request: &ApprovalRequest) -> Option<chrono::DateTime<Utc>> {
    request
        .meta()
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() != Some(FIELD_MANAGER) && m.subresource.is_none())
        .filter_map(|m| m.time.as_ref())
        .map(|t| {
            chrono::DateTime::from_timestamp(t.0.as_second(), t.0.subsec_nanosecond().max(0) as u32)
                .unwrap_or_default()
        })
        .max()
}

/// The identity the admission policy verified and stamped when the decision was set.
fn verified_identity(request: &ApprovalRequest) -> Option<crate::crd::VerifiedIdentity> {
    let text = request.annotations().get(DECIDED_BY_ANNOTATION)?;
    serde_json::from_str(text).ok()
}

/// Cleanup on delete: release the run's ApprovalRequests so the garbage collector can remove
/// them with the run (until then their finalizer keeps the decision record).
async fn cleanup(run: Arc<AgentRun>, ctx: &Context) -> Result<Requeue, ReconcileError> {
    let ns = run.namespace().ok_or(ReconcileError::NoNamespace)?;
    let api: Api<ApprovalRequest> = Api::namespaced(ctx.client.clone(), &ns);
    let selector = format!("{RUN_LABEL}={}", worker_pod::label_value(&run.name_any()));
    for request in api.list(&ListParams::default().labels(&selector)).await? {
        let finalizers: Vec<String> = request
            .finalizers()
            .iter()
            .filter(|f| f.as_str() != AUDIT_FINALIZER)
            .cloned()
            .collect();
        if finalizers.len() != request.finalizers().len() {
            let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": request.resource_version()}});
            api.patch(
                &request.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        }
    }
    Ok(Requeue::await_change())
}

/// An object as a server-side apply body (with its apiVersion and kind).
fn typed<T: serde::Serialize>(object: &T, api_version: &str, kind: &str) -> serde_json::Value {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    value["apiVersion"] = json!(api_version);
    value["kind"] = json!(kind);
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("managedFields");
        meta.remove("resourceVersion");
    }
    value
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AgentRef, AgentRunSpec};

    fn run(uid: &str, rv: &str) -> AgentRun {
        let mut run = AgentRun::new(
            "r1",
            AgentRunSpec {
                agent_ref: AgentRef { name: "ops".into() },
                input: "hi".into(),
                worker: None,
            },
        );
        run.metadata.uid = Some(uid.into());
        run.metadata.resource_version = Some(rv.into());
        run
    }

    #[test]
    fn a_version_this_replica_wrote_over_is_stale_and_newer_ones_are_not() {
        let written = WrittenVersions::default();
        assert!(!written.is_stale(&run("u1", "10")));
        written.wrote_over(&run("u1", "10"));
        assert!(written.is_stale(&run("u1", "10")));
        assert!(
            !written.is_stale(&run("u1", "11")),
            "the watch delivered the write"
        );
        assert!(!written.is_stale(&run("u2", "10")), "another run");
    }

    #[test]
    fn recorded_decisions_are_remembered_until_forgotten() {
        let recorded = RecentlyRecorded::default();
        assert!(!recorded.contains("ns", "r1-call-1"));
        recorded.remember("ns", "r1-call-1");
        assert!(recorded.contains("ns", "r1-call-1"));
        assert!(!recorded.contains("other", "r1-call-1"));
        recorded.forget("ns", "r1-call-1");
        assert!(!recorded.contains("ns", "r1-call-1"));
    }
}
