//! The join behind the audit: one [`AuditEntry`] per tool call, from the run's state and its
//! ApprovalRequests, with a warning wherever the two disagree.

use std::collections::{HashMap, HashSet};

use kube::ResourceExt;
use serde::Serialize;

use crate::agent::model::{self, ToolArguments};
use crate::crd::request_decision::{approved_arguments_digest, decision_of, recorded_decision};
use crate::crd::{ApprovalPhase, ApprovalRequest, arguments_digest};
use crate::plugin::text::rfc3339;
use crate::state::RunState;
use crate::state::pyjson::{self, Value};
use crate::time::try_from_k8s as to_utc;

/// What happened to a call's approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum AuditDecision {
    /// The tool needs no approval.
    NotRequired,
    /// Waiting for a decision.
    Pending,
    /// Approved.
    Approved,
    /// Rejected by a person.
    Rejected,
    /// Not decided in time: treated as rejected.
    Expired,
    /// The call changed after the request was made: treated as rejected.
    Superseded,
}

impl AuditDecision {
    /// The decision as shown in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditDecision::NotRequired => "NotRequired",
            AuditDecision::Pending => "Pending",
            AuditDecision::Approved => "Approved",
            AuditDecision::Rejected => "Rejected",
            AuditDecision::Expired => "Expired",
            AuditDecision::Superseded => "Superseded",
        }
    }
}

/// The audit record of one tool call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The tool.
    pub tool: String,
    /// SHA-256 (lowercase hex) of the ApprovalRequest's arguments, or of the call's arguments
    /// serialized as the ApprovalRequest would carry them.
    pub arguments_digest: String,
    /// Whether the call needed a person's approval.
    pub requires_approval: bool,
    /// What was decided.
    pub decision: AuditDecision,
    /// False while a decision set on the ApprovalRequest is not yet in the run's state.
    pub applied: bool,
    /// The approverId claimed in the decision.
    pub approver_id: Option<String>,
    /// The identity the API server authenticated for the decision (ApprovalRequest
    /// `status.verifiedIdentity.username`), when recorded.
    pub verified_identity: Option<String>,
    /// For a decision a GitOps identity applied: `claimed via GitOps commit <sha>, applied by
    /// <identity>` (the approverId is then claimed, never verified).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gitops: Option<String>,
    /// Decided or required by an ApprovalPolicy: `policy:<policy>/<rule>` (`policy:none` when no
    /// rule matched a call only a policy's tools halted), with what it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Requests needing several approvals: how many, and every vote (`<user>: <decision>`, with
    /// whether it counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required_approvals: Option<u32>,
    /// The votes cast on the request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub votes: Vec<String>,
    /// Approved with edited arguments: the SHA-256 of the arguments the tool received (the
    /// original's is `argumentsDigest`) and who edited them (the approver).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited_arguments_digest: Option<String>,
    /// The reason (audit only).
    pub reason: Option<String>,
    /// What the model was told instead of the result (rejections).
    pub message: Option<String>,
    /// When the decision was made: the ApprovalRequest's `status.decidedAt`, else the
    /// `approval_metadata` timestamp (RFC 3339).
    pub decided_at: Option<String>,
    /// Whether the tool ran: a tool message answers the call and it was approved or needed no
    /// approval.
    pub executed: bool,
    /// The ApprovalRequest of the call.
    pub approval_request: Option<String>,
    /// The step that halted for the call (from the ApprovalRequest).
    pub step: Option<u32>,
    /// Disagreements between the run's state and the ApprovalRequest.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// The digest of a call's arguments as the model wrote them, serialized the way the controller
/// writes an ApprovalRequest's arguments (the raw text when it is not JSON).
fn written_arguments_digest(arguments: &ToolArguments) -> String {
    let text = match arguments {
        ToolArguments::Text(text) if text.trim().is_empty() => "{}".to_owned(),
        ToolArguments::Text(text) => pyjson::loads(text)
            .ok()
            .and_then(|v| pyjson::dumps(&v).ok())
            .unwrap_or_else(|| text.clone()),
        ToolArguments::Value(value) => pyjson::dumps(value).unwrap_or_else(|_| "null".to_owned()),
    };
    arguments_digest(&text)
}

fn tool_call_id_of(message: &Value) -> Option<&str> {
    (model::role(message) == Some("tool"))
        .then(|| message.get("tool_call_id").and_then(Value::as_str))
        .flatten()
}

