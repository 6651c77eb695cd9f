//! The pages: askama templates (`src/console/templates/`, compiled into the binary) and the view
//! models they render.
//!
//! Every value is inserted with askama's HTML escaping (the templates are `.html`, so escaping is
//! on by default, and no template uses `|safe`): text written by the model, a tool, a requester or
//! an approver is shown as text, never interpreted as markup. No text is ever turned into a link:
//! the only links are the console's own paths, built from Kubernetes object names.

use askama::Template;
use chrono::{DateTime, Utc};
use kube::ResourceExt;

use super::data::{InboxRow, RequestData};
use crate::agent::model::{self, ToolArguments};
use crate::crd::keys::annotations::DECIDED_BY;
use crate::crd::{
    AgentRun, ApprovalPhase, ApprovalRequest, ApprovalRequestSpec, Decision, arguments_digest,
};
use crate::plugin::audit::{AuditEntry, AuditReport};
use crate::plugin::show::RunView;
use crate::plugin::text::{age, rfc3339};
use crate::state::pyjson::{self, Value};
use crate::time::try_from_k8s as to_utc;

/// What every page's frame shows.
#[derive(Clone, Debug, Default)]
pub struct Frame {
    /// The page's title.
    pub title: String,
    /// The person's username (absent on the login page).
    pub user: Option<String>,
    /// True when the person came through an authenticating proxy (no logout button: the proxy
    /// owns the login).
    pub via_proxy: bool,
    /// The session's CSRF token, for the forms.
    pub csrf: String,
}

/// The login page.
#[derive(Template)]
#[template(path = "login.html")]
pub struct LoginPage {
    /// The frame.
    pub frame: Frame,
    /// Why the last attempt failed (the API server's message).
    pub error: Option<String>,
    /// A notice (e.g. the session expired).
    pub notice: Option<String>,
}

/// One row of the inbox.
#[derive(Clone, Debug)]
pub struct RowView {
    /// The request page.
    pub href: String,
    /// The run's audit page.
    pub audit_href: String,
    /// The request's namespace.
    pub namespace: String,
    /// The request's name.
    pub name: String,
    /// The run.
    pub run: String,
    /// The tool.
    pub tool: String,
    /// Who created the run.
    pub requester: String,
    /// How long it has waited.
    pub waiting: String,
    /// When it was created (RFC 3339).
    pub created: String,
    /// Time left before it expires (`no deadline` without one).
    pub time_left: String,
    /// Less than 10 minutes left.
    pub urgent: bool,
    /// Quorum progress, when the request has one.
    pub quorum: Option<String>,
}

/// The inbox's table body (also served alone for the live updates).
#[derive(Template)]
#[template(path = "inbox_rows.html")]
pub struct InboxRows {
    /// The rows, oldest first.
    pub rows: Vec<RowView>,
    /// Whether any row has a quorum column.
    pub quorum: bool,
}

/// The inbox page.
#[derive(Template)]
#[template(path = "inbox.html")]
pub struct InboxPage {
    /// The frame.
    pub frame: Frame,
    /// The pending requests, oldest first (the same rows as [`InboxRows`]).
    pub rows: Vec<RowView>,
    /// Whether any row has a quorum column.
    pub quorum: bool,
    /// What was looked at.
    pub scope: String,
    /// Namespaces that could not be read, with the API server's message.
    pub unreadable: Vec<(String, String)>,
    /// The `namespaces` field's value.
    pub namespaces: String,
    /// The URL of the table body alone.
    pub rows_url: String,
    /// The URL of the live updates.
    pub events_url: String,
}

/// A tool call inside a message.
#[derive(Clone, Debug)]
pub struct CallView {
    /// The model's id of the call.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments, pretty-printed.
    pub arguments: String,
    /// True for the call this request is about.
    pub current: bool,
}

/// One message of the conversation.
#[derive(Clone, Debug)]
pub struct MessageView {
    /// 1-based position.
    pub number: usize,
    /// `user`, `assistant`, `tool`, `system`, `developer` or `other` (a CSS class: never the
    /// message's own text).
    pub role: String,
    /// A heading, e.g. `tool result of call_1 (lookup_user)`.
    pub heading: String,
    /// The message's text.
    pub text: String,
    /// The tool calls of an assistant message.
    pub calls: Vec<CallView>,
}

