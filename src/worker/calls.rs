//! The gate every tool call of a step passes just before it is sent:
//!
//! - a call that needs approval is sent only if its ApprovalRequest (read with the worker's own,
//!   read-only rights) is recorded Approved by the controller for this run, step, call and tool,
//!   with the digest of the exact bytes about to be sent (the approver's edit, when they edited
//!   the arguments) and the definition and endpoint of the tool about to be called; anything else
//!   refuses the call and ends the step (`TamperedState`).
//!   The call carries the signed approval assertion the controller stored on the request, if any.
//!   For an MCP tool the definition digest compared is the one of the definition the server lists
//!   just before the call; a server that changed it since the run started never gets the call
//!   (the runner does not send it; it is recorded `Superseded` here and the model is told);
//! - every call is recorded in the run's status before it is sent (at-most-once execution). A
//!   call already recorded by an earlier worker of the run was sent before a crash: it is re-sent
//!   with the same Idempotency-Key when the tool is idempotent (and counted in `resent`), and
//!   otherwise not sent at all: the model is told its outcome is unknown and the record says
//!   `Unknown`.

use std::sync::Mutex as SyncMutex;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use tokio::sync::Mutex;
use tracing::warn;

use crate::agent::{HookError, RunHooks, ToolCallGate, ToolCallStart};
use crate::controller::verify::normalize;
use crate::crd::keys::{annotations, field_managers};
use crate::crd::policy::DecidedBy;
use crate::crd::request_decision::{approved_arguments_digest, recorded_decision};
use crate::crd::status_patch::{AgentRunStatusPatch, StatusPatch};
use crate::crd::{
    AgentRun, AgentSnapshot, ApprovalPhase, ApprovalRequest, Decision, ToolCallRecord,
    approval_request_name, arguments_digest,
};

/// The `outcome` of a call record whose MCP tool changed its definition: the call was not sent.
pub const SUPERSEDED_OUTCOME: &str = "Superseded";

/// What the model gets for a call recorded `Superseded` when a later worker meets it again.
pub const SUPERSEDED_CALL_MESSAGE: &str = "tool error: the call was not sent: its MCP server changed the tool's definition since this run started. Start a new run to use the changed tool.";

/// The message a model gets for a call of a non-idempotent tool that a stopped worker may already
/// have sent: it is not sent again.
pub const UNKNOWN_OUTCOME_MESSAGE: &str = "The outcome of this tool call is unknown: a worker stopped after sending it, and the tool is not idempotent, so it was not sent again. Check the system before retrying.";

/// The gate of one step's tool calls.
pub struct CallGate {
    runs: Api<AgentRun>,
    requests: Api<ApprovalRequest>,
    run: String,
    run_uid: String,
    step: u32,
    snapshot: AgentSnapshot,
    records: Mutex<Vec<ToolCallRecord>>,
    refused: SyncMutex<Option<String>>,
    /// How a failed read of a request is retried.
    read_backoff: ExponentialBuilder,
}

impl CallGate {
    /// The gate of `step` of `run`, whose calls use the tools of `snapshot` (the run's snapshot
    /// of its Agent).
    pub fn new(
        client: Client,
        run: &AgentRun,
        step: u32,
        snapshot: AgentSnapshot,
        records: Vec<ToolCallRecord>,
    ) -> CallGate {
        let ns = run.namespace().unwrap_or_default();
        CallGate {
            runs: Api::namespaced(client.clone(), &ns),
            requests: Api::namespaced(client, &ns),
            run: run.name_any(),
            run_uid: run.uid().unwrap_or_default(),
            step,
            snapshot,
            records: Mutex::new(records),
            refused: SyncMutex::new(None),
            read_backoff: ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(6),
        }
    }

