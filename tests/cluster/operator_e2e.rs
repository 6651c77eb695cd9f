//! End-to-end tests of the operator against the real control plane: the controller and the dev
//! kubelet run in this process (the dev kubelet starts real `agentrun worker` processes with tokens
//! minted for the run's service account), people act through real `kubectl` with their own tokens,
//! and the model and tools are real HTTP servers on loopback.

use std::ops::ControlFlow;
use std::time::Duration;

use agentrun::controller;
use agentrun::crd::{AgentRun, AgentRunPhase, ApprovalRequest};
use agentrun::state::RunState;
use agentrun_testkit::cluster::{ControlPlane, Identity, TestNamespace, assert_success};
use agentrun_testkit::model_server::{ModelServer, Reply};
use agentrun_testkit::operator::{Operator, start_controller};
use agentrun_testkit::runs::{
    agent_yaml, approvers_role, pods_of, requests_of, run_yaml, wait_for_phase,
};
use agentrun_testkit::tool_server::ToolServer;
use agentrun_testkit::wait::poll_until;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

async fn start_operator(cp: &ControlPlane, ns: &TestNamespace) -> Operator {
    let operator = agentrun_testkit::operator::start_operator(cp, ns).await;
    grant_approvers(cp, &ns.name);
    operator
}

/// alice and bob may read and decide ApprovalRequests in the namespace.
fn grant_approvers(cp: &ControlPlane, ns: &str) {
    cp.apply(
        Identity::Admin,
        &approvers_role(ns, &["agentrun:approvers"]),
    );
}

fn openai_model(server: &ModelServer) -> serde_json::Value {
    json!({"baseUrl": server.base_url(), "name": "test-model", "maxRetries": 0, "timeoutSeconds": 10})
}

fn decide(
    cp: &ControlPlane,
    identity: Identity,
    ns: &str,
    request: &str,
    patch: serde_json::Value,
) {
    let out = cp.kubectl(
        identity,
        &[
            "patch",
            "apr",
            request,
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ],
    );
    assert_success(&out, "kubectl patch apr");
}

fn state_of(run: &AgentRun) -> RunState {
    RunState::from_json(run.status.as_ref().unwrap().run_state.as_deref().unwrap()).unwrap()
}

