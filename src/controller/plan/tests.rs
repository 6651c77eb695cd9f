//! Unit tests of the planner: each action's steps from plain fixtures.

use super::*;
use crate::controller::children::WorkerPodDeletion;
use crate::crd::keys::{finalizers, labels};
use crate::crd::stored_state::decode;
use crate::crd::{
    Agent, AgentRun, AgentRunPhase, AgentRunStatus, ApprovalPhase, Decision, ToolCallRecord,
    WorkerOverrides, halted_state,
};
use crate::state::RunState;
use k8s_openapi::api::core::v1::PodStatus;
use kube::ResourceExt;
use kube::api::ObjectMeta;

fn settings() -> (Policy, WorkerSettings) {
    (Policy::default(), WorkerSettings::default())
}

fn plan_of(o: &Observed) -> Plan {
    let (policy, worker) = settings();
    plan(o, &policy, &worker, None)
}

fn awaiting(request: ApprovalRequest) -> Observed {
    let mut o = Observed::of(
        AgentRun::test()
            .in_phase(Some(AgentRunPhase::AwaitingApproval))
            .at_step(0)
            .with_pending(1)
            .with_resource_version("7"),
    );
    o.requests = vec![request];
    o.state = Some(Ok(halted_state()));
    o
}

/// The steps that resume a run: the writes made one after the other (the resolutions, then the
/// run's status) and, at the same time, its next Pod (sent first).
fn resumed(step: &Step) -> (&[Step], &Step) {
    match step {
        Step::Together(steps) => match &steps[..] {
            [pod, Step::InOrder(writes)] => (writes, pod),
            other => panic!("expected the writes in order and the Pod, got {other:?}"),
        },
        other => panic!("expected steps performed together, got {other:?}"),
    }
}

/// Every step of `steps`, those performed together or in order included.
fn leaves(steps: &[Step]) -> Vec<&Step> {
    steps
        .iter()
        .flat_map(|step| match step {
            Step::Together(inner) | Step::InOrder(inner) => leaves(inner),
            other => vec![other],
        })
        .collect()
}

fn run_patch(step: &Step) -> &StatusPatch<AgentRunStatusPatch> {
    match step {
        Step::PatchRun(patch) => patch,
        other => panic!("expected PatchRun, got {other:?}"),
    }
}

fn ready_reason(patch: &AgentRunStatusPatch) -> String {
    let conditions = patch.conditions.as_ref().expect("conditions");
    crate::crd::find_condition(conditions, ConditionType::Ready)
        .expect("Ready")
        .reason
        .clone()
}

#[test]
fn an_approval_is_applied_with_its_audit_fields_then_the_next_step_starts() {
    let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
    request.metadata.creation_timestamp = Some(to_k8s(Utc::now() - chrono::Duration::seconds(30)));
    request.metadata.resource_version = Some("5".into());
    let o = awaiting(request);
    let plan = plan_of(&o);
    assert_eq!(plan.steps.len(), 1, "{:?}", plan.steps);
    let (writes, pod) = resumed(&plan.steps[0]);
    assert_eq!(writes.len(), 2, "{writes:?}");
    // The decision is recorded first, at the time the controller observed it, guarded by the
    // request's version.
    match &writes[0] {
        Step::RecordResolution(r) => {
            assert_eq!(r.phase, ApprovalPhase::Approved);
            assert_eq!(r.identity.as_ref().unwrap().username, "alice@example.com");
            assert_eq!(r.decided_at, o.now);
            assert_eq!(r.resource_version.as_deref(), Some("5"));
        }
        other => panic!("expected the resolution first, got {other:?}"),
    }
    // Then the state with the decision applied; the next worker Pod is created meanwhile.
    let patch = run_patch(&writes[1]);
    assert_eq!(patch.metadata.as_ref().unwrap().resource_version, "7");
    let status = &patch.status;
    assert_eq!(status.phase, Some(AgentRunPhase::Running));
    assert_eq!(
        (status.step, status.retries, status.pending_approvals),
        (Some(1), Some(0), Some(0))
    );
    assert_eq!(status.worker_pod.as_deref(), Some("r1-step-1"));
    let stored = AgentRunStatus {
        run_state: status.run_state.clone().flatten(),
        run_state_encoding: status.run_state_encoding,
        run_state_digest: status.run_state_digest.clone(),
        ..Default::default()
    };
    let state = decode(&stored).unwrap().unwrap();
    assert_eq!(state.approved_tools, ["call_1"]);
    let audit = &state.approval_metadata["call_1"];
    assert_eq!(audit.approver_id.as_deref(), Some("alice@example.com"));
    assert_eq!(audit.reason.as_deref(), Some("CR-1234"));
    match pod {
        Step::CreatePod {
            pod,
            announce,
            resumes,
        } => {
            assert_eq!(pod.metadata.name.as_deref(), Some("r1-step-1"));
            assert_eq!(*announce, None, "a resume is announced by its decisions");
            assert_eq!(resumes.len(), 1);
        }
        other => panic!("expected CreatePod, got {other:?}"),
    }
    match &plan.after[..] {
        [Step::Publish(event)] => {
            assert_eq!(event.reason, EventReason::Approved);
            assert_eq!(
                event.note,
                "Approved by alice@example.com: CR-1234 (call_1); resumed at step 1"
            );
            assert!(event.related.is_some());
        }
        other => panic!("expected an Event, got {other:?}"),
    }
    assert_eq!(plan.approval_waits.len(), 1);
    assert!(plan.approval_waits[0] >= 29.0, "{:?}", plan.approval_waits);
}

