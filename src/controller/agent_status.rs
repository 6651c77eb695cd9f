//! The status of `Agent`s: their tool names (shown by `kubectl get agents`) and whether their
//! spec is one a worker can run, written by the controller as it sees each Agent change.
//!
//! The desired status is a pure function of the Agent ([`desired_status`]); the writer patches it
//! only when it differs from what the Agent already holds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::mpsc;
use tracing::warn;

use crate::crd::{Agent, AgentStatus, ConditionStatus, find_condition, new_condition};

/// The condition type saying whether the Agent's spec can be run.
pub const READY: &str = "Ready";

/// The status the controller wants an Agent to show.
pub fn desired_status(agent: &Agent) -> AgentStatus {
    let mut status = agent.status.clone().unwrap_or_default();
    let (condition_status, reason, message) =
        match crate::agent::Agent::from_spec_with_name(&agent.name_any(), &agent.spec) {
            Ok(_) => (
                ConditionStatus::True,
                "Valid",
                format!(
                    "{} tool(s); runs can use this agent",
                    agent.spec.tools.len()
                ),
            ),
            Err(e) => (ConditionStatus::False, "InvalidSpec", e.to_string()),
        };
    crate::crd::set_condition(
        &mut status.conditions,
        new_condition(
            READY,
            condition_status,
            reason,
            &message,
            agent.metadata.generation,
            Time(k8s_openapi::jiff::Timestamp::now()),
        ),
    );
    status.observed_generation = agent.metadata.generation;
    status.tool_names = Some(AgentStatus::tool_names_of(&agent.spec));
    status
}

/// Whether the Agent's status differs from [`desired_status`] (transition times aside).
pub fn needs_update(agent: &Agent) -> bool {
    let current = agent.status.clone().unwrap_or_default();
    let desired = desired_status(agent);
    let same_condition = match (
        find_condition(&current.conditions, READY),
        find_condition(&desired.conditions, READY),
    ) {
        (Some(a), Some(b)) => {
            a.status == b.status
                && a.reason == b.reason
                && a.message == b.message
                && a.observed_generation == b.observed_generation
        }
        _ => false,
    };
    !same_condition
        || current.observed_generation != desired.observed_generation
        || current.tool_names != desired.tool_names
}

/// Writes Agent statuses sent on a channel, one at a time (Agents change rarely).
pub fn spawn_writer(client: Client) -> (mpsc::UnboundedSender<Agent>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Agent>();
    let task = tokio::spawn(async move {
        while let Some(agent) = rx.recv().await {
            let Some(ns) = agent.namespace() else {
                continue;
            };
            let status = desired_status(&agent);
            let patch = json!({
                "metadata": {"resourceVersion": agent.resource_version()},
                "status": status,
            });
            let params = PatchParams {
                field_manager: Some(super::FIELD_MANAGER.into()),
                ..Default::default()
            };
            let api: Api<Agent> = Api::namespaced(client.clone(), &ns);
            match api
                .patch_status(&agent.name_any(), &params, &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                // Changed since: the watch brings the newer Agent.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
                Err(error) => {
                    warn!(agent = %agent.name_any(), %ns, %error, "could not write the Agent's status")
                }
            }
        }
    });
    (tx, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::spec::AgentSpec;

    fn agent(yaml: &str) -> Agent {
        let spec: AgentSpec = serde_yaml_ng::from_str(yaml).unwrap();
        let mut agent = Agent::new("ops", spec);
        agent.metadata.namespace = Some("ns".into());
        agent.metadata.generation = Some(3);
        agent
    }

    const VALID: &str = r#"
instructions: Help.
model: {name: m, baseUrl: "http://127.0.0.1:1/v1"}
tools:
  - {name: delete_user, description: d, requiresApproval: true, http: {url: "http://127.0.0.1:2/d"}}
  - {name: lookup, description: l, http: {url: "http://127.0.0.1:2/l"}}
"#;

    #[test]
    fn a_valid_agent_shows_its_tools_and_is_ready() {
        let mut a = agent(VALID);
        assert!(needs_update(&a));
        let status = desired_status(&a);
        assert_eq!(status.tool_names.as_deref(), Some("delete_user,lookup"));
        assert_eq!(status.observed_generation, Some(3));
        let ready = find_condition(&status.conditions, READY).unwrap();
        assert_eq!(ready.reason, "Valid");
        a.status = Some(status);
        assert!(!needs_update(&a), "written once, then left alone");
        a.metadata.generation = Some(4);
        assert!(needs_update(&a));
    }

    #[test]
    fn an_invalid_agent_says_why() {
        let a = agent(&VALID.replace("lookup, description", "delete_user, description"));
        let status = desired_status(&a);
        let ready = find_condition(&status.conditions, READY).unwrap();
        assert_eq!(ready.reason, "InvalidSpec");
        assert!(
            ready.message.contains("duplicate tool name"),
            "{}",
            ready.message
        );
    }
}