/// Every request body the model received, as text: `reason` and `approverId` must never be there.
fn assert_model_never_saw(model: &ModelServer, secrets: &[&str]) {
    for request in model.requests() {
        let body = request.json().to_string();
        for secret in secrets {
            assert!(
                !body.contains(secret),
                "the model received {secret:?}: {body}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_then_the_tool_runs_once_and_the_audit_holds_alice() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-approve").await;
    let _operator = start_operator(cp, &ns).await;
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model.push(Reply::tool_calls(&[(
        "call_TX_9",
        "delete_user",
        json!({"user_id": "u-1"}),
    )]));
    model.push(Reply::text("User u-1 deleted."));
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", openai_model(&model), &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete user u-1"),
    );

    let halted = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    assert_eq!(halted.status.as_ref().unwrap().pending_approvals, Some(1));
    assert!(tools.requests().is_empty(), "nothing runs before approval");
    let requests = requests_of(cp, &ns.name, "r1").await;
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.spec.tool_call_id, "call_TX_9");
    assert_eq!(request.spec.tool_name, "delete_user");
    assert_eq!(request.spec.arguments, r#"{"user_id": "u-1"}"#);
    let name = request.metadata.name.clone().unwrap();
    assert!(name.starts_with("r1-call-tx-9"), "{name}");

    decide(
        cp,
        Identity::Alice,
        &ns.name,
        &name,
        json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "authorized per change CR-1234"}}),
    );
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.final_output.as_deref(), Some("User u-1 deleted."));
    assert_eq!(tools.calls_of("call_TX_9"), 1);
    assert_eq!(
        tools.requests_to("/delete_user")[0].json(),
        json!({"user_id": "u-1"})
    );
    let state = state_of(&done);
    let audit = &state.approval_metadata["call_TX_9"];
    assert_eq!(audit.approver_id.as_deref(), Some("alice@example.com"));
    assert_eq!(
        audit.reason.as_deref(),
        Some("authorized per change CR-1234")
    );
    assert_eq!(state.approved_tools, vec!["call_TX_9".to_string()]);
    assert_model_never_saw(
        &model,
        &["authorized per change CR-1234", "alice@example.com"],
    );
    assert_eq!(pods_of(cp, &ns.name).await, vec!["r1-step-0", "r1-step-1"]);
    let apr = requests_of(cp, &ns.name, "r1").await;
    assert_eq!(
        apr[0].status.as_ref().unwrap().phase,
        Some(agentrun::crd::ApprovalPhase::Approved)
    );
    let events = cp.kubectl(
        Identity::Admin,
        &["get", "events", "-n", &ns.name, "-o", "json"],
    );
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(
        events.contains("Approved by alice@example.com: authorized per change CR-1234"),
        "{events}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_tells_the_model_the_message_never_the_reason() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-reject").await;
    let _operator = start_operator(cp, &ns).await;
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model.push(Reply::tool_calls(&[(
        "call_1",
        "delete_user",
        json!({"user_id": "u-1"}),
    )]));
    model.push(Reply::text("I could not delete the user."));
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", openai_model(&model), &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete user u-1"),
    );
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    let name = requests_of(cp, &ns.name, "r1").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    decide(
        cp,
        Identity::Bob,
        &ns.name,
        &name,
        json!({"spec": {"decision": "Rejected", "approverId": "bob@example.com",
                        "reason": "policy violation: tier-0 write", "message": "Not authorized for this resource"}}),
    );
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    assert!(tools.requests().is_empty(), "a rejected tool never runs");
    let last = model.requests().last().unwrap().json().to_string();
    assert!(last.contains("Not authorized for this resource"), "{last}");
    assert_model_never_saw(
        &model,
        &["policy violation: tier-0 write", "bob@example.com"],
    );
    let state = state_of(&done);
    assert_eq!(
        state.rejected_tools[0].message.as_deref(),
        Some("Not authorized for this resource")
    );
    assert_eq!(
        state.approval_metadata["call_1"].reason.as_deref(),
        Some("policy violation: tier-0 write")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_calls_in_one_halt_then_a_second_halt() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-two").await;
    let _operator = start_operator(cp, &ns).await;
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model.push(Reply::tool_calls(&[
        ("call_a", "delete_user", json!({"user_id": "u-1"})),
        ("call_b", "delete_user", json!({"user_id": "u-2"})),
    ]));
    model.push(Reply::tool_calls(&[(
        "call_c",
        "delete_user",
        json!({"user_id": "u-3"}),
    )]));
    model.push(Reply::text("Deleted u-1 and u-3; u-2 was refused."));
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", openai_model(&model), &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete u-1, u-2, u-3"),
    );

    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    let requests = requests_of(cp, &ns.name, "r1").await;
    assert_eq!(requests.len(), 2);
    let approve = json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ok"}});
    decide(
        cp,
        Identity::Alice,
        &ns.name,
        requests[0].metadata.name.as_deref().unwrap(),
        approve.clone(),
    );
    // One decision is not enough: the run keeps waiting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let api: Api<AgentRun> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    assert_eq!(
        api.get("r1").await.unwrap().status.unwrap().phase,
        Some(AgentRunPhase::AwaitingApproval)
    );
    decide(
        cp,
        Identity::Bob,
        &ns.name,
        requests[1].metadata.name.as_deref().unwrap(),
        json!({"spec": {"decision": "Rejected", "approverId": "bob@example.com", "reason": "not this one", "message": "u-2 must stay"}}),
    );

    // The second halt.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let third = loop {
        let list = requests_of(cp, &ns.name, "r1").await;
        if let Some(r) = list.into_iter().find(|r| r.spec.tool_call_id == "call_c") {
            break r;
        }
        assert!(tokio::time::Instant::now() < deadline, "no second halt");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(third.spec.step, 1);
    decide(
        cp,
        Identity::Alice,
        &ns.name,
        third.metadata.name.as_deref().unwrap(),
        approve,
    );
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(tools.calls_of("call_a"), 1);
    assert_eq!(tools.calls_of("call_b"), 0);
    assert_eq!(tools.calls_of("call_c"), 1);
    let state = state_of(&done);
    assert_eq!(state.approval_metadata.len(), 3);
    assert_eq!(done.status.unwrap().step, Some(2));
    assert_eq!(
        pods_of(cp, &ns.name).await,
        vec!["r1-step-0", "r1-step-1", "r1-step-2"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_needing_no_approval_finishes_in_one_step() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-noapproval").await;
    let _operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    let scripted = json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "lookup_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "u-1 exists."}
    ]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted, &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Is u-1 there?"),
    );
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(
        done.status.as_ref().unwrap().final_output.as_deref(),
        Some("u-1 exists.")
    );
    assert_eq!(tools.calls_of("call_1"), 1);
    assert!(requests_of(cp, &ns.name, "r1").await.is_empty());
    assert_eq!(pods_of(cp, &ns.name).await, vec!["r1-step-0"]);
}