#[test]
fn an_expiry_is_recorded_before_the_run_moves_on_and_the_model_is_told() {
    let mut request = ApprovalRequest::test_for(&halted_state(), None);
    request.status.as_mut().unwrap().expires_at =
        Some(to_k8s(Utc::now() - chrono::Duration::seconds(5)));
    let plan = plan_of(&awaiting(request));
    let (writes, _) = resumed(&plan.steps[0]);
    match &writes[0] {
        Step::RecordResolution(r) => assert_eq!(r.phase, ApprovalPhase::Expired),
        other => panic!("expected the expiry first, got {other:?}"),
    }
    let status = &run_patch(&writes[1]).status;
    let state = decode(&AgentRunStatus {
        run_state: status.run_state.clone().flatten(),
        ..Default::default()
    })
    .unwrap()
    .unwrap();
    assert_eq!(
        state.rejected_tools[0].message.as_deref(),
        Some(EXPIRED_MESSAGE)
    );
    assert_eq!(
        state.approval_metadata["call_1"].reason.as_deref(),
        Some("expired")
    );
    assert!(matches!(&plan.after[..], [Step::Publish(e)] if e.reason == EventReason::Expired));
}

#[test]
fn an_already_recorded_decision_is_not_recorded_again() {
    let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Rejected));
    let status = request.status.as_mut().unwrap();
    status.phase = Some(ApprovalPhase::Rejected);
    status.decided_at = Some(to_k8s(Utc::now()));
    let plan = plan_of(&awaiting(request));
    assert!(
        plan.after
            .iter()
            .all(|s| !matches!(s, Step::RecordResolution(_)))
    );
    assert!(
        leaves(&plan.steps)
            .iter()
            .all(|s| !matches!(s, Step::RecordResolution(_)))
    );
    assert_eq!(resumed(&plan.steps[0]).0.len(), 1, "only the run's status");
}

#[test]
fn the_first_step_creates_the_worker_identity_then_the_status_then_the_pod() {
    let mut run = AgentRun::test().with_resource_version("3");
    run.metadata.annotations = Some(
        [(
            crate::crd::keys::annotations::CREATED_BY.to_owned(),
            "carol@example.com".to_owned(),
        )]
        .into(),
    );
    let plan = plan_of(&Observed::of(run.clone()));
    assert!(matches!(plan.steps[0], Step::ApplyWorkerIdentity(_)));
    let patch = run_patch(&plan.steps[1]);
    assert_eq!(patch.metadata.as_ref().unwrap().resource_version, "3");
    assert_eq!(patch.status.phase, Some(AgentRunPhase::Running));
    assert_eq!(
        patch.status.created_by.as_deref(),
        Some("carol@example.com")
    );
    assert!(patch.status.started_at.is_some());
    assert_eq!(ready_reason(&patch.status), "Running");
    assert!(matches!(
        &plan.steps[2],
        Step::CreatePod { announce: Some(note), .. } if note == "Started worker Pod r1-step-0 for step 0"
    ));

    // A run with its own ServiceAccount gets no per-run identity.
    run.spec.worker = Some(WorkerOverrides {
        service_account_name: Some("custom".into()),
        ..Default::default()
    });
    let plan = plan_of(&Observed::of(run));
    assert!(matches!(plan.steps[0], Step::PatchRun(_)));
}

