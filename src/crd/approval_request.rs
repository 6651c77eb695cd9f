//! The `ApprovalRequest` custom resource: one deferred tool call waiting for a person's decision.
//!
//! The controller creates it with the request fields (which run, which call, its exact arguments
//! and their digest); a person decides by setting the decision fields, e.g.
//!
//! ```text
//! kubectl patch apr NAME --type merge -p '{"spec":{"decision":"Approved","approverId":"alice@example.com","reason":"authorized per change CR-1234"}}'
//! ```
//!
//! CEL rules in the CRD keep the request fields immutable and make a decision final.

use std::collections::BTreeMap;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::CrdError;
use super::approval_policy::{Approvers, MAX_REQUIRED_APPROVALS, PolicyDecision};

/// The longest `spec.arguments` the API server accepts, in characters.
pub const MAX_ARGUMENTS_LENGTH: usize = 1_048_576;
/// The longest `spec.toolCallId` the API server accepts.
pub const MAX_TOOL_CALL_ID_LENGTH: usize = 256;
/// The longest identity (`approverId`, `runCreator`, usernames) the API server accepts.
pub const MAX_IDENTITY_LENGTH: usize = 512;
/// The longest `spec.reason` and `spec.message` the API server accepts.
pub const MAX_DECISION_TEXT_LENGTH: usize = 4096;

/// The longest `status.assertion` the API server accepts.
pub const MAX_ASSERTION_LENGTH: usize = 16_384;

/// The message refusing a decision on a request a policy decided.
pub const POLICY_DECIDED_MESSAGE: &str =
    "an ApprovalPolicy decided this request (see spec.policy): it takes no decision";
/// The message refusing a single decision on a request that needs several approvals.
pub const QUORUM_DECISION_MESSAGE: &str = "this request needs several approvals (spec.requiredApprovals): add your vote under spec.votes instead of setting decision";
/// The message refusing votes on a request that needs one approval.
pub const VOTES_ONLY_FOR_QUORUM_MESSAGE: &str = "votes are only for requests that need several approvals (spec.requiredApprovals above 1); decide this one with decision";
/// The message refusing a change or removal of a vote.
pub const VOTE_FINAL_MESSAGE: &str = "a vote is final: it cannot be changed or removed";

/// The message of the CEL rule that makes a decision final.
pub const DECISION_FINAL_MESSAGE: &str = "a decision is final: decision, approverId, reason, message and editedArguments cannot change once decision is set";

