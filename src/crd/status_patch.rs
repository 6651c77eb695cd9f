//! Typed JSON merge patches of the resources' status subresources.
//!
//! In a merge patch an absent field is left as it is and `null` removes it: fields that are ever
//! removed are `Option<Option<T>>` here (`Some(None)` sends `null`), the others `Option<T>`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::Serialize;

use super::{
    AgentRunPhase, AgentSnapshot, ApprovalPhase, GitOpsDecision, RunStateEncoding, ToolCallRecord,
    VerifiedIdentity,
};

/// A merge patch body: `{"metadata": {"resourceVersion": …}, "status": …}`, the resourceVersion
/// present only when the write must fail (409) if the object changed since it was read.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StatusPatch<S> {
    /// The optimistic-concurrency guard.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Guard>,
    /// The status fields to change.
    pub status: S,
}

/// `metadata.resourceVersion` of a guarded patch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Guard {
    /// The version the change was computed from.
    pub resource_version: String,
}

impl<S> StatusPatch<S> {
    /// A patch applied whatever the object's version.
    pub fn unguarded(status: S) -> Self {
        StatusPatch {
            metadata: None,
            status,
        }
    }

    /// A patch applied only to `resource_version` (unguarded when it is unknown).
    pub fn guarded(status: S, resource_version: Option<String>) -> Self {
        StatusPatch {
            metadata: resource_version.map(|resource_version| Guard { resource_version }),
            status,
        }
    }
}

/// A merge patch of an AgentRun's status (see [`AgentRunStatus`](super::AgentRunStatus) for the
/// fields' meaning).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentRunStatusPatch {
    /// `phase`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<AgentRunPhase>,
    /// `conditions`, the whole list (a merge patch replaces lists).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// `observedGeneration`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<Option<i64>>,
    /// `runState`; removed when the new state is offloaded to chunks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_state: Option<Option<String>>,
    /// `runStateEncoding`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_state_encoding: Option<RunStateEncoding>,
    /// `runStateBytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_state_bytes: Option<u64>,
    /// `runStateDigest`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_state_digest: Option<String>,
    /// `runStateChunks`; removed when the new state is not offloaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_state_chunks: Option<Option<u32>>,
    /// `step`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// `finalOutput`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_output: Option<String>,
    /// `pendingApprovals`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_approvals: Option<u32>,
    /// `workerPod`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_pod: Option<String>,
    /// `startedAt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// `completedAt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// `retries`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// `createdBy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// `agent`, the snapshot of the run's Agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSnapshot>,
    /// `toolCalls`, the whole list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallRecord>>,
    /// `approvalGates`, the whole list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_gates: Option<Vec<String>>,
}

/// A merge patch of an ApprovalRequest's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequestStatusPatch {
    /// `phase`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<ApprovalPhase>,
    /// `decidedAt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<Time>,
    /// `expiresAt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Time>,
    /// `verifiedIdentity`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified_identity: Option<VerifiedIdentity>,
    /// `gitops`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gitops: Option<GitOpsDecision>,
    /// `conditions`, the whole list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// `assertion`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assertion: Option<String>,
    /// `voters`, the whole list.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub voters: Option<Vec<VerifiedIdentity>>,
    /// `editedArgumentsDigest`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited_arguments_digest: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_fields_are_left_out_and_removals_are_null() {
        let patch = StatusPatch::guarded(
            AgentRunStatusPatch {
                phase: Some(AgentRunPhase::Running),
                run_state: Some(None),
                run_state_chunks: Some(Some(3)),
                ..Default::default()
            },
            Some("42".into()),
        );
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            json!({
                "metadata": {"resourceVersion": "42"},
                "status": {"phase": "Running", "runState": null, "runStateChunks": 3}
            })
        );
        let unguarded = StatusPatch::unguarded(ApprovalRequestStatusPatch::default());
        assert_eq!(
            serde_json::to_value(&unguarded).unwrap(),
            json!({"status": {}})
        );
    }
}
