//! Applying the decisions of a halt: the RunState with each decision's audit fields, the next
//! step, and the resolutions and Events that record them.

use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::actions::Planner;
use super::{Announcement, MAX_NOTE, Plan, Step, patch_run, truncate};
use super::{EXPIRED_MESSAGE, SUPERSEDED_MESSAGE};
use crate::agent::model::set_tool_call_arguments;
use crate::controller::assertions;
use crate::controller::decide::{ResolvedDecision, ResolvedKind};
use crate::controller::resolutions::{self, Resolution};
use crate::controller::verify::{Decider, Refusal};
use crate::crd::names::worker_pod_name;
use crate::crd::status_patch::AgentRunStatusPatch;
use crate::crd::stored_state::StoredState;
use crate::crd::{AgentRunPhase, ApprovalRequest, ConditionStatus, EventReason, Reason};
use crate::state::{Approval, DecisionError, Rejection, RunState, pyjson};

impl Planner<'_> {
    fn request(&self, name: &str) -> Option<&ApprovalRequest> {
        self.o.requests.iter().find(|r| r.name_any() == name)
    }

    /// The steps recording the resolutions observed in this reconcile on their requests.
    fn resolutions(&self, resolved: &[ResolvedDecision]) -> Vec<Step> {
        resolved
            .iter()
            .filter(|d| d.new)
            .map(|decision| {
                let request = self.request(&decision.request);
                let mut resolution = Resolution::of(decision, request);
                // An approval carries the signed assertion the worker sends to the tool.
                if let (Some(issuer), Some(request), ResolvedKind::Approved { .. }) =
                    (self.issuer, request, &decision.kind)
                {
                    resolution.assertion =
                        assertions::issue(issuer, self.o, request, decision).ok();
                }
                Step::RecordResolution(resolution)
            })
            .collect()
    }

    /// Records the resolutions observed in this reconcile on their requests (before anything
    /// acts on them) and reports the decisions that were refused.
    pub(super) fn record(
        &self,
        plan: &mut Plan,
        resolved: &[ResolvedDecision],
        refused: &[(String, Refusal)],
    ) {
        plan.steps.extend(self.resolutions(resolved));
        for (name, refusal) in refused {
            let Some(request) = self.request(name) else {
                continue;
            };
            let Some(conditions) = resolutions::refused_conditions(request, refusal, self.o.now)
            else {
                continue;
            };
            plan.refusals.push(refusal.reason);
            let message = format!(
                "the decision on {name} was not applied: {}",
                refusal.message
            );
            plan.steps.push(Step::RecordRefusal {
                request: name.clone(),
                conditions,
            });
            plan.steps.push(patch_run(
                AgentRunStatusPatch {
                    conditions: self.ready(ConditionStatus::False, refusal.reason, &message),
                    observed_generation: self.generation(),
                    ..Default::default()
                },
                None,
            ));
            plan.steps.push(Step::Publish(Announcement {
                type_: EventType::Warning,
                reason: EventReason::DecisionRefused,
                note: truncate(&format!("{}: {message}", refusal.reason), MAX_NOTE),
                related: Some(request.object_ref(&())),
            }));
        }
    }

    /// Records the new resolutions, applies every decision of the halt to the RunState, then
    /// stores it with the next step, starts that step's worker meanwhile, and announces
    /// the decisions.
    pub(super) fn resume(
        &self,
        plan: &mut Plan,
        mut state: RunState,
        decisions: Vec<ResolvedDecision>,
    ) {
        let run = &self.o.run;
        let step = self.step() + 1;
        let mut in_order = self.resolutions(&decisions);
        let mut decided_times = vec![];
        let mut announcements = vec![];
        for decision in &decisions {
            let request = self.request(&decision.request);
            if decision.new
                && let Some(created) = request.and_then(|r| r.meta().creation_timestamp.as_ref())
            {
                let waited = decision.decided_at - crate::time::from_k8s(created);
                plan.approval_waits
                    .push(waited.num_milliseconds().max(0) as f64 / 1000.0);
            }
            decided_times.push(decision.decided_at);
            if let Err(e) = apply_decision(&mut state, decision) {
                plan.steps.extend(in_order);
                plan.steps.extend(self.fail(
                    Reason::InvalidRunState,
                    &format!("applying the decision on {}: {e}", decision.request),
                ));
                return;
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
            approval_gates: Some(self.o.approval_gates()),
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
            in_order.push(Step::WriteChunks(Box::new(stored)));
        }
        // Guarded by resourceVersion: a decision is applied to exactly the state it was made on.
        in_order.push(patch_run(patch, run.resource_version()));
        // The next worker Pod is created at the same time as the resolutions are recorded and the
        // state is written after them: its worker waits until the run is at its step (so after
        // the resolutions) before it reads the state, whatever decision the state holds.
        plan.steps.push(Step::Together(vec![
            self.create_pod(step, 0, false, decided_times),
            Step::InOrder(in_order),
        ]));
        plan.steps.extend(prune);
        plan.after.extend(announcements);
    }
}

