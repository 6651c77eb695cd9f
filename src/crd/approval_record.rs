//! The `ApprovalRecord` custom resource: the durable copy of one ApprovalRequest and its
//! resolution, written by the controller before a run (and so its requests) may be deleted.
//! Cluster-scoped, so that no namespace role (the editors of the run's namespace among them)
//! can change or delete it; its spec is immutable.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use super::{AgentRunRef, ApprovalPhase, ApprovalRequest, ApprovalRequestSpec, GitOpsDecision};
use super::{VerifiedIdentity, keys::labels, names};

/// What an ApprovalRequest asked and how it was resolved, kept after its run is gone.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
// The printer columns repeat `type_ = "string"`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "agentrun.dev",
    version = "v1alpha1",
    kind = "ApprovalRecord",
    shortname = "aprec",
    category = "agentrun-all",
    derive = "PartialEq",
    derive = "Default",
    label("app.kubernetes.io/part-of", "agentrun"),
    doc = "The durable record of one ApprovalRequest and its resolution (who decided what, when, and as verified by whom), written by the controller before the request's run may be deleted. Cluster-scoped and immutable.",
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.namespace",
        description = "The namespace of the run"
    ),
    printcolumn(
        name = "Run",
        type_ = "string",
        json_path = ".spec.request.agentRunRef.name",
        description = "The AgentRun"
    ),
    printcolumn(
        name = "Tool",
        type_ = "string",
        json_path = ".spec.request.toolName",
        description = "The tool"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".spec.phase",
        description = "How the request was resolved"
    ),
    printcolumn(
        name = "Approver",
        type_ = "string",
        json_path = ".spec.request.approverId",
        description = "Who decided (as claimed; see verifiedIdentity)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("an ApprovalRecord is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRecordSpec {
    /// The namespace of the run and its request.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The request's name.
    #[schemars(length(min = 1, max = 253))]
    pub request_name: String,
    /// The request as it was: what was asked (call, arguments, tool) and the decision fields.
    pub request: ApprovalRequestSpec,
    /// How the request was resolved (Pending when its run was deleted before a decision).
    pub phase: ApprovalPhase,
    /// When the controller observed the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// The identity the API server stamped when the decision was set, when it is the approverId.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_identity: Option<VerifiedIdentity>,
    /// A GitOps decision: the commit and the identity that applied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitops: Option<GitOpsDecision>,
    /// A quorum's decision: the identities whose votes counted, as the API server stamped them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub voters: Vec<VerifiedIdentity>,
    /// Approved with edited arguments: the SHA-256 of the arguments the tool received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub edited_arguments_digest: Option<String>,
    /// Whether the call ran (the run's state holds the tool's answer to the approved call);
    /// absent when the state could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executed: Option<bool>,
}

impl ApprovalRecord {
    /// The record of `request` (in namespace `namespace`) as it is now; `executed` says whether
    /// its call ran, when known.
    pub fn of(
        namespace: &str,
        request: &ApprovalRequest,
        executed: Option<bool>,
    ) -> ApprovalRecord {
        let request_name = request.metadata.name.clone().unwrap_or_default();
        let status = request.status.clone().unwrap_or_default();
        let run: &AgentRunRef = &request.spec.agent_run_ref;
        let mut record = ApprovalRecord::new(
            &names::approval_record_name(namespace, &request_name),
            ApprovalRecordSpec {
                namespace: namespace.to_owned(),
                request_name,
                request: request.spec.clone(),
                phase: status.phase.unwrap_or_default(),
                decided_at: status.decided_at,
                verified_identity: status.verified_identity,
                gitops: status.gitops,
                voters: status.voters,
                edited_arguments_digest: status.edited_arguments_digest,
                executed,
            },
        );
        record.metadata.labels = Some(
            [
                (
                    labels::NAMESPACE.to_owned(),
                    names::run_label_value(namespace),
                ),
                (labels::RUN.to_owned(), names::run_label_value(&run.name)),
                (labels::RUN_UID.to_owned(), names::run_label_value(&run.uid)),
            ]
            .into(),
        );
        record
    }
}