#[test]
fn a_halt_creates_its_requests_then_says_the_run_awaits_approval() {
    let mut o = finished_step(halted_state());
    o.run.status.as_mut().unwrap().created_by = Some("carol@example.com".into());
    let plan = plan_of(&o);
    match &plan.steps[0] {
        Step::CreateRequest {
            request,
            status,
            announce,
        } => {
            let name = crate::crd::approval_request_name("r1", "call_1");
            assert_eq!(request.metadata.name.as_ref(), Some(&name));
            assert_eq!(
                request.spec.run_creator.as_deref(),
                Some("carol@example.com")
            );
            assert_eq!(request.spec.arguments, r#"{"user_id": "u-1"}"#);
            assert_eq!(request.metadata.labels.as_ref().unwrap()[labels::RUN], "r1");
            assert_eq!(
                request.metadata.finalizers.as_deref(),
                Some(&[finalizers::KEEP_WITH_RUN.to_owned()][..])
            );
            assert_eq!(request.owner_references()[0].uid, "uid-1");
            assert_eq!(request.metadata.annotations, None, "no trace context");
            assert_eq!(status.phase, Some(ApprovalPhase::Pending));
            assert_eq!(status.expires_at, None);
            assert!(
                announce.contains("kubectl patch apr r1-call-1"),
                "{announce}"
            );
        }
        other => panic!("expected CreateRequest, got {other:?}"),
    }
    let patch = run_patch(&plan.steps[1]);
    assert!(patch.metadata.is_none());
    assert_eq!(patch.status.phase, Some(AgentRunPhase::AwaitingApproval));
    assert_eq!(patch.status.pending_approvals, Some(1));

    // A traced run: its well-formed trace context is copied onto the request (for the
    // notifications about it), nothing else of its annotations.
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut t = o.clone();
    t.run.metadata.annotations = Some(
        [
            ("traceparent".to_owned(), parent.to_owned()),
            ("other".to_owned(), "x".to_owned()),
        ]
        .into(),
    );
    match &plan_of(&t).steps[0] {
        Step::CreateRequest { request, .. } => assert_eq!(
            request.metadata.annotations,
            Some([("agentrun.dev/traceparent".to_owned(), parent.to_owned())].into())
        ),
        other => panic!("expected CreateRequest, got {other:?}"),
    }

    // Self-approval allowed by the admin: the creator is not copied, so the policy does not
    // refuse it.
    let mut agent = Agent::test();
    agent.spec.tools[0].approval_timeout = Some("30m".into());
    o.agent = Some(std::sync::Arc::new(agent));
    let mut policy = Policy::default();
    policy.decisions.allow_self_approval = true;
    match &super::plan(&o, &policy, &WorkerSettings::default(), None).steps[0] {
        Step::CreateRequest {
            request, status, ..
        } => {
            assert_eq!(request.spec.run_creator, None);
            assert!(status.expires_at.is_some());
        }
        other => panic!("expected CreateRequest, got {other:?}"),
    }
}

#[test]
fn stale_and_finished_runs_do_nothing() {
    let mut o = Observed::of(AgentRun::test().in_phase(Some(AgentRunPhase::Running)));
    o.stale = true;
    let plan = plan_of(&o);
    assert!(plan.steps.is_empty());
    assert_eq!(plan.requeue, Requeue::After(Duration::from_secs(1)));

    let mut o = Observed::of(
        AgentRun::test()
            .in_phase(Some(AgentRunPhase::Succeeded))
            .at_step(1),
    );
    o.requests = vec![ApprovalRequest::test_for(
        &halted_state(),
        Some(Decision::Approved),
    )];
    let plan = plan_of(&o);
    assert!(plan.steps.is_empty(), "{:?}", plan.steps);
    assert_eq!(plan.requeue, Requeue::AwaitChange);
}

#[test]
fn unknown_outcomes_are_reported_once() {
    let mut run = AgentRun::test().in_phase(Some(AgentRunPhase::Running));
    run.status.as_mut().unwrap().tool_calls = vec![ToolCallRecord {
        tool_call_id: "call_1".into(),
        tool_name: "delete_user".into(),
        step: 0,
        started_at: to_k8s(Utc::now()),
        resent: None,
        outcome: Some("Unknown".into()),
    }];
    let plan = plan_of(&Observed::of(run.clone()));
    let patch = run_patch(&plan.steps[0]);
    let conditions = patch.status.conditions.as_ref().unwrap();
    let c = crate::crd::find_condition(conditions, ConditionType::ToolOutcomeUnknown).unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "NotResent")
    );
    assert!(c.message.contains("call_1 (delete_user)"), "{}", c.message);
    assert!(
        matches!(&plan.steps[1], Step::Publish(e) if e.reason == EventReason::ToolOutcomeUnknown)
    );
    run.status.as_mut().unwrap().conditions = conditions.clone();
    let again = plan_of(&Observed::of(run));
    assert!(
        again
            .steps
            .iter()
            .all(|s| !matches!(s, Step::Publish(e) if e.reason == EventReason::ToolOutcomeUnknown))
    );
}