    /// Why a call was refused, if one was: the step must end without writing anything.
    pub fn refused(&self) -> Option<String> {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Checks an approved call against its ApprovalRequest; returns the signed approval assertion
    /// the controller stored on it, if any.
    async fn check_approval(&self, call: &ToolCallStart<'_>) -> Result<Option<String>, NotSent> {
        let name = approval_request_name(&self.run, call.tool_call_id);
        let read = || self.requests.get_opt(&name);
        let request = read
            .retry(self.read_backoff)
            .when(|e| !matches!(e, kube::Error::Api(_)))
            .await
            .map_err(|e| NotSent::Unread(format!("reading ApprovalRequest {name}: {e}")))?
            .ok_or_else(|| {
                format!(
                    "{} is marked approved, but its ApprovalRequest {name} does not exist",
                    call.tool_call_id
                )
            })
            .map_err(NotSent::Refused)?;
        let tool = self.snapshot.tool_binding(call.tool_name).ok_or_else(|| {
            NotSent::Refused(format!("the run's Agent has no tool {}", call.tool_name))
        })?;
        if let Some(live) = call.definition_digest
            && live != tool.definition_digest
        {
            return Err(NotSent::Refused(format!(
                "the MCP server lists {} with definition digest {live}, not the {} the run is bound to",
                call.tool_name, tool.definition_digest
            )));
        }
        let expected = Expected {
            run_uid: &self.run_uid,
            step: self.step,
            tool_call_id: call.tool_call_id,
            tool_name: call.tool_name,
            arguments_digest: arguments_digest(call.body),
            tool_endpoint: &tool.endpoint,
            tool_definition_digest: call
                .definition_digest
                .map_or(tool.definition_digest.clone(), str::to_owned),
        };
        check_request(&request, &expected).map_err(NotSent::Refused)?;
        Ok(request.status.and_then(|s| s.assertion))
    }

    async fn record_start(&self, call: &ToolCallStart<'_>) -> Result<ToolCallGate, HookError> {
        let mut records = self.records.lock().await;
        let gate = match records
            .iter_mut()
            .find(|r| r.tool_call_id == call.tool_call_id)
        {
            Some(record) if record.outcome.as_deref() == Some(SUPERSEDED_OUTCOME) => {
                return Ok(ToolCallGate::Skip {
                    result: SUPERSEDED_CALL_MESSAGE.into(),
                });
            }
            Some(record) if call.idempotent => {
                record.resent = Some(record.resent.unwrap_or(0) + 1);
                warn!(
                    tool_call_id = call.tool_call_id,
                    "re-sending a call a stopped worker had started, with the same Idempotency-Key"
                );
                ToolCallGate::Send
            }
            Some(record) => {
                record.outcome = Some("Unknown".into());
                warn!(
                    tool_call_id = call.tool_call_id,
                    "not re-sending a non-idempotent call a stopped worker had started"
                );
                ToolCallGate::Skip {
                    result: UNKNOWN_OUTCOME_MESSAGE.into(),
                }
            }
            None => {
                records.push(ToolCallRecord {
                    tool_call_id: call.tool_call_id.to_owned(),
                    tool_name: call.tool_name.to_owned(),
                    step: self.step,
                    started_at: Time(k8s_openapi::jiff::Timestamp::now()),
                    resent: None,
                    outcome: None,
                });
                ToolCallGate::Send
            }
        };
        let params = PatchParams {
            field_manager: Some(field_managers::WORKER.into()),
            ..Default::default()
        };
        let patch = StatusPatch::unguarded(AgentRunStatusPatch {
            tool_calls: Some(records.clone()),
            ..Default::default()
        });
        self.runs
            .patch_status(&self.run, &params, &Patch::Merge(&patch))
            .await
            .map_err(|e| HookError::new(format!("recording the tool call start: {e}")))?;
        Ok(gate)
    }
}

impl CallGate {
    /// Records a call that was not sent because its MCP tool changed (`outcome: Superseded`).
    async fn record_superseded(&self, call: &ToolCallStart<'_>) -> Result<(), HookError> {
        let mut records = self.records.lock().await;
        if records.iter().any(|r| r.tool_call_id == call.tool_call_id) {
            return Ok(());
        }
        records.push(ToolCallRecord {
            tool_call_id: call.tool_call_id.to_owned(),
            tool_name: call.tool_name.to_owned(),
            step: self.step,
            started_at: Time(k8s_openapi::jiff::Timestamp::now()),
            resent: None,
            outcome: Some(SUPERSEDED_OUTCOME.into()),
        });
        let params = PatchParams {
            field_manager: Some(field_managers::WORKER.into()),
            ..Default::default()
        };
        let patch = StatusPatch::unguarded(AgentRunStatusPatch {
            tool_calls: Some(records.clone()),
            ..Default::default()
        });
        self.runs
            .patch_status(&self.run, &params, &Patch::Merge(&patch))
            .await
            .map_err(|e| HookError::new(format!("recording the superseded call: {e}")))?;
        Ok(())
    }
}

impl RunHooks for CallGate {
    fn tool_superseded<'a>(
        &'a self,
        call: ToolCallStart<'a>,
        why: &'a str,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        Box::pin(async move {
            warn!(tool_call_id = call.tool_call_id, %why, "call superseded: not sent");
            self.record_superseded(&call).await
        })
    }

    fn before_tool_call<'a>(
        &'a self,
        call: ToolCallStart<'a>,
    ) -> BoxFuture<'a, Result<ToolCallGate, HookError>> {
        Box::pin(async move {
            let mut assertion = None;
            if call.requires_approval {
                match self.check_approval(&call).await {
                    Ok(signed) => assertion = signed,
                    Err(NotSent::Unread(unread)) => {
                        return Err(HookError::new(format!(
                            "not sent: {}: {unread}",
                            call.tool_call_id
                        )));
                    }
                    Err(NotSent::Refused(why)) => {
                        let why = format!("{}: {why}", call.tool_call_id);
                        *self.refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
                        return Err(HookError::new(format!("not sent: {why}")));
                    }
                }
            }
            Ok(match (self.record_start(&call).await?, assertion) {
                (ToolCallGate::Send, Some(assertion)) => {
                    ToolCallGate::SendWithAssertion { assertion }
                }
                (gate, _) => gate,
            })
        })
    }
}