/// A decision already made.
#[derive(Clone, Debug)]
pub struct DecisionView {
    /// Approved or Rejected.
    pub decision: String,
    /// The approverId written.
    pub approver_id: String,
    /// The reason (audit only).
    pub reason: Option<String>,
    /// What the model is told (rejections).
    pub message: Option<String>,
    /// Who the API server's admission stamp says decided.
    pub stamped_by: Option<String>,
    /// The controller's verified identity.
    pub verified: Option<String>,
    /// A GitOps origin.
    pub gitops: Option<String>,
    /// When the controller saw the decision.
    pub decided_at: Option<String>,
}

/// The request page.
#[derive(Template)]
#[template(path = "request.html")]
pub struct RequestPage {
    /// The frame.
    pub frame: Frame,
    /// The request's namespace.
    pub namespace: String,
    /// The request's name.
    pub name: String,
    /// Its uid (the decision forms send it back as a precondition).
    pub uid: String,
    /// The run.
    pub run: String,
    /// The run's audit page.
    pub audit_href: String,
    /// The tool.
    pub tool: String,
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The run step that halted.
    pub step: u32,
    /// The arguments pretty-printed (numbers and strings exactly as stored).
    pub arguments_pretty: String,
    /// The arguments exactly as stored (what the digest is of).
    pub arguments_exact: String,
    /// Their SHA-256.
    pub arguments_digest: String,
    /// False when the digest is not the SHA-256 of the arguments (never expected).
    pub digest_ok: bool,
    /// The endpoint the call goes to.
    pub endpoint: String,
    /// The digest of the tool's definition.
    pub definition_digest: String,
    /// Why approval is needed (the ApprovalPolicy rule, else the Agent's setting).
    pub rule: String,
    /// Quorum progress (`1 of 2 approvals`), when the request needs several approvals.
    pub quorum: Option<String>,
    /// The votes cast so far, when it does.
    pub votes: Vec<VoteView>,
    /// Whether the approver may approve edited arguments (a request one person decides).
    pub can_edit: bool,
    /// Who created the run.
    pub requester: String,
    /// When the request was created.
    pub created: String,
    /// Its phase.
    pub phase: String,
    /// When it expires.
    pub expires: String,
    /// Time left.
    pub time_left: String,
    /// The decision, once made.
    pub decision: Option<DecisionView>,
    /// True while a decision can be made.
    pub decidable: bool,
    /// The conversation.
    pub conversation: Vec<MessageView>,
    /// The run's input (shown when there is no conversation yet).
    pub input: String,
    /// Why the run could not be read.
    pub run_note: Option<String>,
    /// The API server's refusal of the last decision.
    pub error: Option<String>,
    /// A notice (e.g. the decision was recorded).
    pub notice: Option<String>,
    /// The reason typed before a refusal.
    pub reason: String,
    /// The message typed before a refusal.
    pub message: String,
    /// The edited arguments typed before a refusal.
    pub edited_arguments: String,
}

/// One vote on a request that needs several approvals.
#[derive(Clone, Debug)]
pub struct VoteView {
    /// The voter's username (the key the admission policy let only them add).
    pub voter: String,
    /// Approved or Rejected.
    pub decision: String,
    /// Their reason.
    pub reason: String,
}

/// One row of a run's audit.
#[derive(Clone, Debug)]
pub struct AuditRow {
    /// The entry.
    pub entry: AuditEntry,
    /// Its request page.
    pub href: Option<String>,
    /// The digest's first 12 digits.
    pub short_digest: String,
}

/// A run's audit page.
#[derive(Template)]
#[template(path = "audit.html")]
pub struct AuditPage {
    /// The frame.
    pub frame: Frame,
    /// The run.
    pub run: String,
    /// Its namespace.
    pub namespace: String,
    /// Its phase.
    pub phase: String,
    /// One row per tool call.
    pub rows: Vec<AuditRow>,
}

/// An error page.
#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    /// The frame.
    pub frame: Frame,
    /// What failed.
    pub heading: String,
    /// The message (often the API server's).
    pub message: String,
}

/// The path of a request's page.
pub fn request_href(namespace: &str, name: &str) -> String {
    format!("/requests/{namespace}/{name}")
}

/// The path of a run's audit page.
pub fn audit_href(namespace: &str, run: &str) -> String {
    format!("/runs/{namespace}/{run}/audit")
}

/// How long until `deadline`: `no deadline`, `expired`, or kubectl's short duration.
pub fn time_left(deadline: Option<DateTime<Utc>>, now: DateTime<Utc>) -> String {
    match deadline {
        None => "no deadline".to_owned(),
        Some(deadline) if deadline <= now => "expired".to_owned(),
        Some(deadline) => age(Some(now), deadline),
    }
}