#[test]
fn a_missing_agent_is_reported_once_and_looked_at_again() {
    let mut o = Observed::of(AgentRun::test());
    o.agent = None;
    let plan = plan_of(&o);
    let patch = run_patch(&plan.steps[0]);
    assert_eq!(patch.status.phase, Some(AgentRunPhase::Pending));
    assert_eq!(ready_reason(&patch.status), "AgentNotFound");
    assert!(
        matches!(&plan.steps[1], Step::Publish(e) if e.note == "Agent ops not found in namespace ns")
    );
    assert_eq!(plan.requeue, Requeue::After(Policy::default().recheck));
    o.run.status = Some(AgentRunStatus {
        conditions: patch.status.conditions.clone().unwrap(),
        ..Default::default()
    });
    let again = plan_of(&o);
    assert!(again.steps.is_empty());
    assert_eq!(again.requeue, Requeue::After(Policy::default().recheck));
}

#[test]
fn an_invalid_state_fails_the_run_with_a_condition_and_an_event() {
    let mut o = awaiting(ApprovalRequest::test_for(&halted_state(), None));
    o.state = Some(Err("runState: field `messages`: expected a list".into()));
    let plan = plan_of(&o);
    let patch = run_patch(&plan.steps[0]);
    assert_eq!(patch.status.phase, Some(AgentRunPhase::Failed));
    assert_eq!(ready_reason(&patch.status), "InvalidRunState");
    assert!(patch.status.completed_at.is_some());
    assert!(
        matches!(&plan.steps[1], Step::Publish(e) if e.reason == EventReason::Failed && e.note.starts_with("InvalidRunState: runState"))
    );
}

fn issuer() -> (crate::controller::Issuer, crate::assertion::Jwks) {
    let signer = crate::assertion::Signer::generate().unwrap();
    let jwks = crate::assertion::Jwks::new([signer.jwk()]);
    (
        crate::controller::Issuer::new(signer, jwks.clone(), Duration::from_secs(600)),
        jwks,
    )
}

#[test]
fn with_signing_an_approval_is_recorded_with_its_assertion_before_the_state_moves_on() {
    let (issuer, jwks) = issuer();
    let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
    request.metadata.uid = Some("req-uid-1".into());
    let body = request.spec.arguments.clone();
    let (policy, worker) = settings();
    let planned = plan(&awaiting(request), &policy, &worker, Some(&issuer));
    fn kind(step: &Step) -> String {
        match step {
            Step::PatchRun(_) => "run".into(),
            Step::RecordResolution(_) => "resolution".into(),
            Step::CreatePod { .. } => "pod".into(),
            Step::Together(steps) => steps.iter().map(kind).collect::<Vec<_>>().join(" + "),
            Step::InOrder(steps) => {
                format!(
                    "({})",
                    steps.iter().map(kind).collect::<Vec<_>>().join(", ")
                )
            }
            _ => "other".into(),
        }
    }
    let kinds: Vec<String> = planned.steps.iter().map(kind).collect();
    assert_eq!(kinds, ["pod + (resolution, run)"]);
    let Step::RecordResolution(resolution) = leaves(&planned.steps)[1] else {
        panic!("expected the resolution before the run's state")
    };
    let token = resolution
        .status_patch()
        .status
        .assertion
        .expect("an assertion");
    let claims = crate::assertion::verify(
        &token,
        &jwks,
        &crate::assertion::Expected::new("http://127.0.0.1:2/d", body.as_bytes()),
    )
    .unwrap();
    assert_eq!(
        (claims.approver.as_str(), claims.tool_call_id.as_str()),
        ("alice@example.com", "call_1")
    );

    // A claimed approval (no stamp, applied only because the admin allows it) gets none.
    let mut unstamped = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
    unstamped.metadata.annotations = None;
    let mut claims_allowed = policy.clone();
    claims_allowed.decisions.allow_unverified_decisions = true;
    let mut o = awaiting(unstamped);
    o.policies_installed = false;
    let planned = plan(&o, &claims_allowed, &worker, Some(&issuer));
    assert!(
        matches!(leaves(&planned.steps)[1], Step::RecordResolution(r) if r.assertion.is_none())
    );
}

