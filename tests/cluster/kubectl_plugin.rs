//! The `kubectl-agentrun` plugin against the real control plane: the controller and the dev
//! kubelet run in this process (as in `operator_e2e.rs`), the agent uses the scripted model and a
//! real HTTP tool server, and every plugin command runs as the built binary with an identity's own
//! kubeconfig, like a person at a terminal.

use std::process::{Command, Output};
use std::time::Duration;

use agentrun::crd::{AgentRunPhase, ApprovalRequest};
use agentrun_testkit::cluster::{ControlPlane, Identity, TestNamespace, assert_success};
use agentrun_testkit::operator::Operator;
use agentrun_testkit::runs::{
    agent_yaml, approvers_role, requests_of, run_yaml, scripted_model, wait_for_phase,
};
use agentrun_testkit::tool_server::ToolServer;
use kube::api::Api;
use serde_json::{Value, json};

async fn start_operator(cp: &ControlPlane, ns: &TestNamespace) -> Operator {
    let operator = agentrun_testkit::operator::start_operator(cp, ns).await;
    grant_roles(cp, &ns.name);
    operator
}

/// alice, bob and the GitOps identity may read runs and read and decide ApprovalRequests in the
/// namespace; carol (a requester) may create runs, so that no approver decides on a run of their
/// own.
fn grant_roles(cp: &ControlPlane, ns: &str) {
    let requesters = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: requesters, namespace: {ns}}}
rules:
- apiGroups: [agentrun.dev]
  resources: [agentruns]
  verbs: [get, list, watch, create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: requesters, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: requesters}}
subjects: [{{kind: Group, name: "agentrun:requesters"}}]
"#
    );
    let approvers = approvers_role(ns, &["agentrun:approvers", "agentrun:gitops"]);
    cp.apply(Identity::Admin, &format!("{approvers}---{requesters}"));
}

