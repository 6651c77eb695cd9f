//! ApprovalPolicies (issue 14) against the whole operator, with real identities: Allow and Deny
//! decide without a person and the trail names the rule; Require gates a call the Agent does not
//! gate; a policy that does not compile is not Ready and one that errors fails closed; only admins
//! write policies; a quorum needs distinct permitted approvers, each adding only their own final
//! vote; the rule's approvers are enforced by the API server; edited arguments are checked again.
//!
//! alice and bob are approvers (group `agentrun:approvers`); carol holds the built-in `edit` role
//! and creates the runs. Each test owns a namespace, and its policies select only that namespace.

use std::time::Duration;

use agentrun::crd::approval_request::{QUORUM_DECISION_MESSAGE, VOTE_FINAL_MESSAGE};
use agentrun::crd::policy::{NOT_AN_APPROVER_MESSAGE, OWN_VOTE_MESSAGE};
use agentrun::crd::{
    AgentRunPhase, ApprovalPhase, ApprovalPolicy, ApprovalRequest, ConditionType, find_condition,
};
use agentrun::state::RunState;
use agentrun_testkit::cluster::{
    ControlPlane, Identity, TestNamespace, assert_refused, assert_success,
};
use agentrun_testkit::operator::{Operator, start_operator};
use agentrun_testkit::runs::{
    agent_yaml, approvers_role, requests_of, run_yaml, scripted_model, wait_for_phase,
};
use agentrun_testkit::tool_server::ToolServer;
use agentrun_testkit::wait::eventually;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};

/// A namespace with its operator, a tool server, alice and bob as approvers and carol as editor.
async fn scene(prefix: &str) -> (&'static ControlPlane, TestNamespace, Operator, ToolServer) {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace(prefix).await;
    let operator = start_operator(cp, &ns).await;
    let name = &ns.name;
    let editors = format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: editors, namespace: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol@example.com}}
"#
    );
    let approvers = approvers_role(name, &["agentrun:approvers"]);
    cp.apply(Identity::Admin, &format!("{approvers}---\n{editors}"));
    (cp, ns, operator, ToolServer::start().await)
}

/// The cluster-scoped ApprovalPolicy `name` selecting only `ns`; deleted when dropped.
pub(crate) struct TestPolicy {
    cp: &'static ControlPlane,
    name: String,
}

impl TestPolicy {
    /// Applies the policy with `rules` (YAML flow sequence) and waits for its Ready condition.
    pub(crate) async fn apply(
        cp: &'static ControlPlane,
        ns: &str,
        name: &str,
        rules: &str,
    ) -> TestPolicy {
        let name = format!("{ns}-{name}");
        cp.apply(Identity::Admin, &policy_yaml(&name, ns, rules));
        let policy = TestPolicy { cp, name };
        policy.ready().await;
        policy
    }

    /// Waits until the controller reported on the current generation; returns (status, reason,
    /// message) of Ready.
    async fn ready(&self) -> (String, String, String) {
        let api: Api<ApprovalPolicy> = Api::all(self.cp.client(Identity::Admin).await);
        eventually(
            Duration::from_secs(30),
            "the policy's Ready condition",
            || async {
                let policy = api.get(&self.name).await.ok()?;
                let status = policy.status.as_ref()?;
                (status.observed_generation == policy.metadata.generation).then_some(())?;
                let ready = find_condition(&status.conditions, ConditionType::Ready)?;
                Some((
                    ready.status.clone(),
                    ready.reason.clone(),
                    ready.message.clone(),
                ))
            },
        )
        .await
    }
}

impl Drop for TestPolicy {
    fn drop(&mut self) {
        let _ = self.cp.kubectl(
            Identity::Admin,
            &["delete", "approvalpolicy", &self.name, "--wait=false"],
        );
    }
}

fn policy_yaml(name: &str, ns: &str, rules: &str) -> String {
    format!(
        "apiVersion: agentrun.dev/v1alpha1\nkind: ApprovalPolicy\nmetadata: {{name: {name}}}\nspec:\n  namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}\n  rules: {rules}\n"
    )
}

/// An Agent `name` whose model calls `tool` with `arguments` once, then says "Done.".
fn calling(cp: &ControlPlane, ns: &str, name: &str, tools: &ToolServer, tool: &str, args: Value) {
    let model = scripted_model(json!([
        {"toolCalls": [{"id": "call_1", "name": tool, "arguments": args}]},
        {"content": "Done."}
    ]));
    cp.apply(Identity::Admin, &agent_yaml(ns, name, model, tools));
}

