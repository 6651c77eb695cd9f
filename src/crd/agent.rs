//! The `Agent` custom resource. Its spec is the declarative agent,
//! [`AgentSpec`](crate::agent::spec::AgentSpec), on which the resource type is derived; this
//! module holds its status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The observed state of an Agent, written by the controller. Secrets the agent references are
/// never copied here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// The latest observations of the agent's state (e.g. whether its spec is valid), one per
    /// type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// The names of the agent's tools, comma-separated, as the controller last saw them (shown by
    /// `kubectl get agents`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TOOL_NAMES_LENGTH))]
    pub tool_names: Option<String>,
}

impl AgentStatus {
    /// The `toolNames` value for a spec: its tool names joined with `,`, cut to the schema bound.
    pub fn tool_names_of(spec: &crate::agent::spec::AgentSpec) -> String {
        let mut names = spec
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>()
            .join(",");
        if names.len() > MAX_TOOL_NAMES_LENGTH {
            let mut end = MAX_TOOL_NAMES_LENGTH;
            while !names.is_char_boundary(end) {
                end -= 1;
            }
            names.truncate(end);
        }
        names
    }
}

/// The longest `status.toolNames` the API server accepts.
pub const MAX_TOOL_NAMES_LENGTH: usize = 8192;

#[cfg(test)]
mod tests {
    use super::AgentStatus;
    use crate::agent::spec::{AgentSpec, ApprovalSettings};
    use crate::crd::Agent;

    #[test]
    fn an_agent_reads_from_yaml_with_its_approval_settings() {
        let agent: Agent = serde_yaml_ng::from_str(
            "apiVersion: agentrun.dev/v1alpha1\nkind: Agent\nmetadata: {name: ops}\nspec:\n  instructions: be careful\n  model: {baseUrl: 'http://127.0.0.1:1/v1', name: m, apiKeySecretRef: {name: s, key: k}}\n  approvals: {allowSelfApproval: true}\n",
        )
        .unwrap();
        assert!(agent.spec.approvals.allow_self_approval);
        assert_eq!(agent.spec.model.name.as_deref(), Some("m"));
    }

    #[test]
    fn tool_names_are_joined_and_bounded() {
        use crate::agent::spec::ToolSpec;
        let tool = |name: &str| ToolSpec {
            name: name.into(),
            ..Default::default()
        };
        let mut spec = AgentSpec {
            tools: vec![tool("restart"), tool("read")],
            ..Default::default()
        };
        assert_eq!(AgentStatus::tool_names_of(&spec), "restart,read");
        spec.tools = (0..200)
            .map(|i| tool(&format!("{i}{}", "x".repeat(60))))
            .collect();
        assert_eq!(
            AgentStatus::tool_names_of(&spec).len(),
            super::MAX_TOOL_NAMES_LENGTH
        );
        assert_eq!(AgentStatus::tool_names_of(&AgentSpec::default()), "");
    }

    #[test]
    fn default_approval_settings_are_left_out() {
        let spec = AgentSpec::default();
        assert_eq!(spec.approvals, ApprovalSettings::default());
        assert!(!spec.approvals.allow_self_approval);
        let json = serde_json::to_value(&spec).unwrap();
        assert!(json.get("approvals").is_none(), "{json}");
    }
}
