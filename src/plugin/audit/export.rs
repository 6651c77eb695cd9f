//! `kubectl agentrun audit [-A] -o jsonl`: the audit of every run of a namespace (or of the
//! cluster), as one JSON line per decision and one per execution.
//!
//! Live runs are audited as `audit RUN` does (their state joined with their ApprovalRequests);
//! deleted runs from the ApprovalRecords the controller wrote before their requests went (so
//! reading the export takes the `agentrun-auditor` ClusterRole besides read access to the runs).
//! A decision line is written for each request that was decided, expired or superseded; an
//! execution line for each call the tool received (gated or not). Times are the controller's
//! (`decidedAt`); when a call was sent is in the API server's audit log (the worker's status
//! write that records the call before sending it), see `docs/notifications.md`.

use std::collections::{BTreeMap, HashMap, HashSet};

use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;

use super::{AuditDecision, AuditEntry, AuditReport, records_report, report};
use crate::chunk_store;
use crate::crd::keys::labels;
use crate::crd::names::run_label_value;
use crate::crd::{AgentRun, ApprovalRecord, ApprovalRequest};
use crate::plugin::cli::{AuditArgs, AuditFormat};
use crate::plugin::text::{Table, shorten};
use crate::plugin::{PluginError, Session, render};
use crate::state::RunState;

/// How many objects one list request asks for.
const PAGE_SIZE: u32 = 200;

/// What a line records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LineKind {
    /// A request was decided (approved or rejected), expired or superseded.
    Decision,
    /// A call reached its tool.
    Execution,
}

/// One line of the export.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditLine {
    /// A decision or an execution.
    pub kind: LineKind,
    /// The run's namespace.
    pub namespace: String,
    /// The run's name.
    pub run: String,
    /// The run's uid (a new run of the same name has another).
    pub run_uid: Option<String>,
    /// True when the run is deleted: the line comes from its ApprovalRecord.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub run_deleted: bool,
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The tool.
    pub tool: String,
    /// SHA-256 (lowercase hex) of the call's arguments.
    pub arguments_digest: String,
    /// The run step that halted for the call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// The call's ApprovalRequest.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approval_request: Option<String>,
    /// What was decided (for an execution: what let it run, `Approved` or `NotRequired`).
    pub decision: AuditDecision,
    /// False while a decision is not yet applied to the run.
    pub applied: bool,
    /// The approverId of the decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub approver_id: Option<String>,
    /// The identity the API server authenticated for the decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified_identity: Option<String>,
    /// A GitOps decision's origin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gitops: Option<String>,
    /// The ApprovalPolicy rule that decided or set the requirement (`policy:<policy>/<rule>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// How many distinct approvals the call needed, when more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required_approvals: Option<u32>,
    /// The votes of a quorum (`<voter>: <decision>`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub votes: Vec<String>,
    /// SHA-256 (lowercase hex) of the arguments the approver edited, which the tool received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edited_arguments_digest: Option<String>,
    /// The decision's reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the model was told instead of the result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the controller observed the decision (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// Disagreements between the sources.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl AuditLine {
    fn of(kind: LineKind, report: &AuditReport, entry: &AuditEntry) -> AuditLine {
        AuditLine {
            kind,
            namespace: report.namespace.clone(),
            run: report.run.clone(),
            run_uid: report.uid.clone(),
            run_deleted: report.deleted,
            tool_call_id: entry.tool_call_id.clone(),
            tool: entry.tool.clone(),
            arguments_digest: entry.arguments_digest.clone(),
            step: entry.step,
            approval_request: entry.approval_request.clone(),
            decision: entry.decision,
            applied: entry.applied,
            approver_id: entry.approver_id.clone(),
            verified_identity: entry.verified_identity.clone(),
            gitops: entry.gitops.clone(),
            policy: entry.policy.clone(),
            required_approvals: entry.required_approvals,
            votes: entry.votes.clone(),
            edited_arguments_digest: entry.edited_arguments_digest.clone(),
            reason: entry.reason.clone(),
            message: entry.message.clone(),
            decided_at: entry.decided_at.clone(),
            warnings: entry.warnings.clone(),
        }
    }
}

