//! The status of `Agent`s: their tool names (shown by `kubectl get agents`) and whether their
//! spec is one a worker can run, kept by a controller of its own.
//!
//! The desired status is a pure function of the Agent ([`desired_status`]); [`reconcile`] patches
//! it only when it differs from what the Agent already holds, and a failed write is retried.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use tracing::warn;

use crate::crd::keys::field_managers;
use crate::crd::status_patch::StatusPatch;
use crate::crd::{
    Agent, AgentStatus, ConditionStatus, ConditionType, Reason, find_condition, new_condition,
};

/// The status the controller wants an Agent to show.
pub fn desired_status(agent: &Agent) -> AgentStatus {
    let mut status = agent.status.clone().unwrap_or_default();
    let (condition_status, reason, message) =
        match crate::agent::Agent::from_spec_with_name(&agent.name_any(), &agent.spec) {
            Ok(_) => (
                ConditionStatus::True,
                Reason::Valid,
                format!(
                    "{} tool(s); runs can use this agent",
                    agent.spec.tools.len()
                ),
            ),
            Err(e) => (ConditionStatus::False, Reason::InvalidSpec, e.to_string()),
        };
    crate::crd::set_condition(
        &mut status.conditions,
        new_condition(
            ConditionType::Ready,
            condition_status,
            reason,
            &message,
            agent.metadata.generation,
            crate::time::to_k8s(chrono::Utc::now()),
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
        find_condition(&current.conditions, ConditionType::Ready),
        find_condition(&desired.conditions, ConditionType::Ready),
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

/// What the Agents' status controller shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
}

/// Errors writing an Agent's status.
#[derive(Debug, thiserror::Error)]
pub enum AgentStatusError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Writes the Agent's status when it differs from [`desired_status`], guarded by the Agent's
/// resourceVersion (a newer Agent is reconciled again when the watch brings it).
pub async fn reconcile(agent: Arc<Agent>, ctx: Arc<Context>) -> Result<Action, AgentStatusError> {
    let Some(ns) = agent.namespace() else {
        return Ok(Action::await_change());
    };
    if !needs_update(&agent) {
        return Ok(Action::await_change());
    }
    let patch = StatusPatch::guarded(desired_status(&agent), agent.resource_version());
    let params = PatchParams {
        field_manager: Some(field_managers::CONTROLLER.into()),
        ..Default::default()
    };
    let api: Api<Agent> = Api::namespaced(ctx.client.clone(), &ns);
    match api
        .patch_status(&agent.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        // Changed or deleted since: the watch brings the newer Agent.
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
        other => {
            other?;
        }
    }
    Ok(Action::await_change())
}

/// Retries a failed status write after a few seconds.
pub fn error_policy(agent: Arc<Agent>, error: &AgentStatusError, _: Arc<Context>) -> Action {
    warn!(agent = %agent.name_any(), %error, "could not write the Agent's status");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::AgentSpec;

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
        let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
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
        let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
        assert_eq!(ready.reason, "InvalidSpec");
        assert!(
            ready.message.contains("duplicate tool name"),
            "{}",
            ready.message
        );
    }
}
