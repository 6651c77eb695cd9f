//! The `ApprovalPolicy` custom resource: a cluster admin's rules for which tool calls need a
//! person, which are allowed or denied outright, and how many (and which) people must approve.
//! Cluster-scoped, so that no namespace role (an Agent's or a run's author among them) can write
//! one. The controller evaluates the rules ([`crate::approval_policy`]) when a call halts.
//!
//! ```yaml
//! apiVersion: agentrun.dev/v1alpha1
//! kind: ApprovalPolicy
//! metadata: {name: prod-writes}
//! spec:
//!   namespaceSelector: {matchLabels: {tier: prod}}
//!   rules:
//!   - {name: small-refunds, tools: [refund], when: "args.amount <= 100", action: Allow}
//!   - {name: no-drops, tools: ["drop_*"], action: Deny, message: "Dropping tables is not allowed."}
//!   - name: big-refunds
//!     tools: [refund]
//!     when: "args.amount > 1000"
//!     action: Require
//!     requiredApprovals: 2
//!     approvers: {groups: ["finance:approvers"]}
//! ```

use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::CrdError;
use super::approval_request::MAX_IDENTITY_LENGTH;

/// The most approvals a rule may require.
pub const MAX_REQUIRED_APPROVALS: u32 = 16;
/// The longest `when` expression the API server accepts.
pub const MAX_WHEN_LENGTH: usize = 4096;

/// Rules for the tool calls of runs in the namespaces the policy selects: the first rule whose
/// tools and condition match a call decides it.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
// The printer columns repeat `type_ = "string"`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "agentrun.dev",
    version = "v1alpha1",
    kind = "ApprovalPolicy",
    shortname = "apol",
    category = "agentrun-all",
    status = "ApprovalPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    label("app.kubernetes.io/part-of", "agentrun"),
    doc = "A cluster admin's approval rules for the tool calls of AgentRuns in the namespaces it selects: the first rule whose tools and condition match a call allows it, denies it, or requires people to approve it. An Agent can add approval requirements, never remove one a policy sets.",
    printcolumn(
        name = "Rules",
        type_ = "string",
        json_path = ".status.ruleNames",
        description = "The rules, in order"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether every rule compiled"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(
    validation = Rule::new("self.rules.all(r, self.rules.exists_one(s, s.name == r.name))")
        .message("rule names must be unique within a policy")
        .field_path(".rules")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalPolicySpec {
    /// The namespaces whose runs the policy applies to, by their labels. Absent or empty: every
    /// namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// The rules, in order: the first rule whose tools and condition match a call decides it.
    /// When several policies select a namespace, each policy's first matching rule counts and the
    /// strictest wins: Deny over Require over Allow, and among Require rules the one requiring
    /// the most approvals.
    #[schemars(length(min = 1, max = 64))]
    pub rules: Vec<ApprovalRule>,
}

/// One rule: which calls it matches (tools and condition) and what it does with them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(
    validation = Rule::new("!has(self.message) || self.action == 'Deny'")
        .message("message is only allowed with action Deny (it is what the model is told)")
        .field_path(".message"),
    validation = Rule::new("!has(self.requiredApprovals) || self.action == 'Require'")
        .message("requiredApprovals is only allowed with action Require")
        .field_path(".requiredApprovals"),
    validation = Rule::new("!has(self.approvers) || self.action == 'Require'")
        .message("approvers is only allowed with action Require")
        .field_path(".approvers"),
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalRule {
    /// The rule's name, unique in the policy: decisions it makes are recorded as made by
    /// `policy:<policy>/<rule>`.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The tool names the rule applies to; `*` matches any characters, e.g. `drop_*`.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 128)))]
    pub tools: Vec<String>,
    /// A CEL condition the call must meet for the rule to apply, over `args` (the call's
    /// arguments), `tool` (its name), `agent` (the Agent's name), `run` (the AgentRun:
    /// `run.name`, `run.namespace`, `run.labels`) and `labels` (the AgentRun's labels), e.g.
    /// `args.amount > 1000`. Absent:
    /// every call of the tools. A condition that fails to compile makes the policy Ready=False;
    /// one that fails to evaluate makes the call need a person (fails closed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_WHEN_LENGTH))]
    pub when: Option<String>,
    /// Allow (approved by the policy, recorded as such), Deny (rejected, the model is told the
    /// message) or Require (people decide, even where the Agent does not ask for approval).
    pub action: PolicyAction,
    /// Deny only: what the model is told instead of the tool's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub message: Option<String>,
    /// Require only: how many distinct people must approve (default 1). Any rejection rejects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_REQUIRED_APPROVALS))]
    pub required_approvals: Option<u32>,
    /// Require only: who may decide the calls the rule matches (enforced by the API server).
    /// Absent: anyone allowed to decide ApprovalRequests in the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvers: Option<Approvers>,
}

/// Who may decide: members of any of `groups`, or any of `users`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[x_kube(
    validation = Rule::new("size(self.groups) + size(self.users) > 0")
        .message("approvers must name at least one group or user")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Approvers {
    /// Groups whose members may decide, e.g. `finance:approvers`.
    #[serde(default)]
    #[schemars(length(max = 32), inner(length(min = 1, max = MAX_IDENTITY_LENGTH)))]
    pub groups: Vec<String>,
    /// Usernames that may decide (compared trimmed and lowercased).
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(min = 1, max = MAX_IDENTITY_LENGTH)))]
    pub users: Vec<String>,
}