/// The lines of one run's audit: for each call in order, its decision (if one was made) and its
/// execution (if it ran).
pub fn lines(report: &AuditReport) -> Vec<AuditLine> {
    let mut out = Vec::new();
    for entry in &report.calls {
        if matches!(
            entry.decision,
            AuditDecision::Approved
                | AuditDecision::Rejected
                | AuditDecision::Expired
                | AuditDecision::Superseded
        ) {
            out.push(AuditLine::of(LineKind::Decision, report, entry));
        }
        if entry.executed {
            out.push(AuditLine::of(LineKind::Execution, report, entry));
        }
    }
    out
}

/// The lines as JSON Lines.
pub fn jsonl(lines: &[AuditLine]) -> Result<String, PluginError> {
    let mut out = String::new();
    for line in lines {
        let text = serde_json::to_string(line).map_err(|e| PluginError::Render {
            what: "the audit",
            format: "JSON",
            message: e.to_string(),
        })?;
        out.push_str(&text);
        out.push('\n');
    }
    Ok(out)
}

/// The lines as a table.
pub fn render_lines(lines: &[AuditLine]) -> String {
    if lines.is_empty() {
        return "No decision or execution to audit.\n".to_owned();
    }
    let mut table = Table::new([
        "NAMESPACE",
        "RUN",
        "KIND",
        "TOOL",
        "CALL",
        "DECISION",
        "APPROVER",
        "VERIFIED",
        "TIME",
    ]);
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_owned());
    for line in lines {
        let run = if line.run_deleted {
            format!("{} (deleted)", line.run)
        } else {
            line.run.clone()
        };
        table.push([
            line.namespace.clone(),
            run,
            match line.kind {
                LineKind::Decision => "decision".to_owned(),
                LineKind::Execution => "execution".to_owned(),
            },
            line.tool.clone(),
            shorten(&line.tool_call_id, 24),
            line.decision.as_str().to_owned(),
            dash(&line.approver_id),
            dash(&line.verified_identity),
            dash(&line.decided_at),
        ]);
    }
    table.render()
}

/// Every object of `api` (listed a page at a time).
async fn list_all<K>(api: &Api<K>, params: ListParams, what: &str) -> Result<Vec<K>, PluginError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = params.limit(PAGE_SIZE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| PluginError::api(format!("list {what}"), &e))?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// Runs `audit` without a run: every run of the session's namespace, or of every namespace.
pub async fn export(session: &Session, args: &AuditArgs) -> Result<String, PluginError> {
    let reports = reports(session, args.all_namespaces).await?;
    match args.output {
        AuditFormat::Jsonl => jsonl(&reports.iter().flat_map(lines).collect::<Vec<_>>()),
        AuditFormat::Json => render(&reports, true, "the audit"),
        AuditFormat::Yaml => render(&reports, false, "the audit"),
        AuditFormat::Table => Ok(render_lines(
            &reports.iter().flat_map(lines).collect::<Vec<_>>(),
        )),
    }
}

