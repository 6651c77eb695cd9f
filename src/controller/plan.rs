//! The pure heart of a reconcile: from an [`Observed`] run to the [`Plan`] that carries out its
//! next [`Action`]. A plan holds everything its execution needs — the typed status changes, the
//! objects to create, the RunState with the decisions applied (approve/reject with their audit
//! fields happen here), the Events, the resolutions to record — so that
//! [`execute`](super::execute) only performs it, in order.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::children::{self, WorkerSettings};
use super::decide::{self, Action, NewRequest, Policy, ResolvedDecision, ResolvedKind};
use super::observe::Observed;
use super::resolutions::{self, Resolution};
use crate::crd::keys::{finalizers, labels};
use crate::crd::names::{run_label_value, worker_pod_name};
use crate::crd::status_patch::{AgentRunStatusPatch, ApprovalRequestStatusPatch, StatusPatch};
use crate::crd::stored_state::StoredState;
use crate::crd::{
    Agent, AgentRunPhase, AgentRunRef, ApprovalPhase, ApprovalRequest, ApprovalRequestSpec,
    ConditionStatus, ConditionType, EventReason, Reason, new_condition, set_condition,
};
use crate::state::{Approval, DecisionError, Rejection, RunState};
use crate::time::to_k8s;

/// The message a model gets for a call whose approval timed out.
pub const EXPIRED_MESSAGE: &str = "approval timed out";
/// The message a model gets for a call whose approval request no longer matched it.
pub const SUPERSEDED_MESSAGE: &str =
    "The approval request no longer matched this call, so it was not executed.";
/// The longest Event note.
const MAX_NOTE: usize = 1000;

/// What one reconcile does.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The writes, in order; the first that fails ends the reconcile (retried by the error
    /// policy).
    pub steps: Vec<Step>,
    /// Writes done beside the next reconciles, once `steps` succeeded (off the path from a
    /// decision to the next worker Pod).
    pub after: Vec<Step>,
    /// When to look at the run again.
    pub requeue: Requeue,
    /// A worker failed (counted in the metrics).
    pub worker_failed: bool,
    /// Seconds each applied decision waited for a person (counted in the metrics).
    pub approval_waits: Vec<f64>,
}

/// When a run is reconciled again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Requeue {
    /// When a watch event brings it back.
    #[default]
    AwaitChange,
    /// After this long.
    After(Duration),
}

/// One write of a plan.
#[derive(Clone, Debug)]
pub enum Step {
    /// Record a request's resolution in its status.
    RecordResolution(Resolution),
    /// Apply the run's worker ServiceAccount, Role and RoleBinding (server-side apply).
    ApplyWorkerIdentity(Box<(ServiceAccount, Role, RoleBinding)>),
    /// Write the chunks of an offloaded state, before the status that references them.
    WriteChunks(Box<StoredState>),
    /// Patch the run's status.
    PatchRun(Box<StatusPatch<AgentRunStatusPatch>>),
    /// Delete the run's chunks of other states than this digest.
    PruneChunks {
        /// The digest of the state the status references.
        keep_digest: String,
    },
    /// Create a worker Pod (a no-op if it exists).
    CreatePod {
        /// The Pod.
        pod: Box<Pod>,
        /// The `WorkerStarted` Event's note, published if the Pod was created.
        announce: Option<String>,
        /// When the decisions this Pod resumes were made (for the resume latency).
        resumes: Vec<DateTime<Utc>>,
    },
    /// Create (server-side apply) an ApprovalRequest and set its status.
    CreateRequest {
        /// The request.
        request: Box<ApprovalRequest>,
        /// Its initial status.
        status: ApprovalRequestStatusPatch,
        /// The `ApprovalRequested` Event's note.
        announce: String,
    },
    /// Publish an Event about the run.
    Publish(Announcement),
}

