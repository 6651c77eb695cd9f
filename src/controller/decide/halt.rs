//! The decisions on a halt: where each pending call stands (resolved, its decision refused, still
//! waiting), from its ApprovalRequest; when every call is resolved, the run resumes.

use chrono::{DateTime, Utc};
use kube::ResourceExt;

use super::{
    Action, Policy, ResolvedDecision, ResolvedKind, awaiting_requests, decision_context, edits,
    expires_at, recheck_at, tampered, verify_copy,
};
use crate::controller::observe::Observed;
use crate::controller::verify::{self, Decider, Refusal};
use crate::crd::request_decision::{DecisionOf, decision_of, edited_arguments, recorded_decision};
use crate::crd::{ApprovalPhase, ApprovalRequest, Decision, Reason, approval_request_name};
use crate::state::{DeferredToolCall, RunState};
use crate::time::from_k8s;
use std::time::Duration;

/// Where one pending call of a halt stands.
enum CallOutcome {
    Resolved(ResolvedDecision),
    Refused(String, Refusal),
    /// Waiting for a person (until it expires, if it does).
    Waiting(Option<DateTime<Utc>>),
    /// This replica recorded its resolution but the cache does not show it yet.
    Lagging,
}

pub(super) fn awaiting(observed: &Observed, state: &RunState, policy: &Policy) -> Action {
    let pending = state.pending_approvals();
    if pending.is_empty() {
        // Decisions were applied but the next step was not recorded: nothing to wait for.
        return Action::Fail {
            reason: Reason::InvalidRunState,
            message: "the run awaits approval but its RunState has no pending tool call".into(),
        };
    }
    if let Err(why) = verify_copy(observed, state, policy) {
        return tampered(why);
    }
    let run_name = observed.run.name_any();
    let mut outcomes = Vec::with_capacity(pending.len());
    for call in &pending {
        let name = approval_request_name(&run_name, &call.tool_call_id);
        let Some(request) = observed.requests.iter().find(|r| r.name_any() == name) else {
            return awaiting_requests(observed, state);
        };
        outcomes.push(resolve(observed, request, call, policy));
    }
    if outcomes
        .iter()
        .all(|o| matches!(o, CallOutcome::Resolved(_)))
    {
        let decisions = outcomes
            .into_iter()
            .filter_map(|o| match o {
                CallOutcome::Resolved(d) => Some(d),
                _ => None,
            })
            .collect();
        return Action::Resume { decisions };
    }
    let mut resolved = vec![];
    let mut refused = vec![];
    let mut next_expiry: Option<DateTime<Utc>> = None;
    let mut lagging = false;
    for outcome in outcomes {
        match outcome {
            CallOutcome::Resolved(d) if d.new => resolved.push(d),
            CallOutcome::Resolved(_) => {}
            CallOutcome::Refused(request, refusal) => refused.push((request, refusal)),
            CallOutcome::Waiting(Some(at)) => {
                next_expiry = Some(next_expiry.map_or(at, |n| n.min(at)));
            }
            CallOutcome::Waiting(None) => {}
            CallOutcome::Lagging => lagging = true,
        }
    }
    let recheck = match recheck_at(next_expiry, observed.now, policy) {
        Action::Recheck(after) => Some(after),
        _ => None,
    };
    if !resolved.is_empty() || !refused.is_empty() {
        return Action::Record {
            resolved,
            refused,
            recheck,
        };
    }
    if lagging {
        return Action::Recheck(Duration::from_millis(500));
    }
    recheck_at(next_expiry, observed.now, policy)
}