/// Creates run `name` of Agent `agent` as carol.
async fn create_run(cp: &ControlPlane, ns: &str, name: &str, agent: &str) {
    let yaml = run_yaml(ns, name, agent, "Go.");
    eventually(Duration::from_secs(60), "create the run", || async {
        let out = cp.kubectl_with_stdin(Identity::Carol, &["apply", "-f", "-"], Some(&yaml));
        out.status.success().then_some(())
    })
    .await;
}

/// The one ApprovalRequest of `run`, once it exists.
async fn request_of(cp: &ControlPlane, ns: &str, run: &str) -> ApprovalRequest {
    eventually(Duration::from_secs(60), "the run's request", || async {
        requests_of(cp, ns, run).await.into_iter().next()
    })
    .await
}

fn patch(
    cp: &ControlPlane,
    who: Identity,
    ns: &str,
    request: &str,
    patch: Value,
) -> std::process::Output {
    let patch = patch.to_string();
    cp.kubectl(
        who,
        &[
            "patch", "apr", request, "-n", ns, "--type", "merge", "-p", &patch,
        ],
    )
}

fn approve(who: Identity, extra: Value) -> Value {
    let mut spec =
        json!({"decision": "Approved", "approverId": who.username(), "reason": "checked"});
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    json!({"spec": spec})
}

fn vote(who: Identity, decision: &str) -> Value {
    let mut vote = json!({"decision": decision, "reason": format!("{} checked", who.key())});
    if decision == "Rejected" {
        vote["message"] = json!("Not this one.");
    }
    json!({"spec": {"votes": {who.username(): vote}}})
}

fn state_of(run: &agentrun::crd::AgentRun) -> RunState {
    RunState::from_json(run.status.as_ref().unwrap().run_state.as_deref().unwrap()).unwrap()
}

fn approver_of(state: &RunState) -> String {
    state.approval_metadata["call_1"]
        .approver_id
        .clone()
        .unwrap_or_default()
}

fn events(cp: &ControlPlane, ns: &str) -> String {
    let out = cp.kubectl(Identity::Admin, &["get", "events", "-n", ns]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Allow and Deny decide at once, recorded as the rule (request, RunState, Event); Require makes
/// a person decide a call the Agent does not gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_allow_deny_and_require() {
    let (cp, ns, _operator, tools) = scene("apol-actions").await;
    let ns = ns.name.as_str();
    let rules = r#"[
    {name: test-users, tools: ["delete_*"], when: "args.user_id.startsWith('test-')", action: Allow},
    {name: never-root, tools: ["delete_*"], when: "args.user_id == 'root'", action: Deny, message: "Deleting root is not allowed from agents."},
    {name: lookups, tools: [lookup_user], action: Require}]"#;
    let policy = TestPolicy::apply(cp, ns, "p", rules).await;
    assert_eq!(policy.ready().await.0, "True");
    let by = |rule: &str| format!("policy:{}/{rule}", policy.name);

    calling(
        cp,
        ns,
        "allowed",
        &tools,
        "delete_user",
        json!({"user_id": "test-1"}),
    );
    calling(
        cp,
        ns,
        "denied",
        &tools,
        "delete_user",
        json!({"user_id": "root"}),
    );
    calling(
        cp,
        ns,
        "required",
        &tools,
        "lookup_user",
        json!({"user_id": "u-1"}),
    );
    create_run(cp, ns, "allowed", "allowed").await;
    create_run(cp, ns, "denied", "denied").await;
    create_run(cp, ns, "required", "required").await;

    let run = wait_for_phase(cp, ns, "allowed", AgentRunPhase::Succeeded).await;
    assert_eq!(approver_of(&state_of(&run)), by("test-users"));
    let request = request_of(cp, ns, "allowed").await;
    assert_eq!(
        request.spec.policy.as_ref().unwrap().rule.as_deref(),
        Some("test-users")
    );
    assert_eq!(request.status.unwrap().phase, Some(ApprovalPhase::Approved));
    assert_eq!(tools.requests_to("/delete_user").len(), 1);
    assert!(tools.requests_to("/delete_user")[0].body.contains("test-1"));

    let run = wait_for_phase(cp, ns, "denied", AgentRunPhase::Succeeded).await;
    let state = state_of(&run);
    assert_eq!(approver_of(&state), by("never-root"));
    assert_eq!(
        state.rejection("call_1").unwrap().message.as_deref(),
        Some("Deleting root is not allowed from agents."),
        "the model is told the rule's message"
    );
    assert_eq!(
        tools.requests_to("/delete_user").len(),
        1,
        "root was never sent"
    );
    let events = events(cp, ns);
    assert!(events.contains("PolicyDecided"), "{events}");

    wait_for_phase(cp, ns, "required", AgentRunPhase::AwaitingApproval).await;
    assert!(tools.requests_to("/lookup_user").is_empty());
    let request = request_of(cp, ns, "required").await;
    assert_eq!(
        request.spec.policy.as_ref().unwrap().rule.as_deref(),
        Some("lookups")
    );
    let out = patch(
        cp,
        Identity::Alice,
        ns,
        &request.name_any(),
        approve(Identity::Alice, json!({})),
    );
    assert_success(&out, "alice approves the lookup");
    let run = wait_for_phase(cp, ns, "required", AgentRunPhase::Succeeded).await;
    assert_eq!(approver_of(&state_of(&run)), "alice@example.com");
    assert_eq!(tools.requests_to("/lookup_user").len(), 1);
}

