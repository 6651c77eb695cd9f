//! `kubectl agentrun list [--pending] [-A]`.

use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::cli::ListArgs;
use super::text::{Table, age, rfc3339, shorten};
use super::{PluginError, Session, render_report};
use crate::crd::{AgentRun, ApprovalPhase, ApprovalRequest};
use crate::time::try_from_k8s as to_utc;

/// How many characters of a call's arguments the pending table shows.
pub const ARGUMENTS_WIDTH: usize = 60;

/// One run, as `list` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRow {
    /// The run's name.
    pub name: String,
    /// The run's namespace.
    pub namespace: String,
    /// `status.phase` (absent before the controller saw the run).
    pub phase: Option<String>,
    /// The Agent it runs.
    pub agent: String,
    /// `status.step`.
    pub step: Option<u32>,
    /// `status.pendingApprovals`.
    pub pending_approvals: Option<u32>,
    /// When the run was created (RFC 3339).
    pub created: Option<String>,
    #[serde(skip)]
    created_at: Option<DateTime<Utc>>,
}

/// One ApprovalRequest waiting for a decision, as `list --pending` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingRow {
    /// The ApprovalRequest's name (what `approve`/`reject` take).
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The run that halted.
    pub run: String,
    /// The tool the model wants to call.
    pub tool: String,
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The call's arguments, exactly as stored.
    pub arguments: String,
    /// Their SHA-256.
    pub arguments_digest: String,
    /// When the request expires, if its tool has an approval timeout (RFC 3339).
    pub expires_at: Option<String>,
    /// When the request was created (RFC 3339).
    pub created: Option<String>,
    #[serde(skip)]
    created_at: Option<DateTime<Utc>>,
}