/// Run `name` of an Agent (named after it) whose model refuses every attempt (the test policy
/// allows three), once it failed.
async fn run_failing_every_attempt(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    tools: &ToolServer,
) -> AgentRun {
    let model = ModelServer::start().await;
    for _ in 0..3 {
        model.push(Reply::status(401, "invalid api key"));
    }
    cp.apply(
        Identity::Admin,
        &agent_yaml(ns, name, openai_model(&model), tools),
    );
    cp.apply(Identity::Admin, &run_yaml(ns, name, name, "Say hello"));
    wait_for_phase(cp, ns, name, AgentRunPhase::Failed).await
}

/// The default deletion of worker Pods: a run that succeeded loses its Pods once its status says
/// so; one that failed keeps them (and their logs) for whoever looks into the failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_succeeded_run_deletes_its_worker_pods_and_a_failed_one_keeps_them() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-pod-deletion").await;
    let config = controller::ControllerConfig {
        worker: controller::WorkerSettings::default(),
        ..agentrun_testkit::operator::test_config(&ns.name)
    };
    let _operator = agentrun_testkit::operator::start_operator_with(cp, &ns, config).await;
    let tools = ToolServer::start().await;
    run_failing_every_attempt(cp, &ns.name, "bad", &tools).await;

    let scripted = json!({"scripted": {"turns": [{"content": "Hello."}]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted, &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "ok", "ops", "Say hello"),
    );
    wait_for_phase(cp, &ns.name, "ok", AgentRunPhase::Succeeded).await;
    let left = poll_until(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let pods = pods_of(cp, &ns.name).await;
            if pods.iter().any(|p| p.starts_with("ok-")) {
                ControlFlow::Continue(pods)
            } else {
                ControlFlow::Break(pods)
            }
        },
    )
    .await
    .unwrap_or_else(|pods| pods);
    // The failed run finished first: had its Pods been deleted, they would be gone by now.
    assert_eq!(
        left,
        vec!["bad-step-0", "bad-step-0-r1", "bad-step-0-r2"],
        "the succeeded run's Pods deleted, the failed run's kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_fails_once_is_retried() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-retry").await;
    let _operator = start_operator(cp, &ns).await;
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model.push(Reply::garbage());
    model.push(Reply::text("Hello."));
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", openai_model(&model), &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Say hello"),
    );
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    let status = done.status.unwrap();
    assert_eq!(status.final_output.as_deref(), Some("Hello."));
    assert_eq!(status.retries, Some(1));
    assert_eq!(
        pods_of(cp, &ns.name).await,
        vec!["r1-step-0", "r1-step-0-r1"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_keeps_failing_fails_the_run_with_its_error() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-fail").await;
    let _operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    let failed = run_failing_every_attempt(cp, &ns.name, "r1", &tools).await;
    let condition = failed
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(condition.reason, "WorkerFailed");
    assert!(condition.message.contains("401"), "{}", condition.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restarted_mid_run_loses_and_duplicates_nothing() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-restart").await;
    let mut operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    let scripted = json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted, &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete u-1"),
    );
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;

    operator.controller.abort();
    let name = requests_of(cp, &ns.name, "r1").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    decide(
        cp,
        Identity::Alice,
        &ns.name,
        &name,
        json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ok"}}),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    operator.controller = start_controller(cp, &ns.name).await;
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(tools.calls_of("call_1"), 1);
    assert_eq!(pods_of(cp, &ns.name).await, vec!["r1-step-0", "r1-step-1"]);
    assert_eq!(requests_of(cp, &ns.name, "r1").await.len(), 1);
    assert_eq!(
        state_of(&done).approval_metadata["call_1"]
            .approver_id
            .as_deref(),
        Some("alice@example.com")
    );
}

/// The controller records a decision on its request when it first observes it, before the run
/// moves on. A controller stopped right after recording it leaves the run awaiting approval with
/// the request recorded; the next controller applies the decision as recorded, without recording
/// it again: the audit's time stays the time it was first observed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_recorded_by_a_stopped_controller_is_applied_as_recorded() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-record").await;
    let mut operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    let scripted = json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted, &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete u-1"),
    );
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    let name = requests_of(cp, &ns.name, "r1").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    operator.controller.abort();
    decide(
        cp,
        Identity::Alice,
        &ns.name,
        &name,
        json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ok"}}),
    );
    // What a controller stopped right after recording the decision leaves behind.
    let observed_at = k8s_openapi::jiff::Timestamp::from_second(
        k8s_openapi::jiff::Timestamp::now().as_second() - 90,
    )
    .unwrap();
    let requests: Api<ApprovalRequest> =
        Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    requests
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Approved",
                "decidedAt": observed_at.to_string(),
                "verifiedIdentity": {"username": "alice@example.com", "groups": ["agentrun:approvers"]},
            }})),
        )
        .await
        .unwrap();
    operator.controller = start_controller(cp, &ns.name).await;
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    let status = requests.get(&name).await.unwrap().status.unwrap();
    assert_eq!(
        status.decided_at.map(|t| t.0.as_second()),
        Some(observed_at.as_second()),
        "recorded once"
    );
    let state = state_of(&done);
    assert_eq!(
        state.approval_metadata["call_1"].timestamp.timestamp(),
        observed_at.as_second()
    );
    assert_eq!(tools.calls_of("call_1"), 1);
    assert_eq!(pods_of(cp, &ns.name).await, vec!["r1-step-0", "r1-step-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_run_state_fails_that_run_and_others_go_on() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-malformed").await;
    let _operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    let scripted = json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted, &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "bad", "ops", "Delete u-1"),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "good", "ops", "Delete u-1"),
    );
    wait_for_phase(cp, &ns.name, "bad", AgentRunPhase::AwaitingApproval).await;
    wait_for_phase(cp, &ns.name, "good", AgentRunPhase::AwaitingApproval).await;

    let api: Api<AgentRun> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let garbage = r#"{"run_id": "x", "messages": "not a list"}"#;
    api.patch_status(
        "bad",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"runState": garbage, "runStateDigest": agentrun::crd::stored_state::sha256_hex(garbage.as_bytes())}})),
    )
    .await
    .unwrap();
    for run in ["bad", "good"] {
        let name = requests_of(cp, &ns.name, run).await[0]
            .metadata
            .name
            .clone()
            .unwrap();
        decide(
            cp,
            Identity::Alice,
            &ns.name,
            &name,
            json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ok"}}),
        );
    }
    let failed = wait_for_phase(cp, &ns.name, "bad", AgentRunPhase::Failed).await;
    let condition = failed
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(condition.reason, "InvalidRunState");
    assert!(
        condition.message.contains("messages"),
        "{}",
        condition.message
    );
    wait_for_phase(cp, &ns.name, "good", AgentRunPhase::Succeeded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_of_a_missing_agent_says_so_and_starts_when_it_appears() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-noagent").await;
    let _operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    cp.apply(Identity::Admin, &run_yaml(&ns.name, "r1", "later", "hi"));
    let pending = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Pending).await;
    let condition = pending
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(condition.reason, "AgentNotFound");
    assert!(
        condition.message.contains("Agent later not found"),
        "{}",
        condition.message
    );
    let scripted = json!({"scripted": {"turns": [{"content": "hello"}]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "later", scripted, &tools),
    );
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
}