/// One tool call waiting for a person's decision. The request fields are written once by the
/// controller; the decision fields are written once by a person.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "agentrun.dev",
    version = "v1alpha1",
    kind = "ApprovalRequest",
    namespaced,
    shortname = "apr",
    category = "agentrun-all",
    status = "ApprovalRequestStatus",
    derive = "PartialEq",
    derive = "Default",
    label("app.kubernetes.io/part-of", "agentrun"),
    doc = "A tool call of an AgentRun that waits for a person's decision. Approve or reject it by setting spec.decision, spec.approverId and spec.reason (and spec.message when rejecting); a decision is final.",
    printcolumn(
        name = "Run",
        type_ = "string",
        json_path = ".spec.agentRunRef.name",
        description = "The AgentRun that halted"
    ),
    printcolumn(
        name = "Tool",
        type_ = "string",
        json_path = ".spec.toolName",
        description = "The tool the model wants to call"
    ),
    printcolumn(
        name = "Decision",
        type_ = "string",
        json_path = ".spec.decision",
        description = "Approved or Rejected; empty while pending"
    ),
    printcolumn(
        name = "Approver",
        type_ = "string",
        json_path = ".spec.approverId",
        description = "Who decided"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Pending, Approved, Rejected, Expired or Superseded",
        priority = 1
    ),
    validation = Rule::new(
        "!has(self.spec.decision) || has(oldSelf.spec.decision) || !has(self.status) || !has(self.status.phase) || !(self.status.phase in ['Expired', 'Superseded'])"
    )
    .message("this request is Expired or Superseded: it can no longer be decided")
    .field_path(".spec.decision"),
    validation = Rule::new(
        "(has(self.spec.votes) ? size(self.spec.votes) : 0) <= (has(oldSelf.spec.votes) ? size(oldSelf.spec.votes) : 0) || !has(self.status) || !has(self.status.phase) || self.status.phase == 'Pending'"
    )
    .message("this request is no longer Pending: no more votes can be added")
    .field_path(".spec.votes")
)]
#[x_kube(
    validation = Rule::new(
        "!has(oldSelf.decision) || (has(self.decision) && self.decision == oldSelf.decision && has(self.approverId) == has(oldSelf.approverId) && (!has(self.approverId) || self.approverId == oldSelf.approverId) && has(self.reason) == has(oldSelf.reason) && (!has(self.reason) || self.reason == oldSelf.reason) && has(self.message) == has(oldSelf.message) && (!has(self.message) || self.message == oldSelf.message) && has(self.editedArguments) == has(oldSelf.editedArguments) && (!has(self.editedArguments) || self.editedArguments == oldSelf.editedArguments))"
    ).message(DECISION_FINAL_MESSAGE),
    validation = Rule::new("!has(self.decision) || has(self.approverId)")
        .message("approverId is required with decision")
        .field_path(".approverId")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("has(self.decision) || (!has(self.approverId) && !has(self.reason) && !has(self.message))")
        .message("approverId, reason and message can only be set together with decision"),
    validation = Rule::new("!has(self.message) || (has(self.decision) && self.decision == 'Rejected')")
        .message("message is only allowed with decision Rejected (it is shown to the model); use reason for the audit trail")
        .field_path(".message"),
    validation = Rule::new("has(self.runCreator) == has(oldSelf.runCreator)")
        .message("runCreator is immutable")
        .field_path(".runCreator"),
    validation = Rule::new("has(self.policy) == has(oldSelf.policy)")
        .message("policy is immutable")
        .field_path(".policy"),
    validation = Rule::new("has(self.requiredApprovals) == has(oldSelf.requiredApprovals)")
        .message("requiredApprovals is immutable")
        .field_path(".requiredApprovals"),
    validation = Rule::new("has(self.approvers) == has(oldSelf.approvers)")
        .message("approvers is immutable")
        .field_path(".approvers"),
    validation = Rule::new("!has(self.decision) || !has(self.policy) || self.policy.action == 'Require'")
        .message(POLICY_DECIDED_MESSAGE)
        .field_path(".decision"),
    validation = Rule::new("!has(self.decision) || !has(self.requiredApprovals) || self.requiredApprovals <= 1")
        .message(QUORUM_DECISION_MESSAGE)
        .field_path(".decision"),
    validation = Rule::new("!has(self.votes) || (has(self.requiredApprovals) && self.requiredApprovals > 1)")
        .message(VOTES_ONLY_FOR_QUORUM_MESSAGE)
        .field_path(".votes"),
    validation = Rule::new("!has(oldSelf.votes) || has(self.votes)")
        .message(VOTE_FINAL_MESSAGE)
        .field_path(".votes"),
    validation = Rule::new("!has(self.editedArguments) || (has(self.decision) && self.decision == 'Approved')")
        .message("editedArguments is only allowed with decision Approved")
        .field_path(".editedArguments"),
)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequestSpec {
    /// The AgentRun that halted for this call. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("agentRunRef is immutable"))]
    pub agent_run_ref: AgentRunRef,
    /// The run's step that halted for this call. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("step is immutable"))]
    pub step: u32,
    /// The tool call's id exactly as the model wrote it. Immutable.
    #[schemars(length(min = 1, max = MAX_TOOL_CALL_ID_LENGTH))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("toolCallId is immutable"))]
    pub tool_call_id: String,
    /// The tool the model wants to call. Immutable.
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("toolName is immutable"))]
    pub tool_name: String,
    /// The call's JSON arguments exactly as stored in the run's state, as a string (so their
    /// digest and large numbers survive unchanged). Immutable.
    #[schemars(length(max = MAX_ARGUMENTS_LENGTH))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("arguments is immutable"))]
    pub arguments: String,
    /// The SHA-256 (lowercase hex) of arguments. A decision applies only to a call whose
    /// arguments still have this digest. Immutable.
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("argumentsDigest is immutable"))]
    pub arguments_digest: String,
    /// The verified identity of the AgentRun's creator, copied by the controller so admission
    /// policy can keep creators from deciding their own runs' requests. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_IDENTITY_LENGTH))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("runCreator is immutable"))]
    pub run_creator: Option<String>,
    /// The URL the call is sent to if approved, from the Agent the run is bound to. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("toolEndpoint is immutable"))]
    pub tool_endpoint: Option<String>,
    /// The SHA-256 (lowercase hex) of the tool's definition (endpoint, schema, approval and
    /// timeout settings) in the Agent the run is bound to: the call is sent only to a tool with
    /// this definition. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("toolDefinitionDigest is immutable"))]
    pub tool_definition_digest: Option<String>,
    /// What the ApprovalPolicies decided about the call, when a policy applies (or when no rule
    /// matched a call only a policy halted). Allow and Deny decide the request without a person.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("policy is immutable"))]
    pub policy: Option<PolicyDecision>,
    /// How many distinct people must approve the call (from the policy rule; absent: 1). Above 1,
    /// people vote under `votes` instead of setting `decision`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_REQUIRED_APPROVALS))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("requiredApprovals is immutable"))]
    pub required_approvals: Option<u32>,
    /// Who may decide the call (from the policy rule), enforced by the admission policy. Absent:
    /// anyone allowed to decide ApprovalRequests in the namespace. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("approvers is immutable"))]
    pub approvers: Option<Approvers>,
    /// Requests needing several approvals: one vote per person, keyed by the voter's exact
    /// username (the admission policy allows adding only your own). A vote is final. The request
    /// is approved when `requiredApprovals` distinct people approved it; any rejection rejects it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(length(max = 64))]
    #[x_kube(
        validation = Rule::new("oldSelf.all(k, k in self && self[k] == oldSelf[k])").message(VOTE_FINAL_MESSAGE),
        validation = Rule::new("self.all(k, size(k) > 0 && size(k) <= 512)").message("a vote's key is the voter's username (1 to 512 characters)")
    )]
    pub votes: BTreeMap<String, Vote>,
    /// The decision: Approved or Rejected. Set once, by a person; it cannot change afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// Who decided, e.g. alice@example.com: must be the authenticated user making the change.
    /// Required with decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_IDENTITY_LENGTH))]
    pub approver_id: Option<String>,
    /// Why, for the audit trail (e.g. a change ticket). Never shown to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DECISION_TEXT_LENGTH))]
    pub reason: Option<String>,
    /// Rejected only: what the model is told instead of the tool's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DECISION_TEXT_LENGTH))]
    pub message: Option<String>,
    /// Approved only: the JSON object of arguments the approver approved instead of the model's
    /// (e.g. `{"amount": 50}`). Checked against the tool's schema and the ApprovalPolicies again;
    /// the tool receives these, and the model's history shows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = MAX_ARGUMENTS_LENGTH))]
    pub edited_arguments: Option<String>,
}

