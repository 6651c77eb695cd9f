//! `kubectl agentrun audit RUN`: one row per tool call of a run, built from the RunState (the
//! conversation, the approved and rejected lists, `approval_metadata`) joined with the run's
//! ApprovalRequests (claimed approver, verified identity, decision time, arguments digest).
//!
//! When the two sources disagree (a different approver or reason, a digest that does not match),
//! the row carries a warning instead of silently preferring one of them.

use std::collections::{HashMap, HashSet};

use kube::ResourceExt;
use serde::Serialize;

use super::cli::{AuditArgs, OutputFormat};
use super::text::{Table, rfc3339, shorten};
use super::{PluginError, Session, render_report};
use crate::agent::model::{self, ToolArguments};
use crate::chunk_store;
use crate::crd::{AgentRun, ApprovalPhase, ApprovalRequest, arguments_digest};
use crate::state::RunState;
use crate::state::pyjson::{self, Value};
use crate::time::try_from_k8s as to_utc;

/// How many hex digits of the arguments digest the table shows (`-o json` has all of them).
pub const DIGEST_WIDTH: usize = 12;
/// How many characters of a reason or message the table shows.
pub const TEXT_WIDTH: usize = 40;

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

/// The audit of one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditReport {
    /// The run's name.
    pub run: String,
    /// Its namespace.
    pub namespace: String,
    /// Its uid.
    pub uid: Option<String>,
    /// Its phase.
    pub phase: Option<String>,
    /// Every tool call, in the order the model made them.
    pub calls: Vec<AuditEntry>,
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
            let arguments_digest = match request {
                Some(r) => {
                    let computed = arguments_digest(&r.spec.arguments);
                    if computed != r.spec.arguments_digest {
                        warnings.push(format!(
                            "the ApprovalRequest's argumentsDigest {} is not the SHA-256 of its arguments",
                            r.spec.arguments_digest
                        ));
                    }
                    if state_digest.as_deref().is_some_and(|d| d != computed) {
                        warnings.push(
                            "the call's arguments in the run's state differ from the ApprovalRequest's"
                                .to_owned(),
                        );
                    }
                    computed
                }
                None => state_digest.unwrap_or_default(),
            };

            let phase = request.and_then(|r| r.status.as_ref()).and_then(|s| s.phase);
            let closed_as = |phase: Option<ApprovalPhase>| match phase {
                Some(ApprovalPhase::Expired) => Some(AuditDecision::Expired),
                Some(ApprovalPhase::Superseded) => Some(AuditDecision::Superseded),
                _ => None,
            };
            let (decision, applied) = if approved {
                (AuditDecision::Approved, true)
            } else if rejection.is_some() {
                (closed_as(phase).unwrap_or(AuditDecision::Rejected), true)
            } else if let Some(decision) = request.and_then(|r| r.spec.decision) {
                let decision = match decision {
                    crate::crd::Decision::Approved => AuditDecision::Approved,
                    crate::crd::Decision::Rejected => AuditDecision::Rejected,
                };
                (decision, false)
            } else if let Some(closed) = closed_as(phase) {
                (closed, false)
            } else if requires_approval {
                (AuditDecision::Pending, true)
            } else {
                (AuditDecision::NotRequired, true)
            };

            let claimed = request.and_then(|r| r.spec.approver_id.clone());
            let recorded = metadata.and_then(|m| m.approver_id.clone());
            if let (Some(c), Some(r)) = (&claimed, &recorded)
                && c != r
            {
                warnings.push(format!(
                    "approverId {c:?} on the ApprovalRequest but {r:?} in the run's approval_metadata"
                ));
            }
            let request_reason = request.and_then(|r| r.spec.reason.clone());
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
            let executed = answered.contains(id.as_str()) && (approved || !requires_approval);

            AuditEntry {
                tool,
                arguments_digest,
                requires_approval,
                decision,
                applied,
                approver_id: recorded.or(claimed),
                verified_identity: request
                    .and_then(|r| r.status.as_ref())
                    .and_then(|s| s.verified_identity.as_ref())
                    .map(|v| v.username.clone()),
                reason: recorded_reason.or(request_reason),
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

/// The audit report of `run`.
pub fn report(
    run: &AgentRun,
    state: Option<&RunState>,
    requests: &[ApprovalRequest],
) -> AuditReport {
    AuditReport {
        run: run.name_any(),
        namespace: run.namespace().unwrap_or_default(),
        uid: run.uid(),
        phase: run
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .map(|p| p.to_string()),
        calls: state
            .map(|s| audit_entries(s, requests))
            .unwrap_or_default(),
    }
}

/// The report as a table, followed by its warnings.
pub fn render_table(report: &AuditReport) -> String {
    if report.calls.is_empty() {
        return format!("agentrun {} has made no tool calls yet.\n", report.run);
    }
    let mut table = Table::new([
        "TOOL",
        "CALL",
        "ARGS SHA256",
        "DECISION",
        "APPROVER",
        "VERIFIED",
        "REASON",
        "MESSAGE",
        "TIME",
        "EXECUTED",
    ]);
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    for call in &report.calls {
        let decision = if call.applied {
            call.decision.as_str().to_owned()
        } else {
            format!("{} (not applied yet)", call.decision.as_str())
        };
        table.push([
            call.tool.clone(),
            call.tool_call_id.clone(),
            call.arguments_digest.chars().take(DIGEST_WIDTH).collect(),
            decision,
            dash(&call.approver_id),
            dash(&call.verified_identity),
            call.reason
                .as_deref()
                .map_or_else(|| "-".to_owned(), |r| shorten(r, TEXT_WIDTH)),
            call.message
                .as_deref()
                .map_or_else(|| "-".to_owned(), |m| shorten(m, TEXT_WIDTH)),
            dash(&call.decided_at),
            if call.executed { "yes" } else { "no" }.to_owned(),
        ]);
    }
    let mut out = table.render();
    for call in &report.calls {
        for warning in &call.warnings {
            out.push_str(&format!(
                "warning: {}: {}\n",
                super::text::one_line(&call.tool_call_id),
                super::text::one_line(warning)
            ));
        }
    }
    out
}

/// Runs `audit`.
pub async fn audit(session: &Session, args: &AuditArgs) -> Result<String, PluginError> {
    let run = session.run(&args.run).await?;
    let state = chunk_store::load(&session.client, &run)
        .await
        .map_err(|source| PluginError::RunState {
            run: args.run.clone(),
            source,
        })?;
    let requests = session.requests_of(&run).await?;
    let report = report(&run, state.as_ref(), &requests);
    if let Some(out) = render_report(&report, args.output, "the audit") {
        return out;
    }
    debug_assert!(args.output == OutputFormat::Table);
    Ok(render_table(&report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ApprovalRequestSpec, ApprovalRequestStatus, Decision, VerifiedIdentity};
    use crate::state::{Approval, DeferredToolCall, Rejection};
    use chrono::{DateTime, Utc};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn ts(second: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(second, 0).unwrap()
    }

    fn call(id: &str, name: &str, args: &str) -> serde_json::Value {
        serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
    }

    /// call_1 lookup (no approval, ran), call_2 delete approved (ran), call_3 delete rejected.
    fn state() -> RunState {
        let mut state = RunState::new("r1", "ops", "clean up");
        state.messages = vec![
            Value::from(serde_json::json!({"role": "user", "content": "clean up"})),
            Value::from(
                serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                    call("call_1", "lookup_user", r#"{"user_id":"u-1"}"#),
                    call("call_2", "delete_user", r#"{"user_id":"u-1"}"#),
                    call("call_3", "delete_user", r#"{"user_id":"u-2"}"#),
                ]}),
            ),
            Value::from(
                serde_json::json!({"role": "tool", "tool_call_id": "call_1", "content": "found"}),
            ),
            Value::from(
                serde_json::json!({"role": "tool", "tool_call_id": "call_2", "content": "deleted"}),
            ),
            Value::from(
                serde_json::json!({"role": "tool", "tool_call_id": "call_3", "content": "Not allowed"}),
            ),
            Value::from(serde_json::json!({"role": "assistant", "content": "done"})),
        ];
        for (id, user) in [("call_2", "u-1"), ("call_3", "u-2")] {
            state
                .deferred_tool_requests
                .approvals
                .push(DeferredToolCall {
                    tool_call_id: id.into(),
                    tool_name: "delete_user".into(),
                    args: Value::from(serde_json::json!({"user_id": user})),
                });
        }
        state
            .approve(
                "call_2",
                Approval::new()
                    .approver_id("alice@example.com")
                    .reason("CR-1")
                    .at(ts(100)),
            )
            .unwrap();
        state
            .reject(
                "call_3",
                Rejection::new()
                    .message("Not allowed")
                    .approver_id("bob@example.com")
                    .reason("policy")
                    .at(ts(200)),
            )
            .unwrap();
        state
    }

    fn request(
        id: &str,
        args: &str,
        decision: Decision,
        approver: &str,
        reason: &str,
    ) -> ApprovalRequest {
        let mut r = ApprovalRequest::new(
            &format!("r1-{id}"),
            ApprovalRequestSpec {
                step: 0,
                tool_call_id: id.into(),
                tool_name: "delete_user".into(),
                arguments: args.into(),
                arguments_digest: arguments_digest(args),
                decision: Some(decision),
                approver_id: Some(approver.into()),
                reason: Some(reason.into()),
                ..Default::default()
            },
        );
        r.status = Some(ApprovalRequestStatus {
            phase: Some(match decision {
                Decision::Approved => ApprovalPhase::Approved,
                Decision::Rejected => ApprovalPhase::Rejected,
            }),
            decided_at: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(150).unwrap(),
            )),
            ..Default::default()
        });
        r
    }

    #[test]
    fn every_call_is_audited_with_its_decision_and_execution() {
        let state = state();
        let mut approved = request(
            "call_2",
            r#"{"user_id": "u-1"}"#,
            Decision::Approved,
            "alice@example.com",
            "CR-1",
        );
        approved.status.as_mut().unwrap().verified_identity = Some(VerifiedIdentity {
            username: "alice@example.com".into(),
            ..Default::default()
        });
        let rejected = request(
            "call_3",
            r#"{"user_id": "u-2"}"#,
            Decision::Rejected,
            "bob@example.com",
            "policy",
        );
        let entries = audit_entries(&state, &[approved, rejected]);
        assert_eq!(entries.len(), 3);

        let lookup = &entries[0];
        assert_eq!(
            (lookup.tool.as_str(), lookup.decision),
            ("lookup_user", AuditDecision::NotRequired)
        );
        assert!(lookup.executed && !lookup.requires_approval);
        assert_eq!(
            lookup.arguments_digest,
            arguments_digest(r#"{"user_id": "u-1"}"#)
        );
        assert_eq!(lookup.approver_id, None);

        let delete = &entries[1];
        assert_eq!(delete.decision, AuditDecision::Approved);
        assert!(delete.executed && delete.applied);
        assert_eq!(delete.approver_id.as_deref(), Some("alice@example.com"));
        assert_eq!(
            delete.verified_identity.as_deref(),
            Some("alice@example.com")
        );
        assert_eq!(delete.reason.as_deref(), Some("CR-1"));
        assert_eq!(delete.decided_at.as_deref(), Some("1970-01-01T00:02:30Z"));
        assert_eq!(delete.approval_request.as_deref(), Some("r1-call_2"));
        assert!(delete.warnings.is_empty(), "{:?}", delete.warnings);

        let refused = &entries[2];
        assert_eq!(refused.decision, AuditDecision::Rejected);
        assert!(
            !refused.executed,
            "a rejected call never executes, even though the model got a tool message"
        );
        assert_eq!(refused.message.as_deref(), Some("Not allowed"));
        assert_eq!(refused.verified_identity, None);

        let table = render_table(&report(
            &AgentRun::new("r1", Default::default()),
            Some(&state),
            &[],
        ));
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("TOOL          CALL     ARGS SHA256    DECISION"),
            "{table}"
        );
        assert!(
            lines[2].contains("Approved")
                && lines[2].contains("alice@example.com")
                && lines[2].ends_with("yes"),
            "{table}"
        );
        assert!(
            lines[3].contains("Rejected")
                && lines[3].contains("Not allowed")
                && lines[3].ends_with("no"),
            "{table}"
        );
        // Without the ApprovalRequests, time comes from approval_metadata.
        assert!(lines[2].contains("1970-01-01T00:01:40Z"), "{table}");
    }

    #[test]
    fn disagreements_and_unapplied_decisions_are_reported() {
        let mut state = state();
        state.approved_tools.clear();
        state.approval_metadata.shift_remove("call_2");
        let tampered = {
            let mut r = request(
                "call_2",
                r#"{"user_id": "u-9"}"#,
                Decision::Approved,
                "mallory",
                "x",
            );
            r.spec.arguments_digest = "0".repeat(64);
            r
        };
        let rejected = request(
            "call_3",
            r#"{"user_id": "u-2"}"#,
            Decision::Rejected,
            "carol@example.com",
            "policy",
        );
        let entries = audit_entries(&state, &[tampered, rejected]);
        let delete = &entries[1];
        assert_eq!(delete.decision, AuditDecision::Approved);
        assert!(!delete.applied && !delete.executed);
        assert_eq!(delete.warnings.len(), 2, "{:?}", delete.warnings);
        let refused = &entries[2];
        assert!(
            refused.warnings[0].contains("carol@example.com"),
            "{:?}",
            refused.warnings
        );
        let table = render_table(&AuditReport {
            run: "r1".into(),
            namespace: "ns".into(),
            uid: None,
            phase: None,
            calls: entries,
        });
        assert!(table.contains("Approved (not applied yet)"), "{table}");
        assert!(table.contains("warning: call_2: "), "{table}");
    }

    #[test]
    fn pending_and_expired_calls() {
        let mut state = state();
        state
            .deferred_tool_requests
            .approvals
            .push(DeferredToolCall {
                tool_call_id: "call_4".into(),
                tool_name: "delete_user".into(),
                args: Value::from(serde_json::json!({})),
            });
        state.reject("call_3", Rejection::new()).unwrap_err();
        let mut expired = request(
            "call_3",
            r#"{"user_id": "u-2"}"#,
            Decision::Rejected,
            "x",
            "y",
        );
        expired.spec.decision = None;
        expired.spec.approver_id = None;
        expired.spec.reason = None;
        expired.status.as_mut().unwrap().phase = Some(ApprovalPhase::Expired);
        let entries = audit_entries(&state, &[expired]);
        assert_eq!(entries[2].decision, AuditDecision::Expired);
        assert_eq!(entries[3].tool_call_id, "call_4");
        assert_eq!(entries[3].decision, AuditDecision::Pending);
        assert_eq!(entries[3].arguments_digest, arguments_digest("{}"));
        let json = serde_json::to_value(&entries[3]).unwrap();
        assert_eq!(json["decision"], "Pending");
        assert_eq!(json["executed"], false);
        assert!(json.get("warnings").is_none());
    }
}
