//! Counting the controller's API requests: from the API server's audit log, and the writes behind
//! the Events it published.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Seek};
use std::path::Path;

use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::BenchError;
use crate::cluster::Cluster;
use crate::error::{io_error, kube_error};

/// API requests by `"<verb> <resource>[/<subresource>]"`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// The counts.
    pub by_kind: BTreeMap<String, u64>,
    /// Audit lines that could not be parsed (e.g. a line being written).
    pub unreadable_lines: u64,
}

/// The key of Pod create requests in [`RequestCounts::by_kind`].
pub const POD_CREATES: &str = "create pods";

/// Whether a verb changes state.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

impl RequestCounts {
    /// Adds `n` requests of a verb on a resource.
    pub fn add(&mut self, verb: &str, resource: &str, n: u64) {
        *self
            .by_kind
            .entry(format!("{verb} {resource}"))
            .or_default() += n;
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }

    /// Requests that change state.
    pub fn writes(&self) -> u64 {
        self.by_kind
            .iter()
            .filter(|(k, _)| is_write(k.split(' ').next().unwrap_or_default()))
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes that finish a run (see [`COMPLETION`]).
    pub fn completion_writes(&self) -> u64 {
        self.by_kind
            .iter()
            .filter(|(k, _)| k.ends_with(COMPLETION))
            .map(|(_, n)| n)
            .sum()
    }
}

#[derive(serde::Deserialize)]
struct AuditEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    #[serde(default)]
    stage: String,
    verb: String,
    #[serde(rename = "requestURI", default)]
    request_uri: String,
    user: AuditUser,
    #[serde(rename = "objectRef", default)]
    object_ref: Option<AuditObject>,
    #[serde(rename = "requestObject", default)]
    request_object: Option<AuditRequestObject>,
}

/// The part of a status patch that says whether it finishes a run.
#[derive(serde::Deserialize)]
struct AuditRequestObject {
    #[serde(default)]
    status: Option<AuditRequestStatus>,
}

#[derive(serde::Deserialize)]
struct AuditRequestStatus {
    #[serde(default)]
    phase: Option<String>,
}

/// The suffix of the request kind of a write that finishes a run: its status write whose phase
/// becomes Succeeded or Failed, and the deletion of its worker Pods (which follows that write).
/// The run's completion, not part of its approval cycle.
pub const COMPLETION: &str = " (completion)";

/// The suffix of the request kind of a watch that lists every object again before watching (a
/// streaming list: a cache filled afresh, or refilled after its watch fell too far behind).
pub const RELIST: &str = " (relist)";

/// Whether an Event reason marks a run's completion.
pub fn is_completion_reason(reason: &str) -> bool {
    matches!(reason, "Succeeded" | "Failed")
}

#[derive(serde::Deserialize)]
struct AuditUser {
    #[serde(default)]
    username: String,
}

#[derive(serde::Deserialize)]
struct AuditObject {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
}

/// Counts the requests of `username` in an API server audit log (JSON lines). A request logged at
/// several stages (a watch: started, then complete) counts once, by its `auditID`; a watch counts
/// where it started.
pub fn count_audit_requests<R: BufRead>(
    mut reader: R,
    username: &str,
) -> std::io::Result<RequestCounts> {
    let mut counts = RequestCounts::default();
    let mut seen = HashSet::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        // Most lines are other users': skip them before parsing.
        if !line.contains(username) {
            continue;
        }
        let Ok(event) = serde_json::from_str::<AuditEvent>(&line) else {
            counts.unreadable_lines += 1;
            continue;
        };
        if event.user.username != username
            || is_watch_completion(&event)
            || !seen.insert(event.audit_id)
        {
            continue;
        }
        let mut resource = match &event.object_ref {
            Some(o) => match &o.subresource {
                Some(sub) if !sub.is_empty() => format!("{}/{sub}", o.resource),
                _ => o.resource.clone(),
            },
            None => "(none)".to_owned(),
        };
        let finishes = event
            .request_object
            .as_ref()
            .and_then(|o| o.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(is_completion_reason);
        let deletes_pods = resource == "pods" && event.verb == "delete";
        if (resource == "agentruns/status" && is_write(&event.verb) && finishes) || deletes_pods {
            resource.push_str(COMPLETION);
        }
        if event.verb == "watch" && event.request_uri.contains("sendInitialEvents=true") {
            resource.push_str(RELIST);
        }
        counts.add(&event.verb, &resource, 1);
    }
    Ok(counts)
}