/// The audit of every live run and every deleted run with records, sorted by namespace, run and
/// uid.
async fn reports(session: &Session, all: bool) -> Result<Vec<AuditReport>, PluginError> {
    let client = session.client.clone();
    let (runs, requests): (Api<AgentRun>, Api<ApprovalRequest>) = if all {
        (Api::all(client.clone()), Api::all(client.clone()))
    } else {
        (session.runs(), session.requests())
    };
    let runs = list_all(&runs, ListParams::default(), "agentruns").await?;
    let requests = list_all(&requests, ListParams::default(), "approvalrequests").await?;
    let records_params = if all {
        ListParams::default()
    } else {
        ListParams::default().labels(&format!(
            "{}={}",
            labels::NAMESPACE,
            run_label_value(&session.namespace)
        ))
    };
    let records = list_all(
        &Api::<ApprovalRecord>::all(client.clone()),
        records_params,
        "approvalrecords (reading them takes the agentrun-auditor ClusterRole)",
    )
    .await?;

    let mut requests_of: HashMap<(String, String), Vec<ApprovalRequest>> = HashMap::new();
    for request in requests {
        let key = (
            request.namespace().unwrap_or_default(),
            request.spec.agent_run_ref.uid.clone(),
        );
        requests_of.entry(key).or_default().push(request);
    }
    let mut live = HashSet::new();
    let mut out = Vec::new();
    for run in &runs {
        let namespace = run.namespace().unwrap_or_default();
        let uid = run.uid().unwrap_or_default();
        live.insert((namespace.clone(), uid.clone()));
        let requests = requests_of.remove(&(namespace, uid)).unwrap_or_default();
        out.push(match chunk_store::load(&client, run).await {
            Ok(state) => report(run, state.as_ref(), &requests),
            Err(error) => {
                // One unreadable state must not hide the other runs: audited from its requests,
                // with a warning on each call.
                let mut unread = report(run, Some(&RunState::default()), &requests);
                for call in &mut unread.calls {
                    call.warnings
                        .push(format!("the run's state cannot be read: {error}"));
                }
                unread
            }
        });
    }
    let mut deleted: BTreeMap<(String, String, String), Vec<ApprovalRecord>> = BTreeMap::new();
    for record in records {
        let run = &record.spec.request.agent_run_ref;
        let key = (record.spec.namespace.clone(), run.uid.clone());
        if live.contains(&key) {
            continue;
        }
        deleted
            .entry((key.0, run.name.clone(), key.1))
            .or_default()
            .push(record);
    }
    for ((namespace, run, uid), records) in deleted {
        out.push(records_report(&namespace, &run, Some(&uid), records));
    }
    out.sort_by(|a, b| {
        (&a.namespace, &a.run, &a.uid, a.deleted).cmp(&(&b.namespace, &b.run, &b.uid, b.deleted))
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{
        AgentRunRef, ApprovalPhase, ApprovalRecordSpec, ApprovalRequestSpec, Decision,
        VerifiedIdentity, arguments_digest,
    };

    fn record(call: &str, phase: ApprovalPhase, executed: Option<bool>) -> ApprovalRecord {
        let decision = match phase {
            ApprovalPhase::Approved => Some(Decision::Approved),
            ApprovalPhase::Rejected => Some(Decision::Rejected),
            _ => None,
        };
        ApprovalRecord::new(
            &format!("ns.r1-{call}"),
            ApprovalRecordSpec {
                namespace: "ns".into(),
                request_name: format!("r1-{call}"),
                request: ApprovalRequestSpec {
                    agent_run_ref: AgentRunRef {
                        name: "r1".into(),
                        uid: "uid-1".into(),
                    },
                    tool_call_id: call.into(),
                    tool_name: "delete_user".into(),
                    arguments: "{}".into(),
                    arguments_digest: arguments_digest("{}"),
                    approver_id: decision.map(|_| "alice@example.com".to_owned()),
                    reason: decision.map(|_| "CR-1".to_owned()),
                    decision,
                    ..Default::default()
                },
                voters: vec![],
                edited_arguments_digest: None,
                phase,
                decided_at: Some(crate::time::to_k8s(
                    chrono::DateTime::from_timestamp(100, 0).unwrap(),
                )),
                verified_identity: decision.map(|_| VerifiedIdentity {
                    username: "alice@example.com".into(),
                    ..Default::default()
                }),
                gitops: None,
                executed,
            },
        )
    }

    #[test]
    fn a_deleted_run_gives_a_decision_line_per_request_and_an_execution_line_per_call_that_ran() {
        let report = records_report(
            "ns",
            "r1",
            Some("uid-1"),
            vec![
                record("call_1", ApprovalPhase::Approved, Some(true)),
                record("call_2", ApprovalPhase::Rejected, Some(false)),
                record("call_3", ApprovalPhase::Expired, Some(false)),
                record("call_4", ApprovalPhase::Pending, Some(false)),
            ],
        );
        let lines = lines(&report);
        let kinds: Vec<(&str, LineKind, AuditDecision)> = lines
            .iter()
            .map(|l| (l.tool_call_id.as_str(), l.kind, l.decision))
            .collect();
        assert_eq!(
            kinds,
            vec![
                ("call_1", LineKind::Decision, AuditDecision::Approved),
                ("call_1", LineKind::Execution, AuditDecision::Approved),
                ("call_2", LineKind::Decision, AuditDecision::Rejected),
                ("call_3", LineKind::Decision, AuditDecision::Expired),
            ]
        );
        let text = jsonl(&lines).unwrap();
        assert_eq!(text.lines().count(), 4);
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["kind"], "decision");
        assert_eq!(first["namespace"], "ns");
        assert_eq!(first["run"], "r1");
        assert_eq!(first["runUid"], "uid-1");
        assert_eq!(first["runDeleted"], true);
        assert_eq!(first["approverId"], "alice@example.com");
        assert_eq!(first["verifiedIdentity"], "alice@example.com");
        assert_eq!(first["decidedAt"], "1970-01-01T00:01:40Z");
        let table = render_lines(&lines);
        assert!(table.contains("r1 (deleted)"), "{table}");
        assert!(
            table.lines().nth(2).unwrap().contains("execution"),
            "{table}"
        );
    }
}