fn delete_pod(cp: &ControlPlane, ns: &str, pod: &str) {
    assert_success(
        &cp.kubectl(
            Identity::Admin,
            &["delete", "pod", pod, "-n", ns, "--wait=false"],
        ),
        "delete pod",
    );
}

/// Waits until the tool server has received `n` calls on `path`.
async fn wait_for_calls(tools: &ToolServer, path: &str, n: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tools.requests_to(path).len() < n {
        assert!(tokio::time::Instant::now() < deadline, "no call to {path}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn at_most_once_run(idempotent: bool) -> (KeepAlive, AgentRun, ToolServer) {
    let cp = ControlPlane::shared().await;
    let ns = cp
        .namespace(if idempotent {
            "e2e-resend"
        } else {
            "e2e-unknown"
        })
        .await;
    let operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    // The first call hangs long enough for the test to kill its worker mid-call.
    tools.push(
        "/delete_user",
        agentrun_testkit::tool_server::ToolReply::Delay(
            Duration::from_secs(30),
            Box::new(agentrun_testkit::tool_server::ToolReply::Echo),
        ),
    );
    let scripted = json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}});
    let mut agent: serde_json::Value =
        serde_json::from_str(&agent_yaml(&ns.name, "ops", scripted, &tools)).unwrap();
    agent["spec"]["tools"][0]["idempotent"] = json!(idempotent);
    cp.apply(Identity::Admin, &agent.to_string());
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete u-1"),
    );
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    let name = requests_of(cp, &ns.name, "r1").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    decide(
        cp,
        Identity::Alice,
        &ns.name,
        &name,
        json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ok"}}),
    );
    wait_for_calls(&tools, "/delete_user", 1).await;
    // The worker has recorded the start and sent the call; it dies before the result.
    delete_pod(cp, &ns.name, "r1-step-1");
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    (
        KeepAlive {
            _ns: ns,
            _operator: operator,
        },
        done,
        tools,
    )
}

