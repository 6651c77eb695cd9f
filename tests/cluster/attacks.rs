//! The attacks of issue 12 against the whole operator (controller, workers, admission policies),
//! performed as an attacker with ordinary roles would: carol and bob hold the built-in `edit` role
//! in the namespace (and so may act as any of its ServiceAccounts), bob and alice are approvers.
//! Each test asserts the refusal or the `Failed`/`Expired` outcome, that the tool received nothing,
//! and that the record names nobody who did not decide. The API-level attacks on the policies
//! alone are in `approval_policy`.

use std::time::Duration;

use agentrun::crd::{
    AgentRun, AgentRunPhase, ApprovalPhase, ApprovalRecord, ApprovalRequest, ConditionType,
    approval_request_name, find_condition,
};
use agentrun::crd::{names, policy};
use agentrun::state::RunState;
use agentrun_testkit::cluster::{
    ControlPlane, Identity, TestNamespace, assert_refused, assert_success,
};
use agentrun_testkit::operator::{
    Operator, start_dev_kubelet, start_operator, start_operator_with, test_config,
};
use agentrun_testkit::runs::{agent_yaml, approvers_role, run_yaml, wait_for_phase};
use agentrun_testkit::tool_server::ToolServer;
use agentrun_testkit::wait::eventually;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

/// One run halting on `delete_user {"user_id": "u-1"}`, then finishing.
fn one_call() -> Value {
    json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}})
}

/// alice and bob approve; carol, bob and the namespace's CI ServiceAccount `ci` hold the
/// built-in `edit` role.
fn grant(cp: &ControlPlane, ns: &str) {
    let edit = format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: editors, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol@example.com}}
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob@example.com}}
- {{kind: ServiceAccount, name: ci, namespace: {ns}}}
"#
    );
    let approvers = approvers_role(ns, &["agentrun:approvers"]);
    cp.apply(Identity::Admin, &format!("{approvers}---\n{edit}"));
}

/// A namespace with its operator, the roles above, a tool server and the Agent `ops`.
async fn scene(prefix: &str) -> (&'static ControlPlane, TestNamespace, Operator, ToolServer) {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace(prefix).await;
    let operator = start_operator(cp, &ns).await;
    grant(cp, &ns.name);
    let tools = ToolServer::start().await;
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", one_call(), &tools),
    );
    (cp, ns, operator, tools)
}

/// Creates run `name` of Agent `ops` as `identity` (retried while the policies settle).
async fn create_run(cp: &ControlPlane, identity: Identity, ns: &str, name: &str, extra: &[&str]) {
    let yaml = run_yaml(ns, name, "ops", "Delete u-1");
    let mut args = vec!["apply", "-f", "-"];
    args.extend_from_slice(extra);
    eventually(Duration::from_secs(60), "create the run", || async {
        let out = cp.kubectl_with_stdin(identity, &args, Some(&yaml));
        out.status.success().then_some(())
    })
    .await;
}

/// Patches `request` with a decision as `identity`.
fn decide(
    cp: &ControlPlane,
    identity: Identity,
    ns: &str,
    request: &str,
    patch: Value,
) -> std::process::Output {
    cp.kubectl(
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
    )
}

fn approve_as(
    cp: &ControlPlane,
    identity: Identity,
    ns: &str,
    request: &str,
) -> std::process::Output {
    decide(
        cp,
        identity,
        ns,
        request,
        json!({"spec": {"decision": "Approved", "approverId": identity.username(), "reason": "CR-1234"}}),
    )
}

/// Patches run `run`'s status as `identity` acting as the run's worker ServiceAccount (what the
/// built-in `edit` role allows).
fn as_worker(
    cp: &ControlPlane,
    identity: Identity,
    ns: &str,
    run: &str,
    patch: &Value,
) -> std::process::Output {
    let account = format!(
        "--as=system:serviceaccount:{ns}:{}",
        names::worker_account_name(run)
    );
    cp.kubectl(
        identity,
        &[
            "patch",
            "agentrun",
            run,
            "-n",
            ns,
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
            &account,
        ],
    )
}

/// The status fields of a RunState as a worker writes them.
fn stored(state: &RunState) -> Value {
    let text = state.to_json();
    json!({
        "runState": text,
        "runStateEncoding": "json",
        "runStateBytes": text.len(),
        "runStateDigest": agentrun::crd::stored_state::sha256_hex(text.as_bytes()),
    })
}

