//! The worker: runs one step of an `AgentRun` in its own Pod. It rebuilds the agent from the
//! snapshot of its `Agent` the run is bound to, the MCP tool definitions included (reading the API
//! key and the MCP servers' headers from the Secrets it names),
//! loads the RunState from the run's status once the run is at its step, runs the agent loop until
//! it halts for approval or finishes, and writes the new state back — only if the run is still at the step it was started
//! for. Before it sends a call that needs approval it checks the call against its ApprovalRequest
//! ([`calls`]): a call the request does not approve as it is about to be sent is never sent.

mod calls;

pub use calls::UNKNOWN_OUTCOME_MESSAGE;

/// The exit code of a worker that refused to send a call (`TamperedState`): the controller fails
/// the run instead of retrying the step.
pub const TAMPERED_EXIT_CODE: u8 = 3;

use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use tracing::{Instrument, debug, info, warn};

use crate::agent::{ApiKey, RunStatus, Runner};
use crate::approval_policy::Gates;
use crate::chunk_store;
use crate::crd::keys::field_managers;
use crate::crd::status_patch::{AgentRunStatusPatch, StatusPatch};
use crate::crd::stored_state::{StoredState, StoredStateError};
use crate::crd::{AgentRun, AgentRunPhase, AgentSnapshot};
use crate::state::RunState;

