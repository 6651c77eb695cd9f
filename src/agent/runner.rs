//! The agent loop. [`Runner::step`] advances a [`RunState`] until the model gives a final answer
//! or some tool call needs a person's decision; [`Runner::run`] and [`Runner::resume`] wrap it.
//!
//! The history lives in `state.messages` in the OpenAI chat shape (the user's input first); the
//! system instructions are not stored but sent first on every request. Audit fields of the
//! state (`approval_metadata`: approver and reason) are never read here, so they never reach
//! the model; a rejection's `message` does, as the tool's result.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use tracing::Instrument;

use super::Agent;
use super::http::{build_client, error_chain};
use super::model::{self, ModelError, ModelRequest, RetryPolicy, ToolArguments, ToolCall};
use super::tool::{NotSent, Prepared};
use crate::approval_policy::Gates;
use crate::state::pyjson::{self, Value};
use crate::state::{DEFAULT_REJECTION_MESSAGE, DeferredToolCall, RunState};

/// Errors that stop a run. A run that halts for approval is not an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The HTTP client could not be created.
    #[error("cannot create the HTTP client: {0}")]
    Client(String),
    /// The state was written by a run of another agent.
    #[error("the run state belongs to agent `{state_agent}`, not to agent `{agent}`")]
    AgentMismatch {
        /// The agent asked to resume.
        agent: String,
        /// The state's `agent_name`.
        state_agent: String,
    },
    /// The run used all its model turns without a final answer.
    #[error(
        "the run reached its limit of {max_turns} model turns (maxTurns) without a final answer"
    )]
    MaxTurnsExceeded {
        /// The agent's limit.
        max_turns: u32,
    },
    /// The model could not be asked, or answered with something unusable.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The model gave a new tool call the id of an earlier one. Approvals are keyed by tool
    /// call id, so the run stops rather than apply an earlier decision to a new call.
    #[error(
        "the model reused tool call id `{id}` from an earlier turn; decisions are keyed by tool \
         call id, so the run stops instead of applying an earlier decision to a new call"
    )]
    ReusedToolCallId {
        /// The reused id.
        id: String,
    },
    /// The state's history cannot be continued (e.g. a malformed assistant message).
    #[error("invalid run state: {0}")]
    InvalidState(String),
    /// The [`RunHooks::before_tool_call`] hook failed; the tool was not called.
    #[error("the before-tool-call hook failed for tool call `{tool_call_id}`: {source}")]
    Hook {
        /// The call that was about to be sent.
        tool_call_id: String,
        /// The hook's error.
        #[source]
        source: HookError,
    },
}

/// How a run (or one step of it) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// The model gave a final answer: `state.final_output` is set.
    Completed,
    /// Some tool calls wait for a decision: `state.deferred_tool_requests.approvals` lists them.
    AwaitingApproval,
}

/// The result of [`Runner::run`] or [`Runner::resume`]: how it ended, and the state to keep.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// Completed, or halted awaiting approval.
    pub status: RunStatus,
    /// The run's state; when halted, persist it (`to_json`) and resume it after the decisions.
    pub state: RunState,
}

impl RunOutcome {
    /// Whether the run halted for approval.
    pub fn is_halted(&self) -> bool {
        self.status == RunStatus::AwaitingApproval
    }

    /// The final answer, when completed.
    pub fn final_output(&self) -> Option<&str> {
        match self.status {
            RunStatus::Completed => self.state.final_output.as_deref(),
            RunStatus::AwaitingApproval => None,
        }
    }

    /// The calls waiting for a decision (empty when completed).
    pub fn pending_approvals(&self) -> Vec<&DeferredToolCall> {
        self.state.pending_approvals()
    }
}