/// Applies one resolved decision to the state, with its audit fields as of when it was made. An
/// approval with edited arguments first puts them in the call (the conversation and the deferred
/// call), so the history shows what the tool receives.
pub fn apply_decision(state: &mut RunState, decision: &ResolvedDecision) -> Result<(), String> {
    let id = &decision.tool_call_id;
    let at = decision.decided_at;
    let applied: Result<(), DecisionError> = match &decision.kind {
        ResolvedKind::Approved {
            approver_id,
            reason,
            edited_arguments,
        } => {
            if let Some(edited) = edited_arguments {
                edit_call(state, id, edited)?;
            }
            let mut approval = Approval::new().at(at);
            approval.approver_id = approver_id.clone();
            approval.reason = reason.clone();
            state.approve(id, approval)
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
            state.reject(id, rejection)
        }
        ResolvedKind::Expired => {
            let rejection = Rejection::new()
                .message(EXPIRED_MESSAGE)
                .reason("expired")
                .at(at);
            state.reject(id, rejection)
        }
        ResolvedKind::Superseded { why } => {
            let rejection = Rejection::new()
                .message(SUPERSEDED_MESSAGE)
                .reason(format!("superseded: {why}"))
                .at(at);
            state.reject(id, rejection)
        }
    };
    applied.map_err(|e| e.to_string())
}

/// Replaces the arguments of the pending call `id` with `edited` (their stored JSON) in the
/// conversation and in the deferred call.
fn edit_call(state: &mut RunState, id: &str, edited: &str) -> Result<(), String> {
    let args = pyjson::loads(edited).map_err(|e| format!("the edited arguments: {e}"))?;
    if !set_tool_call_arguments(&mut state.messages, id, edited) {
        return Err(format!("the conversation has no tool call {id} to edit"));
    }
    for call in state
        .deferred_tool_requests
        .approvals
        .iter_mut()
        .filter(|c| c.tool_call_id == id)
    {
        call.args = args.clone();
    }
    Ok(())
}

/// The Event that announces a decision.
fn decision_event(decision: &ResolvedDecision) -> (EventType, EventReason, String) {
    let who = |approver: &Option<String>| approver.as_deref().unwrap_or("unknown").to_owned();
    let why = |reason: &Option<String>| reason.as_deref().unwrap_or("no reason given").to_owned();
    let by_policy = |person: EventReason| {
        if decision.decider == Some(Decider::Policy) {
            EventReason::PolicyDecided
        } else {
            person
        }
    };
    match &decision.kind {
        ResolvedKind::Approved {
            approver_id,
            reason,
            edited_arguments,
        } => (
            EventType::Normal,
            by_policy(EventReason::Approved),
            format!(
                "Approved by {}{}{}: {}",
                who(approver_id),
                how(&decision.decider),
                if edited_arguments.is_some() {
                    " with edited arguments"
                } else {
                    ""
                },
                why(reason)
            ),
        ),
        ResolvedKind::Rejected {
            approver_id,
            reason,
            ..
        } => (
            EventType::Normal,
            by_policy(EventReason::Rejected),
            format!(
                "Rejected by {}{}: {}",
                who(approver_id),
                how(&decision.decider),
                why(reason)
            ),
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

/// How a decider is shown after the approver's name: nothing for a verified identity.
fn how(decider: &Option<Decider>) -> String {
    match decider {
        Some(Decider::GitOps(gitops)) => format!(
            " (claimed via GitOps commit {}, applied by {})",
            gitops.commit, gitops.applied_by.username
        ),
        Some(Decider::Claimed) => " (claimed, not verified)".to_owned(),
        Some(Decider::Policy) => " (ApprovalPolicy)".to_owned(),
        Some(Decider::Voters(voters)) => format!(" ({} verified votes)", voters.len()),
        Some(Decider::Verified(_)) | None => String::new(),
    }
}
