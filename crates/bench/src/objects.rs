//! The benchmark's objects: its Agent (a scripted model and one tool needing approval) and runs.

use agentrun::crd::{Agent, AgentRun};
use agentrun_testkit::tool_server::{ToolReply, ToolServer};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::cluster::Cluster;
use crate::error::kube_error;
use crate::{AGENT_NAME, BenchError, RUN_PREFIX, TOOL_CALL_ID};

/// The path of the benchmark's tool on the tool server.
pub(crate) const TOOL_PATH: &str = "/change_config";

/// The benchmark's Agent: a scripted model whose first turn calls a tool needing approval and
/// whose second turn answers.
pub(crate) fn agent_object(ns: &str, tool_url: &str) -> Result<Agent, BenchError> {
    serde_json::from_value(json!({
        "apiVersion": agentrun::crd::API_VERSION,
        "kind": "Agent",
        "metadata": {"name": AGENT_NAME, "namespace": ns},
        "spec": {
            "instructions": "You apply configuration changes once a person approves them.",
            "model": {"scripted": {"turns": [
                {"toolCalls": [{"id": TOOL_CALL_ID, "name": "change_config",
                                "arguments": {"key": "replicas", "value": "3"}}]},
                {"content": "The change was applied."}
            ]}},
            "maxTurns": 5,
            "tools": [{
                "name": "change_config",
                "description": "Apply a configuration change.",
                "requiresApproval": true,
                "parameters": {"type": "object",
                               "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                               "required": ["key", "value"]},
                "http": {"url": tool_url, "timeoutSeconds": 30}
            }]
        }
    }))
    .map_err(|e| BenchError::Config(format!("the benchmark Agent: {e}")))
}

/// Creates the benchmark's Agent in `ns`, its tool on `tools`.
pub(crate) async fn create_agent(
    cluster: &Cluster,
    ns: &str,
    tools: &ToolServer,
) -> Result<Agent, BenchError> {
    let path = tool_path(ns);
    tools.set_reply(&path, ToolReply::Json(json!({"ok": true, "applied": true})));
    let agent = agent_object(ns, &tools.url(&path))?;
    Api::<Agent>::namespaced(cluster.admin.clone(), ns)
        .create(&PostParams::default(), &agent)
        .await
        .map_err(kube_error("creating the Agent"))
}

/// The path of the tool of the Agent in `ns` on the benchmark's tool server (one per namespace,
/// so that each namespace's calls are counted apart).
pub(crate) fn tool_path(ns: &str) -> String {
    format!("{TOOL_PATH}/{ns}")
}

/// One run of the benchmark's Agent.
pub(crate) fn run_object(ns: &str, name: &str) -> Result<AgentRun, BenchError> {
    serde_json::from_value(json!({
        "apiVersion": agentrun::crd::API_VERSION,
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"agentRef": {"name": AGENT_NAME}, "input": "Set replicas to 3."}
    }))
    .map_err(|e| BenchError::Config(format!("the benchmark AgentRun: {e}")))
}

/// alice's merge patch approving a request.
pub(crate) fn approval_patch() -> serde_json::Value {
    json!({"spec": {
        "decision": "Approved",
        "approverId": crate::APPROVER,
        "reason": "benchmark: approved",
    }})
}

/// The name of the `i`-th run (`run-00042`).
pub(crate) fn run_name(i: usize) -> String {
    format!("{RUN_PREFIX}{i:05}")
}