/// A running run whose step-0 worker succeeded, with `state`.
fn finished_step(state: RunState) -> Observed {
    let mut o = Observed::of(
        AgentRun::test()
            .in_phase(Some(AgentRunPhase::Running))
            .at_step(0)
            .with_retries(0),
    );
    o.pods = vec![
        Pod {
            metadata: ObjectMeta {
                name: Some("r1-step-0".into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some("Succeeded".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
        .into(),
    ];
    o.state = Some(Ok(state));
    o
}

/// The worker Pods a plan deletes, wherever in the plan.
fn deleted_pods(planned: &Plan) -> Vec<&Vec<String>> {
    planned
        .steps
        .iter()
        .chain(&planned.after)
        .filter_map(|s| match s {
            Step::DeleteWorkerPods(pods) => Some(pods),
            _ => None,
        })
        .collect()
}

#[test]
fn a_finished_runs_worker_pods_are_deleted_as_configured_once_its_cached_version_says_so() {
    let mut done = RunState::new("uid-1", "ops", "hi");
    done.final_output = Some("User u-1 deleted.".into());
    let finishing = finished_step(done);
    let mut invalid = awaiting(ApprovalRequest::test_for(&halted_state(), None));
    invalid.state = Some(Err("runState: field `messages`: expected a list".into()));
    invalid.pods = finishing.pods.clone();
    // A reconcile that read the run from the API server and found it finished, while the cache
    // still has the version before.
    let mut read_finished = finishing.clone();
    read_finished.run.status.as_mut().unwrap().phase = Some(AgentRunPhase::Succeeded);
    let finished_in = |phase| {
        let mut o = Observed::of(AgentRun::test().in_phase(Some(phase)).at_step(0));
        o.pods = finishing.pods.clone();
        o
    };
    let (succeeded, failed) = (
        finished_in(AgentRunPhase::Succeeded),
        finished_in(AgentRunPhase::Failed),
    );
    let mut no_pods = finished_in(AgentRunPhase::Succeeded);
    no_pods.pods.clear();
    let policy = Policy::default();
    let every_pod = vec!["r1-step-0".to_owned()];
    for (deletion, on_success, on_failure) in [
        (WorkerPodDeletion::Succeeded, true, false),
        (WorkerPodDeletion::Finished, true, true),
        (WorkerPodDeletion::Never, false, false),
    ] {
        let worker = WorkerSettings {
            pod_deletion: deletion,
            ..Default::default()
        };
        // Not at the write that finishes the run: until the watch brings it, a reconcile sees
        // the run at its step, with the step's Pod gone, and would create it again.
        for (o, phase) in [
            (&finishing, AgentRunPhase::Succeeded),
            (&invalid, AgentRunPhase::Failed),
        ] {
            let planned = plan(o, &policy, &worker, None);
            assert_eq!(run_patch(&planned.steps[0]).status.phase, Some(phase));
            assert!(deleted_pods(&planned).is_empty(), "{deletion}, {phase:?}");
        }
        assert!(deleted_pods(&plan(&read_finished, &policy, &worker, None)).is_empty());
        assert!(deleted_pods(&plan(&no_pods, &policy, &worker, None)).is_empty());
        for (o, deletes) in [(&succeeded, on_success), (&failed, on_failure)] {
            let planned = plan(o, &policy, &worker, None);
            let expected = if deletes { vec![&every_pod] } else { vec![] };
            assert_eq!(deleted_pods(&planned), expected, "{deletion}");
            assert_eq!(planned.steps.len() + planned.after.len(), expected.len());
        }
    }
    assert_eq!(WorkerPodDeletion::default(), WorkerPodDeletion::Succeeded);
}