/// Puts `approver` on the GitOps approver allow-list (empty as generated: GitOps decisions are
/// refused until an admin lists someone), as the docs tell an admin without Helm to, and waits
/// until the list is in effect: the GitOps identity applying `manifest` with someone else as the
/// approver is refused as "not on the list" rather than "the list is empty" (a refusal, so no
/// decision event in the API server's log).
async fn allow_gitops_approver(cp: &ControlPlane, manifest: &str, approver: &str) {
    use agentrun::crd::policy::{
        GITOPS_ALLOW_LIST_VARIABLE, GITOPS_APPROVERS_POLICY, GITOPS_NOT_ALLOWED_MESSAGE,
        gitops_allow_list,
    };
    let patch = json!([{
        "op": "replace",
        "path": "/spec/variables/0",
        "value": {"name": GITOPS_ALLOW_LIST_VARIABLE, "expression": gitops_allow_list(&[approver])},
    }]);
    assert_success(
        &cp.kubectl(
            Identity::Admin,
            &[
                "patch",
                "validatingadmissionpolicy",
                GITOPS_APPROVERS_POLICY,
                "--type=json",
                "-p",
                &patch.to_string(),
            ],
        ),
        "the GitOps allow-list",
    );
    let probe = manifest.replace(approver, "not-listed@example.com");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = cp.kubectl_with_stdin(
            Identity::Gitops,
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            Some(&probe),
        );
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && err.contains(GITOPS_NOT_ALLOWED_MESSAGE) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the GitOps allow-list never took effect: {err}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates a run as `identity`. Right after `crds/` is installed the API server may refuse it for
/// a moment while its admission policies come into effect (the CRD's kind not yet known to a
/// policy, or the creator check in effect before the creator stamp): such refusals are retried,
/// any other failure or a refusal lasting 60 s fails the test.
async fn create_run(cp: &ControlPlane, identity: Identity, yaml: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = cp.kubectl_with_stdin(identity, &["apply", "-f", "-"], Some(yaml));
        let stderr = String::from_utf8_lossy(&out.stderr);
        let settling = stderr
            .contains("There can be a delay between when CustomResourceDefinitions")
            || stderr.contains("agentrun.dev/created-by must be your own username");
        if out.status.success() || !settling || tokio::time::Instant::now() > deadline {
            assert_success(&out, "create the run");
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Starts the operator, creates the agent (as admin) and the run `r1` (as carol), and waits for
/// the run's first halt. Returns the namespace, the operator, the tool server and the
/// ApprovalRequests of the halt.
async fn halted_run(
    cp: &'static ControlPlane,
    prefix: &str,
    turns: Value,
    input: &str,
) -> (TestNamespace, Operator, ToolServer, Vec<ApprovalRequest>) {
    let ns = cp.namespace(prefix).await;
    let operator = start_operator(cp, &ns).await;
    let tools = ToolServer::start().await;
    cp.apply(
        Identity::Admin,
        &agent_yaml(&ns.name, "ops", scripted_model(turns), &tools),
    );
    create_run(cp, Identity::Carol, &run_yaml(&ns.name, "r1", "ops", input)).await;
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    let requests = requests_of(cp, &ns.name, "r1").await;
    (ns, operator, tools, requests)
}

async fn request(cp: &ControlPlane, ns: &str, name: &str) -> ApprovalRequest {
    let api: Api<ApprovalRequest> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    api.get(name).await.expect("get approval request")
}

/// The result of one plugin run.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Panics unless the command succeeded; returns its stdout.
    fn ok(self, what: &str) -> String {
        assert_eq!(
            self.code,
            Some(0),
            "{what} failed:\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self.stdout
    }

    /// Panics unless the command failed with `code` and one error line on stderr; returns it.
    fn fails(self, code: i32, what: &str) -> String {
        assert_eq!(
            self.code,
            Some(code),
            "{what}: expected exit code {code}:\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        assert!(self.stdout.is_empty(), "{what}: stdout: {}", self.stdout);
        self.stderr
    }

    fn json(self, what: &str) -> Value {
        let text = self.ok(what);
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {text}"))
    }
}

/// Runs the built `kubectl-agentrun` binary as `identity` (its kubeconfig in `KUBECONFIG`).
fn plugin(cp: &ControlPlane, identity: Identity, args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-agentrun"))
        .env("KUBECONFIG", cp.kubeconfig(identity))
        .env("HOME", std::env::temp_dir())
        .args(args)
        .output()
        .expect("run kubectl-agentrun");
    Run::from(out)
}

/// The one call of `report` (audit `-o json`) with this tool call id.
fn audited_call<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .find(|c| c["toolCallId"] == id)
        .unwrap_or_else(|| panic!("no audited call {id}: {report}"))
}

/// The API server's audit events of decisions written to `request`: patches of the object
/// itself (not its status) that set `spec.decision`.
async fn decision_events(cp: &ControlPlane, ns: &str, request: &str) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let events: Vec<Value> = cp
            .audit_events()
            .into_iter()
            .filter(|e| {
                let object = &e["objectRef"];
                e["verb"] == "patch"
                    && e["stage"] == "ResponseComplete"
                    && object["resource"] == "approvalrequests"
                    && object["namespace"] == ns
                    && object["name"] == request
                    && object.get("subresource").is_none()
                    && e["responseStatus"]["code"] == 200
                    && e["responseObject"]["spec"].get("decision").is_some()
                    && e["requestObject"]["spec"].get("decision").is_some()
            })
            .collect();
        if !events.is_empty() || tokio::time::Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The row of a table whose first column is `first`, split on whitespace.
fn row<'a>(table: &'a str, first: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{table}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_approve_as_alice_and_audit_against_the_api_servers_log() {
    let cp = ControlPlane::shared().await;
    let turns = json!([
        {"toolCalls": [
            {"id": "call_look", "name": "lookup_user", "arguments": {"user_id": "u-1"}},
            {"id": "call_del", "name": "delete_user", "arguments": {"user_id": "u-1"}}
        ]},
        {"content": "User u-1 deleted."}
    ]);
    let (ns, _operator, tools, requests) =
        halted_run(cp, "plugin-approve", turns, "Delete user u-1").await;
    let ns = ns.name.as_str();
    assert_eq!(requests.len(), 1, "only delete_user needs approval");
    let apr = requests[0].metadata.name.clone().unwrap();
    assert_eq!(
        tools.calls_of("call_look"),
        1,
        "lookup_user ran before the halt"
    );

    // list: the run, then the pending request.
    let table = plugin(cp, Identity::Alice, &["list", "-n", ns]).ok("list");
    assert!(table.starts_with("NAME "), "{table}");
    let cells = row(&table, "r1");
    assert_eq!(
        &cells[..5],
        ["r1", "AwaitingApproval", "ops", "0", "1"],
        "{table}"
    );
    let runs = plugin(cp, Identity::Alice, &["list", "-n", ns, "-o", "json"]).json("list -o json");
    assert_eq!(runs[0]["name"], "r1");
    assert_eq!(runs[0]["phase"], "AwaitingApproval");
    assert_eq!(runs[0]["pendingApprovals"], 1);
    let pending =
        plugin(cp, Identity::Alice, &["list", "--pending", "-n", ns]).ok("list --pending");
    let cells = row(&pending, &apr);
    assert_eq!(
        &cells[..3],
        [apr.as_str(), "r1", "delete_user"],
        "{pending}"
    );
    assert!(pending.contains(r#"{"user_id": "u-1"}"#), "{pending}");
    let pending_json = plugin(
        cp,
        Identity::Alice,
        &["list", "--pending", "-n", ns, "-o", "json"],
    )
    .json("list --pending -o json");
    assert_eq!(pending_json.as_array().unwrap().len(), 1);
    assert_eq!(pending_json[0]["toolCallId"], "call_del");
    assert_eq!(pending_json[0]["arguments"], r#"{"user_id": "u-1"}"#);

    // show: the conversation so far and the pending call with its request.
    let shown = plugin(cp, Identity::Alice, &["show", "r1", "-n", ns]).ok("show");
    for expected in [
        "Phase:      AwaitingApproval (step 0)",
        "#1 user\n    Delete user u-1\n",
        r#"-> tool call call_look lookup_user({"user_id":"u-1"})"#,
        &format!(
            r#"-> tool call call_del delete_user({{"user_id":"u-1"}})   [awaiting approval: {apr}]"#
        ),
        "tool result of call_look lookup_user",
        "Pending tool calls (1):\n  call_del  delete_user\n",
        "    arguments:        {\"user_id\": \"u-1\"}\n",
        &format!("    approval request: {apr}\n"),
    ] {
        assert!(
            shown.contains(expected),
            "show lacks {expected:?}:\n{shown}"
        );
    }

    // Usage and lookup errors: one line on stderr, exit 2 and 1.
    let err = plugin(cp, Identity::Alice, &["approve", &apr, "-n", ns])
        .fails(2, "approve without --reason");
    assert!(err.contains("--reason"), "{err}");
    let err = plugin(
        cp,
        Identity::Alice,
        &["approve", "no-such-request", "-n", ns, "--reason", "x"],
    )
    .fails(1, "approve a missing request");
    assert_eq!(
        err,
        format!("error: approvalrequest no-such-request not found in namespace {ns}\n")
    );
    let err = plugin(cp, Identity::Alice, &["show", "no-such-run", "-n", ns])
        .fails(1, "show a missing run");
    assert_eq!(
        err,
        format!("error: agentrun no-such-run not found in namespace {ns}\n")
    );

    // approve as alice: approverId comes from the SelfSubjectReview.
    let reason = "authorized per change CR-1234";
    let out = plugin(
        cp,
        Identity::Alice,
        &["approve", &apr, "-n", ns, "--reason", reason],
    )
    .ok("approve");
    assert_eq!(
        out,
        format!("approvalrequest.agentrun.dev/{apr} approved by alice@example.com\n")
    );
    let decided = request(cp, ns, &apr).await;
    assert_eq!(
        decided.spec.approver_id.as_deref(),
        Some("alice@example.com")
    );
    assert_eq!(decided.spec.reason.as_deref(), Some(reason));
    assert_eq!(decided.spec.message, None);
    wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(tools.calls_of("call_del"), 1);

    // A decision is final: approving or rejecting again is refused with a clear line.
    let err = plugin(
        cp,
        Identity::Alice,
        &["approve", &apr, "-n", ns, "--reason", "again"],
    )
    .fails(1, "approve twice");
    assert_eq!(
        err,
        format!(
            "error: approvalrequest {apr} already has a decision (Approved by alice@example.com): a decision is final and cannot be changed\n"
        )
    );
    let err = plugin(
        cp,
        Identity::Bob,
        &[
            "reject",
            &apr,
            "-n",
            ns,
            "--message",
            "no",
            "--reason",
            "changed my mind",
        ],
    )
    .fails(1, "reject a decided request");
    assert!(err.contains("already has a decision"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");

    // audit: the table and JSON.
    let table = plugin(cp, Identity::Alice, &["audit", "r1", "-n", ns]).ok("audit");
    let lookup = row(&table, "lookup_user");
    assert_eq!(lookup[1], "call_look");
    assert_eq!(lookup[3], "NotRequired", "{table}");
    assert_eq!(lookup.last(), Some(&"yes"), "{table}");
    let delete = row(&table, "delete_user");
    assert_eq!(delete[1], "call_del");
    assert_eq!(delete[3], "Approved", "{table}");
    assert_eq!(delete[4], "alice@example.com", "{table}");
    assert_eq!(delete.last(), Some(&"yes"), "{table}");
    assert!(table.contains(reason), "{table}");
    assert!(!table.contains("warning:"), "{table}");

    let report = plugin(
        cp,
        Identity::Alice,
        &["audit", "r1", "-n", ns, "-o", "json"],
    )
    .json("audit -o json");
    assert_eq!(report["run"], "r1");
    assert_eq!(report["phase"], "Succeeded");
    assert_eq!(report["calls"].as_array().unwrap().len(), 2);
    let lookup = audited_call(&report, "call_look");
    assert_eq!(lookup["decision"], "NotRequired");
    assert_eq!(lookup["executed"], true);
    assert_eq!(
        lookup["argumentsDigest"],
        agentrun::crd::arguments_digest(r#"{"user_id": "u-1"}"#)
    );
    let delete = audited_call(&report, "call_del");
    assert_eq!(delete["tool"], "delete_user");
    assert_eq!(delete["decision"], "Approved");
    assert_eq!(delete["approverId"], "alice@example.com");
    assert_eq!(delete["reason"], reason);
    assert_eq!(delete["message"], Value::Null);
    assert_eq!(delete["executed"], true);
    assert_eq!(delete["approvalRequest"], apr.as_str());
    assert_eq!(
        delete["argumentsDigest"],
        decided.spec.arguments_digest.as_str()
    );
    assert!(delete["decidedAt"].is_string(), "{delete}");
    if let Some(verified) = delete["verifiedIdentity"].as_str() {
        assert_eq!(verified, "alice@example.com");
    }

    // The API server's own audit log: the decision was written by the identity the plugin
    // claimed, with exactly the merge patch a person writes by hand.
    let events = decision_events(cp, ns, &apr).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let event = &events[0];
    assert_eq!(event["user"]["username"], delete["approverId"]);
    assert_eq!(
        event["requestObject"],
        json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": reason}})
    );
    assert_eq!(event["requestObject"]["spec"]["reason"], delete["reason"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_as_bob_with_message_and_reason_and_the_audit_shows_it_never_ran() {
    let cp = ControlPlane::shared().await;
    let turns = json!([
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "I could not delete the user."}
    ]);
    let (ns, _operator, tools, requests) =
        halted_run(cp, "plugin-reject", turns, "Delete user u-1").await;
    let ns = ns.name.as_str();
    let apr = requests[0].metadata.name.clone().unwrap();

    // carol may not decide (no RBAC): the API server's refusal is the one error line.
    let err = plugin(
        cp,
        Identity::Carol,
        &["approve", &apr, "-n", ns, "--reason", "mine"],
    )
    .fails(1, "approve as carol");
    assert!(
        err.starts_with("error: cannot get approvalrequest"),
        "{err}"
    );
    assert!(err.contains("forbidden"), "{err}");

    let message = "Not authorized for this resource";
    let reason = "policy violation: tier-0 write";
    let out = plugin(
        cp,
        Identity::Bob,
        &[
            "reject",
            &apr,
            "-n",
            ns,
            "--message",
            message,
            "--reason",
            reason,
        ],
    )
    .ok("reject");
    assert_eq!(
        out,
        format!("approvalrequest.agentrun.dev/{apr} rejected by bob@example.com\n")
    );
    wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    assert!(tools.requests().is_empty(), "a rejected tool never runs");

    let err = plugin(
        cp,
        Identity::Alice,
        &["approve", &apr, "-n", ns, "--reason", "late"],
    )
    .fails(1, "approve a rejected request");
    assert!(
        err.contains("already has a decision (Rejected by bob@example.com)"),
        "{err}"
    );

    let report =
        plugin(cp, Identity::Bob, &["audit", "r1", "-n", ns, "-o", "json"]).json("audit -o json");
    let call = audited_call(&report, "call_1");
    assert_eq!(call["decision"], "Rejected");
    assert_eq!(call["approverId"], "bob@example.com");
    assert_eq!(call["reason"], reason);
    assert_eq!(call["message"], message);
    assert_eq!(call["executed"], false);
    assert_eq!(call["requiresApproval"], true);
    let yaml =
        plugin(cp, Identity::Bob, &["audit", "r1", "-n", ns, "-o", "yaml"]).ok("audit -o yaml");
    let from_yaml: Value = serde_yaml_ng::from_str(&yaml).expect("audit -o yaml parses");
    assert_eq!(from_yaml, report);
    let table = plugin(cp, Identity::Bob, &["audit", "r1", "-n", ns]).ok("audit");
    let cells = row(&table, "delete_user");
    assert_eq!(cells[3], "Rejected", "{table}");
    assert_eq!(cells[4], "bob@example.com", "{table}");
    assert_eq!(cells.last(), Some(&"no"), "{table}");
    assert!(table.contains(message), "{table}");

    let events = decision_events(cp, ns, &apr).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["user"]["username"], call["approverId"]);
    assert_eq!(
        events[0]["requestObject"],
        json!({"spec": {"decision": "Rejected", "approverId": "bob@example.com", "reason": reason, "message": message}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_manifests_applied_server_side_resume_the_run() {
    let cp = ControlPlane::shared().await;
    let turns = json!([
        {"toolCalls": [
            {"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-7"}},
            {"id": "call_2", "name": "delete_user", "arguments": {"user_id": "u-8"}}
        ]},
        {"content": "Done."}
    ]);
    let (ns, _operator, tools, requests) =
        halted_run(cp, "plugin-gitops", turns, "Delete users u-7 and u-8").await;
    let ns = ns.name.as_str();
    assert_eq!(requests.len(), 2);
    let first = requests[0].metadata.name.clone().unwrap();
    let second = requests[1].metadata.name.clone().unwrap();

    // With --approver-id and --commit: exactly the decision fields and the commit annotation.
    let yaml = plugin(
        cp,
        Identity::Alice,
        &[
            "approve",
            &first,
            "-n",
            ns,
            "--reason",
            "merged in PR 42",
            "--dry-run",
            "-o",
            "yaml",
            "--approver-id",
            "bob@example.com",
            "--commit",
            "0123abcd",
        ],
    )
    .ok("approve --dry-run");
    assert!(
        yaml.starts_with("# Approved tool call call_1 (delete_user) of agentrun r1\n"),
        "{yaml}"
    );
    assert!(yaml.contains(&requests[0].spec.arguments_digest), "{yaml}");
    let manifest: Value = serde_yaml_ng::from_str(&yaml).expect("manifest parses");
    assert_eq!(
        manifest,
        json!({
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "ApprovalRequest",
            "metadata": {"name": first, "namespace": ns, "annotations": {"agentrun.dev/gitops-commit": "0123abcd"}},
            "spec": {"decision": "Approved", "approverId": "bob@example.com", "reason": "merged in PR 42"}
        })
    );
    let json_manifest = plugin(
        cp,
        Identity::Alice,
        &[
            "approve",
            &first,
            "-n",
            ns,
            "--reason",
            "merged in PR 42",
            "--dry-run",
            "-o",
            "json",
            "--approver-id",
            "bob@example.com",
            "--commit",
            "0123abcd",
        ],
    )
    .json("approve --dry-run -o json");
    assert_eq!(json_manifest, manifest);
    // Without --commit: a placeholder to replace. No dry run wrote anything.
    let placeholder = plugin(
        cp,
        Identity::Alice,
        &["approve", &first, "-n", ns, "--reason", "r", "--dry-run"],
    )
    .ok("approve --dry-run without --commit");
    assert!(
        placeholder.contains("REPLACE-WITH-THE-COMMIT-SHA"),
        "{placeholder}"
    );
    let parsed: Value = serde_yaml_ng::from_str(&placeholder).unwrap();
    assert_eq!(parsed["spec"]["approverId"], "alice@example.com");
    for name in [&first, &second] {
        assert_eq!(request(cp, ns, name).await.spec.decision, None, "{name}");
    }

    // The first manifest made as admin (approverId from the SelfSubjectReview) and applied by
    // admin with server-side apply.
    let manifest = plugin(
        cp,
        Identity::Admin,
        &[
            "approve",
            &first,
            "-n",
            ns,
            "--reason",
            "merged in PR 43",
            "--dry-run",
            "-o",
            "yaml",
            "--commit",
            "4567cdef",
        ],
    )
    .ok("approve --dry-run as admin");
    let parsed: Value = serde_yaml_ng::from_str(&manifest).unwrap();
    assert_eq!(parsed["spec"]["approverId"], "admin");
    assert_success(
        &cp.kubectl_with_stdin(
            Identity::Admin,
            &["apply", "--server-side", "-f", "-"],
            Some(&manifest),
        ),
        "kubectl apply --server-side (admin)",
    );
    // The second made by alice for her own approval and applied by the GitOps identity.
    let manifest = plugin(
        cp,
        Identity::Alice,
        &[
            "approve",
            &second,
            "-n",
            ns,
            "--reason",
            "merged in PR 44",
            "--dry-run",
            "-o",
            "yaml",
            "--commit",
            "89abcdef",
        ],
    )
    .ok("approve --dry-run as alice");
    allow_gitops_approver(cp, &manifest, "alice@example.com").await;
    assert_success(
        &cp.kubectl_with_stdin(
            Identity::Gitops,
            &["apply", "--server-side", "-f", "-"],
            Some(&manifest),
        ),
        "kubectl apply --server-side (gitops)",
    );
    wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(tools.calls_of("call_1"), 1);
    assert_eq!(tools.calls_of("call_2"), 1);
    let applied = request(cp, ns, &first).await;
    assert_eq!(applied.spec.reason.as_deref(), Some("merged in PR 43"));
    assert_eq!(
        applied.metadata.annotations.unwrap_or_default()["agentrun.dev/gitops-commit"],
        "4567cdef"
    );

    // The audit tells the claimed approver from the identity that wrote the decision, and the
    // API server's log agrees.
    let report = plugin(
        cp,
        Identity::Alice,
        &["audit", "r1", "-n", ns, "-o", "json"],
    )
    .json("audit -o json");
    let by_admin = audited_call(&report, "call_1");
    assert_eq!(by_admin["decision"], "Approved");
    assert_eq!(by_admin["approverId"], "admin");
    assert_eq!(by_admin["reason"], "merged in PR 43");
    assert_eq!(by_admin["executed"], true);
    let events = decision_events(cp, ns, &first).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["user"]["username"], by_admin["approverId"]);

    let by_gitops = audited_call(&report, "call_2");
    assert_eq!(by_gitops["decision"], "Approved");
    assert_eq!(by_gitops["approverId"], "alice@example.com");
    assert_eq!(by_gitops["reason"], "merged in PR 44");
    assert_eq!(by_gitops["executed"], true);
    let events = decision_events(cp, ns, &second).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["user"]["username"], "gitops");
    assert_eq!(
        events[0]["requestObject"]["metadata"]["annotations"]["agentrun.dev/gitops-commit"],
        "89abcdef"
    );
    if !by_gitops["verifiedIdentity"].is_null() {
        assert_eq!(by_gitops["verifiedIdentity"], events[0]["user"]["username"]);
    }

    // Once decided, a dry run is refused too.
    let err = plugin(
        cp,
        Identity::Alice,
        &["approve", &first, "-n", ns, "--reason", "r", "--dry-run"],
    )
    .fails(1, "dry run on a decided request");
    assert!(
        err.contains("already has a decision (Approved by admin)"),
        "{err}"
    );
}