impl ApprovalRequestSpec {
    /// True when `argumentsDigest` is the SHA-256 of `arguments`.
    pub fn digest_matches(&self) -> bool {
        arguments_digest(&self.arguments) == self.arguments_digest
    }

    /// How many distinct approvals the request needs (at least 1).
    pub fn approvals_needed(&self) -> u32 {
        self.required_approvals.unwrap_or(1).max(1)
    }

    /// Whether people decide by voting (more than one approval needed).
    pub fn is_quorum(&self) -> bool {
        self.approvals_needed() > 1
    }

    /// The decision a policy made without a person (Allow or Deny), if one did.
    pub fn policy_decision(&self) -> Option<&PolicyDecision> {
        self.policy.as_ref().filter(|p| p.decides())
    }
}

/// The lowercase hex SHA-256 of a call's arguments string, as stored in `spec.argumentsDigest`.
pub fn arguments_digest(arguments: &str) -> String {
    hex::encode(Sha256::digest(arguments.as_bytes()))
}

/// One person's vote on a request that needs several approvals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[x_kube(
    validation = Rule::new("!has(self.message) || self.decision == 'Rejected'")
        .message("message is only allowed with decision Rejected (it is shown to the model); use reason for the audit trail")
        .field_path(".message")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Vote {
    /// Approved or Rejected.
    pub decision: Decision,
    /// Why, for the audit trail. Never shown to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DECISION_TEXT_LENGTH))]
    pub reason: Option<String>,
    /// Rejected only: what the model is told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DECISION_TEXT_LENGTH))]
    pub message: Option<String>,
    /// Written by the admission policy, never by hand: the identity that cast the vote, as the
    /// API server authenticated it (the JSON of `agentrun.dev/decided-by`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16384))]
    pub decided_by: Option<String>,
}

/// A reference to the AgentRun a request belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRunRef {
    /// The AgentRun's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The AgentRun's uid, so a request never applies to a new run of the same name.
    #[schemars(length(min = 1, max = 128))]
    pub uid: String,
}

/// A person's decision on a tool call.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[schemars(transform = super::field_docs_only)]
pub enum Decision {
    /// The call may run.
    Approved,
    /// The call must not run; the model is told `message` instead.
    Rejected,
}

impl Decision {
    /// The decision as written in `spec.decision`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl FromStr for Decision {
    type Err = CrdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        super::parse_value("ApprovalRequest spec.decision", s)
    }
}

/// The observed state of a request, written by the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequestStatus {
    /// Pending, Approved, Rejected, Expired (no decision in time: treated as rejected) or
    /// Superseded (the call changed; the decision was not applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<ApprovalPhase>,
    /// When the controller saw the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Time>,
    /// When the request expires and is treated as rejected, if the tool has an approvalTimeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// The authenticated identity that set the decision, as the API server stamped it. Set only
    /// when that identity is the approverId (never for GitOps decisions, see gitops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_identity: Option<VerifiedIdentity>,
    /// A decision a GitOps identity applied for the approverId it claims: the commit it names
    /// and the identity that applied it. The approverId is then claimed, not verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitops: Option<GitOpsDecision>,
    /// Requests needing several approvals: the identities whose votes counted (the approvers
    /// once approved, the rejecter once rejected), as the API server stamped them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub voters: Vec<VerifiedIdentity>,
    /// Approved with edited arguments: the SHA-256 (lowercase hex) of the arguments the tool
    /// receives (the edit, as stored in the run's state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub edited_arguments_digest: Option<String>,
    /// Approved only, when the controller signs approval assertions: the signed assertion (a
    /// compact JWS) the worker sends to the tool in the `Agentrun-Approval` header, so that the
    /// tool can verify the approval itself (see docs/security.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_ASSERTION_LENGTH))]
    pub assertion: Option<String>,
    /// The latest observations of the request's state, one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}