/// A tool call about to be sent, as shown to [`RunHooks::before_tool_call`].
#[derive(Clone, Copy, Debug)]
pub struct ToolCallStart<'a> {
    /// The call's id (the `Idempotency-Key` is derived from it and the run's id).
    pub tool_call_id: &'a str,
    /// The tool's name.
    pub tool_name: &'a str,
    /// The validated arguments.
    pub arguments: &'a Value,
    /// The exact body that will be sent (the arguments as Python-compatible JSON).
    pub body: &'a str,
    /// Whether the call runs on an approval (which the hooks check before it is sent).
    pub requires_approval: bool,
    /// Whether the tool declares repeated calls with the same key safe.
    pub idempotent: bool,
    /// For an MCP tool: the digest of the definition its server lists now (equal to the one the
    /// run is bound to, or the call would not have come this far).
    pub definition_digest: Option<&'a str>,
}

/// What the hook decides about a call about to be sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolCallGate {
    /// Send it.
    Send,
    /// Send it with this signed approval assertion (in the
    /// [`HEADER`](crate::assertion::HEADER) header), so that the tool can verify the approval.
    SendWithAssertion {
        /// The assertion, a compact JWS.
        assertion: String,
    },
    /// Do not send it; the model gets `result` as the tool's result instead (e.g. when a
    /// non-idempotent call may already have run before a crash).
    Skip {
        /// The tool result text given to the model.
        result: String,
    },
}

/// An error from a [`RunHooks`] implementation.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct HookError {
    message: String,
}

impl HookError {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> HookError {
        HookError {
            message: message.into(),
        }
    }
}

/// Callbacks around the runner's side effects, e.g. for the Kubernetes worker to record that a
/// call started before it is sent (at-most-once execution).
pub trait RunHooks: Send + Sync {
    /// Called just before each tool call is sent (approved calls and calls of tools that need
    /// no approval). An error stops the run with [`RunError::Hook`] and the tool is not called.
    fn before_tool_call<'a>(
        &'a self,
        call: ToolCallStart<'a>,
    ) -> BoxFuture<'a, Result<ToolCallGate, HookError>>;

    /// Called instead of [`before_tool_call`](Self::before_tool_call) when a call is not sent
    /// because its MCP server now defines the tool otherwise than the run is bound to (the call
    /// is superseded; `why` names both digests). An error stops the run.
    fn tool_superseded<'a>(
        &'a self,
        call: ToolCallStart<'a>,
        why: &'a str,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        let _ = (call, why);
        Box::pin(async { Ok(()) })
    }
}

/// Settings of a [`Runner`].
#[derive(Clone, Debug, Default)]
pub struct RunnerConfig {
    /// How failed model requests are retried.
    pub retry: RetryPolicy,
}

/// Runs agents: calls the model and the tools, halts when a call needs approval.
#[derive(Clone)]
pub struct Runner {
    client: reqwest::Client,
    config: RunnerConfig,
    hooks: Option<Arc<dyn RunHooks>>,
    gates: Gates,
}

impl fmt::Debug for Runner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runner")
            .field("config", &self.config)
            .field("hooks", &self.hooks.is_some())
            .finish_non_exhaustive()
    }
}

enum CallResult {
    Answer(String),
    Defer(DeferredToolCall),
}

/// A fresh run id: `run-` and 16 hex digits.
pub fn new_run_id() -> String {
    format!("run-{:016x}", rand::random::<u64>())
}

impl Runner {
    /// A runner with default settings.
    pub fn new() -> Result<Runner, RunError> {
        Runner::with_config(RunnerConfig::default())
    }

    /// A runner with these settings.
    pub fn with_config(config: RunnerConfig) -> Result<Runner, RunError> {
        let client = build_client().map_err(|e| RunError::Client(error_chain(&e)))?;
        Ok(Runner::with_client(client, config))
    }

    /// A runner that sends its requests through `client` (which should not follow redirects).
    pub fn with_client(client: reqwest::Client, config: RunnerConfig) -> Runner {
        Runner {
            client,
            config,
            hooks: None,
            gates: Gates::default(),
        }
    }

    /// Installs hooks called around side effects.
    pub fn with_hooks(mut self, hooks: Arc<dyn RunHooks>) -> Runner {
        self.hooks = Some(hooks);
        self
    }

    /// Halts on calls of the tools `gates` match too (the ApprovalPolicies' tools, which the
    /// controller evaluates), besides those the Agent requires approval for.
    pub fn with_gates(mut self, gates: Gates) -> Runner {
        self.gates = gates;
        self
    }

