//! The events an object's state implies, as CloudEvents 1.0 in the structured JSON format.
//!
//! Pure: the same object always gives the same events, with the same ids and bodies. Every field
//! of a body is one the object no longer changes once the event is implied (a request's call and
//! its creation time; a decision, which is final, and the controller's record of it; a finished
//! run's outcome), so an event derived again after a restart is the one derived before.
//!
//! What a body carries is listed in `docs/notifications.md`. It never carries a call's arguments
//! (only their digest) nor a run's input or output: a sink may be a chat channel whose readers
//! are not the namespace's; approvers read the call with their own identity where they decide it.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use cloudevents::{EventBuilder, EventBuilderV10};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde_json::{Map, Value, json};

use crate::crd::{
    AgentRun, AgentRunPhase, ApprovalPhase, ApprovalRequest, ConditionType, NotificationType,
    find_condition,
};
use crate::time::try_from_k8s;

/// The annotations whose W3C trace context an event carries (the CloudEvents distributed-tracing
/// extension), the first present of each pair.
pub const TRACEPARENT_ANNOTATIONS: [&str; 2] = ["agentrun.dev/traceparent", "traceparent"];
/// See [`TRACEPARENT_ANNOTATIONS`].
pub const TRACESTATE_ANNOTATIONS: [&str; 2] = ["agentrun.dev/tracestate", "tracestate"];
/// The longest `tracestate` carried (W3C: 512 characters).
const MAX_TRACESTATE_LENGTH: usize = 512;

/// The media type of an event's data.
const DATA_CONTENT_TYPE: &str = "application/json";

/// One event derived from an object's state, ready to be sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The CloudEvents `id`: `<object uid>:<type suffix>`.
    pub id: String,
    /// Its type.
    pub kind: NotificationType,
    /// The namespace of the object.
    pub namespace: String,
    /// The CloudEvents `time`: when it happened, as the API server or the controller recorded it.
    pub time: DateTime<Utc>,
    /// The whole event in the structured JSON format: the body of every request that delivers
    /// it.
    pub body: Arc<str>,
}

/// The id of the event of type `kind` about the object with this uid.
pub fn event_id(uid: &str, kind: NotificationType) -> String {
    format!("{uid}:{}", kind.suffix())
}