impl Approvers {
    /// Whether the identity `username` with `groups` is one of these approvers.
    pub fn permits(&self, username: &str, groups: &[String]) -> bool {
        let key = normalized(username);
        self.users.iter().any(|u| normalized(u) == key)
            || self.groups.iter().any(|g| groups.contains(g))
    }
}

/// The form identities are compared in: trimmed, ASCII-lowercased (as the admission policy does).
fn normalized(identity: &str) -> String {
    identity.trim().to_ascii_lowercase()
}

/// What a rule does with the calls it matches.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[schemars(transform = super::field_docs_only)]
pub enum PolicyAction {
    /// Approved by the policy, without a person.
    #[default]
    Allow,
    /// People decide (`requiredApprovals` of them, from `approvers`).
    Require,
    /// Rejected by the policy: the model is told the rule's message.
    Deny,
}

impl PolicyAction {
    /// The action as written in a rule.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl FromStr for PolicyAction {
    type Err = CrdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        super::parse_value("ApprovalPolicy rule action", s)
    }
}

/// What the ApprovalPolicies decided about one call, as recorded on its ApprovalRequest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDecision {
    /// The ApprovalPolicy whose rule decided; absent when no rule matched (the Agent's own
    /// setting then applies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub name: Option<String>,
    /// The rule that decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub rule: Option<String>,
    /// Allow (approved without a person), Deny (rejected) or Require (people decide).
    pub action: PolicyAction,
    /// Deny only: what the model is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub message: Option<String>,
    /// How the decision came about, for people: e.g. that a condition failed to evaluate, so a
    /// person decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub note: Option<String>,
}

impl PolicyDecision {
    /// The approver recorded for a decision the policy made: `policy:<policy>/<rule>`, or
    /// `policy:none` when no rule matched.
    pub fn approver_id(&self) -> String {
        match (&self.name, &self.rule) {
            (Some(policy), Some(rule)) => format!("policy:{policy}/{rule}"),
            (Some(policy), None) => format!("policy:{policy}"),
            _ => "policy:none".to_owned(),
        }
    }

    /// Whether the policy decided the call without a person (Allow or Deny).
    pub fn decides(&self) -> bool {
        self.action != PolicyAction::Require
    }
}

/// Whether the policy's rules compiled, written by the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalPolicyStatus {
    /// The rule names, in order, comma-separated (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_names: Option<String>,
    /// `Ready`: True when every rule's tools and condition compiled; False with the compiler's
    /// messages otherwise (calls a broken rule's tools match then need a person).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation the controller last compiled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_policy_parses() {
        let policy: ApprovalPolicySpec = serde_yaml_ng::from_str(
            r#"
namespaceSelector: {matchLabels: {tier: prod}}
rules:
- {name: small-refunds, tools: [refund], when: "args.amount <= 100", action: Allow}
- {name: no-drops, tools: ["drop_*"], action: Deny, message: "Dropping tables is not allowed."}
- name: big-refunds
  tools: [refund]
  when: "args.amount > 1000"
  action: Require
  requiredApprovals: 2
  approvers: {groups: ["finance:approvers"], users: []}
"#,
        )
        .unwrap();
        assert_eq!(policy.rules.len(), 3);
        assert_eq!(policy.rules[1].action, PolicyAction::Deny);
        assert_eq!(policy.rules[2].required_approvals, Some(2));
        let approvers = policy.rules[2].approvers.as_ref().unwrap();
        assert!(approvers.permits("carol", &["finance:approvers".to_owned()]));
        assert!(!approvers.permits("carol", &["ops".to_owned()]));
        assert!(
            Approvers {
                users: vec![" Dave@Example.com".into()],
                ..Default::default()
            }
            .permits("dave@example.com", &[])
        );
        assert!(serde_yaml_ng::from_str::<ApprovalPolicySpec>("rules: []\nextra: 1").is_err());
        assert_eq!("Deny".parse::<PolicyAction>().unwrap(), PolicyAction::Deny);
        assert!("deny".parse::<PolicyAction>().is_err());
        assert!(
            PolicyAction::Deny > PolicyAction::Require
                && PolicyAction::Require > PolicyAction::Allow
        );
    }
}