async fn run_of(cp: &ControlPlane, ns: &str, name: &str) -> AgentRun {
    Api::<AgentRun>::namespaced(cp.client(Identity::Admin).await, ns)
        .get(name)
        .await
        .expect("the run")
}

async fn request_of(cp: &ControlPlane, ns: &str, name: &str) -> ApprovalRequest {
    Api::<ApprovalRequest>::namespaced(cp.client(Identity::Admin).await, ns)
        .get(name)
        .await
        .expect("the request")
}

fn state_of(run: &AgentRun) -> RunState {
    RunState::from_json(run.status.as_ref().unwrap().run_state.as_deref().unwrap()).unwrap()
}

fn ready(run: &AgentRun) -> (String, String) {
    let c = find_condition(
        &run.status.as_ref().unwrap().conditions,
        ConditionType::Ready,
    )
    .unwrap();
    (c.reason.clone(), c.message.clone())
}

/// The run's state with `call_1`'s arguments changed to `u-666` in the conversation.
fn swapped(state: &RunState) -> RunState {
    RunState::from_json(&state.to_json().replace(r#"\"u-1\""#, r#"\"u-666\""#)).unwrap()
}

/// Attack 1 of the issue: carol, acting as a run's worker, injects an approval (and moves the run
/// on). The API server refuses it; the run waits; nothing is sent; the audit names nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_injected_through_the_worker_identity_is_refused() {
    let (cp, ns, _operator, tools) = scene("attack-inject").await;
    let ns = ns.name.as_str();
    create_run(cp, Identity::Carol, ns, "r2", &[]).await;
    let halted = wait_for_phase(cp, ns, "r2", AgentRunPhase::AwaitingApproval).await;
    let mut forged = state_of(&halted);
    forged
        .approve(
            "call_1",
            agentrun::state::Approval::new()
                .approver_id("alice@example.com")
                .reason("authorized per change CR-1234"),
        )
        .unwrap();
    let mut move_on = stored(&forged);
    move_on["phase"] = json!("Running");
    move_on["step"] = json!(1);
    let out = as_worker(cp, Identity::Carol, ns, "r2", &json!({"status": move_on}));
    assert_refused(
        &out,
        "moving the run as its worker",
        &[policy::RUN_STATUS_MESSAGE],
    );
    let out = as_worker(
        cp,
        Identity::Carol,
        ns,
        "r2",
        &json!({"status": stored(&forged)}),
    );
    assert_refused(
        &out,
        "a forged state while the run waits",
        &[policy::RUN_NOT_RUNNING_MESSAGE],
    );

    tokio::time::sleep(Duration::from_secs(3)).await;
    let run = run_of(cp, ns, "r2").await;
    assert_eq!(
        run.status.as_ref().unwrap().phase,
        Some(AgentRunPhase::AwaitingApproval)
    );
    assert!(state_of(&run).approved_tools.is_empty());
    assert_eq!(tools.calls_of("call_1"), 0, "the tool received nothing");
    let request = request_of(cp, ns, &approval_request_name("r2", "call_1")).await;
    assert_eq!(request.spec.decision, None, "nobody decided");
    assert_eq!(request.status.unwrap().verified_identity, None);
}

/// Attack 2: the call's arguments swapped after the halt. While the run waits, the API server
/// refuses the change; once alice approved and the next worker is about to start (the run is
/// Running, so its worker may write), carol swaps them: the worker checks the call against the
/// request before sending it, refuses, and the run fails `TamperedState`. The tool gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_swapped_after_the_halt_never_reach_the_tool() {
    let (cp, ns, mut operator, tools) = scene("attack-args").await;
    let ns = ns.name.as_str();
    create_run(cp, Identity::Carol, ns, "r1", &[]).await;
    let halted = wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
    let out = as_worker(
        cp,
        Identity::Carol,
        ns,
        "r1",
        &json!({"status": stored(&swapped(&state_of(&halted)))}),
    );
    assert_refused(
        &out,
        "swapping arguments while the run waits",
        &[policy::RUN_NOT_RUNNING_MESSAGE],
    );

    // No kubelet: the approved step's worker Pod is created but does not run yet.
    operator.kubelet.abort();
    let request = approval_request_name("r1", "call_1");
    assert_success(
        &approve_as(cp, Identity::Alice, ns, &request),
        "alice approves",
    );
    let resumed = eventually(Duration::from_secs(60), "the resume", || async {
        let run = run_of(cp, ns, "r1").await;
        (run.status.as_ref().and_then(|s| s.step) == Some(1)).then_some(run)
    })
    .await;
    assert_eq!(state_of(&resumed).approved_tools, ["call_1"]);
    let out = as_worker(
        cp,
        Identity::Carol,
        ns,
        "r1",
        &json!({"status": stored(&swapped(&state_of(&resumed)))}),
    );
    assert_success(&out, "a worker's write while the run is Running");
    operator.kubelet = start_dev_kubelet(cp, ns).await;

    let failed = wait_for_phase(cp, ns, "r1", AgentRunPhase::Failed).await;
    let (reason, message) = ready(&failed);
    assert_eq!(reason, "TamperedState", "{message}");
    assert!(message.contains("arguments about to be sent"), "{message}");
    assert_eq!(tools.calls_of("call_1"), 0, "the tool received nothing");
}