/// Keeps a test's namespace and operator alive while it inspects the result.
struct KeepAlive {
    _ns: TestNamespace,
    _operator: Operator,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_call_resends_an_idempotent_call_with_the_same_key() {
    let (_keep, done, tools) = at_most_once_run(true).await;
    let calls = tools.requests_to("/delete_user");
    assert_eq!(calls.len(), 2, "sent again after the crash");
    let key =
        agentrun::agent::tool::idempotency_key(&kube::ResourceExt::uid(&done).unwrap(), "call_1");
    assert!(
        calls
            .iter()
            .all(|c| c.idempotency_key() == Some(key.as_str()))
    );
    let status = done.status.unwrap();
    let record = &status.tool_calls[0];
    assert_eq!(record.tool_call_id, "call_1");
    assert_eq!(record.resent, Some(1));
    assert_eq!(record.outcome, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_idempotent_call_with_an_unknown_outcome_is_not_sent_again() {
    let (_keep, done, tools) = at_most_once_run(false).await;
    assert_eq!(
        tools.requests_to("/delete_user").len(),
        1,
        "never sent twice"
    );
    let status = done.status.clone().unwrap();
    assert_eq!(status.tool_calls[0].outcome.as_deref(), Some("Unknown"));
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == agentrun::crd::ConditionType::ToolOutcomeUnknown.as_ref())
        .expect("a condition says the outcome is unknown");
    assert!(
        condition.message.contains("call_1"),
        "{}",
        condition.message
    );
    let state = state_of(&done);
    let told = state
        .messages
        .iter()
        .map(|m| agentrun::state::pyjson::dumps(m).unwrap())
        .find(|m| m.contains("\"tool\"") && m.contains("call_1"))
        .expect("the model got a result for call_1");
    assert!(
        told.contains("outcome of this tool call is unknown"),
        "{told}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_history_grows_to_5_mib_finishes() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-large").await;
    let _operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    // 250 KB of incompressible-ish text per lookup: 21 lookups grow the history past 5 MiB.
    let mut seed = 11u64;
    let mut page = String::new();
    while page.len() < 250_000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        page.push_str(&format!("{:x} ", seed >> 16));
    }
    tools.set_reply(
        "/lookup_user",
        agentrun_testkit::tool_server::ToolReply::Json(json!({"page": page})),
    );
    let mut turns: Vec<serde_json::Value> = (0..12)
        .map(|i| json!({"toolCalls": [{"id": format!("call_l{i}"), "name": "lookup_user", "arguments": {"user_id": "u-1"}}]}))
        .collect();
    turns.push(json!({"toolCalls": [{"id": "call_d", "name": "delete_user", "arguments": {"user_id": "u-1"}}]}));
    turns.extend((12..21).map(|i| json!({"toolCalls": [{"id": format!("call_l{i}"), "name": "lookup_user", "arguments": {"user_id": "u-1"}}]})));
    turns.push(json!({"content": "Read everything."}));
    let mut agent: serde_json::Value = serde_json::from_str(&agent_yaml(
        &ns.name,
        "ops",
        json!({"scripted": {"turns": turns}}),
        &tools,
    ))
    .unwrap();
    agent["spec"]["maxTurns"] = json!(40);
    cp.apply(Identity::Admin, &agent.to_string());
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Read all pages"),
    );