/// Why an approved call is not sent.
enum NotSent {
    /// Its ApprovalRequest does not allow it: the call is refused and the step ends
    /// (`TamperedState`).
    Refused(String),
    /// Its ApprovalRequest could not be read (the API server did not answer, even after a few
    /// retries): nothing is known against the call, so the step fails and is retried.
    Unread(String),
}

/// What an ApprovalRequest must say for a call to be sent.
#[derive(Clone, Debug)]
struct Expected<'a> {
    run_uid: &'a str,
    step: u32,
    tool_call_id: &'a str,
    tool_name: &'a str,
    arguments_digest: String,
    tool_endpoint: &'a str,
    tool_definition_digest: String,
}

/// Whether `request` approves exactly the call `expected` describes; `Err` says what differs.
fn check_request(request: &ApprovalRequest, expected: &Expected<'_>) -> Result<(), String> {
    let spec = &request.spec;
    let status = request.status.clone().unwrap_or_default();
    let name = request.name_any();
    let decision = recorded_decision(request).map(|d| d.decision);
    if status.phase != Some(ApprovalPhase::Approved) || decision != Some(Decision::Approved) {
        return Err(format!(
            "{name} is {}, not recorded Approved by the controller",
            status.phase.unwrap_or_default()
        ));
    }
    if spec.agent_run_ref.uid != expected.run_uid {
        return Err(format!(
            "{name} belongs to run uid {}",
            spec.agent_run_ref.uid
        ));
    }
    if spec.step + 1 != expected.step {
        return Err(format!(
            "{name} was made at step {}, but this worker runs step {}",
            spec.step, expected.step
        ));
    }
    if spec.tool_call_id != expected.tool_call_id || spec.tool_name != expected.tool_name {
        return Err(format!(
            "{name} approves {} ({}), not this call",
            spec.tool_call_id, spec.tool_name
        ));
    }
    let approved_digest = approved_arguments_digest(spec)?;
    let edit_recorded = spec.edited_arguments.is_none()
        || status.edited_arguments_digest.as_deref() == Some(approved_digest.as_str());
    if approved_digest != expected.arguments_digest || !spec.digest_matches() || !edit_recorded {
        return Err(format!(
            "the arguments about to be sent (SHA-256 {}) are not the ones {name} approved ({approved_digest})",
            expected.arguments_digest
        ));
    }
    if spec.tool_endpoint.as_deref() != Some(expected.tool_endpoint)
        || spec.tool_definition_digest.as_deref() != Some(&expected.tool_definition_digest)
    {
        return Err(format!(
            "the tool about to be called ({} at {}) is not the one {name} approved",
            expected.tool_definition_digest, expected.tool_endpoint
        ));
    }
    if let Some(identity) = &status.verified_identity {
        let approver = spec.approver_id.as_deref().unwrap_or_default();
        let stamp = request
            .annotations()
            .get(annotations::DECIDED_BY)
            .and_then(|text| DecidedBy::parse(text).ok());
        let stamped = stamp.is_some_and(|s| normalize(&s.username) == normalize(approver));
        if !stamped || normalize(&identity.username) != normalize(approver) {
            return Err(format!(
                "{name} names {approver} as approver, but the API server stamped someone else"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ApprovalRequestStatus, VerifiedIdentity, halted_state};

    #[tokio::test]
    async fn an_unanswered_read_of_the_request_fails_the_step_without_refusing_the_call() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let run = AgentRun::test();
        let mut gate = CallGate::new(client, &run, 1, AgentSnapshot::default(), vec![]);
        gate.read_backoff = ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(1))
            .with_max_times(2);
        let call = ToolCallStart {
            tool_call_id: "call-1",
            tool_name: "delete_user",
            arguments: &serde_json::json!({}).into(),
            body: "{}",
            requires_approval: true,
            idempotent: false,
            definition_digest: None,
        };
        let error = gate.before_tool_call(call).await.unwrap_err();
        assert!(
            error.to_string().contains("reading ApprovalRequest"),
            "{error}"
        );
        assert_eq!(gate.refused(), None, "not a refusal: the step is retried");
    }

    fn approved() -> ApprovalRequest {
        let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
        request.spec.tool_endpoint = Some("http://127.0.0.1:2/d".into());
        request.spec.tool_definition_digest = Some("d".repeat(64));
        request.status = Some(ApprovalRequestStatus {
            phase: Some(ApprovalPhase::Approved),
            verified_identity: Some(VerifiedIdentity {
                username: "alice@example.com".into(),
                uid: None,
                groups: vec![],
            }),
            ..Default::default()
        });
        request
    }

    fn expected(request: &ApprovalRequest) -> Expected<'static> {
        Expected {
            run_uid: "uid-1",
            step: 1,
            tool_call_id: "call_1",
            tool_name: "delete_user",
            arguments_digest: request.spec.arguments_digest.clone(),
            tool_endpoint: "http://127.0.0.1:2/d",
            tool_definition_digest: "d".repeat(64),
        }
    }

    #[test]
    fn an_approved_call_as_approved_is_sent() {
        let request = approved();
        assert_eq!(check_request(&request, &expected(&request)), Ok(()));
    }

    #[test]
    fn anything_that_differs_from_the_approval_is_refused() {
        let request = approved();
        let base = expected(&request);
        let refused = |mutate: &dyn Fn(&mut ApprovalRequest, &mut Expected<'static>)| {
            let (mut r, mut e) = (request.clone(), base.clone());
            mutate(&mut r, &mut e);
            check_request(&r, &e).unwrap_err()
        };
        let why = refused(&|_, e| e.arguments_digest = arguments_digest(r#"{"user_id": "u-666"}"#));
        assert!(why.contains("arguments about to be sent"), "{why}");
        let why = refused(&|_, e| e.tool_endpoint = "http://evil.example/d");
        assert!(why.contains("not the one"), "{why}");
        let why = refused(&|_, e| e.tool_definition_digest = "e".repeat(64));
        assert!(why.contains("not the one"), "{why}");
        let why = refused(&|r, _| r.status.as_mut().unwrap().phase = Some(ApprovalPhase::Pending));
        assert!(why.contains("not recorded Approved"), "{why}");
        let why = refused(&|r, _| r.spec.decision = Some(Decision::Rejected));
        assert!(why.contains("not recorded Approved"), "{why}");
        let why = refused(&|r, _| r.spec.agent_run_ref.uid = "uid-2".into());
        assert!(why.contains("run uid"), "{why}");
        let why = refused(&|_, e| e.step = 3);
        assert!(why.contains("step"), "{why}");
        let why = refused(&|r, _| {
            r.metadata.annotations = Some(
                [(
                    annotations::DECIDED_BY.to_owned(),
                    r#"{"username":"bob@example.com","uid":"","groups":[]}"#.to_owned(),
                )]
                .into(),
            )
        });
        assert!(why.contains("stamped someone else"), "{why}");
    }
}
