//! What the controller checks before it trusts anything it did not write itself (see
//! `docs/security.md`), pure:
//!
//! - a decision counts only when the API server stamped the identity that set it and that
//!   identity is the approver the decision names (or a GitOps identity applied it, which is
//!   recorded as such), and the approver is not the run's creator;
//! - the RunState's copy of the decisions (`approved_tools`, `rejected_tools`,
//!   `approval_metadata`) matches the ApprovalRequests, and the calls' arguments in the
//!   conversation are the ones the requests show.

use std::collections::BTreeSet;

use kube::ResourceExt;

use crate::agent::runner::{call_body, find_call};
use crate::crd::keys::annotations;
use crate::crd::policy::{DecidedBy, GITOPS_GROUP};
use crate::crd::{
    ApprovalPhase, ApprovalRequest, Decision, GitOpsDecision, Reason, VerifiedIdentity,
    approval_request_name, arguments_digest,
};
use crate::state::RunState;

/// The admin's rules for decisions (controller flags; never an Agent's or a run's field).
#[derive(Clone, Debug)]
pub struct DecisionRules {
    /// Let a run's creator decide its own requests.
    pub allow_self_approval: bool,
    /// Apply decisions without an API-server stamp (clusters without the admission policies):
    /// the approverId is then recorded as claimed, never as verified.
    pub allow_unverified_decisions: bool,
    /// Refuse decisions of approvers who may create runs or impersonate ServiceAccounts in the
    /// run's namespace (and so could approve runs they requested under another name).
    pub strict_separation_of_duties: bool,
    /// The group whose members may apply decisions claimed for someone else (with a commit).
    pub gitops_group: String,
}

impl Default for DecisionRules {
    fn default() -> Self {
        DecisionRules {
            allow_self_approval: false,
            allow_unverified_decisions: false,
            strict_separation_of_duties: false,
            gitops_group: GITOPS_GROUP.to_owned(),
        }
    }
}

/// An identity as compared: surrounding whitespace trimmed, lowercase.
pub fn normalize(identity: &str) -> String {
    identity.trim().to_lowercase()
}

/// Who decided, as far as the controller can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decider {
    /// The API server stamped this identity, which is the approverId.
    Verified(VerifiedIdentity),
    /// A GitOps identity applied a decision claimed for the approverId.
    GitOps(GitOpsDecision),
    /// Nothing verified it (allowed only by `allow_unverified_decisions`).
    Claimed,
}

/// What a decider may do in the run's namespace (strict separation of duties).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeciderRights {
    /// May create AgentRuns.
    pub create_runs: bool,
    /// May impersonate ServiceAccounts.
    pub impersonate_service_accounts: bool,
}

/// What the decision check needs besides the request.
#[derive(Clone, Copy, Debug)]
pub struct DecisionContext<'a> {
    /// The admission policies that stamp and check decisions are installed.
    pub policies_installed: bool,
    /// The run's creator (its stamped `created-by`).
    pub creator: Option<&'a str>,
    /// The decider's rights, when strict separation of duties asked for them.
    pub rights: Option<DeciderRights>,
}

/// A decision that is not applied, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `UnverifiedDecision` or `SeparationOfDuties`.
    pub reason: Reason,
    /// What was wrong, for people.
    pub message: String,
}

impl Refusal {
    fn unverified(message: impl Into<String>) -> Refusal {
        Refusal {
            reason: Reason::UnverifiedDecision,
            message: message.into(),
        }
    }

    fn separation(message: impl Into<String>) -> Refusal {
        Refusal {
            reason: Reason::SeparationOfDuties,
            message: message.into(),
        }
    }
}