    let halted = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    let status = halted.status.clone().unwrap();
    assert_ne!(
        status.run_state_encoding,
        Some(agentrun::crd::RunStateEncoding::Json)
    );
    let name = requests_of(cp, &ns.name, "r1").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    decide(
        cp,
        Identity::Alice,
        &ns.name,
        &name,
        json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ok"}}),
    );
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.final_output.as_deref(), Some("Read everything."));
    assert_eq!(
        status.run_state_encoding,
        Some(agentrun::crd::RunStateEncoding::GzipBase64Chunks)
    );
    let client = cp.client(Identity::Admin).await;
    let state = agentrun::chunk_store::load(&client, &done)
        .await
        .unwrap()
        .unwrap();
    assert!(
        state.to_json().len() > 5 * 1024 * 1024,
        "{} bytes",
        state.to_json().len()
    );
    assert_eq!(
        state.approval_metadata["call_d"].approver_id.as_deref(),
        Some("alice@example.com")
    );
    assert_eq!(tools.calls_of("call_d"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecided_request_expires_and_the_model_is_told_approval_timed_out() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-expiry").await;
    let _operator = start_operator(cp, &ns).await;
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model.push(Reply::tool_calls(&[(
        "call_1",
        "delete_user",
        json!({"user_id": "u-1"}),
    )]));
    model.push(Reply::text("Nobody approved; nothing was deleted."));
    let mut agent: serde_json::Value =
        serde_json::from_str(&agent_yaml(&ns.name, "ops", openai_model(&model), &tools)).unwrap();
    agent["spec"]["tools"][0]["approvalTimeout"] = json!("2s");
    cp.apply(Identity::Admin, &agent.to_string());
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete u-1"),
    );
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    assert!(tools.requests().is_empty(), "nothing auto-approves");
    let last = model.requests().last().unwrap().json().to_string();
    assert!(last.contains("approval timed out"), "{last}");
    let state = state_of(&done);
    assert_eq!(
        state.approval_metadata["call_1"].reason.as_deref(),
        Some("expired")
    );
    assert_eq!(
        state.rejected_tools[0].message.as_deref(),
        Some(controller::EXPIRED_MESSAGE)
    );
    let request = &requests_of(cp, &ns.name, "r1").await[0];
    assert_eq!(
        request.status.as_ref().unwrap().phase,
        Some(agentrun::crd::ApprovalPhase::Expired)
    );
    // The policy and the CRD refuse a late decision on an expired request.
    let out = cp.kubectl(
        Identity::Alice,
        &[
            "patch",
            "apr",
            request.metadata.name.as_deref().unwrap(),
            "-n",
            &ns.name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"decision":"Approved","approverId":"alice@example.com","reason":"late"}}"#,
        ],
    );
    assert!(!out.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_token_cannot_write_another_runs_status() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-worker-rbac").await;
    let _operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    let scripted = json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted.clone(), &tools),
    );
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "other", scripted, &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete u-1"),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r2", "ops", "Delete u-1"),
    );
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    wait_for_phase(cp, &ns.name, "r2", AgentRunPhase::AwaitingApproval).await;

    let token = cp.service_account_token(&ns.name, "r1-worker").await;
    let worker = cp.client_with_token(&token).await;
    let runs: Api<AgentRun> = Api::namespaced(worker.clone(), &ns.name);
    let forbidden =
        |r: Result<AgentRun, kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
    let patch = Patch::Merge(json!({"status": {"finalOutput": "forged"}}));
    assert!(
        forbidden(
            runs.patch_status("r2", &PatchParams::default(), &patch)
                .await
        ),
        "another run's status"
    );
    assert!(forbidden(runs.get("r2").await), "another run");
    assert!(
        forbidden(
            runs.patch(
                "r1",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"input": "x"}}))
            )
            .await
        ),
        "its own spec"
    );
    runs.get("r1").await.expect("its own run");
    runs.get_status("r1").await.expect("its own status");
    // The run uses the snapshot of its Agent in its status: no Agent is readable.
    let agents: Api<agentrun::crd::Agent> = Api::namespaced(worker.clone(), &ns.name);
    assert!(matches!(agents.get("ops").await, Err(kube::Error::Api(s)) if s.code == 403));
    assert!(matches!(agents.get("other").await, Err(kube::Error::Api(s)) if s.code == 403));
    // ApprovalRequests are read one by one (to check a call before it is sent), never changed.
    let requests: Api<agentrun::crd::ApprovalRequest> = Api::namespaced(worker.clone(), &ns.name);
    let name = agentrun::crd::approval_request_name("r1", "call_1");
    requests.get(&name).await.expect("its ApprovalRequest");
    assert!(matches!(
        requests.patch(&name, &PatchParams::default(), &Patch::Merge(json!({"spec": {"decision": "Approved", "approverId": "x"}}))).await,
        Err(kube::Error::Api(s)) if s.code == 403
    ));
    assert!(matches!(
        requests.list(&ListParams::default()).await,
        Err(kube::Error::Api(s)) if s.code == 403
    ));
    // No ConfigMaps at all; offloaded states are RunStateChunks.
    let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(worker.clone(), &ns.name);
    assert!(
        matches!(maps.get("kube-root-ca.crt").await, Err(kube::Error::Api(s)) if s.code == 403)
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(worker, &ns.name);
    assert!(
        matches!(secrets.list(&ListParams::default()).await, Err(kube::Error::Api(s)) if s.code == 403)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_requests_stay_as_long_as_their_run_and_go_with_it() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-keep").await;
    let _operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    let scripted = json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted, &tools),
    );
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "ops", "Delete u-1"),
    );
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    let name = requests_of(cp, &ns.name, "r1").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    // Deleting the decision record alone does not remove it while its run exists.
    assert_success(
        &cp.kubectl(
            Identity::Admin,
            &["delete", "apr", &name, "-n", &ns.name, "--wait=false"],
        ),
        "delete apr",
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kept = requests_of(cp, &ns.name, "r1").await;
    assert_eq!(kept.len(), 1, "the finalizer keeps the ApprovalRequest");
    assert!(kept[0].metadata.deletion_timestamp.is_some());
    // Deleting the run releases it; the garbage collector removes it with the run.
    assert_success(
        &cp.kubectl(
            Identity::Admin,
            &[
                "delete",
                "agentrun",
                "r1",
                "-n",
                &ns.name,
                "--wait=true",
                "--timeout=60s",
            ],
        ),
        "delete run",
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !requests_of(cp, &ns.name, "r1").await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the ApprovalRequest outlived its run"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `kubectl get agents` shows each Agent's tools, and its Ready condition says whether a worker
/// could run it (here: a tool whose parameters are not a valid JSON Schema).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_show_their_tools_and_whether_their_spec_is_valid() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-agent-status").await;
    let _operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    let scripted = json!({"scripted": {"turns": [{"content": "Done."}]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted.clone(), &tools),
    );
    let mut broken: serde_json::Value =
        serde_json::from_str(&agent_yaml(&ns.name, "broken", scripted, &tools)).unwrap();
    broken["spec"]["tools"][1]["parameters"] =
        json!({"type": "object", "properties": {"x": {"type": 12}}});
    cp.apply(Identity::Admin, &broken.to_string());

    let api: Api<agentrun::crd::Agent> =
        Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let ready_of = |agent: &agentrun::crd::Agent| {
        agent.status.as_ref().and_then(|s| {
            agentrun::crd::find_condition(&s.conditions, "Ready")
                .map(|c| (c.reason.clone(), c.message.clone(), s.observed_generation))
        })
    };
    let (ops, broken) = loop {
        let ops = api.get("ops").await.unwrap();
        let broken = api.get("broken").await.unwrap();
        if ready_of(&ops).is_some() && ready_of(&broken).is_some() {
            break (ops, broken);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no Agent status written"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (reason, _, generation) = ready_of(&ops).unwrap();
    assert_eq!(reason, "Valid");
    assert_eq!(generation, ops.metadata.generation);
    let (reason, message, _) = ready_of(&broken).unwrap();
    assert_eq!(reason, "InvalidSpec");
    assert!(message.contains("tools[1].parameters"), "{message}");

    let table = cp.kubectl(Identity::Admin, &["get", "agents", "-n", &ns.name]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("ops ") && l.contains("delete_user,lookup_user")),
        "{table}"
    );
}
