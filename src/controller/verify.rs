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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ApprovalRequestStatus, halted_state};
    use crate::state::pyjson;
    use crate::state::{Approval, Rejection};

    const ALICE: &str =
        r#"{"username":"alice@example.com","uid":"","groups":["agentrun:approvers"]}"#;

    fn cx(creator: Option<&str>) -> DecisionContext<'_> {
        DecisionContext {
            policies_installed: true,
            creator,
            rights: None,
        }
    }

    fn decided(stamp: Option<&str>, approver: &str) -> ApprovalRequest {
        let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
        request.spec.approver_id = Some(approver.into());
        request.metadata.annotations =
            stamp.map(|s| [(annotations::DECIDED_BY.to_owned(), s.to_owned())].into());
        request
    }

    fn refused(result: Result<Decider, Refusal>) -> Refusal {
        result.expect_err("the decision must be refused")
    }

    #[test]
    fn a_stamped_decision_by_the_approver_it_names_is_verified() {
        let rules = DecisionRules::default();
        let request = decided(Some(ALICE), "Alice@Example.com ");
        match verify_decision(&request, cx(Some("carol@example.com")), &rules) {
            Ok(Decider::Verified(identity)) => assert_eq!(identity.username, "alice@example.com"),
            other => panic!("expected a verified decision, got {other:?}"),
        }
    }

    #[test]
    fn decisions_without_a_matching_stamp_are_refused() {
        let rules = DecisionRules::default();
        let why = refused(verify_decision(
            &decided(None, "alice@example.com"),
            cx(None),
            &rules,
        ));
        assert_eq!(why.reason, Reason::UnverifiedDecision);
        assert!(
            why.message.contains("no agentrun.dev/decided-by stamp"),
            "{}",
            why.message
        );
        let why = refused(verify_decision(
            &decided(Some(ALICE), "bob@example.com"),
            cx(None),
            &rules,
        ));
        assert!(
            why.message.contains("is not alice@example.com"),
            "{}",
            why.message
        );
        let why = refused(verify_decision(
            &decided(Some("{forged"), "alice@example.com"),
            cx(None),
            &rules,
        ));
        assert_eq!(why.reason, Reason::UnverifiedDecision);
    }

    #[test]
    fn without_the_policies_nothing_is_verified_unless_the_admin_allows_claims() {
        let mut rules = DecisionRules::default();
        let no_policies = DecisionContext {
            policies_installed: false,
            creator: None,
            rights: None,
        };
        let request = decided(Some(ALICE), "alice@example.com");
        let why = refused(verify_decision(&request, no_policies, &rules));
        assert!(why.message.contains("not installed"), "{}", why.message);
        rules.allow_unverified_decisions = true;
        assert_eq!(
            verify_decision(&request, no_policies, &rules),
            Ok(Decider::Claimed)
        );
    }

    #[test]
    fn gitops_decisions_are_marked_as_such_never_verified() {
        let rules = DecisionRules::default();
        let mut request = decided(
            Some(r#"{"username":"gitops","uid":"","groups":["agentrun:gitops"]}"#),
            "alice@example.com",
        );
        assert!(
            verify_decision(&request, cx(None), &rules).is_err(),
            "no commit"
        );
        request
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(
                annotations::GITOPS_COMMIT.to_owned(),
                " 4b825dc ".to_owned(),
            );
        match verify_decision(&request, cx(None), &rules) {
            Ok(Decider::GitOps(gitops)) => {
                assert_eq!(gitops.commit, "4b825dc");
                assert_eq!(gitops.applied_by.username, "gitops");
            }
            other => panic!("expected a GitOps decision, got {other:?}"),
        }
        // Separation of duties holds for the claimed approver too.
        let why = refused(verify_decision(
            &request,
            cx(Some("ALICE@example.com")),
            &rules,
        ));
        assert_eq!(why.reason, Reason::SeparationOfDuties);
    }

    #[test]
    fn the_creator_cannot_decide_whatever_the_case_unless_the_admin_allows_it() {
        let mut rules = DecisionRules::default();
        let request = decided(Some(ALICE), "alice@example.com");
        let why = refused(verify_decision(
            &request,
            cx(Some(" Alice@example.com")),
            &rules,
        ));
        assert_eq!(why.reason, Reason::SeparationOfDuties);
        rules.allow_self_approval = true;
        assert!(verify_decision(&request, cx(Some("alice@example.com")), &rules).is_ok());
    }

    #[test]
    fn strict_mode_refuses_approvers_who_could_request_runs() {
        let rules = DecisionRules {
            strict_separation_of_duties: true,
            ..Default::default()
        };
        let request = decided(Some(ALICE), "alice@example.com");
        let with = |rights| DecisionContext {
            policies_installed: true,
            creator: None,
            rights,
        };
        assert!(
            refused(verify_decision(&request, with(None), &rules))
                .message
                .contains("could not be checked")
        );
        let impersonates = DeciderRights {
            create_runs: false,
            impersonate_service_accounts: true,
        };
        assert_eq!(
            refused(verify_decision(&request, with(Some(impersonates)), &rules)).reason,
            Reason::SeparationOfDuties
        );
        assert!(verify_decision(&request, with(Some(DeciderRights::default())), &rules).is_ok());
    }

    /// The state of the halt after the controller applied alice's approval, its request recorded.
    fn approved_state() -> (RunState, Vec<ApprovalRequest>) {
        let mut state = halted_state();
        let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        state
            .approve(
                "call_1",
                Approval::new()
                    .approver_id("alice@example.com")
                    .reason("CR-1234")
                    .at(at),
            )
            .unwrap();
        let mut request = decided(Some(ALICE), "alice@example.com");
        request.status = Some(ApprovalRequestStatus {
            phase: Some(ApprovalPhase::Approved),
            decided_at: Some(crate::time::to_k8s(at)),
            ..Default::default()
        });
        (state, vec![request])
    }

    fn copy(state: &RunState, requests: &[ApprovalRequest]) -> Result<(), String> {
        verify_copy(state, "r1", "uid-1", requests, |r| {
            r.status.as_ref().and_then(|s| s.phase) == Some(ApprovalPhase::Approved)
        })
    }

    #[test]
    fn the_controllers_own_copy_verifies() {
        let (state, requests) = approved_state();
        assert_eq!(copy(&state, &requests), Ok(()));
        assert_eq!(
            copy(&halted_state(), &[]),
            Ok(()),
            "a halt before any decision"
        );
    }

    #[test]
    fn an_approval_injected_into_the_state_is_found() {
        let (state, _) = approved_state();
        let why = copy(&state, &[]).unwrap_err();
        assert!(why.contains("no ApprovalRequest"), "{why}");
        let undecided = ApprovalRequest::test_for(&halted_state(), None);
        let why = copy(&state, &[undecided]).unwrap_err();
        assert!(why.contains("was not approved"), "{why}");
    }

    #[test]
    fn arguments_swapped_in_the_conversation_are_found() {
        let (mut state, requests) = approved_state();
        let swapped = state.to_json().replace(r#"\"u-1\""#, r#"\"u-666\""#);
        state = RunState::from_json(&swapped).unwrap();
        let why = copy(&state, &requests).unwrap_err();
        assert!(why.contains("not the ones approved"), "{why}");

        let mut pending = halted_state();
        pending.messages[1] = pyjson::loads(
            &pyjson::dumps(&pending.messages[1])
                .unwrap()
                .replace(r#"\"u-1\""#, r#"\"u-666\""#),
        )
        .unwrap();
        let why = copy(&pending, &[]).unwrap_err();
        assert!(why.contains("pending call call_1"), "{why}");
    }

    #[test]
    fn an_audit_naming_someone_else_or_backdated_is_found() {
        let (state, requests) = approved_state();
        let forged = RunState::from_json(
            &state
                .to_json()
                .replace("alice@example.com", "bob@example.com"),
        )
        .unwrap();
        assert!(
            copy(&forged, &requests)
                .unwrap_err()
                .contains("approval_metadata of call_1")
        );
        let backdated =
            RunState::from_json(&state.to_json().replace("2027-01-15", "2020-01-01")).unwrap();
        assert!(
            copy(&backdated, &requests)
                .unwrap_err()
                .contains("is dated")
        );

        let mut rejected_by_nobody = halted_state();
        rejected_by_nobody
            .reject(
                "call_1",
                Rejection::new()
                    .approver_id("alice@example.com")
                    .reason("no"),
            )
            .unwrap();
        let undecided = ApprovalRequest::test_for(&halted_state(), None);
        let why = copy(&rejected_by_nobody, &[undecided]).unwrap_err();
        assert!(why.contains("who did not decide it"), "{why}");
    }
}