/// A rule that does not compile makes its policy Ready=False with the compiler's message; a
/// rule whose expression errors on a call fails closed: a person must decide, and the request
/// says why. Neither editors nor approvers may write policies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_rules_fail_closed_and_only_admins_write_policies() {
    let (cp, ns, _operator, tools) = scene("apol-broken").await;
    let ns = ns.name.as_str();
    let broken = TestPolicy::apply(
        cp,
        ns,
        "broken",
        r#"[{name: bad, tools: [delete_user], when: "args.user_id ==", action: Allow}]"#,
    )
    .await;
    let (status, reason, message) = broken.ready().await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "CompileError"),
        "{message}"
    );
    assert!(
        message.contains("bad"),
        "the message names the rule: {message}"
    );

    let _errors = TestPolicy::apply(
        cp,
        ns,
        "errors",
        r#"[{name: cheap-lookups, tools: [lookup_user], when: "args.amount < 10", action: Allow}]"#,
    )
    .await;
    calling(
        cp,
        ns,
        "lookup",
        &tools,
        "lookup_user",
        json!({"user_id": "u-1"}),
    );
    create_run(cp, ns, "lookup", "lookup").await;
    wait_for_phase(cp, ns, "lookup", AgentRunPhase::AwaitingApproval).await;
    let request = request_of(cp, ns, "lookup").await;
    let decision = request.spec.policy.clone().unwrap();
    assert_eq!(decision.rule.as_deref(), Some("cheap-lookups"));
    let note = decision.note.unwrap_or_default();
    assert!(
        note.contains("amount"),
        "the request says why a person decides: {note}"
    );
    assert!(
        tools.requests_to("/lookup_user").is_empty(),
        "the call waits for a person"
    );

    for who in [Identity::Carol, Identity::Alice] {
        let yaml = policy_yaml(
            &format!("{ns}-mine"),
            ns,
            "[{name: all, tools: ['*'], action: Allow}]",
        );
        let out = cp.kubectl_with_stdin(who, &["apply", "-f", "-"], Some(&yaml));
        assert_refused(
            &out,
            &format!("{} writes an ApprovalPolicy", who.key()),
            &["forbidden"],
        );
    }
    let out = cp.kubectl(
        Identity::Carol,
        &[
            "patch",
            "approvalpolicy",
            &broken.name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"rules":[]}}"#,
        ],
    );
    assert_refused(&out, "carol empties a policy", &["forbidden"]);
}

