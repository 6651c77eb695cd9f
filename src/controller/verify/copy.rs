//! The RunState's copy of the decisions, checked against the ApprovalRequests.

use std::collections::BTreeSet;

use kube::ResourceExt;

use crate::agent::runner::{call_body, find_call};
use crate::crd::request_decision::{
    DecisionOf, approved_arguments_digest, decision_of, recorded_decision,
};
use crate::crd::{
    ApprovalPhase, ApprovalRequest, Decision, approval_request_name, arguments_digest,
};
use crate::state::RunState;

/// The decision on `request` as recorded, or (not yet recorded) as its decision fields say.
fn decision_on(request: &ApprovalRequest) -> Option<DecisionOf> {
    let recorded = request
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(ApprovalPhase::is_final);
    if recorded {
        recorded_decision(request)
    } else {
        decision_of(&request.spec, &[])
    }
}

/// Checks the RunState's copy of the decisions against the run's ApprovalRequests, and the
/// arguments of its calls against the conversation; the `Err` says what differs.
///
/// `approved` says whether a request's approval counts: it is recorded as Approved, or (not yet
/// recorded) its decision passes [`verify_decision`](super::verify_decision).
pub fn verify_copy(
    state: &RunState,
    run: &str,
    run_uid: &str,
    requests: &[ApprovalRequest],
    approved: impl Fn(&ApprovalRequest) -> bool,
) -> Result<(), String> {
    let request_of = |id: &str| {
        let name = approval_request_name(run, id);
        requests.iter().find(|r| {
            r.name_any() == name && r.spec.tool_call_id == id && r.spec.agent_run_ref.uid == run_uid
        })
    };
    let mut decided = BTreeSet::new();
    for id in &state.approved_tools {
        decided.insert(id.as_str());
        let Some(request) = request_of(id) else {
            return Err(format!(
                "approved_tools names {id}, but no ApprovalRequest of this run exists for it"
            ));
        };
        let decision = decision_on(request).filter(|d| d.decision == Decision::Approved);
        let Some(decision) = decision.filter(|_| approved(request)) else {
            return Err(format!(
                "approved_tools names {id}, but its ApprovalRequest {} was not approved",
                request.name_any()
            ));
        };
        let digest = approved_arguments_digest(&request.spec)?;
        let body = find_call(&state.messages, id).map(|call| call_body(&call));
        match body {
            Some(Ok(body)) if arguments_digest(&body) == digest => {}
            Some(_) => {
                return Err(format!(
                    "the arguments of {id} in the conversation are not the ones approved in {}",
                    request.name_any()
                ));
            }
            None => return Err(format!("the conversation has no tool call {id}")),
        }
        check_metadata(state, id, request, &decision)?;
    }
    for rejected in &state.rejected_tools {
        let id = rejected.tool_call_id.as_str();
        decided.insert(id);
        let Some(request) = request_of(id) else {
            return Err(format!(
                "rejected_tools names {id}, but no ApprovalRequest of this run exists for it"
            ));
        };
        let named = state
            .approval_metadata
            .get(id)
            .is_some_and(|m| m.approver_id.is_some());
        if named {
            match decision_on(request).filter(|d| d.decision == Decision::Rejected) {
                Some(decision) => check_metadata(state, id, request, &decision)?,
                None => {
                    return Err(format!(
                        "approval_metadata names a person for {id}, whose ApprovalRequest {} nobody rejected",
                        request.name_any()
                    ));
                }
            }
        }
    }
    if let Some(id) = state
        .approval_metadata
        .keys()
        .find(|id| !decided.contains(id.as_str()))
    {
        return Err(format!(
            "approval_metadata has an entry for {id}, which was neither approved nor rejected"
        ));
    }
    for call in state.pending_approvals() {
        let id = &call.tool_call_id;
        let body = find_call(&state.messages, id).map(|c| call_body(&c));
        match body {
            Some(Ok(body)) if body == call.arguments_json() => {}
            Some(_) => {
                return Err(format!(
                    "the arguments of the pending call {id} differ from its arguments in the conversation"
                ));
            }
            None => return Err(format!("the conversation has no tool call {id}")),
        }
    }
    Ok(())
}

/// The audit entry of `id` names who made `decision` on `request`, with its reason and time.
fn check_metadata(
    state: &RunState,
    id: &str,
    request: &ApprovalRequest,
    decision: &DecisionOf,
) -> Result<(), String> {
    let Some(entry) = state.approval_metadata.get(id) else {
        return Err(format!(
            "approval_metadata has no entry for the decided call {id}"
        ));
    };
    if entry.approver_id.as_deref() != Some(decision.approver_id.as_str())
        || entry.reason != decision.reason
    {
        return Err(format!(
            "approval_metadata of {id} says {:?} ({:?}), but {} says {:?} ({:?})",
            entry.approver_id,
            entry.reason,
            request.name_any(),
            decision.approver_id,
            decision.reason
        ));
    }
    let recorded = request
        .status
        .as_ref()
        .filter(|s| s.phase.is_some_and(ApprovalPhase::is_final))
        .and_then(|s| s.decided_at.as_ref());
    if let Some(at) = recorded
        && entry.timestamp.timestamp() != at.0.as_second()
    {
        return Err(format!(
            "approval_metadata of {id} is dated {}, but the decision was recorded at {}",
            entry.timestamp, at.0
        ));
    }
    Ok(())
}