/// An Event about the run.
#[derive(Clone, Debug, PartialEq)]
pub struct Announcement {
    /// Normal or Warning.
    pub type_: EventType,
    /// Why.
    pub reason: EventReason,
    /// What happened, for people.
    pub note: String,
    /// The object it concerns besides the run (an ApprovalRequest).
    pub related: Option<ObjectReference>,
}

/// A step publishing an Event about the run alone.
fn announce(type_: EventType, reason: EventReason, note: impl Into<String>) -> Step {
    Step::Publish(Announcement {
        type_,
        reason,
        note: truncate(&note.into(), MAX_NOTE),
        related: None,
    })
}

/// Plans the next reconcile of a run.
pub fn plan(observed: &Observed, policy: &Policy, worker: &WorkerSettings) -> Plan {
    let mut plan = Plan {
        steps: resolutions::repairs(observed)
            .into_iter()
            .map(Step::RecordResolution)
            .collect(),
        ..Default::default()
    };
    if observed.is_terminal() {
        return plan;
    }
    if observed.stale {
        // This replica already wrote over this version: act on what it wrote, which the watch
        // brings next (acting now would repeat a step, or fail a guarded write).
        plan.requeue = Requeue::After(Duration::from_secs(1));
        return plan;
    }
    if let Some(report) = unknown_outcomes(observed) {
        // Later status patches start from the cached conditions: act once the cache has it.
        plan.steps.extend(report);
        return plan;
    }
    let action = decide::decide(observed, policy);
    plan.worker_failed = matches!(
        action,
        Action::StartStep { attempt: 1.., .. }
            | Action::Fail {
                reason: Reason::WorkerFailed,
                ..
            }
    );
    let planner = Planner {
        o: observed,
        worker,
    };
    match action {
        Action::Wait => {}
        Action::Recheck(after) => plan.requeue = Requeue::After(after),
        Action::StartStep { step, attempt } => match observed.agent.as_deref() {
            Some(agent) => plan.steps.extend(planner.start_step(agent, step, attempt)),
            None => planner.agent_missing(&mut plan, policy),
        },
        Action::AgentMissing => planner.agent_missing(&mut plan, policy),
        Action::CreatePod { step, attempt } => {
            plan.steps
                .push(planner.create_pod(step, attempt, true, vec![]))
        }
        Action::RequestApprovals { create, pending } => plan
            .steps
            .extend(planner.request_approvals(create, pending)),
        Action::Resume { decisions } => match &observed.state {
            Some(Ok(state)) => planner.resume(&mut plan, state.clone(), decisions),
            _ => plan.steps.extend(planner.fail(
                Reason::InvalidRunState,
                "the run's state was not read before its decisions were applied",
            )),
        },
        Action::Succeed { output } => plan.steps.extend(planner.succeed(&output)),
        Action::Fail { reason, message } => plan.steps.extend(planner.fail(reason, &message)),
    }
    plan
}

/// Surfaces, once, the tool calls a worker recorded as `Unknown` (a non-idempotent call that a
/// stopped worker may have sent) in a condition and a Warning Event.
fn unknown_outcomes(o: &Observed) -> Option<Vec<Step>> {
    let status = o.run.status.clone().unwrap_or_default();
    let unknown: Vec<String> = status
        .tool_calls
        .iter()
        .filter(|r| r.outcome.as_deref() == Some("Unknown"))
        .map(|r| format!("{} ({})", r.tool_call_id, r.tool_name))
        .collect();
    if unknown.is_empty()
        || crate::crd::find_condition(&status.conditions, ConditionType::ToolOutcomeUnknown)
            .is_some()
    {
        return None;
    }
    let message = format!(
        "the outcome of {} is unknown: a worker stopped after sending it and the tool is not idempotent, so it was not sent again; the model was told",
        unknown.join(", ")
    );
    let conditions = with_condition(
        o,
        ConditionType::ToolOutcomeUnknown,
        ConditionStatus::True,
        Reason::NotResent,
        &message,
    );
    Some(vec![
        patch_run(
            AgentRunStatusPatch {
                conditions: Some(conditions),
                ..Default::default()
            },
            None,
        ),
        announce(EventType::Warning, EventReason::ToolOutcomeUnknown, message),
    ])
}

