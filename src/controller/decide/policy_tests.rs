//! Unit tests of the decisions that involve ApprovalPolicies: requests made with a policy's
//! requirement, policy decisions, quorums of votes and edited arguments.

use std::sync::Arc;

use super::*;
use crate::agent::runner::{call_body, find_call};
use crate::approval_policy::CompiledPolicy;
use crate::controller::plan::apply_decision;
use crate::controller::verify::Decider;
use crate::crd::keys::annotations;
use crate::crd::{
    Agent, ApprovalPolicy, ApprovalPolicySpec, ApprovalRequestStatus, Approvers, Decision,
    PolicyAction, PolicyDecision, Vote, halted_state,
};

fn policy(yaml: &str) -> Arc<CompiledPolicy> {
    let spec: ApprovalPolicySpec = serde_yaml_ng::from_str(yaml).unwrap();
    Arc::new(CompiledPolicy::compile(&ApprovalPolicy::new("prod", spec)))
}

fn awaiting(requests: &[ApprovalRequest], policies: &[Arc<CompiledPolicy>]) -> Observed {
    let run = AgentRun::test()
        .in_phase(Some(AgentRunPhase::AwaitingApproval))
        .at_step(0)
        .with_pending(1);
    Observed {
        requests: requests.to_vec(),
        state: Some(Ok(halted_state())),
        policies: policies.to_vec(),
        ..Observed::of(run)
    }
}

fn created(observed: &Observed) -> NewRequest {
    match decide(observed, &Policy::default()) {
        Action::RequestApprovals { mut create, .. } => create.remove(0),
        other => panic!("expected RequestApprovals, got {other:?}"),
    }
}

fn resumed(observed: &Observed) -> ResolvedDecision {
    match decide(observed, &Policy::default()) {
        Action::Resume { mut decisions } => decisions.remove(0),
        other => panic!("expected Resume, got {other:?}"),
    }
}

fn stamp(user: &str, groups: &[&str]) -> String {
    serde_json::json!({"username": user, "uid": "", "groups": groups}).to_string()
}

fn vote(decision: Decision, user: &str, groups: &[&str]) -> Vote {
    Vote {
        decision,
        reason: Some(format!("{user} checked")),
        message: (decision == Decision::Rejected).then(|| "No.".to_owned()),
        decided_by: Some(stamp(user, groups)),
    }
}

#[test]
fn requests_carry_the_rule_that_matched() {
    let deny =
        policy("rules: [{name: no-deletes, tools: ['delete_*'], action: Deny, message: Never.}]");
    let new = created(&awaiting(&[], &[deny]));
    let requirement = new.requirement.unwrap();
    assert_eq!(requirement.decision.action, PolicyAction::Deny);
    assert_eq!(requirement.decision.approver_id(), "policy:prod/no-deletes");
    assert_eq!(new.expires_at, None, "a policy decision does not wait");

    let quorum = policy(
        "rules: [{name: two, tools: [delete_user], when: \"args.user_id == 'u-1'\", action: Require, requiredApprovals: 2, approvers: {groups: [sre]}}]",
    );
    let requirement = created(&awaiting(&[], &[quorum])).requirement.unwrap();
    assert_eq!(requirement.required_approvals, Some(2));
    assert_eq!(requirement.approvers.unwrap().groups, vec!["sre"]);

    let unmatched =
        policy("rules: [{name: other, tools: [delete_user], when: 'false', action: Deny}]");
    assert_eq!(
        created(&awaiting(&[], std::slice::from_ref(&unmatched))).requirement,
        None,
        "no rule matched and the Agent requires approval: a person decides"
    );
    let mut observed = awaiting(&[], &[unmatched]);
    let mut agent = Agent::test();
    agent.spec.tools[0].requires_approval = false;
    observed.agent = Some(Arc::new(agent));
    let requirement = created(&observed).requirement.unwrap();
    assert_eq!(requirement.decision.approver_id(), "policy:none");
    assert_eq!(requirement.decision.action, PolicyAction::Allow);
}

