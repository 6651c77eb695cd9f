//! [`IdealController`]: the least a controller of this design could do, to measure ours against.
//!
//! It watches the namespace's ApprovalRequests, and its AgentRuns for their states (both watches
//! synced before the approval burst, so it never reads), and per approved request makes only the
//! writes the design cannot avoid, as soon as the decision arrives:
//!
//! 1. the run's status: its RunState with the approval applied, the next step and its Pod's name
//!    (guarded by the run's resourceVersion),
//! 2. the next worker Pod (the same Pod our controller creates, so the dev kubelet runs the same
//!    worker, which waits until the run is at its step), and
//! 3. the request's resolution (`status.phase: Approved`, which the worker checks before it
//!    calls the tool),
//!
//! all three at the same time, the Pod's request first (ours records the resolution before it
//! writes the state).
//!
//! It publishes no Event, verifies no identity, signs no assertion and keeps no state cache;
//! when a worker reports the final answer it writes the run's final phase (one write; ours also
//! waits for the Pod to exit and publishes an Event). It handles at most `concurrency` decisions
//! at once, like our controller's reconciles, and authenticates as the controller's
//! ServiceAccount, so the audit log counts its requests the same way.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use agentrun::controller::WorkerSettings;
use agentrun::controller::children::worker_pod;
use agentrun::crd::status_patch::{AgentRunStatusPatch, ApprovalRequestStatusPatch, StatusPatch};
use agentrun::crd::stored_state::{StoredState, decode};
use agentrun::crd::{
    AgentRun, AgentRunPhase, ApprovalPhase, ApprovalRequest, Decision, worker_pod_name,
};
use agentrun::state::Approval;
use agentrun::time::to_k8s;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::Semaphore;
use tokio_util::task::AbortOnDropHandle;

use std::time::Duration;

use crate::BenchError;
use crate::cluster::{BenchNamespace, client_from};
use crate::observe::{lock, watch};
use crate::run::wait_for;

/// The field manager of the ideal controller's writes.
const FIELD_MANAGER: &str = "agentrun-bench-ideal";

/// The ideal controller, running in the benchmark process until dropped.
pub(crate) struct IdealController {
    shared: Arc<Shared>,
    _runs: AbortOnDropHandle<()>,
    _requests: AbortOnDropHandle<()>,
}

struct Shared {
    client: Client,
    ns: String,
    worker: WorkerSettings,
    permits: Semaphore,
    /// The latest version of each run its watch delivered.
    runs: Mutex<HashMap<String, AgentRun>>,
    /// Requests whose decision it acted on.
    decided: Mutex<HashSet<String>>,
    /// Runs it finished.
    finished: Mutex<HashSet<String>>,
    writes: AtomicU64,
    errors: Mutex<Vec<String>>,
    runs_synced: AtomicBool,
    requests_synced: AtomicBool,
}

impl IdealController {
    /// Starts the watches of `ns`; decisions are acted on from then on.
    pub(crate) fn start(client: Client, ns: &str, concurrency: usize) -> IdealController {
        let shared = Arc::new(Shared {
            client: client.clone(),
            ns: ns.to_owned(),
            worker: WorkerSettings::default(),
            permits: Semaphore::new(concurrency.max(1)),
            runs: Mutex::default(),
            decided: Mutex::default(),
            finished: Mutex::default(),
            writes: AtomicU64::new(0),
            errors: Mutex::default(),
            runs_synced: AtomicBool::new(false),
            requests_synced: AtomicBool::new(false),
        });
        let (on_run, runs_synced) = (shared.clone(), shared.clone());
        let runs = watch(
            Api::<AgentRun>::namespaced(client.clone(), ns),
            move |run: AgentRun, _| on_run.run_seen(run),
            move || runs_synced.runs_synced.store(true, Ordering::Relaxed),
        );
        let (on_request, requests_synced) = (shared.clone(), shared.clone());
        let requests = watch(
            Api::<ApprovalRequest>::namespaced(client, ns),
            move |request: ApprovalRequest, _| on_request.request_seen(request),
            move || {
                requests_synced
                    .requests_synced
                    .store(true, Ordering::Relaxed)
            },
        );
        IdealController {
            shared,
            _runs: runs,
            _requests: requests,
        }
    }

    /// Whether both watches delivered their initial listing.
    pub(crate) fn synced(&self) -> bool {
        self.shared.runs_synced.load(Ordering::Relaxed)
            && self.shared.requests_synced.load(Ordering::Relaxed)
    }

    /// The writes it made so far.
    pub(crate) fn writes(&self) -> u64 {
        self.shared.writes.load(Ordering::Relaxed)
    }

    /// What failed so far (none expected).
    pub(crate) fn errors(&self) -> Vec<String> {
        lock(&self.shared.errors).clone()
    }
}

impl Shared {
    fn run_seen(self: &Arc<Self>, run: AgentRun) {
        let name = run.name_any();
        let status = run.status.clone().unwrap_or_default();
        let finished = status.phase == Some(AgentRunPhase::Running)
            && status.step.unwrap_or(0) > 0
            && status.final_output.is_some()
            && lock(&self.finished).insert(name.clone());
        lock(&self.runs).insert(name.clone(), run);
        if finished {
            let shared = self.clone();
            tokio::spawn(async move {
                let result = shared.finish(&name).await;
                shared.record(result, &name);
            });
        }
    }

