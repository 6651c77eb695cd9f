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
}

#[cfg(test)]
mod tests {
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
    fn default_approval_settings_are_left_out() {
        let spec = AgentSpec::default();
        assert_eq!(spec.approvals, ApprovalSettings::default());
        assert!(!spec.approvals.allow_self_approval);
        let json = serde_json::to_value(&spec).unwrap();
        assert!(json.get("approvals").is_none(), "{json}");
    }
}