/// The inbox rows of `rows`.
pub fn rows(rows: &[InboxRow], now: DateTime<Utc>) -> InboxRows {
    InboxRows {
        quorum: rows.iter().any(|r| r.quorum.is_some()),
        rows: rows
            .iter()
            .map(|row| RowView {
                href: request_href(&row.namespace, &row.name),
                audit_href: audit_href(&row.namespace, &row.run),
                namespace: row.namespace.clone(),
                name: row.name.clone(),
                run: row.run.clone(),
                tool: row.tool.clone(),
                requester: row.requester.clone().unwrap_or_else(|| "-".to_owned()),
                waiting: age(row.created, now),
                created: row.created.as_ref().map(rfc3339).unwrap_or_default(),
                time_left: time_left(row.expires, now),
                urgent: row.expires.is_some_and(|e| (e - now).num_seconds() < 600),
                quorum: row.quorum.clone(),
            })
            .collect(),
    }
}

/// `value` as indented JSON, every scalar written exactly as Python's `json.dumps` writes it
/// (so large integers and escapes are shown exactly; non-ASCII and control characters as
/// `\uXXXX`, which also makes invisible or bidirectional characters visible).
pub fn pretty(value: &Value) -> String {
    fn write(value: &Value, indent: usize, out: &mut String) {
        let pad = |n: usize| "  ".repeat(n);
        match value {
            Value::List(items) if !items.is_empty() => {
                out.push_str("[\n");
                for (i, item) in items.iter().enumerate() {
                    out.push_str(&pad(indent + 1));
                    write(item, indent + 1, out);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                out.push_str(&pad(indent));
                out.push(']');
            }
            Value::Dict(dict) if !dict.is_empty() => {
                out.push_str("{\n");
                for (i, (key, item)) in dict.iter().enumerate() {
                    out.push_str(&pad(indent + 1));
                    let key = pyjson::dumps(&Value::Str(key.clone())).unwrap_or_default();
                    out.push_str(&key);
                    out.push_str(": ");
                    write(item, indent + 1, out);
                    out.push_str(if i + 1 < dict.len() { ",\n" } else { "\n" });
                }
                out.push_str(&pad(indent));
                out.push('}');
            }
            scalar => {
                out.push_str(
                    &pyjson::dumps(scalar).unwrap_or_else(|e| format!("<unprintable: {e}>")),
                );
            }
        }
    }
    let mut out = String::new();
    write(value, 0, &mut out);
    out
}

/// A call's arguments text, pretty-printed when it is JSON (else as is).
pub fn pretty_text(text: &str) -> String {
    match pyjson::loads(text) {
        Ok(value) => pretty(&value),
        Err(_) => text.to_owned(),
    }
}

fn arguments(arguments: &ToolArguments) -> String {
    match arguments {
        ToolArguments::Text(text) => pretty_text(text),
        ToolArguments::Value(value) => pretty(value),
    }
}

/// The conversation of `view`, the call `current` marked.
pub fn conversation(view: &RunView, current: &str) -> Vec<MessageView> {
    let mut tool_names = std::collections::HashMap::new();
    view.messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            let number = i + 1;
            let text = model::content_text(message);
            match model::role(message) {
                Some("assistant") => {
                    let calls = model::tool_calls(message).unwrap_or_default();
                    let calls: Vec<CallView> = calls
                        .into_iter()
                        .map(|call| {
                            tool_names.insert(call.id.clone(), call.name.clone());
                            CallView {
                                current: call.id == current,
                                arguments: arguments(&call.arguments),
                                id: call.id,
                                name: call.name,
                            }
                        })
                        .collect();
                    MessageView {
                        number,
                        role: "assistant".to_owned(),
                        heading: "the model".to_owned(),
                        text,
                        calls,
                    }
                }
                Some("tool") => {
                    let id = message
                        .get("tool_call_id")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_owned();
                    let tool = tool_names.get(&id).cloned().unwrap_or_default();
                    MessageView {
                        number,
                        role: "tool".to_owned(),
                        heading: format!("result of {tool} ({id})"),
                        text,
                        calls: Vec::new(),
                    }
                }
                Some(role) => MessageView {
                    number,
                    role: if matches!(role, "user" | "system" | "developer") {
                        role.to_owned()
                    } else {
                        "other".to_owned()
                    },
                    heading: role.to_owned(),
                    text,
                    calls: Vec::new(),
                },
                None => MessageView {
                    number,
                    role: "other".to_owned(),
                    heading: "not a chat message".to_owned(),
                    text: pretty(message),
                    calls: Vec::new(),
                },
            }
        })
        .collect()
}