/// Attack 3: the tool's endpoint swapped after the halt. The run uses the Agent it started with:
/// alice's approval sends the call to the endpoint her request showed, never to the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_endpoint_swapped_after_the_halt_is_not_called() {
    let (cp, ns, _operator, tools) = scene("attack-endpoint").await;
    let ns = ns.name.as_str();
    let evil = ToolServer::start().await;
    create_run(cp, Identity::Carol, ns, "r1", &[]).await;
    wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
    assert_success(
        &cp.kubectl_with_stdin(
            Identity::Carol,
            &["apply", "-f", "-"],
            Some(&agent_yaml(ns, "ops", one_call(), &evil)),
        ),
        "carol points the Agent at her own tool",
    );
    let name = approval_request_name("r1", "call_1");
    let request = request_of(cp, ns, &name).await;
    assert_eq!(
        request.spec.tool_endpoint.as_deref(),
        Some(tools.url("/delete_user").as_str())
    );
    assert!(request.spec.tool_definition_digest.is_some());
    assert_success(
        &approve_as(cp, Identity::Alice, ns, &name),
        "alice approves",
    );
    wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(
        tools.calls_of("call_1"),
        1,
        "the approved endpoint ran the call once"
    );
    assert_eq!(
        evil.request_count(),
        0,
        "the swapped endpoint received nothing"
    );
}

/// Attack 4: self-approval. bob cannot switch separation of duties off from an Agent, nor decide
/// a run he created; a run he created as a namespace ServiceAccount is the documented limit, which
/// the controller's strict mode closes: his decision is not applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_approval_is_refused_even_through_a_service_account_in_strict_mode() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("attack-self").await;
    let mut config = test_config(&ns.name);
    config.policy.decisions.strict_separation_of_duties = true;
    let _operator = start_operator_with(cp, &ns, config).await;
    grant(cp, &ns.name);
    let tools = ToolServer::start().await;
    let ns = ns.name.as_str();
    let mut agent: Value =
        serde_json::from_str(&agent_yaml(ns, "ops", one_call(), &tools)).unwrap();
    agent["spec"]["approvals"] = json!({"allowSelfApproval": true});
    let out = cp.kubectl_with_stdin(
        Identity::Bob,
        &["apply", "-f", "-"],
        Some(&agent.to_string()),
    );
    assert_refused(
        &out,
        "an Agent switching separation of duties off",
        &["approvals"],
    );
    cp.apply(Identity::Admin, &agent_yaml(ns, "ops", one_call(), &tools));

    create_run(cp, Identity::Bob, ns, "bobs", &[]).await;
    wait_for_phase(cp, ns, "bobs", AgentRunPhase::AwaitingApproval).await;
    let out = approve_as(
        cp,
        Identity::Bob,
        ns,
        &approval_request_name("bobs", "call_1"),
    );
    assert_refused(
        &out,
        "bob approving his own run",
        &[policy::SEPARATION_OF_DUTIES_MESSAGE],
    );

    let ci = format!("--as=system:serviceaccount:{ns}:ci");
    create_run(cp, Identity::Bob, ns, "via-ci", &[&ci]).await;
    wait_for_phase(cp, ns, "via-ci", AgentRunPhase::AwaitingApproval).await;
    let name = approval_request_name("via-ci", "call_1");
    assert_success(
        &approve_as(cp, Identity::Bob, ns, &name),
        "the API server cannot tell bob from ci",
    );
    let refused = eventually(Duration::from_secs(60), "the refusal", || async {
        let run = run_of(cp, ns, "via-ci").await;
        (ready(&run).0 == "SeparationOfDuties").then_some(run)
    })
    .await;
    assert!(
        ready(&refused).1.contains("impersonate"),
        "{}",
        ready(&refused).1
    );
    assert_eq!(
        refused.status.as_ref().unwrap().phase,
        Some(AgentRunPhase::AwaitingApproval)
    );
    let request = request_of(cp, ns, &name).await;
    let status = request.status.unwrap();
    assert_eq!(status.phase, Some(ApprovalPhase::Pending), "not applied");
    let verified = find_condition(&status.conditions, ConditionType::Verified).unwrap();
    assert_eq!(
        (verified.status.as_str(), verified.reason.as_str()),
        ("False", "SeparationOfDuties")
    );
    assert_eq!(tools.calls_of("call_1"), 0, "the tool received nothing");
}

