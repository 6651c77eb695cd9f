//! The cold state of an interrupted agent run ([`RunState`]) and its JSON form, wire-compatible with
//! the Python implementation (`augments.adk.run.state.RunState`).
//!
//! # Wire format
//!
//! [`RunState::to_json`] is byte-for-byte what CPython's `json.dumps(state.to_dict())` writes: a bare
//! dict with these keys, in this order, and nothing else (in particular no version key):
//!
//! | key | JSON type |
//! |---|---|
//! | `run_id`, `agent_name`, `input` | str |
//! | `messages` | list of chat-completions messages, kept exactly as written |
//! | `deferred_tool_requests` | `{"calls": [...], "approvals": [{"tool_call_id", "tool_name", "args"}]}` |
//! | `approved_tools` | list of tool_call_id |
//! | `rejected_tools` | list of `{"tool_call_id", "message"}` |
//! | `approval_metadata` | `{tool_call_id: {"approver_id", "reason", "timestamp"}}` |
//! | `current_turn` | int |
//! | `usage` | `{"requests", "input_tokens", "output_tokens"}` |
//! | `final_output` | str or null |
//!
//! # Loading is tolerant, but not lax
//!
//! [`RunState::from_dict`] reads every field by name with a safe default, like Python's
//! `dict.get(key, default)`: a payload written by an older build that lacks a later-added field loads
//! with the default, and keys it does not know are ignored (and not written back). `null` for a field
//! that is not nullable is treated like a missing field (the default). A known field holding the wrong
//! type, however, is an error naming the field (with its nested path, e.g.
//! `deferred_tool_requests.approvals[0].tool_name`); it is never silently replaced by the default.
//!
//! Within list entries a few fields have no safe default and are required: `tool_call_id` and
//! `tool_name` of a deferred approval, `tool_call_id` of a rejected tool, and `timestamp` of an
//! approval-metadata entry. The `args` of a deferred approval may be any JSON value, `null`
//! included (kept as written); only a missing `args` defaults (to `{}`).
//!
//! # Timestamps
//!
//! Written like Python's `datetime.isoformat()` of an aware UTC datetime
//! (`2026-12-02T19:30:25.123456+00:00`, no fraction when the microseconds are 0). Loading accepts any
//! UTC offset (converted to UTC), `Z`, a space instead of `T`, and naive timestamps from older payloads
//! (taken as UTC). Precision is the microsecond (extra digits are truncated).

mod codec;
mod decision;
pub mod pyjson;
mod timestamp;

use chrono::{DateTime, Utc};
use indexmap::IndexMap;

pub use decision::{Approval, DecisionError, Rejection};
use pyjson::{JsonError, Value};
pub use timestamp::format_timestamp;

/// The message a runner gives the model for a rejected tool call whose rejection has no message.
pub const DEFAULT_REJECTION_MESSAGE: &str = "The tool call was rejected by a human reviewer.";

/// The resumable, persistable state of an agent run.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RunState {
    /// Identifier of the run.
    pub run_id: String,
    /// Name of the agent that runs.
    pub agent_name: String,
    /// The user input that started the run.
    pub input: String,
    /// The conversation so far (OpenAI chat-completions messages), each kept exactly as written.
    pub messages: Vec<Value>,
    /// Tool calls the run is waiting on.
    pub deferred_tool_requests: DeferredToolRequests,
    /// `tool_call_id`s approved by a human (drives resumption).
    pub approved_tools: Vec<String>,
    /// Tool calls rejected by a human (drives resumption).
    pub rejected_tools: Vec<RejectedTool>,
    /// Audit trail of decisions, keyed by `tool_call_id`. Never consulted to resume.
    pub approval_metadata: IndexMap<String, ApprovalMetadata>,
    /// Number of model turns taken.
    pub current_turn: u64,
    /// Token and request usage so far.
    pub usage: Usage,
    /// The final answer, once the run has finished.
    pub final_output: Option<String>,
}

/// Tool calls the run halted on.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct DeferredToolRequests {
    /// Deferred calls executed outside the run (kept exactly as written).
    pub calls: Vec<Value>,
    /// Calls waiting for a human decision.
    pub approvals: Vec<DeferredToolCall>,
}

/// A tool call waiting for approval.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct DeferredToolCall {
    /// The model's id for the call.
    pub tool_call_id: String,
    /// The tool the model wants to call.
    pub tool_name: String,
    /// The arguments, as the model gave them (usually a dict; kept exactly as written).
    pub args: Value,
}

impl DeferredToolCall {
    /// The arguments as stored: Python-compatible JSON text, byte for byte (what an
    /// ApprovalRequest shows and its digest covers).
    pub fn arguments_json(&self) -> String {
        pyjson::dumps(&self.args).unwrap_or_else(|_| "null".to_owned())
    }
}

/// A tool call a human rejected.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RejectedTool {
    /// The rejected call.
    pub tool_call_id: String,
    /// What the model is told (`None`: the runner uses [`DEFAULT_REJECTION_MESSAGE`]).
    pub message: Option<String>,
}

/// Audit record of one decision. Not shown to the model and not used to resume.
#[derive(Clone, Debug, PartialEq)]
pub struct ApprovalMetadata {
    /// Who decided.
    pub approver_id: Option<String>,
    /// Why (for auditors, not the model).
    pub reason: Option<String>,
    /// When (UTC, microsecond precision).
    pub timestamp: DateTime<Utc>,
}

/// Token and request counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Usage {
    /// Model requests made.
    pub requests: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
}

/// Why a RunState could not be loaded (or, for [`RunState::try_to_json`], written).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateError {
    /// The text is not valid JSON (or not JSON this implementation accepts).
    #[error("runState: {0}")]
    Json(#[from] JsonError),
    /// The JSON document is not an object.
    #[error("runState: not a JSON object (found {found})")]
    NotAnObject {
        /// Type of the document found instead.
        found: &'static str,
    },
    /// A known field holds a value of the wrong JSON type.
    #[error("runState: field `{path}`: expected {expected}, found {found}")]
    WrongType {
        /// Path of the field, e.g. `deferred_tool_requests.approvals[0].tool_name`.
        path: String,
        /// The expected type, e.g. `a list`.
        expected: &'static str,
        /// The type found, e.g. `str`.
        found: &'static str,
    },
    /// A field without a safe default is missing (or null).
    #[error("runState: field `{path}`: missing (required)")]
    Missing {
        /// Path of the field.
        path: String,
    },
    /// A field has the right type but an unusable value.
    #[error("runState: field `{path}`: {problem}")]
    InvalidValue {
        /// Path of the field.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl RunState {
    /// A fresh state for a run: no messages, no deferred calls, turn 0.
    pub fn new(
        run_id: impl Into<String>,
        agent_name: impl Into<String>,
        input: impl Into<String>,
    ) -> Self {
        RunState {
            run_id: run_id.into(),
            agent_name: agent_name.into(),
            input: input.into(),
            ..Self::default()
        }
    }
}
