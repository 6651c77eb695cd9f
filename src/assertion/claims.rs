//! The claims of an approval assertion: the registered JWT claims and what was approved.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ISSUER;

/// How the approver named in an assertion is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApproverKind {
    /// The API server authenticated the approver when they set the decision (the admission policy
    /// stamped their identity on the ApprovalRequest).
    Verified,
    /// A GitOps identity applied a decision that names someone else as the approver; the
    /// repository vouches for them. `applied_by` and `gitops_commit` say who applied it and from
    /// which commit.
    Gitops,
    /// Several people approved, each authenticated by the API server when they voted;
    /// `approver` lists them, comma-separated.
    Quorum,
    /// An ApprovalPolicy approved the call without a person; `approver` is
    /// `policy:<policy>/<rule>` (or `policy:none`).
    Policy,
}

/// What an approval assertion states. Claim names are the serialized field names below; the
/// registered ones (`iss`, `aud`, `iat`, `nbf`, `exp`, `jti`) mean what RFC 7519 says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// `iss`: always [`ISSUER`] (`agentrun`).
    pub iss: String,
    /// `aud`: the tool endpoint the call is sent to (the URL the worker POSTs to, as parsed and
    /// serialized by the WHATWG URL rules, e.g. `https://tools.example.com/delete_user`).
    pub aud: String,
    /// `iat`: when the controller issued it (seconds since the Unix epoch).
    pub iat: u64,
    /// `nbf`: not valid before (equal to `iat`).
    pub nbf: u64,
    /// `exp`: not valid after; assertions are short-lived (minutes).
    pub exp: u64,
    /// `jti`: a unique id of the approval (the controller uses the ApprovalRequest's uid: one
    /// approval, one `jti`). A tool that keeps the `jti`s it has served can drop replays.
    pub jti: String,
    /// The run's namespace.
    pub namespace: String,
    /// The AgentRun's name.
    pub run: String,
    /// The AgentRun's uid (a new run of the same name has another).
    pub run_uid: String,
    /// The run step that halted for this call (the ApprovalRequest's `spec.step`).
    pub step: u32,
    /// The ApprovalRequest's name.
    pub approval_request: String,
    /// The tool call's id, exactly as the model wrote it.
    pub tool_call_id: String,
    /// The tool's name.
    pub tool: String,
    /// The tool endpoint, equal to `aud`.
    pub endpoint: String,
    /// The lowercase hex SHA-256 of the exact request body the worker sends (the ApprovalRequest's
    /// `spec.argumentsDigest`, or `status.editedArgumentsDigest` when the approver edited them).
    pub arguments_sha256: String,
    /// Approvals with edited arguments only: the SHA-256 of the arguments the model asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_arguments_sha256: Option<String>,
    /// The lowercase hex SHA-256 of the tool's definition the approver was shown (empty when the
    /// controller does not record one).
    #[serde(default)]
    pub tool_definition_sha256: String,
    /// Who approved: the verified username, or for [`ApproverKind::Gitops`] the approver the
    /// repository names.
    pub approver: String,
    /// How `approver` is known.
    pub approver_kind: ApproverKind,
    /// GitOps only: the identity that applied the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_by: Option<String>,
    /// GitOps only: the commit the decision came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitops_commit: Option<String>,
    /// When the decision was made (RFC 3339, UTC).
    pub decided_at: DateTime<Utc>,
}

impl Claims {
    /// Sets `iss` to [`ISSUER`], `iat` and `nbf` to `issued_at` and `exp` to `lifetime` later.
    pub fn valid_from(mut self, issued_at: DateTime<Utc>, lifetime: Duration) -> Claims {
        let iat = u64::try_from(issued_at.timestamp()).unwrap_or(0);
        self.iss = ISSUER.to_owned();
        self.iat = iat;
        self.nbf = iat;
        self.exp = iat.saturating_add(lifetime.as_secs());
        self
    }
}

/// The lowercase hex SHA-256 of a request body: what `arguments_sha256` must equal.
pub fn body_digest(body: &[u8]) -> String {
    hex::encode(Sha256::digest(body))
}