/// Two approvals of distinct approvers: one is not enough, nobody writes another's vote or a
/// single decision, votes are final, and the requirement cannot be lowered; a rejection wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_needs_two_distinct_approvers_and_a_rejection_wins() {
    let (cp, ns, _operator, tools) = scene("apol-quorum").await;
    let ns = ns.name.as_str();
    let _policy = TestPolicy::apply(
        cp,
        ns,
        "p",
        r#"[{name: two, tools: [delete_user], action: Require, requiredApprovals: 2, approvers: {groups: ["agentrun:approvers"]}}]"#,
    )
    .await;
    calling(
        cp,
        ns,
        "ops",
        &tools,
        "delete_user",
        json!({"user_id": "u-1"}),
    );
    create_run(cp, ns, "r1", "ops").await;
    create_run(cp, ns, "r2", "ops").await;
    wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
    let request = request_of(cp, ns, "r1").await;
    assert_eq!(request.spec.required_approvals, Some(2));
    let name = request.name_any();

    let out = patch(
        cp,
        Identity::Alice,
        ns,
        &name,
        approve(Identity::Alice, json!({})),
    );
    assert_refused(
        &out,
        "a single decision on a quorum",
        &[QUORUM_DECISION_MESSAGE],
    );
    let out = patch(
        cp,
        Identity::Alice,
        ns,
        &name,
        vote(Identity::Bob, "Approved"),
    );
    assert_refused(&out, "alice casts bob's vote", &[OWN_VOTE_MESSAGE]);
    assert_success(
        &patch(
            cp,
            Identity::Alice,
            ns,
            &name,
            vote(Identity::Alice, "Approved"),
        ),
        "alice votes",
    );
    let out = patch(
        cp,
        Identity::Alice,
        ns,
        &name,
        vote(Identity::Alice, "Rejected"),
    );
    assert_refused(&out, "alice changes her vote", &[VOTE_FINAL_MESSAGE]);
    for lowered in [
        json!({"spec": {"requiredApprovals": 1}}),
        json!({"spec": {"requiredApprovals": null}}),
        json!({"spec": {"approvers": null}}),
    ] {
        let out = patch(cp, Identity::Bob, ns, &name, lowered.clone());
        assert_refused(
            &out,
            &format!("bob lowers the requirement with {lowered}"),
            &["immutable"],
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let request = request_of(cp, ns, "r1").await;
    assert_eq!(
        request.status.unwrap().phase,
        Some(ApprovalPhase::Pending),
        "one vote is not enough"
    );
    assert!(tools.requests_to("/delete_user").is_empty());

    assert_success(
        &patch(
            cp,
            Identity::Bob,
            ns,
            &name,
            vote(Identity::Bob, "Approved"),
        ),
        "bob votes",
    );
    let run = wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(
        approver_of(&state_of(&run)),
        "alice@example.com, bob@example.com"
    );
    let voters: Vec<String> = request_of(cp, ns, "r1")
        .await
        .status
        .unwrap()
        .voters
        .into_iter()
        .map(|v| v.username)
        .collect();
    assert_eq!(voters, ["alice@example.com", "bob@example.com"]);
    assert_eq!(tools.requests_to("/delete_user").len(), 1, "sent once");

    wait_for_phase(cp, ns, "r2", AgentRunPhase::AwaitingApproval).await;
    let name = request_of(cp, ns, "r2").await.name_any();
    assert_success(
        &patch(
            cp,
            Identity::Alice,
            ns,
            &name,
            vote(Identity::Alice, "Approved"),
        ),
        "alice votes",
    );
    assert_success(
        &patch(
            cp,
            Identity::Bob,
            ns,
            &name,
            vote(Identity::Bob, "Rejected"),
        ),
        "bob rejects",
    );
    let run = wait_for_phase(cp, ns, "r2", AgentRunPhase::Succeeded).await;
    let state = state_of(&run);
    assert_eq!(
        state.rejection("call_1").unwrap().message.as_deref(),
        Some("Not this one.")
    );
    assert_eq!(approver_of(&state), "bob@example.com");
    assert_eq!(
        tools.requests_to("/delete_user").len(),
        1,
        "the rejected call was not sent"
    );
}

/// Only the rule's approvers may decide, which the API server enforces; nobody adds a policy or
/// a requirement to a request the controller made without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_approvers_are_enforced_by_the_api_server() {
    let (cp, ns, _operator, tools) = scene("apol-approvers").await;
    let ns = ns.name.as_str();
    let _policy = TestPolicy::apply(
        cp,
        ns,
        "p",
        r#"[{name: alice-only, tools: [delete_user], when: "args.user_id == 'u-1'", action: Require, approvers: {users: [alice@example.com]}}]"#,
    )
    .await;
    calling(
        cp,
        ns,
        "one",
        &tools,
        "delete_user",
        json!({"user_id": "u-1"}),
    );
    calling(
        cp,
        ns,
        "two",
        &tools,
        "delete_user",
        json!({"user_id": "u-2"}),
    );
    create_run(cp, ns, "r1", "one").await;
    create_run(cp, ns, "r2", "two").await;

    wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
    let name = request_of(cp, ns, "r1").await.name_any();
    let out = patch(
        cp,
        Identity::Bob,
        ns,
        &name,
        approve(Identity::Bob, json!({})),
    );
    assert_refused(
        &out,
        "bob approves a call only alice may decide",
        &[NOT_AN_APPROVER_MESSAGE],
    );
    let out = patch(
        cp,
        Identity::Bob,
        ns,
        &name,
        json!({"spec": {"approvers": {"users": ["bob@example.com"]}}}),
    );
    assert_refused(&out, "bob puts himself on the list", &["immutable"]);
    assert_success(
        &patch(
            cp,
            Identity::Alice,
            ns,
            &name,
            approve(Identity::Alice, json!({})),
        ),
        "alice approves",
    );
    wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;

    wait_for_phase(cp, ns, "r2", AgentRunPhase::AwaitingApproval).await;
    let request = request_of(cp, ns, "r2").await;
    assert_eq!(request.spec.policy, None, "no rule matched u-2");
    let name = request.name_any();
    for added in [
        json!({"spec": {"policy": {"name": "x", "rule": "y", "action": "Allow"}}}),
        json!({"spec": {"requiredApprovals": 2}}),
        json!({"spec": {"approvers": {"users": ["bob@example.com"]}}}),
    ] {
        let out = patch(cp, Identity::Bob, ns, &name, added.clone());
        assert_refused(&out, &format!("bob adds {added}"), &["immutable"]);
    }
    assert_success(
        &patch(
            cp,
            Identity::Bob,
            ns,
            &name,
            approve(Identity::Bob, json!({})),
        ),
        "bob approves u-2",
    );
    wait_for_phase(cp, ns, "r2", AgentRunPhase::Succeeded).await;
    assert_eq!(tools.requests_to("/delete_user").len(), 2);
}

