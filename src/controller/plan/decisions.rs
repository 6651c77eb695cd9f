//! Applying the decisions of a halt: the RunState with each decision's audit fields, the next
//! step, and the resolutions and Events that record them.

use chrono::{DateTime, Utc};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::actions::Planner;
use super::{Announcement, MAX_NOTE, Plan, Step, patch_run, truncate};
use super::{EXPIRED_MESSAGE, SUPERSEDED_MESSAGE};
use crate::controller::assertions;
use crate::controller::decide::{ResolvedDecision, ResolvedKind};
use crate::controller::resolutions::{self, Resolution};
use crate::crd::names::worker_pod_name;
use crate::crd::status_patch::AgentRunStatusPatch;
use crate::crd::stored_state::StoredState;
use crate::crd::{
    AgentRunPhase, ApprovalPhase, ApprovalRequest, ConditionStatus, EventReason, Reason,
};
use crate::state::{Approval, DecisionError, Rejection, RunState};

impl Planner<'_> {
    /// Applies every decision of the halt to the RunState, stores it with the next step, starts
    /// that step's worker, and records and announces the decisions.
    pub(super) fn resume(
        &self,
        plan: &mut Plan,
        mut state: RunState,
        decisions: Vec<ResolvedDecision>,
    ) {
        let run = &self.o.run;
        let step = self.step() + 1;
        let mut decided_times = vec![];
        let mut announcements = vec![];
        // Approvals with an assertion are recorded before the worker Pod exists: the worker
        // reads the assertion from the request before it sends the call.
        let mut asserted = vec![];
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
            let assertion = match (self.issuer, request) {
                (Some(issuer), Some(request)) if phase == ApprovalPhase::Approved => {
                    assertions::issue(issuer, self.o, request).ok()
                }
                _ => None,
            };
            let resolution = Resolution {
                request: decision.request.clone(),
                phase,
                decided_at,
                identity: request.and_then(resolutions::verified_identity_or_claimed),
                assertion,
            };
            // People's decisions are recorded on their requests after the next Pod exists, off
            // the path from decision to Pod (a crash in between is repaired from the request
            // alone, see `resolutions::repairs`); expiries and refusals first, as only this step
            // knows them.
            match phase {
                _ if request.is_some_and(|r| resolution.is_recorded_on(r)) => {}
                _ if resolution.assertion.is_some() => {
                    asserted.push(Step::RecordResolution(resolution))
                }
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
        plan.steps.extend(asserted);
        plan.steps
            .push(self.create_pod(step, 0, false, decided_times));
        plan.after.extend(announcements);
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