/// The rows of `runs`, sorted by namespace and name.
pub fn run_rows(runs: &[AgentRun]) -> Vec<RunRow> {
    let mut rows: Vec<RunRow> = runs
        .iter()
        .map(|run| {
            let status = run.status.clone().unwrap_or_default();
            let created_at = run.metadata.creation_timestamp.as_ref().and_then(to_utc);
            RunRow {
                name: run.name_any(),
                namespace: run.namespace().unwrap_or_default(),
                phase: status.phase.map(|p| p.to_string()),
                agent: run.spec.agent_ref.name.clone(),
                step: status.step,
                pending_approvals: status.pending_approvals,
                created: created_at.as_ref().map(rfc3339),
                created_at,
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// True when a request waits for a decision: none is set and the controller has not closed it.
pub fn is_pending(request: &ApprovalRequest) -> bool {
    request.spec.decision.is_none()
        && request.spec.policy_decision().is_none()
        && request
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_none_or(|p| p == ApprovalPhase::Pending)
}

/// The rows of the requests that wait for a decision, sorted by namespace, run and name.
pub fn pending_rows(requests: &[ApprovalRequest]) -> Vec<PendingRow> {
    let mut rows: Vec<PendingRow> = requests
        .iter()
        .filter(|r| is_pending(r))
        .map(|request| {
            let created_at = request
                .metadata
                .creation_timestamp
                .as_ref()
                .and_then(to_utc);
            PendingRow {
                name: request.name_any(),
                namespace: request.namespace().unwrap_or_default(),
                run: request.spec.agent_run_ref.name.clone(),
                tool: request.spec.tool_name.clone(),
                tool_call_id: request.spec.tool_call_id.clone(),
                arguments: request.spec.arguments.clone(),
                arguments_digest: request.spec.arguments_digest.clone(),
                expires_at: request
                    .status
                    .as_ref()
                    .and_then(|s| s.expires_at.as_ref())
                    .and_then(to_utc)
                    .as_ref()
                    .map(rfc3339),
                created: created_at.as_ref().map(rfc3339),
                created_at,
            }
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.run, &a.name).cmp(&(&b.namespace, &b.run, &b.name)));
    rows
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The runs as a table (with a NAMESPACE column when `all_namespaces`).
pub fn render_runs(rows: &[RunRow], all_namespaces: bool, now: DateTime<Utc>) -> String {
    let mut header = vec!["NAME", "PHASE", "AGENT", "STEP", "PENDING", "AGE"];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut table = Table::new(header);
    for row in rows {
        let mut cells = vec![
            row.name.clone(),
            or_dash(row.phase.as_deref()),
            row.agent.clone(),
            or_dash(row.step),
            or_dash(row.pending_approvals),
            age(row.created_at, now),
        ];
        if all_namespaces {
            cells.insert(0, row.namespace.clone());
        }
        table.push(cells);
    }
    table.render()
}

/// The pending requests as a table (arguments shortened to [`ARGUMENTS_WIDTH`] characters).
pub fn render_pending(rows: &[PendingRow], all_namespaces: bool, now: DateTime<Utc>) -> String {
    let mut header = vec!["NAME", "RUN", "TOOL", "ARGUMENTS", "AGE"];
    if all_namespaces {
        header.insert(0, "NAMESPACE");
    }
    let mut table = Table::new(header);
    for row in rows {
        let mut cells = vec![
            row.name.clone(),
            row.run.clone(),
            row.tool.clone(),
            shorten(&row.arguments, ARGUMENTS_WIDTH),
            age(row.created_at, now),
        ];
        if all_namespaces {
            cells.insert(0, row.namespace.clone());
        }
        table.push(cells);
    }
    table.render()
}

/// Runs `list`.
pub async fn list(
    session: &Session,
    args: &ListArgs,
    now: DateTime<Utc>,
) -> Result<String, PluginError> {
    let scope = if args.all_namespaces {
        "all namespaces".to_owned()
    } else {
        format!("namespace {}", session.namespace)
    };
    if args.pending {
        let api: Api<ApprovalRequest> = if args.all_namespaces {
            Api::all(session.client.clone())
        } else {
            session.requests()
        };
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| PluginError::api(format!("list approvalrequests in {scope}"), &e))?;
        let rows = pending_rows(&list.items);
        if let Some(out) = render_report(&rows, args.output, "the pending approval requests") {
            return out;
        }
        if rows.is_empty() {
            return Ok(format!(
                "No approval requests waiting for a decision in {scope}.\n"
            ));
        }
        return Ok(render_pending(&rows, args.all_namespaces, now));
    }
    let api: Api<AgentRun> = if args.all_namespaces {
        Api::all(session.client.clone())
    } else {
        session.runs()
    };
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| PluginError::api(format!("list agentruns in {scope}"), &e))?;
    let rows = run_rows(&list.items);
    if let Some(out) = render_report(&rows, args.output, "the runs") {
        return out;
    }
    if rows.is_empty() {
        return Ok(format!("No agent runs in {scope}.\n"));
    }
    Ok(render_runs(&rows, args.all_namespaces, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{
        AgentRef, AgentRunPhase, AgentRunSpec, AgentRunStatus, ApprovalRequestSpec,
        ApprovalRequestStatus, Decision,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(second: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(second).unwrap())
    }

    fn run(name: &str, ns: &str, phase: Option<AgentRunPhase>, created: i64) -> AgentRun {
        let mut run = AgentRun::new(
            name,
            AgentRunSpec {
                agent_ref: AgentRef { name: "ops".into() },
                input: "hi".into(),
                worker: None,
            },
        );
        run.metadata.namespace = Some(ns.into());
        run.metadata.creation_timestamp = Some(at(created));
        run.status = Some(AgentRunStatus {
            phase,
            step: Some(1),
            pending_approvals: Some(2),
            ..Default::default()
        });
        run
    }

    fn request(
        name: &str,
        decision: Option<Decision>,
        phase: Option<ApprovalPhase>,
    ) -> ApprovalRequest {
        let mut r = ApprovalRequest::new(
            name,
            ApprovalRequestSpec {
                tool_call_id: "call_1".into(),
                tool_name: "delete_user".into(),
                arguments: format!(r#"{{"user_id": "u-1", "note": "{}"}}"#, "x".repeat(80)),
                decision,
                ..Default::default()
            },
        );
        r.spec.agent_run_ref.name = "r1".into();
        r.metadata.namespace = Some("ops".into());
        r.metadata.creation_timestamp = Some(at(1_000_000_000));
        r.status = phase.map(|phase| ApprovalRequestStatus {
            phase: Some(phase),
            ..Default::default()
        });
        r
    }

    #[test]
    fn runs_are_listed_with_phase_agent_step_pending_and_age() {
        let now = DateTime::from_timestamp(1_000_000_090, 0).unwrap();
        let rows = run_rows(&[
            run("r2", "ops", None, 1_000_000_000),
            run(
                "r1",
                "ops",
                Some(AgentRunPhase::AwaitingApproval),
                1_000_000_000,
            ),
        ]);
        assert_eq!(rows[0].name, "r1");
        let text = render_runs(&rows, false, now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "NAME   PHASE              AGENT   STEP   PENDING   AGE"
        );
        assert_eq!(
            lines[1],
            "r1     AwaitingApproval   ops     1      2         90s"
        );
        assert_eq!(
            lines[2],
            "r2     -                  ops     1      2         90s"
        );
        let all = render_runs(&rows, true, now);
        assert!(all.starts_with("NAMESPACE   NAME"), "{all}");
        let json = serde_json::to_value(&rows[0]).unwrap();
        assert_eq!(json["phase"], "AwaitingApproval");
        assert_eq!(json["pendingApprovals"], 2);
        assert_eq!(json["created"], "2001-09-09T01:46:40Z");
    }

    #[test]
    fn only_undecided_open_requests_are_pending() {
        let requests = [
            request("a", None, None),
            request("b", None, Some(ApprovalPhase::Pending)),
            request("c", Some(Decision::Approved), Some(ApprovalPhase::Pending)),
            request("d", None, Some(ApprovalPhase::Expired)),
        ];
        let rows = pending_rows(&requests);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let now = DateTime::from_timestamp(1_000_000_005, 0).unwrap();
        let text = render_pending(&rows, false, now);
        let line = text.lines().nth(1).unwrap();
        assert!(
            line.starts_with("a      r1    delete_user   {\"user_id\": \"u-1\""),
            "{line}"
        );
        assert!(line.contains("...   5s"), "{line}");
        assert_eq!(rows[0].arguments.len(), requests[0].spec.arguments.len());
    }
}