/// Whether `event` is the completion of a watch. A watch is counted at its start
/// (`ResponseStarted`), never at its completion: a log read from an offset may hold only the
/// completion of a watch started before it, and that watch belongs to the earlier part.
fn is_watch_completion(event: &AuditEvent) -> bool {
    event.verb == "watch" && event.stage == "ResponseComplete"
}

/// The API writes behind each Event a controller published: 1 for the create, plus one patch
/// per repeat (`series.count` counts every occurrence), by Event name.
pub fn event_writes(events: &[KubeEvent], reporter: &str) -> BTreeMap<String, u64> {
    event_writes_where(events, reporter, |_| true)
}

/// [`event_writes`] of the Events whose reason passes `keep`.
pub fn event_writes_where(
    events: &[KubeEvent],
    reporter: &str,
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<String, u64> {
    events
        .iter()
        .filter(|e| e.reporting_controller.as_deref() == Some(reporter))
        .filter(|e| keep(e.reason.as_deref().unwrap_or_default()))
        .map(|e| {
            let writes = e
                .series
                .as_ref()
                .map_or(1, |s| u64::try_from(s.count).unwrap_or(0).max(1));
            (e.name_any(), writes)
        })
        .collect()
}

/// The writes between two snapshots of [`event_writes`].
pub fn event_writes_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .map(|(name, n)| n.saturating_sub(before.get(name).copied().unwrap_or(0)))
        .sum()
}

pub(crate) async fn controller_events(
    cluster: &Cluster,
    ns: &str,
) -> Result<Vec<KubeEvent>, BenchError> {
    let events: Api<KubeEvent> = Api::namespaced(cluster.admin.clone(), ns);
    let list = events
        .list(&ListParams::default())
        .await
        .map_err(kube_error("listing Events"))?;
    Ok(list.items)
}

pub(crate) fn audit_size(path: &Path) -> Result<u64, BenchError> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(io_error(format!(
            "reading the audit log {}",
            path.display()
        )))
}

