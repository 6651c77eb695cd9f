//! Agents, AgentRuns and their ApprovalRequests in tests: manifests, waits and queries.

use std::ops::ControlFlow;
use std::time::Duration;

use agentrun::crd::{AgentRun, AgentRunPhase, ApprovalRequest};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::cluster::{ControlPlane, Identity};
use crate::tool_server::ToolServer;
use crate::wait::poll_until;

/// An Agent manifest (JSON) named `name` with `model` (e.g. [`scripted_model`] or an OpenAI-style
/// `{"baseUrl": ...}`) and two HTTP tools on `tools`: `delete_user` needs approval, `lookup_user`
/// does not.
pub fn agent_yaml(ns: &str, name: &str, model: Value, tools: &ToolServer) -> String {
    let agent = json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "instructions": "You are an operations agent. Be careful.",
            "model": model,
            "maxTurns": 10,
            "tools": [
                {"name": "delete_user", "description": "Delete a user", "requiresApproval": true,
                 "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}, "required": ["user_id"]},
                 "http": {"url": tools.url("/delete_user"), "timeoutSeconds": 10}},
                {"name": "lookup_user", "description": "Look a user up", "requiresApproval": false,
                 "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}},
                 "http": {"url": tools.url("/lookup_user"), "timeoutSeconds": 10}}
            ]
        }
    });
    serde_json::to_string(&agent).expect("an Agent manifest")
}

/// The `model` of an Agent that plays `turns` (the scripted model).
pub fn scripted_model(turns: Value) -> Value {
    json!({"scripted": {"turns": turns}})
}

/// An AgentRun manifest (JSON) of `agent` with `input`.
pub fn run_yaml(ns: &str, name: &str, agent: &str, input: &str) -> String {
    serde_json::to_string(&json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"agentRef": {"name": agent}, "input": input}
    }))
    .expect("an AgentRun manifest")
}

/// A Role `approvers` in `ns` that reads and decides ApprovalRequests and reads AgentRuns, bound
/// to the groups `groups` (YAML).
pub fn approvers_role(ns: &str, groups: &[&str]) -> String {
    let subjects: String = groups
        .iter()
        .map(|g| format!("- {{kind: Group, name: \"{g}\"}}\n"))
        .collect();
    format!(
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: approvers, namespace: {ns}}}
rules:
- apiGroups: [agentrun.dev]
  resources: [approvalrequests]
  verbs: [get, list, watch, patch]
- apiGroups: [agentrun.dev]
  resources: [agentruns]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: approvers, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: approvers}}
subjects:
{subjects}"#
    )
}

/// Waits up to 90 s for run `run` to reach `phase` and returns it; panics with its status and the
/// namespace's Events when it does not.
pub async fn wait_for_phase(
    cp: &ControlPlane,
    ns: &str,
    run: &str,
    phase: AgentRunPhase,
) -> AgentRun {
    wait_for_phase_within(cp, ns, run, phase, Duration::from_secs(90)).await
}

/// [`wait_for_phase`] with another limit.
pub async fn wait_for_phase_within(
    cp: &ControlPlane,
    ns: &str,
    run: &str,
    phase: AgentRunPhase,
    timeout: Duration,
) -> AgentRun {
    let api: Api<AgentRun> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    let waited = poll_until(timeout, Duration::from_millis(200), || async {
        let current = api.get(run).await.expect("get run");
        let status = current.status.clone().unwrap_or_default();
        if status.phase == Some(phase) {
            ControlFlow::Break(current)
        } else {
            ControlFlow::Continue(status)
        }
    })
    .await;
    waited.unwrap_or_else(|status| {
        let out = cp.kubectl(
            Identity::Admin,
            &["get", "events", "-n", ns, "--sort-by=.lastTimestamp"],
        );
        panic!(
            "run {run} did not reach {phase:?}; status: {}\nevents:\n{}",
            serde_json::to_string_pretty(&status).unwrap_or_default(),
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The names of the Pods in `ns`, sorted.
pub async fn pods_of(cp: &ControlPlane, ns: &str) -> Vec<String> {
    let api: Api<Pod> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    let mut names: Vec<String> = api
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

/// The ApprovalRequests of run `run`, sorted by tool call id.
pub async fn requests_of(cp: &ControlPlane, ns: &str, run: &str) -> Vec<ApprovalRequest> {
    let api: Api<ApprovalRequest> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    let mut list = api
        .list(&ListParams::default().labels(&format!("agentrun.dev/run={run}")))
        .await
        .expect("list approval requests")
        .items;
    list.sort_by(|a, b| a.spec.tool_call_id.cmp(&b.spec.tool_call_id));
    list
}