    fn request_seen(self: &Arc<Self>, request: ApprovalRequest) {
        let pending = request
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_none_or(|p| p == ApprovalPhase::Pending);
        if request.spec.decision != Some(Decision::Approved)
            || !pending
            || !lock(&self.decided).insert(request.name_any())
        {
            return;
        }
        let shared = self.clone();
        tokio::spawn(async move {
            let name = request.name_any();
            let result = match shared.permits.acquire().await {
                Ok(_permit) => shared.resume(&request).await,
                Err(e) => Err(e.to_string()),
            };
            shared.record(result, &name);
        });
    }

    fn record(&self, result: Result<(), String>, what: &str) {
        if let Err(e) = result {
            lock(&self.errors).push(format!("{what}: {e}"));
        }
    }

    fn wrote(&self) {
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    fn params() -> PatchParams {
        PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        }
    }

    /// Applies the approval to the run's state, starts the next step's Pod and records the
    /// resolution on the request.
    async fn resume(&self, request: &ApprovalRequest) -> Result<(), String> {
        let run_name = &request.spec.agent_run_ref.name;
        let run = lock(&self.runs)
            .get(run_name)
            .cloned()
            .ok_or_else(|| format!("run {run_name} not seen"))?;
        let status = run.status.clone().unwrap_or_default();
        let mut state = decode(&status)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("run {run_name} has no state"))?;
        let now = chrono::Utc::now();
        let mut approval = Approval::new().at(now);
        approval.approver_id = request.spec.approver_id.clone();
        approval.reason = request.spec.reason.clone();
        state
            .approve(&request.spec.tool_call_id, approval)
            .map_err(|e| e.to_string())?;
        let step = status.step.unwrap_or(0) + 1;
        let pod_name = worker_pod_name(run_name, step, 0);
        let stored = StoredState::encode(&state);
        let patch = StatusPatch::guarded(
            AgentRunStatusPatch {
                phase: Some(AgentRunPhase::Running),
                step: Some(step),
                retries: Some(0),
                pending_approvals: Some(0),
                worker_pod: Some(pod_name),
                ..stored.status_patch()
            },
            run.resource_version(),
        );
        let runs: Api<AgentRun> = Api::namespaced(self.client.clone(), &self.ns);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.ns);
        let requests: Api<ApprovalRequest> = Api::namespaced(self.client.clone(), &self.ns);
        let state = async {
            runs.patch_status(run_name, &Self::params(), &Patch::Merge(&patch))
                .await
                .map_err(|e| format!("the run's state: {e}"))?;
            self.wrote();
            Ok::<(), String>(())
        };
        let start = async {
            let pod = worker_pod(&run, step, 0, &self.worker);
            pods.create(&PostParams::default(), &pod)
                .await
                .map_err(|e| format!("the worker Pod: {e}"))?;
            self.wrote();
            Ok::<(), String>(())
        };
        let resolution = StatusPatch::guarded(
            ApprovalRequestStatusPatch {
                phase: Some(ApprovalPhase::Approved),
                decided_at: Some(to_k8s(now)),
                ..Default::default()
            },
            request.resource_version(),
        );
        let record = async {
            requests
                .patch_status(
                    &request.name_any(),
                    &Self::params(),
                    &Patch::Merge(&resolution),
                )
                .await
                .map_err(|e| format!("the resolution: {e}"))?;
            self.wrote();
            Ok::<(), String>(())
        };
        // The Pod's request is sent first, as ours does.
        let (started, written, recorded) = tokio::join!(start, state, record);
        written.and(started).and(recorded)
    }

    /// Writes the final phase of a run whose worker reported its answer.
    async fn finish(&self, run_name: &str) -> Result<(), String> {
        let patch = StatusPatch::unguarded(AgentRunStatusPatch {
            phase: Some(AgentRunPhase::Succeeded),
            completed_at: Some(to_k8s(chrono::Utc::now())),
            ..Default::default()
        });
        Api::<AgentRun>::namespaced(self.client.clone(), &self.ns)
            .patch_status(run_name, &Self::params(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("the final phase: {e}"))?;
        self.wrote();
        Ok(())
    }
}

/// Starts the ideal controller in `ns` as the controller's ServiceAccount, once its watches synced.
pub(crate) async fn start_ideal(ns: &BenchNamespace) -> Result<IdealController, BenchError> {
    let client = client_from(&ns.controller_kubeconfig).await?;
    let ideal = IdealController::start(
        client,
        &ns.name,
        agentrun::controller::DEFAULT_CONCURRENCY.into(),
    );
    wait_for(
        "the ideal controller's watches",
        Duration::from_secs(60),
        || Ok((!ideal.synced()).then(|| "not synced".to_owned())),
    )
    .await?;
    Ok(ideal)
}

/// Fails once a write of the ideal controller (if any) failed.
pub(crate) fn check_ideal(ideal: Option<&IdealController>) -> Result<(), BenchError> {
    match ideal.map(IdealController::errors) {
        Some(errors) if !errors.is_empty() => Err(BenchError::Ideal(errors.join("; "))),
        _ => Ok(()),
    }
}
