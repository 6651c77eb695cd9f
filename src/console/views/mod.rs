//! The pages: askama templates (`src/console/templates/`, compiled into the binary) and the view
//! models they render.
//!
//! Every value is inserted with askama's HTML escaping (the templates are `.html`, so escaping is
//! on by default, and no template uses `|safe`): text written by the model, a tool, a requester or
//! an approver is shown as text, never interpreted as markup. No text is ever turned into a link:
//! the only links are the console's own paths, built from Kubernetes object names.

mod request;

use askama::Template;
use chrono::{DateTime, Utc};

pub use self::request::{
    CallView, DecisionView, MessageView, RequestPage, VoteView, conversation, request_page,
};
use super::data::InboxRow;
use crate::plugin::audit::{AuditEntry, AuditReport};
use crate::plugin::text::{age, rfc3339};
use crate::state::pyjson::{self, Value};

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
                    let key = pyjson::dumps(&Value::Str(key.to_string())).unwrap_or_default();
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