    /// Starts a new run of `agent` on `input`.
    pub async fn run(&self, agent: &Agent, input: &str) -> Result<RunOutcome, RunError> {
        let state = RunState::new(new_run_id(), agent.name().to_owned(), input.to_owned());
        self.resume(agent, state).await
    }

    /// Continues a run from its state (after decisions were recorded with `approve`/`reject`).
    /// On error the state is dropped; use [`Runner::step`] to keep partial progress.
    pub async fn resume(&self, agent: &Agent, mut state: RunState) -> Result<RunOutcome, RunError> {
        let status = self.step(agent, &mut state).await?;
        Ok(RunOutcome { status, state })
    }

    /// Advances `state` in place until the run completes or halts for approval. On error,
    /// `state` holds every message added before the failure (model answers, tool results), so
    /// a caller may persist it and retry the step.
    pub async fn step(&self, agent: &Agent, state: &mut RunState) -> Result<RunStatus, RunError> {
        if state.agent_name != agent.name() {
            return Err(RunError::AgentMismatch {
                agent: agent.name().to_owned(),
                state_agent: state.agent_name.clone(),
            });
        }
        if state.final_output.is_some() {
            state.deferred_tool_requests.approvals.clear();
            return Ok(RunStatus::Completed);
        }
        if state.messages.is_empty() {
            state.messages.push(Value::from(
                serde_json::json!({"role": "user", "content": state.input}),
            ));
        }
        loop {
            if let Some(status) = self.answer_open_calls(agent, state).await? {
                return Ok(status);
            }
            if state.current_turn >= u64::from(agent.max_turns()) {
                return Err(RunError::MaxTurnsExceeded {
                    max_turns: agent.max_turns(),
                });
            }
            let request = ModelRequest {
                instructions: agent.instructions(),
                history: &state.messages,
                tools: agent.tools(),
            };
            let response = agent
                .model()
                .complete(&self.client, &self.config.retry, request)
                .await?;
            check_new_call_ids(&state.messages, &response.message)?;
            state.messages.push(response.message);
            state.current_turn += 1;
            state.usage.requests += 1;
            state.usage.input_tokens += response.input_tokens;
            state.usage.output_tokens += response.output_tokens;
        }
    }

    /// Answers the unanswered tool calls of the last assistant message. `Some` ends the step
    /// (completed, or halted with the undecided calls); `None` means: ask the model.
    async fn answer_open_calls(
        &self,
        agent: &Agent,
        state: &mut RunState,
    ) -> Result<Option<RunStatus>, RunError> {
        let Some(index) = state
            .messages
            .iter()
            .rposition(|m| model::role(m) != Some("tool"))
        else {
            return Err(RunError::InvalidState(
                "the history holds only tool results".to_owned(),
            ));
        };
        if model::role(&state.messages[index]) != Some("assistant") {
            state.deferred_tool_requests.approvals.clear();
            return Ok(None);
        }
        let calls = model::tool_calls(&state.messages[index])
            .map_err(|e| RunError::InvalidState(format!("messages[{index}]: {e}")))?;
        if calls.is_empty() {
            state.final_output = Some(model::content_text(&state.messages[index]));
            state.deferred_tool_requests.approvals.clear();
            return Ok(Some(RunStatus::Completed));
        }
        let answered: HashSet<String> = state.messages[index + 1..]
            .iter()
            .filter_map(tool_call_id_of)
            .collect();
        let mut deferred = Vec::new();
        for call in calls.iter().filter(|c| !answered.contains(&c.id)) {
            match self.answer_call(agent, state, call).await? {
                CallResult::Answer(text) => state.messages.push(tool_message(&call.id, &text)),
                CallResult::Defer(pending) => deferred.push(pending),
            }
        }
        if deferred.is_empty() {
            state.deferred_tool_requests.approvals.clear();
            Ok(None)
        } else {
            state.deferred_tool_requests.approvals = deferred;
            Ok(Some(RunStatus::AwaitingApproval))
        }
    }