/// Checks who made the decision on `request` (which must have one).
pub fn verify_decision(
    request: &ApprovalRequest,
    cx: DecisionContext<'_>,
    rules: &DecisionRules,
) -> Result<Decider, Refusal> {
    let approver = request.spec.approver_id.as_deref().unwrap_or_default();
    if approver.trim().is_empty() {
        return Err(Refusal::unverified("the decision names no approverId"));
    }
    let decider = if cx.policies_installed {
        stamped_decider(request, approver, rules)?
    } else if rules.allow_unverified_decisions {
        // Without the policies a stamp can be written by anyone: it is not evidence.
        Decider::Claimed
    } else {
        return Err(Refusal::unverified(
            "the admission policies that stamp who decided are not installed, so no decision can be verified",
        ));
    };
    if !rules.allow_self_approval
        && let Some(creator) = cx.creator
    {
        let creator = normalize(creator);
        let deciders = [Some(approver), stamped_username(&decider)];
        if deciders
            .into_iter()
            .flatten()
            .any(|d| normalize(d) == creator)
        {
            return Err(Refusal::separation(format!(
                "{creator} created this run and cannot decide its own requests"
            )));
        }
    }
    if rules.strict_separation_of_duties {
        let who = stamped_username(&decider).unwrap_or(approver);
        match cx.rights {
            None => {
                return Err(Refusal::separation(format!(
                    "the rights of {who} in this namespace could not be checked"
                )));
            }
            Some(rights) if rights.create_runs || rights.impersonate_service_accounts => {
                return Err(Refusal::separation(format!(
                    "{who} may create AgentRuns or impersonate ServiceAccounts in this namespace, so could have requested this run under another name (strict separation of duties)"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(decider)
}

/// The decider the admission policy's stamp shows.
fn stamped_decider(
    request: &ApprovalRequest,
    approver: &str,
    rules: &DecisionRules,
) -> Result<Decider, Refusal> {
    let Some(text) = request.annotations().get(annotations::DECIDED_BY) else {
        if rules.allow_unverified_decisions {
            return Ok(Decider::Claimed);
        }
        return Err(Refusal::unverified(format!(
            "the decision carries no {} stamp of who set it",
            annotations::DECIDED_BY
        )));
    };
    let stamp = DecidedBy::parse(text).map_err(|e| Refusal::unverified(e.to_string()))?;
    if normalize(&stamp.username) == normalize(approver) {
        return Ok(Decider::Verified(stamp.to_verified_identity()));
    }
    let commit = request
        .annotations()
        .get(annotations::GITOPS_COMMIT)
        .map(|c| c.trim().to_owned())
        .unwrap_or_default();
    if stamp.groups.contains(&rules.gitops_group) && !commit.is_empty() {
        return Ok(Decider::GitOps(GitOpsDecision {
            commit,
            applied_by: stamp.to_verified_identity(),
        }));
    }
    Err(Refusal::unverified(format!(
        "approverId {approver} is not {}, who set the decision",
        stamp.username
    )))
}

fn stamped_username(decider: &Decider) -> Option<&str> {
    match decider {
        Decider::Verified(identity) => Some(&identity.username),
        Decider::GitOps(gitops) => Some(&gitops.applied_by.username),
        Decider::Claimed => None,
    }
}

/// Checks the RunState's copy of the decisions against the run's ApprovalRequests, and the
/// arguments of its calls against the conversation; the `Err` says what differs.
///
/// `approved` says whether a request's approval counts: it is recorded as Approved, or (not yet
/// recorded) its decision passes [`verify_decision`].
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
        if request.spec.decision != Some(Decision::Approved) || !approved(request) {
            return Err(format!(
                "approved_tools names {id}, but its ApprovalRequest {} was not approved",
                request.name_any()
            ));
        }
        let body = find_call(&state.messages, id).map(|call| call_body(&call));
        match body {
            Some(Ok(body)) if arguments_digest(&body) == request.spec.arguments_digest => {}
            Some(_) => {
                return Err(format!(
                    "the arguments of {id} in the conversation are not the ones approved in {}",
                    request.name_any()
                ));
            }
            None => return Err(format!("the conversation has no tool call {id}")),
        }
        check_metadata(state, id, request, Decision::Approved)?;
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
            check_metadata(state, id, request, Decision::Rejected)?;
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

/// The audit entry of `id` names the person who made `decision` on `request`, with its reason
/// and time.
fn check_metadata(
    state: &RunState,
    id: &str,
    request: &ApprovalRequest,
    decision: Decision,
) -> Result<(), String> {
    let Some(entry) = state.approval_metadata.get(id) else {
        return Err(format!(
            "approval_metadata has no entry for the decided call {id}"
        ));
    };
    let spec = &request.spec;
    if spec.decision != Some(decision) {
        return Err(format!(
            "approval_metadata names {} for {id}, who did not decide it",
            entry.approver_id.as_deref().unwrap_or("nobody")
        ));
    }
    if entry.approver_id != spec.approver_id || entry.reason != spec.reason {
        return Err(format!(
            "approval_metadata of {id} says {:?} ({:?}), but {} says {:?} ({:?})",
            entry.approver_id,
            entry.reason,
            request.name_any(),
            spec.approver_id,
            spec.reason
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