#[test]
fn a_policy_decision_resumes_at_once_and_names_the_rule() {
    let mut request = ApprovalRequest::test_for(&halted_state(), None);
    request.spec.policy = Some(PolicyDecision {
        name: Some("prod".into()),
        rule: Some("no-deletes".into()),
        action: PolicyAction::Deny,
        message: Some("Never.".into()),
        note: None,
    });
    let decision = resumed(&awaiting(&[request.clone()], &[]));
    assert_eq!(decision.decider, Some(Decider::Policy));
    assert_eq!(
        decision.kind,
        ResolvedKind::Rejected {
            approver_id: Some("policy:prod/no-deletes".into()),
            reason: Some("denied by rule no-deletes of ApprovalPolicy prod".into()),
            message: Some("Never.".into()),
        }
    );
    let mut state = halted_state();
    apply_decision(&mut state, &decision).unwrap();
    assert_eq!(
        state.rejection("call_1").unwrap().message.as_deref(),
        Some("Never.")
    );
    assert_eq!(
        state.approval_metadata["call_1"].approver_id.as_deref(),
        Some("policy:prod/no-deletes")
    );

    request.spec.policy.as_mut().unwrap().action = PolicyAction::Allow;
    let decision = resumed(&awaiting(&[request], &[]));
    assert!(
        matches!(decision.kind, ResolvedKind::Approved { .. }),
        "{decision:?}"
    );
}

fn created_by_carol(run: &AgentRun) -> AgentRun {
    let mut run = run.clone();
    run.metadata
        .annotations
        .get_or_insert_default()
        .insert(annotations::CREATED_BY.into(), "carol".into());
    run
}

fn quorum_request(votes: Vec<(&str, Vote)>) -> ApprovalRequest {
    let mut request = ApprovalRequest::test_for(&halted_state(), None);
    request.spec.policy = Some(PolicyDecision {
        name: Some("prod".into()),
        rule: Some("two".into()),
        action: PolicyAction::Require,
        ..Default::default()
    });
    request.spec.required_approvals = Some(2);
    request.spec.approvers = Some(Approvers {
        groups: vec!["sre".into()],
        users: vec![],
    });
    request.spec.votes = votes.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    request
}

#[test]
fn a_quorum_needs_distinct_permitted_stamped_approvals_and_any_rejection_rejects() {
    let one = quorum_request(vec![("alice", vote(Decision::Approved, "alice", &["sre"]))]);
    assert_eq!(
        decide(&awaiting(&[one], &[]), &Policy::default()),
        Action::Wait
    );

    let two = quorum_request(vec![
        ("alice", vote(Decision::Approved, "alice", &["sre"])),
        ("bob", vote(Decision::Approved, "bob", &["sre"])),
    ]);
    let decision = resumed(&awaiting(&[two], &[]));
    let Some(Decider::Voters(voters)) = &decision.decider else {
        panic!("{decision:?}")
    };
    assert_eq!(voters.len(), 2);
    assert_eq!(
        decision.kind,
        ResolvedKind::Approved {
            approver_id: Some("alice, bob".into()),
            reason: Some("alice: alice checked; bob: bob checked".into()),
            edited_arguments: None,
        }
    );

    // A vote stamped for someone else, by someone outside the approvers, or by the run's
    // creator does not count: the request keeps waiting and says why.
    for (key, forged) in [
        ("bob", vote(Decision::Approved, "mallory", &["sre"])),
        ("dave", vote(Decision::Approved, "dave", &["dev"])),
        ("carol", vote(Decision::Approved, "carol", &["sre"])),
        (
            "bob",
            Vote {
                decided_by: None,
                ..vote(Decision::Approved, "bob", &["sre"])
            },
        ),
    ] {
        let request = quorum_request(vec![
            ("alice", vote(Decision::Approved, "alice", &["sre"])),
            (key, forged),
        ]);
        let mut observed = awaiting(&[request], &[]);
        observed.run = created_by_carol(&observed.run);
        match decide(&observed, &Policy::default()) {
            Action::Record {
                resolved, refused, ..
            } => {
                assert!(resolved.is_empty());
                assert!(
                    refused[0].1.message.contains(&format!("the vote of {key}")),
                    "{refused:?}"
                );
            }
            other => panic!("{key}: expected the vote refused, got {other:?}"),
        }
    }

    let rejected = quorum_request(vec![
        ("alice", vote(Decision::Approved, "alice", &["sre"])),
        ("bob", vote(Decision::Rejected, "bob", &["sre"])),
    ]);
    let decision = resumed(&awaiting(&[rejected], &[]));
    assert_eq!(
        decision.kind,
        ResolvedKind::Rejected {
            approver_id: Some("bob".into()),
            reason: Some("bob checked".into()),
            message: Some("No.".into()),
        }
    );
}