/// Where the call `call` of the halt stands, from its request.
fn resolve(
    observed: &Observed,
    request: &ApprovalRequest,
    call: &DeferredToolCall,
    policy: &Policy,
) -> CallOutcome {
    let name = request.name_any();
    let status = request.status.clone().unwrap_or_default();
    let resolved = |kind, decided_at, decider, new| {
        CallOutcome::Resolved(ResolvedDecision {
            request: name.clone(),
            tool_call_id: call.tool_call_id.clone(),
            kind,
            decided_at,
            decider,
            new,
        })
    };
    if let Some(phase) = status.phase.filter(|p| p.is_final()) {
        // Recorded by an earlier reconcile: applied as recorded.
        let decided_at = status.decided_at.as_ref().map_or(observed.now, from_k8s);
        let decider = recorded_decider(request);
        let kind = match (phase, recorded_decision(request)) {
            (ApprovalPhase::Approved, Some(d)) if d.decision == Decision::Approved => {
                match edited_arguments(&request.spec) {
                    Ok(edited) => kind_of(d, edited),
                    Err(why) => ResolvedKind::Superseded { why },
                }
            }
            (ApprovalPhase::Rejected, Some(d)) if d.decision == Decision::Rejected => {
                kind_of(d, None)
            }
            (ApprovalPhase::Expired, _) => ResolvedKind::Expired,
            (ApprovalPhase::Superseded, _) => ResolvedKind::Superseded {
                why: superseded(observed, request, call)
                    .unwrap_or_else(|| "the request no longer matched the call".to_owned()),
            },
            (phase, _) => ResolvedKind::Superseded {
                why: format!(
                    "the request is recorded {phase}, but its decision fields do not say so"
                ),
            },
        };
        return resolved(kind, decided_at, decider, false);
    }
    if observed.recorded.contains(&name) {
        return CallOutcome::Lagging;
    }
    if let Some(why) = superseded(observed, request, call) {
        return resolved(ResolvedKind::Superseded { why }, observed.now, None, true);
    }
    if let Some(decision) = request.spec.policy_decision() {
        // Decided by a policy when the request was made: no person, nothing to wait for.
        let kind = decision_of(&request.spec, &[]).map_or_else(
            || ResolvedKind::Superseded {
                why: format!(
                    "the policy decision {:?} cannot be applied",
                    decision.action
                ),
            },
            |d| kind_of(d, None),
        );
        return resolved(kind, observed.now, Some(Decider::Policy), true);
    }
    let expiry = expires_at(request);
    if expiry.is_some_and(|at| at <= observed.now) {
        return resolved(ResolvedKind::Expired, observed.now, None, true);
    }
    let cx = decision_context(observed);
    if request.spec.is_quorum() {
        let tally = verify::tally(request, cx, &policy.decisions);
        return match tally.outcome {
            Some((_, voters)) => {
                let names: Vec<String> = voters.iter().map(|v| v.username.clone()).collect();
                match decision_of(&request.spec, &names) {
                    Some(d) => resolved(
                        kind_of(d, None),
                        observed.now,
                        Some(Decider::Voters(voters)),
                        true,
                    ),
                    None => CallOutcome::Waiting(expiry),
                }
            }
            None if tally.refused.is_empty() => CallOutcome::Waiting(expiry),
            None => CallOutcome::Refused(name, combined(tally.refused)),
        };
    }
    let Some(decision) = request.spec.decision else {
        return CallOutcome::Waiting(expiry);
    };
    match verify::verify_decision(request, cx, &policy.decisions) {
        Ok(decider) => {
            let Some(d) = decision_of(&request.spec, &[]) else {
                return CallOutcome::Waiting(expiry);
            };
            let kind = match decision {
                Decision::Approved if request.spec.edited_arguments.is_some() => {
                    edits::check(observed, request, &decider, d)
                }
                _ => kind_of(d, None),
            };
            resolved(kind, observed.now, Some(decider), true)
        }
        Err(refusal) => CallOutcome::Refused(name, refusal),
    }
}

/// The resolution a decision makes (`edited`: the approved call's edited arguments).
pub(super) fn kind_of(decision: DecisionOf, edited: Option<String>) -> ResolvedKind {
    match decision.decision {
        Decision::Approved => ResolvedKind::Approved {
            approver_id: Some(decision.approver_id),
            reason: decision.reason,
            edited_arguments: edited,
        },
        Decision::Rejected => ResolvedKind::Rejected {
            approver_id: Some(decision.approver_id),
            reason: decision.reason,
            message: decision.message,
        },
    }
}

/// Who decided a request, as its status recorded it.
fn recorded_decider(request: &ApprovalRequest) -> Option<Decider> {
    let status = request.status.as_ref()?;
    if let Some(identity) = &status.verified_identity {
        return Some(Decider::Verified(identity.clone()));
    }
    if let Some(gitops) = &status.gitops {
        return Some(Decider::GitOps(gitops.clone()));
    }
    if !status.voters.is_empty() {
        return Some(Decider::Voters(status.voters.clone()));
    }
    request.spec.policy_decision().map(|_| Decider::Policy)
}

/// The refusals of several votes as one.
fn combined(refused: Vec<(String, Refusal)>) -> Refusal {
    let reason = refused[0].1.reason;
    let message = refused
        .iter()
        .map(|(voter, r)| format!("the vote of {voter} does not count: {}", r.message))
        .collect::<Vec<_>>()
        .join("; ");
    Refusal { reason, message }
}

/// Why `request` no longer matches the pending `call` of the observed run, if it does not: a
/// decision on it must not be applied.
fn superseded(
    observed: &Observed,
    request: &ApprovalRequest,
    call: &DeferredToolCall,
) -> Option<String> {
    let spec = &request.spec;
    let uid = observed.run.uid().unwrap_or_default();
    let step = observed
        .run
        .status
        .as_ref()
        .and_then(|s| s.step)
        .unwrap_or(0);
    let expected_digest = crate::crd::arguments_digest(&call.arguments_json());
    if spec.agent_run_ref.uid != uid {
        Some(format!(
            "it names run uid {} but the run is {uid}",
            spec.agent_run_ref.uid
        ))
    } else if spec.step != step {
        Some(format!(
            "it was made at step {} but the run is at step {step}",
            spec.step
        ))
    } else if spec.tool_call_id != call.tool_call_id || spec.tool_name != call.tool_name {
        Some("its toolCallId or toolName does not match the pending call".to_owned())
    } else if spec.arguments_digest != expected_digest || !spec.digest_matches() {
        Some(
            "its argumentsDigest does not match the call's arguments in the run's state".to_owned(),
        )
    } else if spec.tool_definition_digest.is_some()
        && spec.tool_definition_digest != observed.tool_definition_digest(&call.tool_name)
    {
        Some(
            "its toolDefinitionDigest does not match the tool in the Agent the run is bound to"
                .to_owned(),
        )
    } else {
        None
    }
}
