//! The worker: runs one step of an `AgentRun` in its own Pod. It rebuilds the agent from its
//! `Agent` (reading the API key from the Secret the Agent names), loads the RunState from the run's
//! status, runs the agent loop until it halts for approval or finishes, and writes the new state
//! back — only if the run is still at the step it was started for.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::Mutex;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use crate::agent::{ApiKey, HookError, RunHooks, RunStatus, Runner, ToolCallGate, ToolCallStart};
use crate::chunk_store;
use crate::crd::keys::field_managers;
use crate::crd::names::approval_request_name;
use crate::crd::status_patch::{AgentRunStatusPatch, StatusPatch};
use crate::crd::stored_state::{StoredState, StoredStateError};
use crate::crd::{Agent, AgentRun, ApprovalRequest, ToolCallRecord};
use crate::state::RunState;

/// Errors of one worker step; each is printed on stderr and ends up in the Pod's termination
/// message, which the controller copies into the run's condition.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The run's Agent does not exist.
    #[error("Agent {0} not found")]
    AgentNotFound(String),
    /// The Agent's spec cannot be used.
    #[error("{0}")]
    Agent(#[from] crate::agent::AgentError),
    /// The Secret holding the model API key is missing or lacks the key.
    #[error("Secret {name}: {problem}")]
    Secret {
        /// The Secret's name.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// The stored RunState cannot be read.
    #[error("{0}")]
    State(#[from] StoredStateError),
    /// The run moved on while this worker ran: its result is not written.
    #[error("the run is at step {current}, not step {expected}: this worker's result is discarded")]
    StaleStep {
        /// The step this worker was started for.
        expected: u32,
        /// The step the run is at.
        current: u32,
    },
    /// The agent loop failed.
    #[error("{0}")]
    Run(#[from] crate::agent::RunError),
}

/// How a step ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepResult {
    /// The run finished.
    Completed,
    /// The run halted; this many calls await a decision.
    AwaitingApproval(usize),
}

/// Runs step `step` of run `name` in `namespace`.
pub async fn run_step(
    client: Client,
    namespace: &str,
    name: &str,
    step: u32,
) -> Result<StepResult, WorkerError> {
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), namespace);
    let run = runs.get(name).await?;
    let status = run.status.clone().unwrap_or_default();
    let current = status.step.unwrap_or(0);
    if current != step {
        return Err(WorkerError::StaleStep {
            expected: step,
            current,
        });
    }
    let agents: Api<Agent> = Api::namespaced(client.clone(), namespace);
    let agent_name = run.spec.agent_ref.name.clone();
    let resource = agents
        .get_opt(&agent_name)
        .await?
        .ok_or_else(|| WorkerError::AgentNotFound(agent_name.clone()))?;
    let mut agent = crate::agent::Agent::from_spec_with_name(&agent_name, &resource.spec)?;
    if let Some(secret_ref) = resource.spec.model.api_key_secret_ref.as_ref() {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let secret =
            secrets
                .get_opt(&secret_ref.name)
                .await?
                .ok_or_else(|| WorkerError::Secret {
                    name: secret_ref.name.clone(),
                    problem: "not found".into(),
                })?;
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&secret_ref.key))
            .ok_or_else(|| WorkerError::Secret {
                name: secret_ref.name.clone(),
                problem: format!("has no key {}", secret_ref.key),
            })?;
        let key = String::from_utf8(bytes.0.clone()).map_err(|_| WorkerError::Secret {
            name: secret_ref.name.clone(),
            problem: format!("key {} is not UTF-8", secret_ref.key),
        })?;
        agent = agent.with_api_key(ApiKey::new(key.trim().to_owned()));
    } else if agent.model().api_key_env().is_some() {
        agent = agent.with_api_key_from_env()?;
    }

    let loaded_digest = status.run_state_digest.clone();
    let mut state = match chunk_store::load(&client, &run).await? {
        Some(state) => state,
        None => RunState::new(
            run.uid().unwrap_or_default(),
            agent_name.clone(),
            run.spec.input.clone(),
        ),
    };
    let hooks = Arc::new(StartRecorder {
        runs: runs.clone(),
        requests: Api::namespaced(client.clone(), namespace),
        name: name.to_owned(),
        uid: run.uid().unwrap_or_default(),
        step,
        records: Mutex::new(status.tool_calls.clone()),
    });
    let runner = Runner::new()?.with_hooks(hooks);
    info!(run = %name, step, "running step");
    let outcome = runner.step(&agent, &mut state).await;
    let status = match outcome {
        Ok(status) => status,
        Err(error) => {
            // Keep the progress made before the failure (model answers, tool results), so the
            // retry does not redo it; the error still fails this step.
            if let Err(write_error) =
                write_state(&client, &runs, name, step, loaded_digest.as_deref(), &state).await
            {
                warn!(error = %write_error, "could not save the partial state");
            }
            return Err(error.into());
        }
    };
    write_state(&client, &runs, name, step, loaded_digest.as_deref(), &state).await?;
    Ok(match status {
        RunStatus::Completed => StepResult::Completed,
        RunStatus::AwaitingApproval => {
            StepResult::AwaitingApproval(state.pending_approvals().len())
        }
    })
}