pub(crate) async fn count_audit_since(
    path: &Path,
    offset: u64,
    username: String,
) -> Result<RequestCounts, BenchError> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let what = format!("reading the audit log {}", path.display());
        let mut file = std::fs::File::open(&path).map_err(io_error(what.clone()))?;
        file.seek(std::io::SeekFrom::Start(offset))
            .map_err(io_error(what.clone()))?;
        count_audit_requests(std::io::BufReader::with_capacity(1 << 20, file), &username)
            .map_err(io_error(what))
    })
    .await
    .map_err(|e| BenchError::Io {
        what: "counting audit events".into(),
        source: std::io::Error::other(e.to_string()),
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EVENT_REPORTER;
    use serde_json::json;

    #[test]
    fn audit_tells_the_writes_that_finish_a_run_apart() {
        let me = "system:serviceaccount:bench-1:agentrun-controller";
        let patch = |id: &str, phase: &str| {
            json!({"auditID": id, "stage": "ResponseComplete", "verb": "patch",
                   "user": {"username": me},
                   "objectRef": {"resource": "agentruns", "subresource": "status"},
                   "requestObject": {"status": {"phase": phase, "step": 1}}})
            .to_string()
        };
        let pods = |id: &str, verb: &str| {
            json!({"auditID": id, "stage": "ResponseComplete", "verb": verb,
                   "user": {"username": me}, "objectRef": {"resource": "pods"}})
            .to_string()
        };
        let log = [
            patch("a", "Running"),
            patch("b", "Succeeded"),
            patch("c", "Failed"),
            pods("d", "create"),
            pods("e", "delete"),
        ]
        .join("\n");
        let counts = count_audit_requests(log.as_bytes(), me).unwrap();
        assert_eq!(counts.writes(), 5);
        assert_eq!(counts.completion_writes(), 3);
        assert_eq!(counts.by_kind["patch agentruns/status"], 1);
        assert_eq!(counts.by_kind["create pods"], 1);
        assert_eq!(counts.by_kind["delete pods (completion)"], 1);
        assert!(is_completion_reason("Succeeded") && !is_completion_reason("Approved"));
    }

    #[test]
    fn audit_counts_one_request_per_audit_id_for_one_user() {
        let me = "system:serviceaccount:bench-1:agentrun-controller";
        let line =
            |id: &str, user: &str, verb: &str, resource: &str, sub: Option<&str>, stage: &str| {
                let mut object = json!({"resource": resource, "namespace": "bench-1", "name": "r"});
                if let Some(sub) = sub {
                    object["subresource"] = json!(sub);
                }
                json!({"kind": "Event", "auditID": id, "stage": stage, "verb": verb,
                   "user": {"username": user}, "objectRef": object,
                   "responseObject": {"huge": "x".repeat(100)}})
                .to_string()
            };
        let log = [
            line(
                "a",
                me,
                "patch",
                "agentruns",
                Some("status"),
                "ResponseComplete",
            ),
            line("b", me, "get", "agentruns", None, "ResponseComplete"),
            line(
                "c",
                me,
                "watch",
                "approvalrequests",
                None,
                "ResponseStarted",
            ),
            line(
                "c",
                me,
                "watch",
                "approvalrequests",
                None,
                "ResponseComplete",
            ),
            line("d", "admin", "patch", "agentruns", None, "ResponseComplete"),
            line(
                "e",
                me,
                "patch",
                "approvalrequests",
                Some("status"),
                "ResponseComplete",
            ),
            line(
                "f",
                me,
                "create",
                "approvalrequests",
                None,
                "ResponseComplete",
            ),
            // A watch started before this part of the log: only its completion is here.
            line("j", me, "watch", "agentruns", None, "ResponseComplete"),
            line("h", me, "create", "pods", None, "ResponseComplete"),
            // A repeated create, answered 409, is a request too.
            line("i", me, "create", "pods", None, "ResponseComplete"),
            format!("{{\"auditID\": \"g\", \"user\": {{\"username\": \"{me}\""),
        ]
        .join("\n");
        let counts = count_audit_requests(log.as_bytes(), me).unwrap();
        assert_eq!(counts.total(), 7);
        assert_eq!(counts.writes(), 5);
        assert_eq!(counts.by_kind[POD_CREATES], 2);
        assert_eq!(counts.by_kind["patch agentruns/status"], 1);
        assert_eq!(counts.by_kind["watch approvalrequests"], 1);
        assert!(!counts.by_kind.contains_key("watch agentruns"));
        assert_eq!(counts.unreadable_lines, 1);
        assert!(!counts.by_kind.keys().any(|k| k.contains("admin")));
        assert!(is_write("deletecollection") && !is_write("list"));
    }

    #[test]
    fn audit_tells_a_relist_from_a_resumed_watch() {
        let me = "system:serviceaccount:bench-1:agentrun-controller";
        let watch = |id: &str, query: &str| {
            json!({"auditID": id, "stage": "ResponseStarted", "verb": "watch",
                   "requestURI": format!("/apis/agentrun.dev/v1alpha1/approvalrequests?{query}"),
                   "user": {"username": me}, "objectRef": {"resource": "approvalrequests"}})
            .to_string()
        };
        let log = [
            watch(
                "a",
                "allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&watch=true",
            ),
            watch("b", "allowWatchBookmarks=true&resourceVersion=812&watch=true"),
            watch(
                "c",
                "allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&sendInitialEvents=true&watch=true",
            ),
        ]
        .join("\n");
        let counts = count_audit_requests(log.as_bytes(), me).unwrap();
        assert_eq!(counts.by_kind["watch approvalrequests"], 1);
        assert_eq!(counts.by_kind["watch approvalrequests (relist)"], 2);
    }

    #[test]
    fn event_writes_count_series_and_only_the_controllers() {
        let event = |name: &str, reporter: &str, series: Option<i32>| -> KubeEvent {
            let mut e: KubeEvent = serde_json::from_value(json!({
                "metadata": {"name": name},
                "eventTime": "2025-01-01T00:00:00.000000Z",
                "reportingController": reporter,
            }))
            .unwrap();
            if let Some(count) = series {
                e.series = serde_json::from_value(json!({
                    "count": count, "lastObservedTime": "2025-01-01T00:00:01.000000Z"
                }))
                .ok();
            }
            e
        };
        let before = event_writes(&[event("a", EVENT_REPORTER, None)], EVENT_REPORTER);
        let after = event_writes(
            &[
                event("a", EVENT_REPORTER, Some(3)),
                event("b", EVENT_REPORTER, None),
                event("c", "someone-else", None),
            ],
            EVENT_REPORTER,
        );
        assert_eq!(after.len(), 2);
        // "a" went from 1 write to 3 (two patches), "b" is new.
        assert_eq!(event_writes_between(&before, &after), 3);
    }
}
