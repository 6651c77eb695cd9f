//! The spans the controller emits, each after the fact with its real start and end: the run's
//! root span when the run ends, and one span per approval from the halt (the request's creation)
//! to its resolution. Emitted through the global tracer: nothing is sent when export is off.
//!
//! What an approval span records (`agentrun.approval.*`): the decision (`approved`, `rejected`,
//! `expired`, `superseded`), the approver only as the API server verified it (or, for a GitOps
//! decision, the claimed approver with `approver_kind: gitops` and who applied it), the wait in
//! seconds, the request's name and the call. Never the decision's `reason` or `message`: the API
//! has no way to mark them sensitive, and they often name tickets, customers or incidents; the
//! audit trail (ApprovalRecords, `kubectl agentrun audit`) keeps them.

use std::time::SystemTime;

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
use opentelemetry::{Context, KeyValue};

use super::{SCOPE, run_context, run_span_context, with_ids};
use crate::crd::{AgentRun, AgentRunPhase, ApprovalPhase, ApprovalRequest, VerifiedIdentity};

fn system_time(time: &Time) -> SystemTime {
    SystemTime::from(crate::time::from_k8s(time))
}

/// Emits the root span of `run`, which just reached the final `phase`: `agentrun.run {name}`, from
/// the run's start to now, with the ids every span of the run has as parent.
pub fn run_finished(run: &AgentRun, phase: AgentRunPhase, message: Option<&str>) {
    let Some(uid) = run.uid() else {
        return;
    };
    let status = run.status.clone().unwrap_or_default();
    let start = status
        .started_at
        .as_ref()
        .or(run.metadata.creation_timestamp.as_ref())
        .map_or_else(SystemTime::now, system_time);
    let agent = run.spec.agent_ref.name.clone();
    let tracer = opentelemetry::global::tracer(SCOPE);
    let builder = tracer
        .span_builder(format!("agentrun.run {}", run.name_any()))
        .with_kind(SpanKind::Internal)
        .with_start_time(start)
        .with_attributes(vec![
            KeyValue::new("gen_ai.agent.name", agent),
            KeyValue::new("gen_ai.conversation.id", uid.clone()),
            KeyValue::new("agentrun.run.name", run.name_any()),
            KeyValue::new("agentrun.run.uid", uid.clone()),
            KeyValue::new("agentrun.run.phase", phase.to_string()),
            KeyValue::new(
                "agentrun.run.steps",
                i64::from(status.step.unwrap_or(0)) + 1,
            ),
            KeyValue::new("k8s.namespace.name", run.namespace().unwrap_or_default()),
        ]);
    let mut span = with_ids(&run_span_context(&uid), || {
        builder.start_with_context(&tracer, &Context::new())
    });
    if phase != AgentRunPhase::Succeeded {
        span.set_status(Status::error(
            message.unwrap_or("the run failed").to_owned(),
        ));
    }
    span.end();
}

/// Who decided a request, as the approval span says it.
#[derive(Clone, Debug, PartialEq)]
pub enum Approver<'a> {
    /// The API server stamped this identity, which is the approverId.
    Verified(&'a VerifiedIdentity),
    /// A GitOps identity applied the decision for the approverId it claims.
    GitOps {
        /// The claimed approver.
        claimed: &'a str,
        /// Who applied it.
        applied_by: &'a str,
    },
    /// Nobody verified (an expiry, a superseded request, an unverified decision).
    None,
}

/// Emits the approval span of `request`, resolved `phase` at `decided_at`:
/// `agentrun.approval {tool}`, from the request's creation (the halt) to the resolution, a child
/// of its run's root span.
pub fn approval(
    request: &ApprovalRequest,
    phase: ApprovalPhase,
    decided_at: DateTime<Utc>,
    approver: Approver<'_>,
) {
    let spec = &request.spec;
    let created = request
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(decided_at, crate::time::from_k8s);
    let waited = (decided_at - created).num_milliseconds().max(0) as f64 / 1000.0;
    let mut attributes = vec![
        KeyValue::new(
            "agentrun.approval.decision",
            phase.to_string().to_lowercase(),
        ),
        KeyValue::new("agentrun.approval.wait_seconds", waited),
        KeyValue::new("agentrun.approval.request", request.name_any()),
        KeyValue::new("agentrun.run.name", spec.agent_run_ref.name.clone()),
        KeyValue::new(
            "k8s.namespace.name",
            request.namespace().unwrap_or_default(),
        ),
        KeyValue::new("gen_ai.tool.name", spec.tool_name.clone()),
        KeyValue::new("gen_ai.tool.call.id", spec.tool_call_id.clone()),
    ];
    if let Some(digest) = &spec.tool_definition_digest {
        attributes.push(KeyValue::new(
            "agentrun.tool.definition_digest",
            digest.clone(),
        ));
    }
    match approver {
        Approver::Verified(identity) => {
            attributes.push(KeyValue::new(
                "agentrun.approval.approver",
                identity.username.clone(),
            ));
            attributes.push(KeyValue::new("agentrun.approval.approver_kind", "verified"));
        }
        Approver::GitOps {
            claimed,
            applied_by,
        } => {
            attributes.push(KeyValue::new(
                "agentrun.approval.approver",
                claimed.to_owned(),
            ));
            attributes.push(KeyValue::new("agentrun.approval.approver_kind", "gitops"));
            attributes.push(KeyValue::new(
                "agentrun.approval.applied_by",
                applied_by.to_owned(),
            ));
        }
        Approver::None => {}
    }
    let tracer = opentelemetry::global::tracer(SCOPE);
    let parent = run_context(&spec.agent_run_ref.uid);
    let mut span = tracer
        .span_builder(format!("agentrun.approval {}", spec.tool_name))
        .with_kind(SpanKind::Internal)
        .with_start_time(SystemTime::from(created))
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent);
    span.end_with_timestamp(SystemTime::from(decided_at));
}