/// The ApprovalPolicy rule that decided the call or asked for people, when one applies.
fn policy_rule(spec: &ApprovalRequestSpec) -> Option<String> {
    let policy = spec.policy.as_ref()?;
    let mut text = match (&policy.name, &policy.rule) {
        (Some(name), Some(rule)) => {
            format!("ApprovalPolicy {name}, rule {rule}: {}", policy.action)
        }
        (Some(name), None) => format!("ApprovalPolicy {name}: {}", policy.action),
        _ => format!("no ApprovalPolicy rule matched: {}", policy.action),
    };
    if spec.is_quorum() {
        text.push_str(&format!(", {} distinct approvals", spec.approvals_needed()));
    }
    if let Some(approvers) = &spec.approvers {
        let who: Vec<String> = approvers
            .groups
            .iter()
            .map(|g| format!("group {g}"))
            .chain(approvers.users.iter().cloned())
            .collect();
        if !who.is_empty() {
            text.push_str(&format!(", approvers: {}", who.join(", ")));
        }
    }
    if let Some(note) = &policy.note {
        text.push_str(&format!(" ({note})"));
    }
    Some(text)
}

/// Why the call needs approval: the tool's rule in the Agent the run is bound to.
fn rule(run: Option<&AgentRun>, tool: &str) -> String {
    let Some(agent) = run
        .and_then(|r| r.status.as_ref())
        .and_then(|s| s.agent.as_ref())
    else {
        return "the run's Agent is not readable here".to_owned();
    };
    let generation = agent
        .generation
        .map(|g| format!(" (generation {g})"))
        .unwrap_or_default();
    match agent
        .spec
        .as_ref()
        .and_then(|s| s.tools.iter().find(|t| t.name == tool))
    {
        Some(spec) => {
            let timeout = spec
                .approval_timeout
                .as_deref()
                .map(|t| format!(", approvalTimeout: {t}"))
                .unwrap_or_default();
            format!(
                "tool {tool} of Agent {}{generation}: requiresApproval: {}{timeout}",
                agent.name, spec.requires_approval
            )
        }
        None => format!(
            "Agent {}{generation} (its tool definitions are not in the run's record)",
            agent.name
        ),
    }
}

fn decision(request: &ApprovalRequest) -> Option<DecisionView> {
    let spec = &request.spec;
    let decision = spec.decision?;
    let status = request.status.as_ref();
    let stamped_by =
        request.annotations().get(DECIDED_BY).map(|stamp| {
            match serde_json::from_str::<serde_json::Value>(stamp) {
                Ok(value) => value["username"]
                    .as_str()
                    .map_or_else(|| stamp.clone(), str::to_owned),
                Err(_) => stamp.clone(),
            }
        });
    Some(DecisionView {
        decision: decision.to_string(),
        approver_id: spec.approver_id.clone().unwrap_or_default(),
        reason: spec.reason.clone(),
        message: spec.message.clone(),
        stamped_by,
        verified: status
            .and_then(|s| s.verified_identity.as_ref())
            .map(|v| v.username.clone()),
        gitops: status.and_then(|s| s.gitops.as_ref()).map(|g| {
            format!(
                "claimed via GitOps commit {}, applied by {}",
                g.commit, g.applied_by.username
            )
        }),
        decided_at: status
            .and_then(|s| s.decided_at.as_ref())
            .and_then(to_utc)
            .as_ref()
            .map(rfc3339),
    })
}

