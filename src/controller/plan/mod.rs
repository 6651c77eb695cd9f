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
use kube::ResourceExt;
use kube::runtime::events::EventType;

mod actions;
mod decisions;
#[cfg(test)]
mod tests;

use super::children::WorkerSettings;
use super::decide::{self, Action, Policy};
use super::observe::Observed;
use super::resolutions::Resolution;
use super::signing::Issuer;
use crate::crd::status_patch::{AgentRunStatusPatch, ApprovalRequestStatusPatch, StatusPatch};
use crate::crd::stored_state::StoredState;
use crate::crd::{
    ApprovalRequest, ConditionStatus, ConditionType, EventReason, Reason, new_condition,
    set_condition,
};
use crate::time::to_k8s;
use actions::Planner;
pub use decisions::apply_decision;

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
    /// Why something was refused: a tampered state, a decision that was not applied (counted in
    /// the metrics).
    pub refusals: Vec<Reason>,
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
    /// Record in a request's conditions that its decision was refused.
    RecordRefusal {
        /// The request's name.
        request: String,
        /// Its conditions, with the refusal.
        conditions: Vec<Condition>,
    },
    /// Apply the run's worker ServiceAccount, Role and RoleBinding (server-side apply).
    ApplyWorkerIdentity(Box<(ServiceAccount, Role, RoleBinding)>),
    /// Write the chunks of an offloaded state, before the status that references them.
    WriteChunks(Box<StoredState>),
    /// Patch the run's status.
    PatchRun(Box<StatusPatch<AgentRunStatusPatch>>),
    /// Delete the finished run's worker Pods, by name (a failure is logged; a later reconcile of
    /// the run tries again, and the Pods go with the run in any case).
    DeleteWorkerPods(Vec<String>),
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
    /// Perform these steps at the same time; every one of them is performed, and the reconcile
    /// ends with the first failure.
    Together(Vec<Step>),
    /// Perform these steps one after the other; the first failure ends the reconcile.
    InOrder(Vec<Step>),
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
/// With an `issuer`, each approval this plan records carries its signed assertion.
pub fn plan(
    observed: &Observed,
    policy: &Policy,
    worker: &WorkerSettings,
    issuer: Option<&Issuer>,
) -> Plan {
    let mut plan = Plan::default();
    if observed.is_terminal() {
        plan.after.extend(delete_worker_pods(observed, worker));
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
    if let Action::Fail {
        reason: Reason::TamperedState,
        ..
    } = action
    {
        plan.refusals.push(Reason::TamperedState);
    }
    let planner = Planner {
        o: observed,
        worker,
        policy,
        issuer,
    };
    match action {
        Action::Wait => {}
        Action::Recheck(after) => plan.requeue = Requeue::After(after),
        Action::StartStep { step, attempt } => {
            plan.steps
                .extend(planner.start_step(observed.agent.as_deref(), step, attempt))
        }
        Action::AgentMissing => planner.agent_missing(&mut plan, policy),
        Action::CreatePod { step, attempt } => {
            plan.steps
                .push(planner.create_pod(step, attempt, true, vec![]))
        }
        Action::Record {
            resolved,
            refused,
            recheck,
        } => {
            planner.record(&mut plan, &resolved, &refused);
            // A refused decision is looked at again (e.g. once the policies are installed).
            let again = (!refused.is_empty()).then_some(policy.recheck);
            if let Some(after) = recheck.into_iter().chain(again).min() {
                plan.requeue = Requeue::After(after);
            }
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

/// Deletes a finished run's worker Pods when the settings ask for it, once the run's cached
/// version says it finished. Not at the status write that finishes it: until the watch delivers
/// that write, a reconcile starts from an earlier version of the run, in which the Pod of the step
/// it runs would be missing, and so created again.
fn delete_worker_pods(o: &Observed, worker: &WorkerSettings) -> Option<Step> {
    let pods: Vec<String> = o.pods.iter().map(|p| p.name_any()).collect();
    (o.finished_in_cache && worker.pod_deletion.deletes_pods_of(&o.run) && !pods.is_empty())
        .then_some(Step::DeleteWorkerPods(pods))
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