/// Attack 7: a late approval. With the controller down, alice approves after the request's
/// deadline: the decision is first observed late, so it is recorded Expired and the model is told
/// the approval timed out; the tool gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_first_observed_after_the_deadline_is_expired() {
    let (cp, ns, mut operator, tools) = scene("attack-late").await;
    let ns = ns.name.as_str();
    let mut agent: Value =
        serde_json::from_str(&agent_yaml(ns, "ops", one_call(), &tools)).unwrap();
    agent["spec"]["tools"][0]["approvalTimeout"] = json!("3s");
    cp.apply(Identity::Admin, &agent.to_string());
    create_run(cp, Identity::Carol, ns, "r1", &[]).await;
    wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
    operator.controller.abort();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let name = approval_request_name("r1", "call_1");
    assert_success(
        &approve_as(cp, Identity::Alice, ns, &name),
        "alice approves, late",
    );
    operator.controller = agentrun_testkit::operator::start_controller(cp, ns).await;
    let done = wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    let state = state_of(&done);
    assert!(state.approved_tools.is_empty());
    assert_eq!(
        state.rejected_tools[0].message.as_deref(),
        Some(agentrun::controller::EXPIRED_MESSAGE)
    );
    assert_eq!(
        state.approval_metadata["call_1"].approver_id, None,
        "nobody is named"
    );
    let status = request_of(cp, ns, &name).await.status.unwrap();
    assert_eq!(status.phase, Some(ApprovalPhase::Expired));
    assert_eq!(status.verified_identity, None);
    assert_eq!(tools.calls_of("call_1"), 0, "the tool received nothing");
}

/// Attack 8: a backdated decision. alice writes managed fields dated 2020 with her decision (and
/// names the controller as field manager): the decision's time is the time the controller
/// observed it, in the request's status and in the RunState's audit entry alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_time_is_never_read_from_what_a_client_writes() {
    let (cp, ns, _operator, tools) = scene("attack-backdate").await;
    let ns = ns.name.as_str();
    create_run(cp, Identity::Carol, ns, "r1", &[]).await;
    wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
    let name = approval_request_name("r1", "call_1");
    let before = k8s_openapi::jiff::Timestamp::now().as_second() - 1;
    let patch = json!({
        "metadata": {"managedFields": [{
            "manager": "backdated", "operation": "Update", "apiVersion": "agentrun.dev/v1alpha1",
            "time": "2020-01-01T00:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:decision": {}, "f:approverId": {}, "f:reason": {}}}
        }]},
        "spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "CR-1234"}
    });
    let out = cp.kubectl(
        Identity::Alice,
        &[
            "patch",
            "apr",
            &name,
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
            "--field-manager=agentrun-controller",
        ],
    );
    assert_success(&out, "alice decides with backdated managed fields");
    let done = wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    let decided = request_of(cp, ns, &name)
        .await
        .status
        .unwrap()
        .decided_at
        .unwrap()
        .0
        .as_second();
    assert!(
        decided >= before,
        "decidedAt {decided} is not before the decision ({before})"
    );
    let audit = state_of(&done).approval_metadata["call_1"]
        .timestamp
        .timestamp();
    assert_eq!(audit, decided);
    assert_eq!(tools.calls_of("call_1"), 1);
}