/// An approver's edited arguments are what the tool receives and the record shows, and they must
/// fit the tool's schema and pass the policies again, or the call does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edited_arguments_run_only_when_they_pass_again() {
    let (cp, ns, _operator, tools) = scene("apol-edits").await;
    let ns = ns.name.as_str();
    let _policy = TestPolicy::apply(
        cp,
        ns,
        "p",
        r#"[{name: never-root, tools: [delete_user], when: "args.user_id == 'root'", action: Deny, message: No.}]"#,
    )
    .await;
    calling(
        cp,
        ns,
        "ops",
        &tools,
        "delete_user",
        json!({"user_id": "u-1"}),
    );
    for run in ["edited", "to-root", "misfit"] {
        create_run(cp, ns, run, "ops").await;
    }
    for (run, edit) in [
        ("edited", r#"{"user_id":"u-2"}"#),
        ("to-root", r#"{"user_id":"root"}"#),
        ("misfit", r#"{"user_id":7}"#),
    ] {
        wait_for_phase(cp, ns, run, AgentRunPhase::AwaitingApproval).await;
        let name = request_of(cp, ns, run).await.name_any();
        let out = patch(
            cp,
            Identity::Alice,
            ns,
            &name,
            approve(Identity::Alice, json!({"editedArguments": edit})),
        );
        assert_success(&out, &format!("alice approves {run} with {edit}"));
    }
    let run = wait_for_phase(cp, ns, "edited", AgentRunPhase::Succeeded).await;
    assert!(
        state_of(&run)
            .to_json()
            .contains(r#"{\"user_id\": \"u-2\"}"#),
        "the history shows the edit"
    );
    let request = request_of(cp, ns, "edited").await;
    assert_eq!(
        request.status.unwrap().edited_arguments_digest,
        Some(agentrun::crd::arguments_digest(r#"{"user_id": "u-2"}"#))
    );
    for run in ["to-root", "misfit"] {
        wait_for_phase(cp, ns, run, AgentRunPhase::Succeeded).await;
        let request = request_of(cp, ns, run).await;
        assert_eq!(
            request.status.unwrap().phase,
            Some(ApprovalPhase::Superseded),
            "{run}"
        );
    }
    let sent: Vec<String> = tools
        .requests_to("/delete_user")
        .into_iter()
        .map(|r| r.body)
        .collect();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0].contains("u-2"), "{sent:?}");
    let events = events(cp, ns);
    assert!(
        events.contains("never-root"),
        "the Event names the rule: {events}"
    );
}