/// The request page of `data`.
pub fn request_page(frame: Frame, data: &RequestData, now: DateTime<Utc>) -> RequestPage {
    let request = &data.request;
    let spec = &request.spec;
    let namespace = request.namespace().unwrap_or_default();
    let status = request.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    let expires = status.and_then(|s| s.expires_at.as_ref()).and_then(to_utc);
    let decided = decision(request);
    let run = data.run.as_ref().ok();
    RequestPage {
        frame,
        audit_href: audit_href(&namespace, &spec.agent_run_ref.name),
        namespace,
        name: request.name_any(),
        uid: request.uid().unwrap_or_default(),
        run: spec.agent_run_ref.name.clone(),
        tool: spec.tool_name.clone(),
        tool_call_id: spec.tool_call_id.clone(),
        step: spec.step,
        arguments_pretty: pretty_text(&spec.arguments),
        arguments_exact: spec.arguments.clone(),
        arguments_digest: spec.arguments_digest.clone(),
        digest_ok: arguments_digest(&spec.arguments) == spec.arguments_digest,
        endpoint: spec
            .tool_endpoint
            .clone()
            .unwrap_or_else(|| "(not recorded)".to_owned()),
        definition_digest: spec
            .tool_definition_digest
            .clone()
            .unwrap_or_else(|| "(not recorded)".to_owned()),
        rule: policy_rule(spec).unwrap_or_else(|| rule(run, &spec.tool_name)),
        quorum: spec.is_quorum().then(|| {
            let approved = spec
                .votes
                .values()
                .filter(|v| v.decision == Decision::Approved)
                .count();
            format!("{approved} of {} approvals", spec.approvals_needed())
        }),
        votes: spec
            .votes
            .iter()
            .map(|(voter, vote)| VoteView {
                voter: voter.clone(),
                decision: vote.decision.to_string(),
                reason: vote.reason.clone().unwrap_or_default(),
            })
            .collect(),
        can_edit: !spec.is_quorum(),
        requester: spec
            .run_creator
            .clone()
            .or_else(|| run.and_then(|r| r.status.as_ref()?.created_by.clone()))
            .unwrap_or_else(|| "-".to_owned()),
        created: request
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(to_utc)
            .as_ref()
            .map(rfc3339)
            .unwrap_or_default(),
        phase: phase.unwrap_or_default().to_string(),
        expires: expires
            .as_ref()
            .map(rfc3339)
            .unwrap_or_else(|| "never".to_owned()),
        time_left: time_left(expires, now),
        decidable: decided.is_none()
            && spec.policy_decision().is_none()
            && !phase.is_some_and(ApprovalPhase::is_final)
            && expires.is_none_or(|e| e > now),
        decision: decided,
        conversation: data
            .view
            .as_ref()
            .map(|v| conversation(v, &spec.tool_call_id))
            .unwrap_or_default(),
        input: data
            .view
            .as_ref()
            .map(|v| v.input.clone())
            .unwrap_or_default(),
        run_note: data.run.as_ref().err().cloned(),
        error: None,
        notice: None,
        reason: String::new(),
        message: String::new(),
        edited_arguments: String::new(),
    }
}

/// The audit page of `report`.
pub fn audit_page(frame: Frame, report: &AuditReport) -> AuditPage {
    AuditPage {
        frame,
        run: report.run.clone(),
        namespace: report.namespace.clone(),
        phase: report.phase.clone().unwrap_or_else(|| "-".to_owned()),
        rows: report
            .calls
            .iter()
            .map(|entry| AuditRow {
                href: entry
                    .approval_request
                    .as_deref()
                    .map(|name| request_href(&report.namespace, name)),
                short_digest: entry.arguments_digest.chars().take(12).collect(),
                entry: entry.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_pretty_and_exact() {
        let text = r#"{"user_id": "u-1", "n": 12345678901234567890123, "list": [1, {"a": "\u00e9<b>"}], "e": {}}"#;
        assert_eq!(
            pretty_text(text),
            "{\n  \"user_id\": \"u-1\",\n  \"n\": 12345678901234567890123,\n  \"list\": [\n    1,\n    {\n      \"a\": \"\\u00e9<b>\"\n    }\n  ],\n  \"e\": {}\n}"
        );
        assert_eq!(pretty_text("not json"), "not json");
    }

    #[test]
    fn hostile_text_is_escaped_in_every_template() {
        let hostile = r#"<script>window.pwned=1</script><img src=x onerror="window.pwned=1"><a href="javascript:window.pwned=1">x</a>"#;
        let page = ErrorPage {
            frame: Frame {
                title: hostile.to_owned(),
                user: Some(hostile.to_owned()),
                via_proxy: false,
                csrf: "t".to_owned(),
            },
            heading: hostile.to_owned(),
            message: hostile.to_owned(),
        };
        let html = page.render().unwrap();
        assert!(!html.contains("<script>window"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(!html.contains("<a href=\"javascript"), "{html}");
        assert!(
            html.contains("&#60;script&#62;window.pwned=1&#60;/script&#62;"),
            "{html}"
        );
    }

    #[test]
    fn time_left_says_expired_or_no_deadline() {
        let now = DateTime::from_timestamp(1_000_000, 0).unwrap();
        assert_eq!(time_left(None, now), "no deadline");
        assert_eq!(time_left(Some(now), now), "expired");
        let later = DateTime::from_timestamp(1_000_090, 0).unwrap();
        assert_eq!(time_left(Some(later), now), "90s");
    }
}