/// Errors of one worker step; each is printed on stderr and ends up in the Pod's termination
/// message, which the controller copies into the run's condition.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The run is not bound to a snapshot of its Agent (or the snapshot does not match its
    /// digest).
    #[error(
        "the run has no valid snapshot of Agent {0}; the controller records it when the run starts"
    )]
    NoAgentSnapshot(String),
    /// A call about to be sent does not match what was approved, or the state's copy of the
    /// decisions is not what the ApprovalRequests say: nothing was sent.
    #[error("TamperedState: {0}")]
    Tampered(String),
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
    /// The run is not at this worker's step: it moved on, or did not reach the step while the
    /// worker waited for it. Nothing of the step is written.
    #[error("the run is at step {current}, not step {expected}: this worker's result is discarded")]
    StaleStep {
        /// The step this worker was started for.
        expected: u32,
        /// The step the run is at.
        current: u32,
    },
    /// The run has finished: no step of it runs again, whatever Pod was started for it.
    #[error("the run has {phase}: this worker runs nothing")]
    RunFinished {
        /// The run's phase.
        phase: AgentRunPhase,
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
    let run = run_at_step(&runs, name, step, step_wait()).await?;
    let status = run.status.clone().unwrap_or_default();
    let agent_name = run.spec.agent_ref.name.clone();
    let snapshot = status
        .agent
        .clone()
        .ok_or_else(|| WorkerError::NoAgentSnapshot(agent_name.clone()))?;
    let (spec, mcp_tools) = snapshot
        .verified_spec()
        .zip(snapshot.verified_mcp_tools())
        .ok_or_else(|| WorkerError::NoAgentSnapshot(agent_name.clone()))?;
    let mut agent = crate::agent::Agent::from_bound(&agent_name, spec, mcp_tools)?;
    if let Some(secret_ref) = spec.model.api_key_secret_ref.as_ref() {
        let key = read_secret(&client, namespace, secret_ref).await?;
        agent = agent.with_api_key(ApiKey::new(key.trim().to_owned()));
    } else if agent.model().api_key_env().is_some() {
        agent = agent.with_api_key_from_env()?;
    }
    for server in &spec.mcp_servers {
        let mut headers = Vec::with_capacity(server.headers.len());
        for header in &server.headers {
            let value = read_secret(&client, namespace, &header.secret_key_ref).await?;
            headers.push((header.name.clone(), value.trim().to_owned()));
        }
        agent = agent.with_mcp_headers(&server.name, &headers);
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
    let hooks = Arc::new(calls::CallGate::new(
        client.clone(),
        &run,
        step,
        AgentSnapshot::clone(&snapshot),
        status.tool_calls.clone(),
    ));
    let runner = Runner::new()?
        .with_hooks(hooks.clone())
        .with_gates(Gates::new(&status.approval_gates));
    info!(run = %name, step, "running step");
    let span = step_span(&run, &agent_name, step);
    let usage_before = (state.usage.input_tokens, state.usage.output_tokens);
    let outcome = runner
        .step(&agent, &mut state)
        .instrument(span.clone())
        .await;
    span.record(
        "gen_ai.usage.input_tokens",
        state.usage.input_tokens.saturating_sub(usage_before.0),
    );
    span.record(
        "gen_ai.usage.output_tokens",
        state.usage.output_tokens.saturating_sub(usage_before.1),
    );
    span.record(
        "agentrun.step.outcome",
        match &outcome {
            Ok(RunStatus::Completed) => "completed",
            Ok(RunStatus::AwaitingApproval) => "awaiting_approval",
            Err(_) => "error",
        },
    );
    if let Err(error) = &outcome {
        span.record("error.type", "run_error");
        span.record("agentrun.error", error.to_string());
    }
    if let Some(why) = hooks.refused() {
        // Nothing of this step is written: the state stays as found, for the audit.
        return Err(WorkerError::Tampered(why));
    }
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

/// The `invoke_agent` span of one step, a child of the run's root span (the trace context the
/// controller put in the Pod's `TRACEPARENT`).
fn step_span(run: &AgentRun, agent: &str, step: u32) -> tracing::Span {
    let uid = run.uid().unwrap_or_default();
    let span = tracing::info_span!(
        target: crate::telemetry::TARGET,
        "invoke_agent",
        otel.name = %format!("invoke_agent {agent}"),
        otel.kind = "internal",
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %agent,
        gen_ai.conversation.id = %uid,
        agentrun.run.name = %run.name_any(),
        agentrun.step = step,
        k8s.namespace.name = %run.namespace().unwrap_or_default(),
        k8s.pod.name = %std::env::var("AGENTRUN_WORKER_POD").unwrap_or_default(),
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        agentrun.step.outcome = tracing::field::Empty,
        agentrun.error = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    let parent = std::env::var(crate::telemetry::TRACEPARENT_ENV)
        .ok()
        .and_then(|t| crate::telemetry::context_from_traceparent(&t))
        .unwrap_or_else(|| crate::telemetry::run_context(&uid));
    crate::telemetry::set_parent(&span, parent);
    span
}

/// The value of one key of a Secret in `namespace` (the worker may read only the Secrets its
/// Agent names).
async fn read_secret(
    client: &Client,
    namespace: &str,
    secret_ref: &crate::crd::SecretKeyRef,
) -> Result<String, WorkerError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
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
    String::from_utf8(bytes.0.clone()).map_err(|_| WorkerError::Secret {
        name: secret_ref.name.clone(),
        problem: format!("key {} is not UTF-8", secret_ref.key),
    })
}

/// How long a worker waits for its run to reach its step.
const STEP_WAIT: Duration = Duration::from_secs(60);

/// The backoff of a worker waiting for its run to reach its step, for at most [`STEP_WAIT`].
fn step_wait() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(20))
        .with_max_delay(Duration::from_millis(500))
        .with_total_delay(Some(STEP_WAIT))
        .without_max_times()
}

/// Reads the run once it is at `step`. The controller creates the Pod of a resumed run's next step
/// at the same time as it writes the status that moves the run to that step, so a worker may start
/// first: it reads again (with `backoff`) while the run is at an earlier step. A run past `step`,
/// or still before it when the backoff ends, is stale; a finished run has no step to run.
async fn run_at_step(
    runs: &Api<AgentRun>,
    name: &str,
    step: u32,
    backoff: ExponentialBuilder,
) -> Result<AgentRun, WorkerError> {
    let read = || async {
        let run = runs.get(name).await?;
        if let Some(phase) = run.status.as_ref().and_then(|s| s.phase)
            && phase.is_terminal()
        {
            return Err(WorkerError::RunFinished { phase });
        }
        let current = run.status.as_ref().and_then(|s| s.step).unwrap_or(0);
        if current == step {
            Ok(run)
        } else {
            Err(WorkerError::StaleStep {
                expected: step,
                current,
            })
        }
    };
    read.retry(backoff)
        .when(|e| matches!(e, WorkerError::StaleStep { current, .. } if *current < step))
        .notify(|_, after| debug!(step, ?after, "the run is not at this worker's step yet"))
        .await
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