/// The events a request's state implies: `requested` once the controller has written its status,
/// and the event of its final phase once the controller has recorded it.
pub fn of_request(request: &ApprovalRequest) -> Vec<Candidate> {
    let (Some(uid), Some(namespace), Some(created)) = (
        request.uid(),
        request.namespace(),
        request.metadata.creation_timestamp.as_ref(),
    ) else {
        return vec![];
    };
    let Some(status) = request.status.as_ref() else {
        return vec![];
    };
    let Some(phase) = status.phase else {
        return vec![];
    };
    let name = request.name_any();
    let spec = &request.spec;
    let mut base = Map::new();
    base.insert("namespace".into(), json!(namespace));
    base.insert("name".into(), json!(name));
    base.insert("uid".into(), json!(uid));
    base.insert(
        "run".into(),
        json!({"name": spec.agent_run_ref.name, "uid": spec.agent_run_ref.uid}),
    );
    base.insert("step".into(), json!(spec.step));
    base.insert("toolName".into(), json!(spec.tool_name));
    base.insert("toolCallId".into(), json!(spec.tool_call_id));
    base.insert("argumentsDigest".into(), json!(spec.arguments_digest));
    insert_some(&mut base, "toolEndpoint", spec.tool_endpoint.as_ref());
    insert_some(
        &mut base,
        "toolDefinitionDigest",
        spec.tool_definition_digest.as_ref(),
    );
    insert_some(&mut base, "runCreator", spec.run_creator.as_ref());
    base.insert("requestedAt".into(), json!(rfc3339_of(created)));
    insert_some(
        &mut base,
        "expiresAt",
        status.expires_at.as_ref().map(rfc3339_of).as_ref(),
    );
    let trace = trace_context(request.annotations());
    let source = format!("/apis/agentrun.dev/v1alpha1/namespaces/{namespace}/approvalrequests");
    let subject = format!("{namespace}/{name}");
    let event = |kind: NotificationType, time: DateTime<Utc>, data: Map<String, Value>| {
        build(&Built {
            id: event_id(&uid, kind),
            kind,
            namespace: &namespace,
            source: &source,
            subject: &subject,
            time,
            data: Value::Object(data),
            trace: &trace,
        })
    };

    let mut out = Vec::new();
    let mut requested = base.clone();
    requested.insert("phase".into(), json!(ApprovalPhase::Pending.as_str()));
    out.extend(event(
        NotificationType::ApprovalRequested,
        try_from_k8s(created).unwrap_or_default(),
        requested,
    ));

    let kind = match phase {
        ApprovalPhase::Pending => return out,
        ApprovalPhase::Approved | ApprovalPhase::Rejected => NotificationType::ApprovalDecided,
        ApprovalPhase::Expired => NotificationType::ApprovalExpired,
        ApprovalPhase::Superseded => NotificationType::ApprovalSuperseded,
    };
    // A final phase without the controller's time is not recorded yet.
    let Some(decided_at) = status.decided_at.as_ref() else {
        return out;
    };
    let mut resolved = base;
    resolved.insert("phase".into(), json!(phase.as_str()));
    resolved.insert("decidedAt".into(), json!(rfc3339_of(decided_at)));
    if kind != NotificationType::ApprovalExpired {
        insert_some(
            &mut resolved,
            "decision",
            spec.decision.map(|d| d.as_str()).as_ref(),
        );
        insert_some(&mut resolved, "approverId", spec.approver_id.as_ref());
        insert_some(&mut resolved, "reason", spec.reason.as_ref());
        insert_some(&mut resolved, "message", spec.message.as_ref());
        insert_some(
            &mut resolved,
            "verifiedIdentity",
            status.verified_identity.as_ref(),
        );
        insert_some(&mut resolved, "gitops", status.gitops.as_ref());
    }
    out.extend(event(
        kind,
        try_from_k8s(decided_at).unwrap_or_default(),
        resolved,
    ));
    out
}

/// The event a run's state implies: `succeeded` or `failed` once it reached that phase.
pub fn of_run(run: &AgentRun) -> Vec<Candidate> {
    let Some(status) = run.status.as_ref() else {
        return vec![];
    };
    let kind = match status.phase {
        Some(AgentRunPhase::Succeeded) => NotificationType::RunSucceeded,
        Some(AgentRunPhase::Failed) => NotificationType::RunFailed,
        _ => return vec![],
    };
    let (Some(uid), Some(namespace)) = (run.uid(), run.namespace()) else {
        return vec![];
    };
    let ready = find_condition(&status.conditions, ConditionType::Ready);
    // The controller's time of the outcome: completedAt, else when the Ready condition changed.
    let Some(time) = status
        .completed_at
        .as_ref()
        .or(ready.map(|c| &c.last_transition_time))
    else {
        return vec![];
    };
    let name = run.name_any();
    let mut data = Map::new();
    data.insert("namespace".into(), json!(namespace));
    data.insert("name".into(), json!(name));
    data.insert("uid".into(), json!(uid));
    data.insert("agent".into(), json!(run.spec.agent_ref.name));
    data.insert("phase".into(), json!(kind_phase(kind)));
    insert_some(&mut data, "step", status.step.as_ref());
    insert_some(&mut data, "createdBy", status.created_by.as_ref());
    insert_some(
        &mut data,
        "startedAt",
        status.started_at.as_ref().map(rfc3339_of).as_ref(),
    );
    data.insert("completedAt".into(), json!(rfc3339_of(time)));
    if let Some(ready) = ready {
        data.insert("reason".into(), json!(ready.reason));
        data.insert("message".into(), json!(ready.message));
    }
    let trace = trace_context(run.annotations());
    build(&Built {
        id: event_id(&uid, kind),
        kind,
        namespace: &namespace,
        source: &format!("/apis/agentrun.dev/v1alpha1/namespaces/{namespace}/agentruns"),
        subject: &format!("{namespace}/{name}"),
        time: try_from_k8s(time).unwrap_or_default(),
        data: Value::Object(data),
        trace: &trace,
    })
    .into_iter()
    .collect()
}