    async fn answer_call(
        &self,
        agent: &Agent,
        state: &RunState,
        call: &ToolCall,
    ) -> Result<CallResult, RunError> {
        let Some(tool) = agent.tool(&call.name) else {
            let known: Vec<&str> = agent.tools().iter().map(|t| t.name()).collect();
            return Ok(CallResult::Answer(format!(
                "tool error: unknown tool `{}`; the available tools are: {}",
                call.name,
                if known.is_empty() {
                    "(none)".to_owned()
                } else {
                    known.join(", ")
                }
            )));
        };
        let (arguments, json) = match parse_arguments(&call.arguments) {
            Ok(parsed) => parsed,
            Err(e) => {
                return Ok(CallResult::Answer(format!(
                    "tool error: the arguments for `{}` are not valid JSON: {e}",
                    call.name
                )));
            }
        };
        if let Err(problems) = tool.check_arguments(&json) {
            return Ok(CallResult::Answer(format!(
                "tool error: invalid arguments for `{}`: {problems}",
                call.name
            )));
        }
        // A decision stands whatever the gates say now: a rejected call is never sent, an
        // approved one only after its approval is checked.
        if let Some(rejected) = state.rejection(&call.id) {
            return Ok(CallResult::Answer(
                rejected
                    .message
                    .clone()
                    .unwrap_or_else(|| DEFAULT_REJECTION_MESSAGE.to_owned()),
            ));
        }
        let approved = state.is_approved(&call.id);
        if (tool.requires_approval() || self.gates.matches(&call.name)) && !approved {
            return Ok(CallResult::Defer(DeferredToolCall {
                tool_call_id: call.id.clone(),
                tool_name: call.name.clone(),
                args: arguments,
            }));
        }
        let body = body_of(&arguments, &json);
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "execute_tool",
            otel.name = %format!("execute_tool {}", call.name),
            otel.kind = "internal",
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = %call.name,
            gen_ai.tool.call.id = %call.id,
            gen_ai.tool.type = "function",
            agentrun.tool.kind = tool.kind(),
            agentrun.tool.endpoint = %tool.endpoint(),
            agentrun.tool.requires_approval = tool.requires_approval(),
            agentrun.mcp.server = tool.mcp_server().unwrap_or_default(),
            agentrun.tool.outcome = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let answer = self
            .send_call(tool, state, call, &arguments, body)
            .instrument(span.clone())
            .await?;
        if let CallResult::Answer(text) = &answer {
            let outcome = if text.starts_with("tool error:") {
                span.record("error.type", "tool_error");
                "error"
            } else {
                "ok"
            };
            span.record("agentrun.tool.outcome", outcome);
        }
        Ok(answer)
    }

    /// Sends an allowed call (approved, or of a tool that needs no approval): the MCP server's
    /// definition checked, the hook asked, then the call.
    async fn send_call(
        &self,
        tool: &super::Tool,
        state: &RunState,
        call: &ToolCall,
        arguments: &Value,
        body: String,
    ) -> Result<CallResult, RunError> {
        let trace = crate::telemetry::current_headers();
        let prepared = match tool.prepare(&self.client, &trace).await {
            Ok(prepared) => prepared,
            Err(NotSent::Failed(result)) => return Ok(CallResult::Answer(result)),
            Err(NotSent::Superseded { why, result }) => {
                tracing::Span::current().record("agentrun.tool.outcome", "superseded");
                if let Some(hooks) = &self.hooks {
                    let start = self.start_of(tool, state, call, arguments, &body, None);
                    hooks
                        .tool_superseded(start, &why)
                        .await
                        .map_err(|source| RunError::Hook {
                            tool_call_id: call.id.clone(),
                            source,
                        })?;
                }
                return Ok(CallResult::Answer(result));
            }
        };
        let live_digest = match &prepared {
            Prepared::Mcp {
                definition_digest, ..
            } => Some(definition_digest.clone()),
            Prepared::Http => None,
        };
        let mut assertion = None;
        if let Some(hooks) = &self.hooks {
            let start = self.start_of(tool, state, call, arguments, &body, live_digest.as_deref());
            let gate = hooks
                .before_tool_call(start)
                .await
                .map_err(|source| RunError::Hook {
                    tool_call_id: call.id.clone(),
                    source,
                })?;
            match gate {
                ToolCallGate::Skip { result } => return Ok(CallResult::Answer(result)),
                ToolCallGate::SendWithAssertion { assertion: signed } => assertion = Some(signed),
                ToolCallGate::Send => {}
            }
        }
        tracing::info!(tool = %call.name, tool_call_id = %call.id, asserted = assertion.is_some(), "calling tool");
        Ok(CallResult::Answer(
            tool.call(
                &self.client,
                prepared,
                &super::tool::idempotency_key(&state.run_id, &call.id),
                body,
                assertion.as_deref(),
                &trace,
            )
            .await,
        ))
    }

