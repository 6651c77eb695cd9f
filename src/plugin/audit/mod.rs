//! `kubectl agentrun audit RUN`: one row per tool call of a run, built from the RunState (the
//! conversation, the approved and rejected lists, `approval_metadata`) joined with the run's
//! ApprovalRequests (claimed approver, verified identity, decision time, arguments digest).
//!
//! When the two sources disagree (a different approver or reason, a digest that does not match),
//! the row carries a warning instead of silently preferring one of them.
//!
//! Without a run, [`export`] audits every run of the namespace or the cluster, the deleted ones
//! from their ApprovalRecords, as one line per decision and per execution (`-o jsonl`).

mod entries;
pub mod export;

use kube::ResourceExt;
use serde::Serialize;

pub use entries::{AuditDecision, AuditEntry, audit_entries};

use super::cli::{AuditArgs, AuditFormat};
use super::text::{Table, shorten};
use super::{PluginError, Session, render_report};
use crate::chunk_store;
use crate::crd::{AgentRun, ApprovalRecord, ApprovalRequest, ApprovalRequestStatus};
use crate::state::RunState;

/// How many hex digits of the arguments digest the table shows (`-o json` has all of them).
pub const DIGEST_WIDTH: usize = 12;
/// How many characters of a reason or message the table shows.
pub const TEXT_WIDTH: usize = 40;

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
    /// True when the run is deleted and this audit comes from its ApprovalRecords (which hold
    /// only the calls that needed approval).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// Every tool call, in the order the model made them.
    pub calls: Vec<AuditEntry>,
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
        deleted: false,
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
        let mut decision = call.decision.as_str().to_owned();
        if call.edited_arguments_digest.is_some() {
            decision.push_str(" (edited)");
        }
        if !call.applied {
            decision.push_str(" (not applied yet)");
        }
        table.push([
            call.tool.clone(),
            call.tool_call_id.clone(),
            call.arguments_digest.chars().take(DIGEST_WIDTH).collect(),
            decision,
            dash(&call.approver_id),
            match (&call.verified_identity, &call.gitops) {
                (Some(identity), _) => identity.clone(),
                (None, Some(gitops)) => shorten(gitops, TEXT_WIDTH),
                (None, None) => "-".to_owned(),
            },
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

/// Runs `audit`. A run that was deleted is audited from its ApprovalRecords (the durable copies
/// of its requests the controller wrote before they went). Without a run: [`export::export`].
pub async fn audit(session: &Session, args: &AuditArgs) -> Result<String, PluginError> {
    let Some(name) = args.run.as_deref() else {
        return export::export(session, args).await;
    };
    let report = match session.run(name).await {
        Ok(run) => live_report(session, &run).await?,
        Err(PluginError::NotFound { .. })
            if let Some(report) = from_records(session, name).await? =>
        {
            report
        }
        Err(e) => return Err(e),
    };
    render(&report, args.output)
}

/// The report in `format`.
fn render(report: &AuditReport, format: AuditFormat) -> Result<String, PluginError> {
    match format.report_format() {
        None => export::jsonl(&export::lines(report)),
        Some(format) => match render_report(report, format, "the audit") {
            Some(out) => out,
            None => Ok(render_table(report)),
        },
    }
}

/// The audit of a live run: its state joined with its requests.
async fn live_report(session: &Session, run: &AgentRun) -> Result<AuditReport, PluginError> {
    let state = chunk_store::load(&session.client, run)
        .await
        .map_err(|source| PluginError::RunState {
            run: run.name_any(),
            source,
        })?;
    let requests = session.requests_of(run).await?;
    Ok(report(run, state.as_ref(), &requests))
}

/// The audit of the deleted run `name` of the session's namespace, from its ApprovalRecords
/// (`None` when it has none).
async fn from_records(session: &Session, name: &str) -> Result<Option<AuditReport>, PluginError> {
    use crate::crd::keys::labels;
    use crate::crd::names::run_label_value;
    use kube::api::{Api, ListParams};
    let selector = format!(
        "{}={},{}={}",
        labels::NAMESPACE,
        run_label_value(&session.namespace),
        labels::RUN,
        run_label_value(name)
    );
    let records: Api<ApprovalRecord> = Api::all(session.client.clone());
    let found = records
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| PluginError::api("list approvalrecords".to_owned(), &e))?;
    if found.items.is_empty() {
        return Ok(None);
    }
    Ok(Some(records_report(
        &session.namespace,
        name,
        None,
        found.items,
    )))
}

/// The audit of a deleted run from its ApprovalRecords: the calls that needed approval, as
/// decided, and whether each ran (as the controller recorded it when the run was deleted).
pub fn records_report(
    namespace: &str,
    run: &str,
    uid: Option<&str>,
    records: Vec<ApprovalRecord>,
) -> AuditReport {
    let executed: std::collections::HashMap<String, Option<bool>> = records
        .iter()
        .map(|r| (r.spec.request.tool_call_id.clone(), r.spec.executed))
        .collect();
    let requests: Vec<ApprovalRequest> = records
        .into_iter()
        .map(|record| {
            let mut request = ApprovalRequest::new(&record.spec.request_name, record.spec.request);
            request.status = Some(ApprovalRequestStatus {
                phase: Some(record.spec.phase),
                decided_at: record.spec.decided_at,
                verified_identity: record.spec.verified_identity,
                gitops: record.spec.gitops,
                voters: record.spec.voters,
                edited_arguments_digest: record.spec.edited_arguments_digest,
                ..Default::default()
            });
            request
        })
        .collect();
    let mut placeholder = AgentRun::new(run, Default::default());
    placeholder.metadata.namespace = Some(namespace.to_owned());
    placeholder.metadata.uid = uid.map(str::to_owned);
    let mut report = report(&placeholder, Some(&RunState::default()), &requests);
    report.deleted = true;
    for call in &mut report.calls {
        call.warnings.clear();
        call.applied = true;
        match executed.get(&call.tool_call_id).copied().flatten() {
            Some(ran) => call.executed = ran,
            None => call
                .warnings
                .push("the run was deleted and whether this call ran was not recorded".into()),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{
        ApprovalPhase, ApprovalRequestSpec, ApprovalRequestStatus, Decision, VerifiedIdentity,
        arguments_digest,
    };
    use crate::state::pyjson::Value;
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
        let requests = [approved, rejected];
        let entries = audit_entries(&state, &requests);
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
            &requests,
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
        assert!(lines[2].contains("1970-01-01T00:02:30Z"), "{table}");

        // The state alone names nobody: a decision counts only as its ApprovalRequest holds it.
        let alone = audit_entries(&state, &[]);
        for entry in &alone[1..] {
            assert_eq!(entry.decision, AuditDecision::Pending, "{entry:?}");
            assert_eq!(entry.approver_id, None);
            assert!(!entry.executed);
            assert!(
                entry
                    .warnings
                    .iter()
                    .any(|w| w.contains("no ApprovalRequest holds")),
                "{:?}",
                entry.warnings
            );
        }
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
            deleted: false,
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