fn kind_phase(kind: NotificationType) -> &'static str {
    match kind {
        NotificationType::RunFailed => AgentRunPhase::Failed.as_str(),
        _ => AgentRunPhase::Succeeded.as_str(),
    }
}

/// What one event is built from.
struct Built<'a> {
    id: String,
    kind: NotificationType,
    namespace: &'a str,
    source: &'a str,
    subject: &'a str,
    time: DateTime<Utc>,
    data: Value,
    trace: &'a TraceContext,
}

/// The event, serialized; `None` (logged) when the CloudEvents builder refuses it, which the
/// attributes above never make it do.
fn build(built: &Built<'_>) -> Option<Candidate> {
    let mut builder = EventBuilderV10::new()
        .id(built.id.clone())
        .ty(built.kind.as_str())
        .source(built.source)
        .subject(built.subject)
        .time(built.time)
        .data(DATA_CONTENT_TYPE, built.data.clone());
    if let Some(parent) = &built.trace.parent {
        builder = builder.extension("traceparent", parent.as_str());
        if let Some(state) = &built.trace.state {
            builder = builder.extension("tracestate", state.as_str());
        }
    }
    let body = builder
        .build()
        .map_err(|e| e.to_string())
        .and_then(|event| serde_json::to_string(&event).map_err(|e| e.to_string()));
    match body {
        Ok(body) => Some(Candidate {
            id: built.id.clone(),
            kind: built.kind,
            namespace: built.namespace.to_owned(),
            time: built.time,
            body: Arc::from(body),
        }),
        Err(error) => {
            tracing::warn!(id = %built.id, %error, "cannot build a CloudEvent");
            None
        }
    }
}

/// W3C trace context read from an object's annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceContext {
    /// A valid `traceparent`.
    pub parent: Option<String>,
    /// `tracestate`, only with a `traceparent`.
    pub state: Option<String>,
}

/// The trace context of `annotations`: a `traceparent` only when it is well-formed (version 00,
/// non-zero ids: annotations are written by editors, so nothing else is passed on), and a
/// `tracestate` of printable ASCII up to 512 characters.
pub fn trace_context(annotations: &std::collections::BTreeMap<String, String>) -> TraceContext {
    let first = |keys: [&str; 2]| keys.iter().find_map(|k| annotations.get(*k)).cloned();
    let Some(parent) = first(TRACEPARENT_ANNOTATIONS).filter(|p| valid_traceparent(p)) else {
        return TraceContext::default();
    };
    let state = first(TRACESTATE_ANNOTATIONS).filter(|s| {
        !s.is_empty()
            && s.len() <= MAX_TRACESTATE_LENGTH
            && s.bytes().all(|b| (0x20..0x7f).contains(&b))
    });
    TraceContext {
        parent: Some(parent),
        state,
    }
}

impl TraceContext {
    /// The context as the annotations `agentrun.dev/traceparent` and `agentrun.dev/tracestate`:
    /// what the controller copies from a run onto the ApprovalRequests it creates, so that the
    /// events about them carry the run's trace (empty without a valid `traceparent`).
    pub fn annotations(&self) -> std::collections::BTreeMap<String, String> {
        let mut out = std::collections::BTreeMap::new();
        if let Some(parent) = &self.parent {
            out.insert(TRACEPARENT_ANNOTATIONS[0].to_owned(), parent.clone());
            if let Some(state) = &self.state {
                out.insert(TRACESTATE_ANNOTATIONS[0].to_owned(), state.clone());
            }
        }
        out
    }
}

