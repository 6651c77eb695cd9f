use std::collections::BTreeMap;

use super::*;
use crate::crd::{ApprovalPhase, Decision};
use crate::crd::{ApprovalRequestStatus, halted_state};
use crate::state::RunState;
use crate::state::pyjson;
use crate::state::{Approval, Rejection};

static NO_RIGHTS: BTreeMap<String, DeciderRights> = BTreeMap::new();

const ALICE: &str = r#"{"username":"alice@example.com","uid":"","groups":["agentrun:approvers"]}"#;

fn cx(creator: Option<&str>) -> DecisionContext<'_> {
    DecisionContext {
        policies_installed: true,
        creator,
        rights: &NO_RIGHTS,
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
        rights: &NO_RIGHTS,
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
    let rights_of = |rights: Option<DeciderRights>| -> BTreeMap<String, DeciderRights> {
        rights
            .map(|r| [("alice@example.com".to_owned(), r)].into())
            .unwrap_or_default()
    };
    let (none, impersonating, plain) = (
        rights_of(None),
        rights_of(Some(DeciderRights {
            create_runs: false,
            impersonate_service_accounts: true,
        })),
        rights_of(Some(DeciderRights::default())),
    );
    let with = |rights| DecisionContext {
        policies_installed: true,
        creator: None,
        rights,
    };
    assert!(
        refused(verify_decision(&request, with(&none), &rules))
            .message
            .contains("could not be checked")
    );
    assert_eq!(
        refused(verify_decision(&request, with(&impersonating), &rules)).reason,
        Reason::SeparationOfDuties
    );
    assert!(verify_decision(&request, with(&plain), &rules).is_ok());
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
    assert!(why.contains("nobody rejected"), "{why}");
}