/// Builds the steps of one action.
struct Planner<'a> {
    o: &'a Observed,
    worker: &'a WorkerSettings,
}

impl Planner<'_> {
    fn run_name(&self) -> String {
        self.o.run.name_any()
    }

    fn step(&self) -> u32 {
        self.o.run.status.as_ref().and_then(|s| s.step).unwrap_or(0)
    }

    /// The run's conditions with `Ready` set.
    fn ready(
        &self,
        status: ConditionStatus,
        reason: Reason,
        message: &str,
    ) -> Option<Vec<Condition>> {
        Some(with_condition(
            self.o,
            ConditionType::Ready,
            status,
            reason,
            message,
        ))
    }

    fn generation(&self) -> Option<Option<i64>> {
        Some(self.o.run.metadata.generation)
    }

    fn agent_missing(&self, plan: &mut Plan, policy: &Policy) {
        plan.requeue = Requeue::After(policy.recheck);
        let already = self
            .o
            .run
            .status
            .as_ref()
            .and_then(|s| crate::crd::find_condition(&s.conditions, ConditionType::Ready))
            .is_some_and(|c| c.reason == Reason::AgentNotFound.as_ref());
        if already {
            return;
        }
        let message = format!(
            "Agent {} not found in namespace {}",
            self.o.run.spec.agent_ref.name,
            self.o.run.namespace().unwrap_or_default()
        );
        let phase = self.o.run.status.as_ref().and_then(|s| s.phase);
        plan.steps.push(patch_run(
            AgentRunStatusPatch {
                conditions: self.ready(ConditionStatus::False, Reason::AgentNotFound, &message),
                observed_generation: self.generation(),
                phase: phase.is_none().then_some(AgentRunPhase::Pending),
                ..Default::default()
            },
            None,
        ));
        plan.steps.push(announce(
            EventType::Warning,
            EventReason::AgentNotFound,
            message,
        ));
    }

    fn start_step(&self, agent: &Agent, step: u32, attempt: u32) -> Vec<Step> {
        let run = &self.o.run;
        let mut steps = vec![];
        let own_account = run
            .spec
            .worker
            .as_ref()
            .and_then(|w| w.service_account_name.as_ref())
            .is_none();
        if step == 0 && attempt == 0 && own_account {
            steps.push(Step::ApplyWorkerIdentity(Box::new(
                children::worker_identity(run, agent),
            )));
        }
        let pod = worker_pod_name(&self.run_name(), step, attempt);
        let status = run.status.clone().unwrap_or_default();
        let created_by = status
            .created_by
            .is_none()
            .then(|| {
                run.annotations()
                    .get(crate::crd::keys::annotations::CREATED_BY)
                    .cloned()
            })
            .flatten();
        steps.push(patch_run(
            AgentRunStatusPatch {
                phase: Some(AgentRunPhase::Running),
                step: Some(step),
                retries: Some(attempt),
                worker_pod: Some(pod.clone()),
                pending_approvals: Some(0),
                observed_generation: self.generation(),
                conditions: self.ready(
                    ConditionStatus::False,
                    Reason::Running,
                    &format!("worker Pod {pod} runs step {step}"),
                ),
                started_at: status.started_at.is_none().then(|| to_k8s(self.o.now)),
                created_by,
                ..Default::default()
            },
            run.resource_version(),
        ));
        steps.push(self.create_pod(step, attempt, true, vec![]));
        steps
    }

    /// Creates the worker Pod of a step's attempt; `announce` publishes a `WorkerStarted` Event
    /// (a resume is announced by its decisions' Events instead).
    fn create_pod(
        &self,
        step: u32,
        attempt: u32,
        announce: bool,
        resumes: Vec<DateTime<Utc>>,
    ) -> Step {
        let pod = children::worker_pod(&self.o.run, step, attempt, self.worker);
        let name = pod.name_any();
        let announce = announce.then(|| match attempt {
            0 => format!("Started worker Pod {name} for step {step}"),
            _ => format!("Started worker Pod {name} for step {step} (retry {attempt})"),
        });
        Step::CreatePod {
            pod: Box::new(pod),
            announce,
            resumes,
        }
    }

    fn request_approvals(&self, create: Vec<NewRequest>, pending: u32) -> Vec<Step> {
        let run = &self.o.run;
        let run_name = self.run_name();
        // With self-approval allowed the creator is not copied, so the policy does not refuse it.
        let allow_self_approval = self
            .o
            .agent
            .as_ref()
            .is_some_and(|a| a.spec.approvals.allow_self_approval);
        let creator = if allow_self_approval {
            None
        } else {
            run.status.as_ref().and_then(|s| s.created_by.clone())
        };
        let mut steps = vec![];
        for new in create {
            let mut request = ApprovalRequest::new(
                &new.name,
                ApprovalRequestSpec {
                    agent_run_ref: AgentRunRef {
                        name: run_name.clone(),
                        uid: run.uid().unwrap_or_default(),
                    },
                    step: self.step(),
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
            request.metadata.namespace = run.namespace();
            request.metadata.labels =
                Some([(labels::RUN.to_owned(), run_label_value(&run_name))].into());
            request.metadata.owner_references = run.controller_owner_ref(&()).map(|o| vec![o]);
            request.metadata.finalizers = Some(vec![finalizers::KEEP_WITH_RUN.to_owned()]);
            steps.push(Step::CreateRequest {
                request: Box::new(request),
                status: ApprovalRequestStatusPatch {
                    phase: Some(ApprovalPhase::Pending),
                    expires_at: new.expires_at.map(to_k8s),
                    ..Default::default()
                },
                announce: format!(
                    "Tool call {} ({}) of run {run_name} awaits a decision: kubectl patch apr {} --type merge -p '{{\"spec\":{{\"decision\":\"Approved\",\"approverId\":\"<you>\",\"reason\":\"<why>\"}}}}'",
                    new.call.tool_name, new.call.tool_call_id, new.name
                ),
            });
        }
        let status = run.status.clone().unwrap_or_default();
        if status.phase != Some(AgentRunPhase::AwaitingApproval)
            || status.pending_approvals != Some(pending)
        {
            // The ApprovalRequested Events say what awaits a decision: no Event of its own.
            steps.push(patch_run(
                AgentRunStatusPatch {
                    phase: Some(AgentRunPhase::AwaitingApproval),
                    pending_approvals: Some(pending),
                    observed_generation: self.generation(),
                    conditions: self.ready(
                        ConditionStatus::False,
                        Reason::AwaitingApproval,
                        &format!("{pending} tool call(s) await a decision"),
                    ),
                    ..Default::default()
                },
                None,
            ));
        }
        steps
    }

    /// Applies every decision of the halt to the RunState, stores it with the next step, starts
    /// that step's worker, and records and announces the decisions.
    fn resume(&self, plan: &mut Plan, mut state: RunState, decisions: Vec<ResolvedDecision>) {
        let run = &self.o.run;
        let step = self.step() + 1;
        let mut decided_times = vec![];
        let mut announcements = vec![];
        for decision in &decisions {
            let request = self
                .o
                .requests
                .iter()
                .find(|r| r.name_any() == decision.request);
            let decided_at = request
                .and_then(resolutions::decision_time)
                .unwrap_or(self.o.now);
            if let Some(created) = request.and_then(|r| r.meta().creation_timestamp.as_ref()) {
                let waited = decided_at - crate::time::from_k8s(created);
                plan.approval_waits
                    .push(waited.num_milliseconds().max(0) as f64 / 1000.0);
            }
            decided_times.push(decided_at);
            let phase = match apply_decision(&mut state, decision, decided_at) {
                Ok(phase) => phase,
                Err(e) => {
                    plan.steps.extend(self.fail(
                        Reason::InvalidRunState,
                        &format!("applying the decision on {}: {e}", decision.request),
                    ));
                    return;
                }
            };
            let resolution = Resolution {
                request: decision.request.clone(),
                phase,
                decided_at,
                identity: request.and_then(resolutions::verified_identity_or_claimed),
            };
            // People's decisions are recorded on their requests after the next Pod exists, off
            // the path from decision to Pod (a crash in between is repaired from the request
            // alone, see `resolutions::repairs`); expiries and refusals first, as only this step
            // knows them.
            match phase {
                _ if request.is_some_and(|r| resolution.is_recorded_on(r)) => {}
                ApprovalPhase::Approved | ApprovalPhase::Rejected => {
                    plan.after.push(Step::RecordResolution(resolution))
                }
                _ => plan.steps.push(Step::RecordResolution(resolution)),
            }
            let (type_, reason, note) = decision_event(decision);
            let related = request.map(|r| r.object_ref(&())).unwrap_or_else(|| {
                ApprovalRequest::new(&decision.request, Default::default()).object_ref(&())
            });
            announcements.push(Step::Publish(Announcement {
                type_,
                reason,
                note: truncate(
                    &format!("{note} ({}); resumed at step {step}", decision.tool_call_id),
                    MAX_NOTE,
                ),
                related: Some(related),
            }));
        }
        let pod = worker_pod_name(&self.run_name(), step, 0);
        let stored = StoredState::encode(&state);
        let had_chunks = run
            .status
            .as_ref()
            .and_then(|s| s.run_state_chunks)
            .is_some();
        let prune = (!stored.chunks.is_empty() || had_chunks).then(|| Step::PruneChunks {
            keep_digest: stored.digest.clone(),
        });
        let patch = AgentRunStatusPatch {
            phase: Some(AgentRunPhase::Running),
            step: Some(step),
            retries: Some(0),
            pending_approvals: Some(0),
            worker_pod: Some(pod.clone()),
            observed_generation: self.generation(),
            conditions: self.ready(
                ConditionStatus::False,
                Reason::Running,
                &format!("resumed in worker Pod {pod} at step {step}"),
            ),
            ..stored.status_patch()
        };
        if !stored.chunks.is_empty() {
            plan.steps.push(Step::WriteChunks(Box::new(stored)));
        }
        // Guarded by resourceVersion: a decision is applied to exactly the state it was made on.
        plan.steps.push(patch_run(patch, run.resource_version()));
        plan.steps.extend(prune);
        plan.steps
            .push(self.create_pod(step, 0, false, decided_times));
        plan.after.extend(announcements);
    }

    fn succeed(&self, output: &str) -> Vec<Step> {
        vec![
            patch_run(
                AgentRunStatusPatch {
                    phase: Some(AgentRunPhase::Succeeded),
                    final_output: Some(truncate(
                        output,
                        crate::crd::agent_run::MAX_FINAL_OUTPUT_LENGTH,
                    )),
                    completed_at: Some(to_k8s(self.o.now)),
                    pending_approvals: Some(0),
                    observed_generation: self.generation(),
                    conditions: self.ready(
                        ConditionStatus::True,
                        Reason::Succeeded,
                        "the run finished",
                    ),
                    ..Default::default()
                },
                None,
            ),
            announce(
                EventType::Normal,
                EventReason::Succeeded,
                format!("Run finished: {}", truncate(output, 200)),
            ),
        ]
    }

    fn fail(&self, reason: Reason, message: &str) -> Vec<Step> {
        vec![
            patch_run(
                AgentRunStatusPatch {
                    phase: Some(AgentRunPhase::Failed),
                    completed_at: Some(to_k8s(self.o.now)),
                    observed_generation: self.generation(),
                    conditions: self.ready(ConditionStatus::False, reason, message),
                    ..Default::default()
                },
                None,
            ),
            announce(
                EventType::Warning,
                EventReason::Failed,
                format!("{reason}: {message}"),
            ),
        ]
    }
}

/// Applies one resolved decision to the state, with its audit fields, as made at `at`; returns
/// the request's final phase.
pub fn apply_decision(
    state: &mut RunState,
    decision: &ResolvedDecision,
    at: DateTime<Utc>,
) -> Result<ApprovalPhase, DecisionError> {
    let id = &decision.tool_call_id;
    match &decision.kind {
        ResolvedKind::Approved {
            approver_id,
            reason,
        } => {
            let mut approval = Approval::new().at(at);
            approval.approver_id = approver_id.clone();
            approval.reason = reason.clone();
            state.approve(id, approval)?;
            Ok(ApprovalPhase::Approved)
        }
        ResolvedKind::Rejected {
            approver_id,
            reason,
            message,
        } => {
            let mut rejection = Rejection::new().at(at);
            rejection.approver_id = approver_id.clone();
            rejection.reason = reason.clone();
            rejection.message = message.clone();
            state.reject(id, rejection)?;
            Ok(ApprovalPhase::Rejected)
        }
        ResolvedKind::Expired => {
            let rejection = Rejection::new()
                .message(EXPIRED_MESSAGE)
                .reason("expired")
                .at(at);
            state.reject(id, rejection)?;
            Ok(ApprovalPhase::Expired)
        }
        ResolvedKind::Superseded { why } => {
            let rejection = Rejection::new()
                .message(SUPERSEDED_MESSAGE)
                .reason(format!("superseded: {why}"))
                .at(at);
            state.reject(id, rejection)?;
            Ok(ApprovalPhase::Superseded)
        }
    }
}

/// The Event that announces a decision.
fn decision_event(decision: &ResolvedDecision) -> (EventType, EventReason, String) {
    let who = |approver: &Option<String>| approver.as_deref().unwrap_or("unknown").to_owned();
    let why = |reason: &Option<String>| reason.as_deref().unwrap_or("no reason given").to_owned();
    match &decision.kind {
        ResolvedKind::Approved {
            approver_id,
            reason,
        } => (
            EventType::Normal,
            EventReason::Approved,
            format!("Approved by {}: {}", who(approver_id), why(reason)),
        ),
        ResolvedKind::Rejected {
            approver_id,
            reason,
            ..
        } => (
            EventType::Normal,
            EventReason::Rejected,
            format!("Rejected by {}: {}", who(approver_id), why(reason)),
        ),
        ResolvedKind::Expired => (
            EventType::Warning,
            EventReason::Expired,
            format!(
                "Approval of {} timed out; treated as rejected",
                decision.tool_call_id
            ),
        ),
        ResolvedKind::Superseded { why } => (
            EventType::Warning,
            EventReason::Superseded,
            format!("Decision on {} refused: {why}", decision.request),
        ),
    }
}

/// The observed run's conditions with one of `type_` set, as of the observation.
fn with_condition(
    o: &Observed,
    type_: ConditionType,
    status: ConditionStatus,
    reason: Reason,
    message: &str,
) -> Vec<Condition> {
    let mut conditions = o
        .run
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    set_condition(
        &mut conditions,
        new_condition(
            type_,
            status,
            reason,
            message,
            o.run.metadata.generation,
            to_k8s(o.now),
        ),
    );
    conditions
}

/// A run status patch, guarded by `resource_version` when given.
fn patch_run(status: AgentRunStatusPatch, resource_version: Option<String>) -> Step {
    Step::PatchRun(Box::new(StatusPatch::guarded(status, resource_version)))
}

/// `text` cut to at most `max` bytes, ending with `...` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}