/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>`, lowercase, ids not all zeros.
fn valid_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    matches!(parts.as_slice(), [version, trace, parent, flags]
        if *version == "00"
            && hex(trace, 32)
            && hex(parent, 16)
            && hex(flags, 2)
            && trace.bytes().any(|b| b != b'0')
            && parent.bytes().any(|b| b != b'0'))
}

fn rfc3339_of(time: &Time) -> String {
    try_from_k8s(time)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

fn insert_some<T: serde::Serialize>(map: &mut Map<String, Value>, key: &str, value: Option<&T>) {
    if let Some(value) = value
        && let Ok(value) = serde_json::to_value(value)
    {
        map.insert(key.to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{
        AgentRef, AgentRunRef, AgentRunSpec, AgentRunStatus, ApprovalRequestSpec,
        ApprovalRequestStatus, ConditionStatus, Decision, VerifiedIdentity, arguments_digest,
        new_condition,
    };
    use crate::time::to_k8s;

    fn at(second: i64) -> Time {
        to_k8s(DateTime::from_timestamp(second, 0).unwrap())
    }

    fn request(phase: Option<ApprovalPhase>) -> ApprovalRequest {
        let mut r = ApprovalRequest::new(
            "r1-call-1",
            ApprovalRequestSpec {
                agent_run_ref: AgentRunRef {
                    name: "r1".into(),
                    uid: "run-uid".into(),
                },
                step: 0,
                tool_call_id: "call_1".into(),
                tool_name: "delete_user".into(),
                arguments: r#"{"user_id": "u-1"}"#.into(),
                arguments_digest: arguments_digest(r#"{"user_id": "u-1"}"#),
                run_creator: Some("carol@example.com".into()),
                ..Default::default()
            },
        );
        r.metadata.namespace = Some("team".into());
        r.metadata.uid = Some("req-uid".into());
        r.metadata.creation_timestamp = Some(at(1_700_000_000));
        r.status = phase.map(|phase| ApprovalRequestStatus {
            phase: Some(phase),
            expires_at: Some(at(1_700_003_600)),
            ..Default::default()
        });
        r
    }

    fn decided(mut r: ApprovalRequest) -> ApprovalRequest {
        r.spec.decision = Some(Decision::Approved);
        r.spec.approver_id = Some("alice@example.com".into());
        r.spec.reason = Some("CR-1".into());
        let status = r.status.as_mut().unwrap();
        status.phase = Some(ApprovalPhase::Approved);
        status.decided_at = Some(at(1_700_000_100));
        status.verified_identity = Some(VerifiedIdentity {
            username: "alice@example.com".into(),
            groups: vec!["agentrun:approvers".into()],
            ..Default::default()
        });
        r
    }

    fn json(c: &Candidate) -> Value {
        serde_json::from_str(&c.body).unwrap()
    }

    #[test]
    fn a_request_is_requested_once_its_status_is_written() {
        assert!(of_request(&request(None)).is_empty());
        let events = of_request(&request(Some(ApprovalPhase::Pending)));
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.id, "req-uid:requested");
        assert_eq!(e.kind, NotificationType::ApprovalRequested);
        let body = json(e);
        assert_eq!(body["specversion"], "1.0");
        assert_eq!(body["type"], "dev.agentrun.approval.requested");
        assert_eq!(body["subject"], "team/r1-call-1");
        assert_eq!(
            body["source"],
            "/apis/agentrun.dev/v1alpha1/namespaces/team/approvalrequests"
        );
        assert_eq!(body["time"], "2023-11-14T22:13:20Z");
        assert_eq!(body["datacontenttype"], "application/json");
        let data = &body["data"];
        assert_eq!(data["run"]["uid"], "run-uid");
        assert_eq!(data["toolName"], "delete_user");
        assert_eq!(data["phase"], "Pending");
        assert_eq!(data["expiresAt"], "2023-11-14T23:13:20Z");
        assert!(data.get("arguments").is_none(), "never the arguments");
        assert!(data["argumentsDigest"].as_str().unwrap().len() == 64);
    }

    #[test]
    fn a_decision_adds_its_event_and_leaves_the_requested_one_unchanged() {
        let pending = of_request(&request(Some(ApprovalPhase::Pending)));
        let events = of_request(&decided(request(Some(ApprovalPhase::Pending))));
        assert_eq!(events.len(), 2);
        assert_eq!(events[0], pending[0], "the same id and the same bytes");
        let e = &events[1];
        assert_eq!(e.id, "req-uid:decided");
        let data = json(e)["data"].clone();
        assert_eq!(data["decision"], "Approved");
        assert_eq!(data["phase"], "Approved");
        assert_eq!(data["approverId"], "alice@example.com");
        assert_eq!(data["verifiedIdentity"]["username"], "alice@example.com");
        assert_eq!(data["decidedAt"], "2023-11-14T22:15:00Z");
        // Derived again: identical.
        assert_eq!(
            events,
            of_request(&decided(request(Some(ApprovalPhase::Pending))))
        );
    }

    #[test]
    fn expiry_and_supersession_are_their_own_events() {
        let mut r = request(Some(ApprovalPhase::Expired));
        assert_eq!(of_request(&r).len(), 1, "not recorded yet: no decidedAt");
        r.status.as_mut().unwrap().decided_at = Some(at(1_700_003_601));
        let events = of_request(&r);
        assert_eq!(events[1].id, "req-uid:expired");
        let data = json(&events[1])["data"].clone();
        assert_eq!(data["phase"], "Expired");
        assert!(data.get("approverId").is_none());
        r.status.as_mut().unwrap().phase = Some(ApprovalPhase::Superseded);
        assert_eq!(of_request(&r)[1].kind, NotificationType::ApprovalSuperseded);
    }

    fn run(phase: AgentRunPhase) -> AgentRun {
        let mut run = AgentRun::new(
            "r1",
            AgentRunSpec {
                agent_ref: AgentRef { name: "ops".into() },
                input: "secret input".into(),
                worker: None,
            },
        );
        run.metadata.namespace = Some("team".into());
        run.metadata.uid = Some("run-uid".into());
        let mut conditions = vec![];
        crate::crd::set_condition(
            &mut conditions,
            new_condition(
                ConditionType::Ready,
                ConditionStatus::False,
                crate::crd::Reason::WorkerFailed,
                "the worker failed 3 times",
                Some(1),
                at(1_700_000_200),
            ),
        );
        run.status = Some(AgentRunStatus {
            phase: Some(phase),
            conditions,
            completed_at: Some(at(1_700_000_200)),
            final_output: Some("secret output".into()),
            step: Some(1),
            ..Default::default()
        });
        run
    }

    #[test]
    fn a_finished_run_has_one_event() {
        assert!(of_run(&run(AgentRunPhase::AwaitingApproval)).is_empty());
        let events = of_run(&run(AgentRunPhase::Failed));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].id, "run-uid:failed");
        let body = json(&events[0]);
        assert_eq!(body["type"], "dev.agentrun.run.failed");
        assert_eq!(body["subject"], "team/r1");
        assert_eq!(body["data"]["reason"], "WorkerFailed");
        assert!(!events[0].body.contains("secret"), "no input or output");
        assert_eq!(
            of_run(&run(AgentRunPhase::Succeeded))[0].kind,
            NotificationType::RunSucceeded
        );
    }

    #[test]
    fn trace_context_is_carried_only_when_well_formed() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut r = request(Some(ApprovalPhase::Pending));
        r.metadata.annotations = Some(
            [
                ("agentrun.dev/traceparent".to_owned(), parent.to_owned()),
                ("tracestate".to_owned(), "congo=t61rcWkgMzE".to_owned()),
            ]
            .into(),
        );
        let body = json(&of_request(&r)[0]);
        assert_eq!(body["traceparent"], parent);
        assert_eq!(body["tracestate"], "congo=t61rcWkgMzE");
        // As copied onto a request: the canonical annotations.
        assert_eq!(
            trace_context(r.annotations()).annotations(),
            [
                ("agentrun.dev/traceparent".to_owned(), parent.to_owned()),
                (
                    "agentrun.dev/tracestate".to_owned(),
                    "congo=t61rcWkgMzE".to_owned()
                ),
            ]
            .into()
        );
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "<script>",
        ] {
            let annotations = [
                ("traceparent".to_owned(), bad.to_owned()),
                ("tracestate".to_owned(), "congo=t61rcWkgMzE".to_owned()),
            ]
            .into();
            assert_eq!(
                trace_context(&annotations),
                TraceContext::default(),
                "{bad}"
            );
            assert!(trace_context(&annotations).annotations().is_empty());
        }
        assert!(
            json(&of_request(&request(Some(ApprovalPhase::Pending)))[0])
                .get("traceparent")
                .is_none()
        );
    }
}
