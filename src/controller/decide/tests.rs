//! Unit tests of the decision step, from plain fixtures.

use super::*;
use crate::crd::{Decision, halted_state};
use crate::state::Approval;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStatus, Pod, PodStatus,
};
use kube::api::ObjectMeta;

fn run(phase: Option<AgentRunPhase>, step: u32, retries: u32) -> AgentRun {
    AgentRun::test()
        .in_phase(phase)
        .at_step(step)
        .with_retries(retries)
}

fn pod(name: &str, phase: &str, exit: Option<(i32, &str)>) -> CachedPod {
    CachedPod::from(Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: exit.map(|(code, message)| {
                vec![ContainerStatus {
                    name: "worker".into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: code,
                            message: Some(message.into()),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn request(state: &RunState, decision: Option<Decision>) -> ApprovalRequest {
    ApprovalRequest::test_for(state, decision)
}

fn observe(
    run: &AgentRun,
    pods: &[CachedPod],
    requests: &[ApprovalRequest],
    state: Option<Result<&RunState, String>>,
) -> Observed {
    Observed {
        pods: pods.to_vec(),
        requests: requests.to_vec(),
        state: state.map(|s| s.cloned()),
        ..Observed::of(run.clone())
    }
}

#[test]
fn a_new_run_starts_step_zero() {
    let mut r = run(None, 0, 0);
    r.status = None;
    let action = decide(&observe(&r, &[], &[], None), &Policy::default());
    assert_eq!(
        action,
        Action::StartStep {
            step: 0,
            attempt: 0
        }
    );
}

#[test]
fn a_missing_agent_is_reported_not_failed() {
    let r = run(None, 0, 0);
    let mut o = observe(&r, &[], &[], None);
    o.agent = None;
    assert_eq!(decide(&o, &Policy::default()), Action::AgentMissing);
}

#[test]
fn terminal_runs_are_left_alone() {
    for phase in [
        AgentRunPhase::Succeeded,
        AgentRunPhase::Failed,
        AgentRunPhase::Cancelled,
    ] {
        let r = run(Some(phase), 1, 0);
        assert_eq!(
            decide(&observe(&r, &[], &[], None), &Policy::default()),
            Action::Wait
        );
    }
}

#[test]
fn a_running_step_without_its_pod_recreates_it_with_the_same_name() {
    let r = run(Some(AgentRunPhase::Running), 2, 0);
    let other = [pod("r1-step-1", "Succeeded", None)];
    assert_eq!(
        decide(&observe(&r, &other, &[], None), &Policy::default()),
        Action::CreatePod {
            step: 2,
            attempt: 0
        }
    );
    let running = [pod("r1-step-2", "Running", None)];
    assert_eq!(
        decide(&observe(&r, &running, &[], None), &Policy::default()),
        Action::Wait
    );
}

#[test]
fn a_pod_this_replica_just_created_is_not_created_again_before_the_watch_shows_it() {
    let r = run(Some(AgentRunPhase::Running), 2, 0);
    let observed = Observed {
        created_unseen: ["r1-step-2".to_owned()].into(),
        ..observe(&r, &[], &[], None)
    };
    assert_eq!(
        decide(&observed, &Policy::default()),
        Action::Recheck(crate::controller::memory::CREATED_POD_UNSEEN_FOR)
    );
    let earlier_attempt = Observed {
        created_unseen: ["r1-step-1".to_owned()].into(),
        ..observe(&r, &[], &[], None)
    };
    assert_eq!(
        decide(&earlier_attempt, &Policy::default()),
        Action::CreatePod {
            step: 2,
            attempt: 0
        }
    );
}

#[test]
fn a_failed_worker_is_retried_after_backoff_then_fails_the_run() {
    let r = run(Some(AgentRunPhase::Running), 0, 0);
    let failed = [pod(
        "r1-step-0",
        "Failed",
        Some((1, "model endpoint unreachable")),
    )];
    let policy = Policy {
        retry_backoff: Duration::ZERO,
        ..Policy::default()
    };
    assert_eq!(
        decide(&observe(&r, &failed, &[], None), &policy),
        Action::StartStep {
            step: 0,
            attempt: 1
        }
    );
    let r = run(Some(AgentRunPhase::Running), 0, 3);
    let failed = [pod(
        "r1-step-0-r3",
        "Failed",
        Some((1, "model endpoint unreachable")),
    )];
    match decide(&observe(&r, &failed, &[], None), &policy) {
        Action::Fail { reason, message } => {
            assert_eq!(reason, Reason::WorkerFailed);
            assert!(message.contains("model endpoint unreachable"), "{message}");
        }
        other => panic!("expected Fail, got {other:?}"),
    }
}

#[test]
fn a_waiting_run_reads_its_state_only_when_a_decision_can_be_applied() {
    let halted = halted_state();
    let mut r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    r.status.as_mut().unwrap().pending_approvals = Some(1);
    let now = Utc::now();
    // No request yet: the state says which to create.
    assert!(needs_state(&r, &[], &[], now));
    // An undecided request: nothing to do, no read.
    let open = [request(&halted, None)];
    assert!(!needs_state(&r, &[], &open, now));
    assert_eq!(
        decide(&observe(&r, &[], &open, None), &Policy::default()),
        Action::Wait
    );
    // A decision arrived: read it.
    let decided = [request(&halted, Some(Decision::Approved))];
    assert!(needs_state(&r, &[], &decided, now));
    // An expiry ahead: look again then, without reading; once due, read.
    let mut expiring = request(&halted, None);
    expiring.status.as_mut().unwrap().expires_at =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(
                (now + chrono::Duration::seconds(60)).timestamp(),
            )
            .unwrap(),
        ));
    let expiring = [expiring];
    assert!(!needs_state(&r, &[], &expiring, now));
    assert!(matches!(
        decide(&observe(&r, &[], &expiring, None), &Policy::default()),
        Action::Recheck(d) if d > Duration::from_secs(50)
    ));
    assert!(needs_state(
        &r,
        &[],
        &expiring,
        now + chrono::Duration::seconds(61)
    ));
    // A request of another run, another step or with a forged digest: read and supersede.
    let mut other_uid = request(&halted, None);
    other_uid.spec.agent_run_ref.uid = "uid-2".into();
    assert!(needs_state(&r, &[], &[other_uid], now));
    let mut other_step = request(&halted, None);
    other_step.spec.step = 3;
    assert!(needs_state(&r, &[], &[other_step], now));
    let mut forged = request(&halted, None);
    forged.spec.arguments = r#"{"user_id": "u-2"}"#.into();
    assert!(needs_state(&r, &[], &[forged], now));
    // Already resolved by an earlier attempt (the run patch then failed): read and resume.
    let mut resolved = request(&halted, Some(Decision::Approved));
    resolved.status.as_mut().unwrap().phase = Some(ApprovalPhase::Approved);
    assert!(needs_state(&r, &[], &[resolved], now));
    // A waiting run that claims no pending call is inconsistent: read it to fail it.
    r.status.as_mut().unwrap().pending_approvals = Some(0);
    assert!(needs_state(&r, &[], &open, now));
}

#[test]
fn backoff_waits_before_the_retry() {
    let r = run(Some(AgentRunPhase::Running), 0, 0);
    let failed = [pod("r1-step-0", "Failed", Some((1, "boom")))];
    let o = observe(&r, &failed, &[], None);
    assert!(matches!(decide(&o, &Policy::default()), Action::Recheck(_)));
}

#[test]
fn a_finished_step_reads_the_state() {
    let r = run(Some(AgentRunPhase::Running), 0, 0);
    let done = [pod("r1-step-0", "Succeeded", None)];
    assert!(needs_state(&r, &done, &[], Utc::now()));
    assert_eq!(
        decide(&observe(&r, &done, &[], None), &Policy::default()),
        Action::Wait
    );

    let mut finished = RunState::new("uid-1", "ops", "hi");
    finished.final_output = Some("User u-1 deleted.".into());
    assert_eq!(
        decide(
            &observe(&r, &done, &[], Some(Ok(&finished))),
            &Policy::default()
        ),
        Action::Succeed {
            output: "User u-1 deleted.".into()
        }
    );

    let halted = halted_state();
    match decide(
        &observe(&r, &done, &[], Some(Ok(&halted))),
        &Policy::default(),
    ) {
        Action::RequestApprovals { create, pending } => {
            assert_eq!(pending, 1);
            assert_eq!(create.len(), 1);
            assert_eq!(create[0].name, approval_request_name("r1", "call_1"));
            assert_eq!(create[0].arguments, r#"{"user_id": "u-1"}"#);
        }
        other => panic!("expected RequestApprovals, got {other:?}"),
    }

    let malformed = decide(
        &observe(
            &r,
            &done,
            &[],
            Some(Err("runState: field `messages`: expected a list".into())),
        ),
        &Policy::default(),
    );
    assert!(matches!(
        malformed,
        Action::Fail {
            reason: Reason::InvalidRunState,
            ..
        }
    ));
}

#[test]
fn approvals_wait_for_every_decision_then_resume() {
    let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    let state = halted_state();
    let undecided = [request(&state, None)];
    assert_eq!(
        decide(
            &observe(&r, &[], &undecided, Some(Ok(&state))),
            &Policy::default()
        ),
        Action::Wait
    );
    let approved = [request(&state, Some(Decision::Approved))];
    match decide(
        &observe(&r, &[], &approved, Some(Ok(&state))),
        &Policy::default(),
    ) {
        Action::Resume { decisions } => {
            assert_eq!(decisions.len(), 1);
            assert_eq!(
                decisions[0].kind,
                ResolvedKind::Approved {
                    approver_id: Some("alice@example.com".into()),
                    reason: Some("CR-1234".into()),
                    edited_arguments: None,
                }
            );
        }
        other => panic!("expected Resume, got {other:?}"),
    }
}

#[test]
fn a_request_whose_digest_no_longer_matches_is_superseded_never_approved() {
    let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    let state = halted_state();
    let mut tampered = request(&state, Some(Decision::Approved));
    tampered.spec.arguments = r#"{"user_id": "u-2"}"#.into();
    tampered.spec.arguments_digest = crate::crd::arguments_digest(&tampered.spec.arguments);
    match decide(
        &observe(&r, &[], &[tampered], Some(Ok(&state))),
        &Policy::default(),
    ) {
        Action::Resume { decisions } => {
            assert!(matches!(decisions[0].kind, ResolvedKind::Superseded { .. }));
        }
        other => panic!("expected Resume, got {other:?}"),
    }
    let mut other_run = request(&state, Some(Decision::Approved));
    other_run.spec.agent_run_ref.uid = "uid-old".into();
    match decide(
        &observe(&r, &[], &[other_run], Some(Ok(&state))),
        &Policy::default(),
    ) {
        Action::Resume { decisions } => {
            assert!(matches!(decisions[0].kind, ResolvedKind::Superseded { .. }));
        }
        other => panic!("expected Resume, got {other:?}"),
    }
}

#[test]
fn an_expired_request_resolves_as_expired() {
    let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    let state = halted_state();
    let mut expired = request(&state, None);
    let past =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(5);
    expired.status.as_mut().unwrap().expires_at =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(past));
    match decide(
        &observe(&r, &[], &[expired.clone()], Some(Ok(&state))),
        &Policy::default(),
    ) {
        Action::Resume { decisions } => assert_eq!(decisions[0].kind, ResolvedKind::Expired),
        other => panic!("expected Resume, got {other:?}"),
    }
    let future =
        k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(60);
    expired.status.as_mut().unwrap().expires_at =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(future));
    assert!(matches!(
        decide(
            &observe(&r, &[], &[expired], Some(Ok(&state))),
            &Policy::default()
        ),
        Action::Recheck(_)
    ));
}

#[test]
fn a_decision_first_observed_after_its_expiry_is_expired() {
    let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    let state = halted_state();
    let mut late = request(&state, Some(Decision::Approved));
    late.status.as_mut().unwrap().expires_at = Some(crate::time::to_k8s(
        Utc::now() - chrono::Duration::seconds(4),
    ));
    match decide(
        &observe(&r, &[], &[late], Some(Ok(&state))),
        &Policy::default(),
    ) {
        Action::Resume { decisions } => {
            assert_eq!(decisions[0].kind, ResolvedKind::Expired);
            assert!(decisions[0].new);
            assert_eq!(decisions[0].decider, None, "nobody is named for an expiry");
        }
        other => panic!("expected Resume, got {other:?}"),
    }
}

#[test]
fn an_unverified_decision_is_refused_and_the_run_keeps_waiting() {
    let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    let state = halted_state();
    let mut forged = request(&state, Some(Decision::Approved));
    forged.metadata.annotations = None;
    match decide(
        &observe(&r, &[], &[forged], Some(Ok(&state))),
        &Policy::default(),
    ) {
        Action::Record {
            resolved, refused, ..
        } => {
            assert!(resolved.is_empty());
            assert_eq!(refused[0].1.reason, Reason::UnverifiedDecision);
        }
        other => panic!("expected Record, got {other:?}"),
    }
}

#[test]
fn a_decision_on_a_tool_whose_definition_changed_is_superseded() {
    let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    let state = halted_state();
    let approved = request(&state, Some(Decision::Approved));
    let mut o = observe(&r, &[], &[approved], Some(Ok(&state)));
    let mut agent = crate::crd::Agent::test();
    agent.spec.tools[0].http.url = "http://evil.example/d".into();
    o.agent = Some(std::sync::Arc::new(agent));
    match decide(&o, &Policy::default()) {
        Action::Resume { decisions } => assert!(
            matches!(&decisions[0].kind, ResolvedKind::Superseded { why } if why.contains("toolDefinitionDigest")),
            "{:?}",
            decisions[0].kind
        ),
        other => panic!("expected Resume, got {other:?}"),
    }
}

#[test]
fn a_state_claiming_an_approval_nobody_gave_fails_the_run() {
    let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    let mut state = halted_state();
    state
        .approve("call_1", Approval::new().approver_id("alice@example.com"))
        .unwrap();
    state
        .deferred_tool_requests
        .approvals
        .push(crate::state::DeferredToolCall {
            tool_call_id: "call_2".into(),
            ..state.deferred_tool_requests.approvals[0].clone()
        });
    let undecided = request(&halted_state(), None);
    match decide(
        &observe(&r, &[], &[undecided], Some(Ok(&state))),
        &Policy::default(),
    ) {
        Action::Fail { reason, message } => {
            assert_eq!(reason, Reason::TamperedState);
            assert!(message.contains("call_1"), "{message}");
        }
        other => panic!("expected Fail, got {other:?}"),
    }
    // A worker that refused to send a call ends the run the same way, without a retry.
    let running = run(Some(AgentRunPhase::Running), 1, 0);
    let refused = [pod(
        "r1-step-1",
        "Failed",
        Some((3, "TamperedState: call_1: ...")),
    )];
    assert!(matches!(
        decide(&observe(&running, &refused, &[], None), &Policy::default()),
        Action::Fail {
            reason: Reason::TamperedState,
            ..
        }
    ));
}

#[test]
fn a_missing_request_is_created_again() {
    let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
    let state = halted_state();
    match decide(&observe(&r, &[], &[], Some(Ok(&state))), &Policy::default()) {
        Action::RequestApprovals { create, .. } => assert_eq!(create.len(), 1),
        other => panic!("expected RequestApprovals, got {other:?}"),
    }
}

#[test]
fn decisions_already_in_the_state_do_not_count_as_pending() {
    let mut state = halted_state();
    state
        .approve("call_1", Approval::new().approver_id("alice@example.com"))
        .unwrap();
    assert!(state.pending_approvals().is_empty());
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn phase() -> impl Strategy<Value = Option<AgentRunPhase>> {
        prop::option::of(prop::sample::select(
            <AgentRunPhase as strum::VariantArray>::VARIANTS.to_vec(),
        ))
    }

    fn pod_phase() -> impl Strategy<Value = Option<&'static str>> {
        prop::option::of(prop::sample::select(vec![
            "Pending",
            "Running",
            "Succeeded",
            "Failed",
        ]))
    }

    proptest! {
        /// Whatever is observed, decide never panics and never approves a call whose request
        /// does not carry an Approved decision for exactly that call: nothing auto-approves.
        #[test]
        fn decide_fails_closed(
            phase in phase(),
            step in 0u32..4,
            retries in 0u32..5,
            pod_state in pod_phase(),
            decision in prop::option::of(prop::sample::select(vec![Decision::Approved, Decision::Rejected])),
            tamper_digest in any::<bool>(),
            tamper_uid in any::<bool>(),
            request_step in 0u32..4,
            with_request in any::<bool>(),
            state_kind in 0u8..4,
            agent_found in any::<bool>(),
        ) {
            let r = run(phase, step, retries);
            let pods: Vec<CachedPod> = pod_state
                .map(|p| pod(&worker_pod_name("r1", step, retries), p, (p == "Failed").then_some((1, "boom"))))
                .into_iter()
                .collect();
            let halted = halted_state();
            let mut finished = RunState::new("uid-1", "ops", "hi");
            finished.final_output = Some("done".into());
            let state: Option<Result<&RunState, String>> = match state_kind {
                0 => None,
                1 => Some(Ok(&halted)),
                2 => Some(Ok(&finished)),
                _ => Some(Err("bad state".into())),
            };
            let mut req = request(&halted, decision);
            req.spec.step = request_step;
            if tamper_digest {
                req.spec.arguments = r#"{"user_id": "u-2"}"#.into();
                req.spec.arguments_digest = crate::crd::arguments_digest(&req.spec.arguments);
            }
            if tamper_uid {
                req.spec.agent_run_ref.uid = "uid-other".into();
            }
            let requests: Vec<ApprovalRequest> = with_request.then_some(req.clone()).into_iter().collect();
            let mut o = observe(&r, &pods, &requests, state);
            if !agent_found {
                o.agent = None;
            }
            let action = decide(&o, &Policy::default());
            if let Action::Resume { decisions } = &action {
                for d in decisions {
                    if let ResolvedKind::Approved { .. } = d.kind {
                        prop_assert!(with_request);
                        prop_assert_eq!(req.spec.decision, Some(Decision::Approved));
                        prop_assert!(!tamper_digest && !tamper_uid);
                        prop_assert_eq!(request_step, step);
                    }
                }
            }
            if phase.is_some_and(AgentRunPhase::is_terminal) {
                prop_assert_eq!(action, Action::Wait);
            }
        }
    }
}