/// Writes the state, guarded by resourceVersion; on a conflict it re-reads the run and writes
/// again only if the run is still at `step` with the state this worker loaded.
async fn write_state(
    client: &Client,
    runs: &Api<AgentRun>,
    name: &str,
    step: u32,
    loaded_digest: Option<&str>,
    state: &RunState,
) -> Result<(), WorkerError> {
    let stored = StoredState::encode(state);
    let status = AgentRunStatusPatch {
        final_output: state.final_output.clone(),
        ..stored.status_patch()
    };
    let params = PatchParams {
        field_manager: Some(field_managers::WORKER.into()),
        ..Default::default()
    };
    for attempt in 0..5 {
        let run = runs.get(name).await?;
        let current = run.status.clone().unwrap_or_default();
        let current_step = current.step.unwrap_or(0);
        if current_step != step || current.run_state_digest.as_deref() != loaded_digest {
            return Err(WorkerError::StaleStep {
                expected: step,
                current: current_step,
            });
        }
        if attempt == 0 {
            chunk_store::write(client, &run, &stored).await?;
        }
        let patch = StatusPatch::guarded(&status, run.resource_version());
        match runs
            .patch_status(name, &params, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tokio::time::sleep(Duration::from_millis(50 * (attempt + 1))).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(WorkerError::StaleStep {
        expected: step,
        current: step,
    })
}

/// The message a model gets for a call of a non-idempotent tool that a stopped worker may already
/// have sent: it is not sent again.
pub const UNKNOWN_OUTCOME_MESSAGE: &str = "The outcome of this tool call is unknown: a worker stopped after sending it, and the tool is not idempotent, so it was not sent again. Check the system before retrying.";

/// Records each tool call in the run's status before it is sent (at-most-once execution). A call
/// already recorded by an earlier worker of the run was sent before a crash: it is re-sent with the
/// same Idempotency-Key when the tool is idempotent (and counted in `resent`), and otherwise not
/// sent at all: the model is told its outcome is unknown and the record says `Unknown`.
///
/// An approved call is sent with the signed approval assertion the controller stored in its
/// ApprovalRequest's `status.assertion`, when there is one.
struct StartRecorder {
    runs: Api<AgentRun>,
    requests: Api<ApprovalRequest>,
    name: String,
    uid: String,
    step: u32,
    records: Mutex<Vec<ToolCallRecord>>,
}

impl StartRecorder {
    /// The approval assertion of the call `tool_call_id` of this run, if the controller issued
    /// one. A request of another run (a new run of the same name) or call is never used.
    async fn assertion(&self, tool_call_id: &str) -> Result<Option<String>, HookError> {
        let name = approval_request_name(&self.name, tool_call_id);
        let request = match self.requests.get_opt(&name).await {
            Ok(request) => request,
            // A Role made before workers read requests: the call goes without an assertion.
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(request = %name, "cannot read the ApprovalRequest: the call is sent without an approval assertion");
                return Ok(None);
            }
            Err(e) => {
                return Err(HookError::new(format!(
                    "reading ApprovalRequest {name} for its approval assertion: {e}"
                )));
            }
        };
        let assertion = request
            .filter(|r| r.spec.agent_run_ref.uid == self.uid && r.spec.tool_call_id == tool_call_id)
            .and_then(|r| r.status)
            .and_then(|s| s.assertion);
        if assertion.is_none() {
            info!(request = %name, "no approval assertion for this call: sent without one");
        }
        Ok(assertion)
    }

    async fn save(&self, records: &[ToolCallRecord]) -> Result<(), HookError> {
        let params = PatchParams {
            field_manager: Some(field_managers::WORKER.into()),
            ..Default::default()
        };
        let patch = StatusPatch::unguarded(AgentRunStatusPatch {
            tool_calls: Some(records.to_vec()),
            ..Default::default()
        });
        self.runs
            .patch_status(&self.name, &params, &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| HookError::new(format!("recording the tool call start: {e}")))
    }
}

impl RunHooks for StartRecorder {
    fn before_tool_call<'a>(
        &'a self,
        call: ToolCallStart<'a>,
    ) -> BoxFuture<'a, Result<ToolCallGate, HookError>> {
        Box::pin(async move {
            // Read before the start is recorded: a failed read sends nothing and records nothing.
            let assertion = if call.requires_approval {
                self.assertion(call.tool_call_id).await?
            } else {
                None
            };
            let mut records = self.records.lock().await;
            let gate = match records
                .iter_mut()
                .find(|r| r.tool_call_id == call.tool_call_id)
            {
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
            self.save(&records).await?;
            Ok(match (gate, assertion) {
                (ToolCallGate::Send, Some(assertion)) => {
                    ToolCallGate::SendWithAssertion { assertion }
                }
                (gate, _) => gate,
            })
        })
    }
}