/// Attack 9: the record erased by deleting the run. The controller writes each request to a
/// cluster-scoped ApprovalRecord before the run's requests go; the editor who deleted the run
/// can neither change nor delete it, and the audit of the deleted run reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_of_a_decision_outlives_its_run() {
    let (cp, ns, _operator, tools) = scene("attack-erase").await;
    let ns = ns.name.as_str();
    create_run(cp, Identity::Carol, ns, "r1", &[]).await;
    wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
    let name = approval_request_name("r1", "call_1");
    assert_success(
        &approve_as(cp, Identity::Alice, ns, &name),
        "alice approves",
    );
    let done = wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    assert_success(
        &cp.kubectl(
            Identity::Carol,
            &[
                "delete",
                "agentrun",
                "r1",
                "-n",
                ns,
                "--wait=true",
                "--timeout=60s",
            ],
        ),
        "carol deletes her run",
    );
    let requests: Api<ApprovalRequest> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    eventually(
        Duration::from_secs(60),
        "the requests go with the run",
        || async {
            requests
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let records: Api<ApprovalRecord> = Api::all(cp.client(Identity::Admin).await);
    let record_name = names::approval_record_name(ns, &name);
    let record = records.get(&record_name).await.expect("the record");
    assert_eq!(record.spec.phase, ApprovalPhase::Approved);
    assert_eq!(
        record.spec.request.approver_id.as_deref(),
        Some("alice@example.com")
    );
    assert_eq!(
        record.spec.verified_identity.unwrap().username,
        "alice@example.com"
    );
    assert_eq!(record.spec.request.agent_run_ref.uid, done.uid().unwrap());
    assert_eq!(record.spec.executed, Some(true));
    for verb in [
        vec!["delete", "approvalrecord", record_name.as_str()],
        vec!["annotate", "approvalrecord", record_name.as_str(), "x=y"],
    ] {
        let out = cp.kubectl(Identity::Carol, &verb);
        assert!(!out.status.success(), "carol may {verb:?}");
    }
    // The audit of the deleted run, from its records.
    let plugin = env!("CARGO_BIN_EXE_kubectl-agentrun");
    let out = std::process::Command::new(plugin)
        .env("KUBECONFIG", cp.kubeconfig(Identity::Admin))
        .env("HOME", std::env::temp_dir())
        .args(["audit", "r1", "-n", ns, "-o", "json"])
        .output()
        .unwrap();
    assert_success(&out, "kubectl agentrun audit of a deleted run");
    let audit: Value = serde_json::from_slice(&out.stdout).unwrap();
    let call = &audit["calls"][0];
    assert_eq!(call["approverId"], "alice@example.com", "{audit}");
    assert_eq!(call["verifiedIdentity"], "alice@example.com", "{audit}");
    assert_eq!(call["executed"], true, "{audit}");
    assert_eq!(tools.calls_of("call_1"), 1);
}

/// Attack 10, the key: two runs whose models use the same call id get different Idempotency-Keys,
/// so one run never gets the other's cached answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_keys_are_unique_per_run() {
    let (cp, ns, _operator, tools) = scene("attack-keys").await;
    let ns = ns.name.as_str();
    for run in ["r1", "r2"] {
        create_run(cp, Identity::Carol, ns, run, &[]).await;
        wait_for_phase(cp, ns, run, AgentRunPhase::AwaitingApproval).await;
        assert_success(
            &approve_as(
                cp,
                Identity::Alice,
                ns,
                &approval_request_name(run, "call_1"),
            ),
            "alice approves",
        );
    }
    let mut keys = vec![];
    for run in ["r1", "r2"] {
        let done = wait_for_phase(cp, ns, run, AgentRunPhase::Succeeded).await;
        let key = agentrun::agent::tool::idempotency_key(&done.uid().unwrap(), "call_1");
        assert_eq!(tools.calls_with_key(&key), 1, "{run}");
        keys.push(key);
    }
    assert_ne!(keys[0], keys[1]);
}