/// Builds the audit of a run from its state and its ApprovalRequests.
pub fn audit_entries(state: &RunState, requests: &[ApprovalRequest]) -> Vec<AuditEntry> {
    let by_call: HashMap<&str, &ApprovalRequest> = requests
        .iter()
        .map(|r| (r.spec.tool_call_id.as_str(), r))
        .collect();
    let answered: HashSet<&str> = state.messages.iter().filter_map(tool_call_id_of).collect();
    let deferred: HashMap<&str, _> = state
        .deferred_tool_requests
        .approvals
        .iter()
        .map(|c| (c.tool_call_id.as_str(), c))
        .collect();

    // Every call in the order the model made it, then any call known only from the approval
    // records (never expected, but an audit must not drop one).
    let mut calls: Vec<(String, String, Option<String>)> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for message in &state.messages {
        if model::role(message) != Some("assistant") {
            continue;
        }
        for call in model::tool_calls(message).unwrap_or_default() {
            if seen.insert(call.id.clone()) {
                let digest = written_arguments_digest(&call.arguments);
                calls.push((call.id, call.name, Some(digest)));
            }
        }
    }
    let extra_ids = state
        .deferred_tool_requests
        .approvals
        .iter()
        .map(|c| c.tool_call_id.as_str())
        .chain(state.approved_tools.iter().map(String::as_str))
        .chain(state.rejected_tools.iter().map(|r| r.tool_call_id.as_str()))
        .chain(state.approval_metadata.keys().map(String::as_str))
        .chain(requests.iter().map(|r| r.spec.tool_call_id.as_str()))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    for id in extra_ids {
        if seen.insert(id.clone()) {
            let tool = deferred
                .get(id.as_str())
                .map(|c| c.tool_name.clone())
                .or_else(|| by_call.get(id.as_str()).map(|r| r.spec.tool_name.clone()))
                .unwrap_or_default();
            calls.push((id, tool, None));
        }
    }

    calls
        .into_iter()
        .map(|(id, tool, written_digest)| {
            let request = by_call.get(id.as_str()).copied();
            let metadata = state.approval_metadata.get(&id);
            let rejection = state.rejection(&id);
            let approved = state.is_approved(&id);
            let requires_approval = request.is_some()
                || deferred.contains_key(id.as_str())
                || approved
                || rejection.is_some()
                || metadata.is_some();
            let mut warnings = Vec::new();

            let state_digest = deferred
                .get(id.as_str())
                .map(|c| arguments_digest(&c.arguments_json()))
                .or(written_digest);
            let edited_digest = request
                .filter(|r| r.spec.edited_arguments.is_some())
                .and_then(|r| approved_arguments_digest(&r.spec).ok());
            let arguments_digest = match request {
                Some(r) => {
                    let computed = arguments_digest(&r.spec.arguments);
                    if computed != r.spec.arguments_digest {
                        warnings.push(format!(
                            "the ApprovalRequest's argumentsDigest {} is not the SHA-256 of its arguments",
                            r.spec.arguments_digest
                        ));
                    }
                    let in_state_ok = |d: &str| {
                        d == computed || (approved && edited_digest.as_deref() == Some(d))
                    };
                    if state_digest.as_deref().is_some_and(|d| !in_state_ok(d)) {
                        warnings.push(
                            "the call's arguments in the run's state differ from the ApprovalRequest's"
                                .to_owned(),
                        );
                    }
                    computed
                }
                None => state_digest.unwrap_or_default(),
            };

            // Who decided what comes from the ApprovalRequest (its decision, and the controller's
            // record of it); the run's state is the copy, checked against it.
            let phase = request.and_then(|r| r.status.as_ref()).and_then(|s| s.phase);
            let in_state = approved || rejection.is_some();
            let pending_decision = request.and_then(|r| decision_of(&r.spec, &[])).map(|d| d.decision);
            let (decision, applied) = match (phase, pending_decision) {
                (Some(ApprovalPhase::Approved), _) => (AuditDecision::Approved, approved),
                (Some(ApprovalPhase::Rejected), _) => (AuditDecision::Rejected, rejection.is_some()),
                (Some(ApprovalPhase::Expired), _) => (AuditDecision::Expired, rejection.is_some()),
                (Some(ApprovalPhase::Superseded), _) => {
                    (AuditDecision::Superseded, rejection.is_some())
                }
                (_, Some(crate::crd::Decision::Approved)) => (AuditDecision::Approved, false),
                (_, Some(crate::crd::Decision::Rejected)) => (AuditDecision::Rejected, false),
                _ if requires_approval => (AuditDecision::Pending, !in_state),
                _ => (AuditDecision::NotRequired, true),
            };
            if in_state && decision == AuditDecision::Pending {
                warnings.push(
                    "the run's state records a decision that no ApprovalRequest holds".to_owned(),
                );
            }
            if approved && decision != AuditDecision::Approved {
                warnings.push(format!(
                    "the run's state records an approval, but the ApprovalRequest is {}",
                    decision.as_str()
                ));
            }
            let person = matches!(decision, AuditDecision::Approved | AuditDecision::Rejected);
            let decided = request.filter(|_| person).and_then(|r| {
                if phase.is_some_and(ApprovalPhase::is_final) {
                    recorded_decision(r)
                } else {
                    decision_of(&r.spec, &[])
                }
            });
            let claimed = decided.as_ref().map(|d| d.approver_id.clone());
            let recorded = metadata.and_then(|m| m.approver_id.clone());
            if recorded.is_some() && recorded != claimed {
                warnings.push(format!(
                    "the run's approval_metadata names {:?}, but the ApprovalRequest's decision was made by {:?}",
                    recorded.as_deref().unwrap_or_default(),
                    claimed.as_deref().unwrap_or("nobody")
                ));
            }
            let request_reason = decided.as_ref().and_then(|d| d.reason.clone());
            let recorded_reason = metadata.and_then(|m| m.reason.clone());
            if let (Some(a), Some(b)) = (&request_reason, &recorded_reason)
                && a != b
                && phase != Some(ApprovalPhase::Expired)
                && phase != Some(ApprovalPhase::Superseded)
            {
                warnings.push(format!(
                    "reason {a:?} on the ApprovalRequest but {b:?} in the run's approval_metadata"
                ));
            }

            let decided_at = request
                .and_then(|r| r.status.as_ref())
                .and_then(|s| s.decided_at.as_ref())
                .and_then(to_utc)
                .or_else(|| metadata.map(|m| m.timestamp))
                .as_ref()
                .map(rfc3339);
            let executed = answered.contains(id.as_str())
                && if requires_approval {
                    decision == AuditDecision::Approved && approved
                } else {
                    true
                };
            let status = request.and_then(|r| r.status.as_ref());

            AuditEntry {
                tool,
                arguments_digest,
                requires_approval,
                decision,
                applied,
                approver_id: claimed,
                verified_identity: status
                    .and_then(|s| s.verified_identity.as_ref())
                    .map(|v| v.username.clone())
                    .or_else(|| {
                        let voters = status.map(|s| &s.voters).filter(|v| !v.is_empty())?;
                        Some(
                            voters
                                .iter()
                                .map(|v| v.username.as_str())
                                .collect::<Vec<_>>()
                                .join(", "),
                        )
                    }),
                policy: request.and_then(|r| r.spec.policy.as_ref()).map(|p| {
                    format!("{} ({})", p.approver_id(), p.action)
                }),
                required_approvals: request
                    .filter(|r| r.spec.is_quorum())
                    .map(|r| r.spec.approvals_needed()),
                votes: request
                    .map(|r| {
                        let counted: Vec<&str> = status
                            .map(|s| s.voters.iter().map(|v| v.username.as_str()).collect())
                            .unwrap_or_default();
                        r.spec
                            .votes
                            .iter()
                            .map(|(who, vote)| {
                                format!(
                                    "{who}: {}{}",
                                    vote.decision,
                                    if counted.contains(&who.as_str()) {
                                        " (counted)"
                                    } else {
                                        ""
                                    }
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                edited_arguments_digest: edited_digest
                    .filter(|_| decision == AuditDecision::Approved),
                gitops: status.and_then(|s| s.gitops.as_ref()).map(|g| {
                    format!(
                        "claimed via GitOps commit {}, applied by {}",
                        g.commit, g.applied_by.username
                    )
                }),
                reason: request_reason.filter(|_| person).or(recorded_reason),
                message: rejection
                    .and_then(|r| r.message.clone())
                    .or_else(|| request.and_then(|r| r.spec.message.clone())),
                decided_at,
                executed,
                approval_request: request.map(|r| r.name_any()),
                step: request.map(|r| r.spec.step),
                warnings,
                tool_call_id: id,
            }
        })
        .collect()
}