    /// What the hooks are told of a call about to be sent. `requires_approval` is whether the
    /// call was approved: an approved call is always checked, whatever the gates say now.
    fn start_of<'a>(
        &self,
        tool: &super::Tool,
        state: &RunState,
        call: &'a ToolCall,
        arguments: &'a Value,
        body: &'a str,
        definition_digest: Option<&'a str>,
    ) -> ToolCallStart<'a> {
        ToolCallStart {
            tool_call_id: &call.id,
            tool_name: &call.name,
            arguments,
            body,
            requires_approval: state.is_approved(&call.id),
            idempotent: tool.idempotent(),
            definition_digest,
        }
    }
}

/// The exact body the runner sends for `call`: its arguments as Python-compatible JSON.
pub fn call_body(call: &ToolCall) -> Result<String, String> {
    let (arguments, json) = parse_arguments(&call.arguments)?;
    Ok(body_of(&arguments, &json))
}

fn body_of(arguments: &Value, json: &serde_json::Value) -> String {
    pyjson::dumps(arguments).unwrap_or_else(|_| json.to_string())
}

/// The tool call with id `id` among the assistant messages of `history`.
pub fn find_call(history: &[Value], id: &str) -> Option<ToolCall> {
    history
        .iter()
        .filter(|m| model::role(m) == Some("assistant"))
        .filter_map(|m| model::tool_calls(m).ok())
        .flatten()
        .find(|c| c.id == id)
}

/// Decodes tool call arguments: the value kept in the state, and its `serde_json` form for
/// schema validation. Empty arguments mean `{}`.
fn parse_arguments(raw: &ToolArguments) -> Result<(Value, serde_json::Value), String> {
    match raw {
        ToolArguments::Text(text) if text.trim().is_empty() => {
            Ok((Value::from(serde_json::json!({})), serde_json::json!({})))
        }
        ToolArguments::Text(text) => {
            let json: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
            let value = pyjson::loads(text).map_err(|e| e.to_string())?;
            Ok((value, json))
        }
        ToolArguments::Value(value) => {
            let json = serde_json::Value::try_from(value).map_err(|e| e.to_string())?;
            Ok((value.clone(), json))
        }
    }
}

/// Refuses a model answer whose tool call ids were used by an earlier assistant message.
fn check_new_call_ids(history: &[Value], message: &Value) -> Result<(), RunError> {
    let new_calls = model::tool_calls(message)
        .map_err(|e| RunError::InvalidState(format!("the new assistant message: {e}")))?;
    if new_calls.is_empty() {
        return Ok(());
    }
    for earlier in history
        .iter()
        .filter(|m| model::role(m) == Some("assistant"))
    {
        let Ok(calls) = model::tool_calls(earlier) else {
            continue;
        };
        if let Some(reused) = new_calls
            .iter()
            .find(|n| calls.iter().any(|c| c.id == n.id))
        {
            return Err(RunError::ReusedToolCallId {
                id: reused.id.clone(),
            });
        }
    }
    Ok(())
}

/// The `tool_call_id` of a tool-result message.
fn tool_call_id_of(message: &Value) -> Option<String> {
    match message {
        Value::Dict(d) => match d.get("tool_call_id") {
            Some(Value::Str(id)) => Some(id.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// A tool-result message in the OpenAI shape.
fn tool_message(tool_call_id: &str, content: &str) -> Value {
    Value::from(serde_json::json!({
        "role": "tool",
        "tool_call_id": tool_call_id,
        "content": content,
    }))
}