/// A decision applied by a GitOps identity on behalf of the approver it names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitOpsDecision {
    /// The commit named by the agentrun.dev/gitops-commit annotation.
    #[schemars(length(max = 256))]
    pub commit: String,
    /// The identity that applied the decision, as the API server stamped it.
    pub applied_by: VerifiedIdentity,
}

/// An identity the API server authenticated.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifiedIdentity {
    /// The username, e.g. alice@example.com.
    #[schemars(length(max = MAX_IDENTITY_LENGTH))]
    pub username: String,
    /// The user's uid, when the authenticator provides one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_IDENTITY_LENGTH))]
    pub uid: Option<String>,
    /// The user's groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = MAX_IDENTITY_LENGTH)))]
    pub groups: Vec<String>,
}

/// Where a request is in its lifecycle.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[schemars(transform = super::field_docs_only)]
pub enum ApprovalPhase {
    /// Waiting for a decision.
    #[default]
    Pending,
    /// Approved; the call runs when the run resumes.
    Approved,
    /// Rejected; the model is told the message.
    Rejected,
    /// No decision in time; treated as rejected.
    Expired,
    /// The call changed after the request was made; its decision was not applied.
    Superseded,
}

impl ApprovalPhase {
    /// The phase as written in `status.phase`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// True for every phase but Pending.
    pub fn is_final(self) -> bool {
        self != ApprovalPhase::Pending
    }
}

impl FromStr for ApprovalPhase {
    type Err = CrdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        super::parse_value("ApprovalRequest status.phase", s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_and_phases_round_trip() {
        for d in [Decision::Approved, Decision::Rejected] {
            assert_eq!(d.to_string().parse::<Decision>().unwrap(), d);
            assert_eq!(
                serde_json::to_value(d).unwrap(),
                serde_json::json!(d.as_str())
            );
        }
        for &p in <ApprovalPhase as strum::VariantArray>::VARIANTS {
            assert_eq!(p.to_string().parse::<ApprovalPhase>().unwrap(), p);
            assert_eq!(
                serde_json::to_value(p).unwrap(),
                serde_json::json!(p.as_str())
            );
        }
        let err = "approved".parse::<Decision>().unwrap_err().to_string();
        assert!(
            err.contains("spec.decision") && err.contains("approved"),
            "{err}"
        );
        assert!(!ApprovalPhase::Pending.is_final());
        assert!(ApprovalPhase::Superseded.is_final());
    }

    #[test]
    fn digest_is_sha256_hex_of_the_exact_string() {
        assert_eq!(
            arguments_digest(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let mut spec = ApprovalRequestSpec {
            arguments: r#"{"n": 12345678901234567890123}"#.to_owned(),
            ..Default::default()
        };
        spec.arguments_digest = arguments_digest(&spec.arguments);
        assert!(spec.digest_matches());
        spec.arguments = r#"{"n":12345678901234567890123}"#.to_owned();
        assert!(!spec.digest_matches());
    }

    #[test]
    fn the_documented_merge_patch_deserializes_into_the_decision_fields() {
        let patch: serde_json::Value = serde_json::from_str(
            r#"{"spec":{"decision":"Approved","approverId":"alice@example.com","reason":"authorized per change CR-1234"}}"#,
        )
        .unwrap();
        let mut base = serde_json::to_value(ApprovalRequestSpec {
            agent_run_ref: AgentRunRef {
                name: "r".into(),
                uid: "u".into(),
            },
            tool_call_id: "call_1".into(),
            tool_name: "restart".into(),
            arguments: "{}".into(),
            arguments_digest: arguments_digest("{}"),
            ..Default::default()
        })
        .unwrap();
        for (k, v) in patch["spec"].as_object().unwrap() {
            base[k] = v.clone();
        }
        let spec: ApprovalRequestSpec = serde_json::from_value(base).unwrap();
        assert_eq!(spec.decision, Some(Decision::Approved));
        assert_eq!(spec.approver_id.as_deref(), Some("alice@example.com"));
        assert_eq!(
            spec.reason.as_deref(),
            Some("authorized per change CR-1234")
        );
        assert_eq!(spec.message, None);
    }
}