fn edited(arguments: &str) -> ApprovalRequest {
    let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
    request.spec.edited_arguments = Some(arguments.into());
    request
}

#[test]
fn an_edit_fits_the_schema_and_passes_the_policies_again_or_the_call_does_not_run() {
    let decision = resumed(&awaiting(&[edited(r#"{"user_id":"u-2"}"#)], &[]));
    let ResolvedKind::Approved {
        edited_arguments, ..
    } = &decision.kind
    else {
        panic!("{decision:?}")
    };
    assert_eq!(edited_arguments.as_deref(), Some(r#"{"user_id": "u-2"}"#));
    let mut state = halted_state();
    apply_decision(&mut state, &decision).unwrap();
    let call = find_call(&state.messages, "call_1").unwrap();
    assert_eq!(
        call_body(&call).unwrap(),
        r#"{"user_id": "u-2"}"#,
        "the history shows the edit"
    );
    assert!(state.is_approved("call_1"));
    assert!(state.pending_approvals().is_empty());

    let superseded = |request: ApprovalRequest, policies: &[Arc<CompiledPolicy>]| match resumed(
        &awaiting(&[request], policies),
    )
    .kind
    {
        ResolvedKind::Superseded { why } => why,
        other => panic!("expected Superseded, got {other:?}"),
    };
    let mut agent_with_schema = awaiting(&[], &[]);
    let mut agent = Agent::test();
    agent.spec.tools[0].parameters = Some(serde_json::json!({
        "type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"],
        "additionalProperties": false
    }));
    let mut request = edited(r#"{"user_id": 7}"#);
    request.spec.tool_definition_digest = Some(agent.spec.tools[0].definition_digest());
    agent_with_schema.agent = Some(Arc::new(agent));
    agent_with_schema.requests = vec![request];
    match resumed(&agent_with_schema).kind {
        ResolvedKind::Superseded { why } => assert!(why.contains("do not fit the schema"), "{why}"),
        other => panic!("{other:?}"),
    }
    let why = superseded(edited("[1]"), &[]);
    assert!(why.contains("not a JSON object"), "{why}");

    let deny = policy(
        "rules: [{name: no-admin, tools: [delete_user], when: \"args.user_id == 'admin'\", action: Deny, message: Never.}]",
    );
    let why = superseded(edited(r#"{"user_id": "admin"}"#), &[deny]);
    assert!(
        why.contains("policy:prod/no-admin denies them (Never.)"),
        "{why}"
    );
    let quorum = policy(
        "rules: [{name: vip, tools: [delete_user], when: \"args.user_id == 'vip'\", action: Require, requiredApprovals: 2}]",
    );
    let why = superseded(edited(r#"{"user_id": "vip"}"#), &[quorum]);
    assert!(why.contains("requires 2 approvals"), "{why}");
    let others = policy(
        "rules: [{name: hr, tools: [delete_user], action: Require, approvers: {groups: [hr]}}]",
    );
    let why = superseded(edited(r#"{"user_id": "u-3"}"#), &[others]);
    assert!(why.contains("allows other approvers"), "{why}");
}

#[test]
fn the_recorded_edit_is_what_the_copy_must_show() {
    let mut request = edited(r#"{"user_id":"u-2"}"#);
    let decision = resumed(&awaiting(&[request.clone()], &[]));
    let mut state = halted_state();
    apply_decision(&mut state, &decision).unwrap();
    request.status = Some(ApprovalRequestStatus {
        phase: Some(crate::crd::ApprovalPhase::Approved),
        decided_at: Some(crate::time::to_k8s(decision.decided_at)),
        edited_arguments_digest: Some(crate::crd::arguments_digest(r#"{"user_id": "u-2"}"#)),
        ..Default::default()
    });
    let copy = |state: &RunState| {
        crate::controller::verify::verify_copy(
            state,
            "r1",
            "uid-1",
            std::slice::from_ref(&request),
            |_| true,
        )
    };
    assert_eq!(copy(&state), Ok(()));
    let mut original = halted_state();
    original
        .approve(
            "call_1",
            crate::state::Approval::new()
                .approver_id("alice@example.com")
                .reason("CR-1234")
                .at(decision.decided_at),
        )
        .unwrap();
    let why = copy(&original).unwrap_err();
    assert!(why.contains("not the ones approved"), "{why}");
}
