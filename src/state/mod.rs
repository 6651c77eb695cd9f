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

pub mod pyjson;

use chrono::{DateTime, NaiveDateTime, Timelike, Utc};
use indexmap::IndexMap;

use pyjson::{Dict, JsonError, Value};

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

/// An approval decision: `Approval::new().approver_id("alice").reason("CR-1234").at(ts)`.
///
/// Audit metadata is recorded only when `approver_id` or `reason` is set.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Approval {
    /// Who approved (audit only).
    pub approver_id: Option<String>,
    /// Why (audit only, never shown to the model).
    pub reason: Option<String>,
    /// When; `None`: now.
    pub timestamp: Option<DateTime<Utc>>,
}

/// A rejection decision: `Rejection::new().message("not allowed").approver_id("bob").reason("policy")`.
///
/// `message` is what the model is told; `approver_id` and `reason` are audit only and are recorded
/// only when one of them is set.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Rejection {
    /// Shown to the model (`None`: the runner uses [`DEFAULT_REJECTION_MESSAGE`]).
    pub message: Option<String>,
    /// Who rejected (audit only).
    pub approver_id: Option<String>,
    /// Why (audit only, never shown to the model).
    pub reason: Option<String>,
    /// When; `None`: now.
    pub timestamp: Option<DateTime<Utc>>,
}

impl Approval {
    /// An approval with no audit metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets who approved.
    pub fn approver_id(mut self, approver_id: impl Into<String>) -> Self {
        self.approver_id = Some(approver_id.into());
        self
    }

    /// Sets the audit reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets the decision time (default: now).
    pub fn at(mut self, timestamp: DateTime<Utc>) -> Self {
        self.timestamp = Some(timestamp);
        self
    }
}

impl Rejection {
    /// A rejection with no message and no audit metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the message shown to the model.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Sets who rejected.
    pub fn approver_id(mut self, approver_id: impl Into<String>) -> Self {
        self.approver_id = Some(approver_id.into());
        self
    }

    /// Sets the audit reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets the decision time (default: now).
    pub fn at(mut self, timestamp: DateTime<Utc>) -> Self {
        self.timestamp = Some(timestamp);
        self
    }
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

/// Why a decision ([`RunState::approve`] / [`RunState::reject`]) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    /// No deferred approval has this id.
    #[error("tool call `{0}` is not awaiting approval (unknown id)")]
    Unknown(String),
    /// The call was already approved.
    #[error("tool call `{0}` is not awaiting approval (already approved)")]
    AlreadyApproved(String),
    /// The call was already rejected.
    #[error("tool call `{0}` is not awaiting approval (already rejected)")]
    AlreadyRejected(String),
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

    /// The state as the dict Python's `RunState.to_dict()` returns.
    pub fn to_dict(&self) -> Dict {
        let mut d = Dict::with_capacity(11);
        d.insert("run_id".into(), Value::from(self.run_id.as_str()));
        d.insert("agent_name".into(), Value::from(self.agent_name.as_str()));
        d.insert("input".into(), Value::from(self.input.as_str()));
        d.insert("messages".into(), Value::List(self.messages.clone()));
        let approvals = self
            .deferred_tool_requests
            .approvals
            .iter()
            .map(|call| {
                Value::from_iter([
                    ("tool_call_id", Value::from(call.tool_call_id.as_str())),
                    ("tool_name", Value::from(call.tool_name.as_str())),
                    ("args", call.args.clone()),
                ])
            })
            .collect::<Value>();
        d.insert(
            "deferred_tool_requests".into(),
            Value::from_iter([
                (
                    "calls",
                    Value::List(self.deferred_tool_requests.calls.clone()),
                ),
                ("approvals", approvals),
            ]),
        );
        d.insert(
            "approved_tools".into(),
            self.approved_tools
                .iter()
                .map(|id| Value::from(id.as_str()))
                .collect(),
        );
        d.insert(
            "rejected_tools".into(),
            self.rejected_tools
                .iter()
                .map(|r| {
                    Value::from_iter([
                        ("tool_call_id", Value::from(r.tool_call_id.as_str())),
                        ("message", Value::from(r.message.clone())),
                    ])
                })
                .collect(),
        );
        d.insert(
            "approval_metadata".into(),
            self.approval_metadata
                .iter()
                .map(|(id, m)| {
                    (
                        id.clone(),
                        Value::from_iter([
                            ("approver_id", Value::from(m.approver_id.clone())),
                            ("reason", Value::from(m.reason.clone())),
                            ("timestamp", Value::from(format_timestamp(&m.timestamp))),
                        ]),
                    )
                })
                .collect(),
        );
        d.insert("current_turn".into(), Value::from(self.current_turn));
        d.insert(
            "usage".into(),
            Value::from_iter([
                ("requests", Value::from(self.usage.requests)),
                ("input_tokens", Value::from(self.usage.input_tokens)),
                ("output_tokens", Value::from(self.usage.output_tokens)),
            ]),
        );
        d.insert(
            "final_output".into(),
            Value::from(self.final_output.clone()),
        );
        d
    }

    /// Reads a state from a dict as Python's `RunState.from_dict` does (see the module docs for the
    /// tolerance rules).
    pub fn from_dict(value: &Value) -> Result<Self, StateError> {
        match value {
            Value::Dict(_) => Self::from_value(value.clone()),
            other => Err(StateError::NotAnObject {
                found: other.type_name(),
            }),
        }
    }

    /// `json.dumps(self.to_dict())`, byte for byte.
    ///
    /// Never fails. A state holding something [`pyjson::dumps`] refuses (only possible for values put
    /// into `messages`, `calls` or `args` by code: a NaN/infinite float, an integer of more than 4300
    /// digits, nesting deeper than [`pyjson::MAX_DEPTH`]) is written the way CPython's `json.dumps`
    /// writes it (`NaN`, `Infinity`, the integer in full), with over-deep values replaced by `null`.
    /// Use [`RunState::try_to_json`] to get an error instead.
    pub fn to_json(&self) -> String {
        let mut writer = pyjson::Writer::lenient();
        // The lenient writer cannot fail.
        let _ = self.write_json(&mut writer);
        writer.finish()
    }

    /// Like [`RunState::to_json`], but fails where [`pyjson::dumps`] fails.
    pub fn try_to_json(&self) -> Result<String, StateError> {
        let mut writer = pyjson::Writer::strict();
        self.write_json(&mut writer)?;
        Ok(writer.finish())
    }

    /// Writes `to_dict()` without building it (same bytes as `dumps(&to_dict())`).
    fn write_json(&self, w: &mut pyjson::Writer) -> Result<(), JsonError> {
        w.raw("{\"run_id\": ");
        w.str(&self.run_id);
        w.raw(", \"agent_name\": ");
        w.str(&self.agent_name);
        w.raw(", \"input\": ");
        w.str(&self.input);
        w.raw(", \"messages\": ");
        // Messages sit inside the top dict and the list.
        write_list(w, &self.messages, 2)?;
        w.raw(", \"deferred_tool_requests\": {\"calls\": ");
        // Calls sit inside the top dict, the deferred dict and the list.
        write_list(w, &self.deferred_tool_requests.calls, 3)?;
        w.raw(", \"approvals\": ");
        if self.deferred_tool_requests.approvals.is_empty() {
            w.raw("[]");
        } else {
            w.raw("[");
            for (i, call) in self.deferred_tool_requests.approvals.iter().enumerate() {
                if i > 0 {
                    w.raw(", ");
                }
                w.raw("{\"tool_call_id\": ");
                w.str(&call.tool_call_id);
                w.raw(", \"tool_name\": ");
                w.str(&call.tool_name);
                w.raw(", \"args\": ");
                // `args` sits 4 levels deep: top dict, deferred dict, approvals list, call dict.
                w.nested_value(&call.args, 4)?;
                w.raw("}");
            }
            w.raw("]");
        }
        w.raw("}, \"approved_tools\": ");
        if self.approved_tools.is_empty() {
            w.raw("[]");
        } else {
            w.raw("[");
            for (i, id) in self.approved_tools.iter().enumerate() {
                if i > 0 {
                    w.raw(", ");
                }
                w.str(id);
            }
            w.raw("]");
        }
        w.raw(", \"rejected_tools\": ");
        if self.rejected_tools.is_empty() {
            w.raw("[]");
        } else {
            w.raw("[");
            for (i, r) in self.rejected_tools.iter().enumerate() {
                if i > 0 {
                    w.raw(", ");
                }
                w.raw("{\"tool_call_id\": ");
                w.str(&r.tool_call_id);
                w.raw(", \"message\": ");
                write_opt_str(w, r.message.as_deref());
                w.raw("}");
            }
            w.raw("]");
        }
        w.raw(", \"approval_metadata\": ");
        if self.approval_metadata.is_empty() {
            w.raw("{}");
        } else {
            w.raw("{");
            for (i, (id, m)) in self.approval_metadata.iter().enumerate() {
                if i > 0 {
                    w.raw(", ");
                }
                w.str(id);
                w.raw(": {\"approver_id\": ");
                write_opt_str(w, m.approver_id.as_deref());
                w.raw(", \"reason\": ");
                write_opt_str(w, m.reason.as_deref());
                w.raw(", \"timestamp\": ");
                w.str(&format_timestamp(&m.timestamp));
                w.raw("}");
            }
            w.raw("}");
        }
        w.raw(", \"current_turn\": ");
        w.u64(self.current_turn);
        w.raw(", \"usage\": {\"requests\": ");
        w.u64(self.usage.requests);
        w.raw(", \"input_tokens\": ");
        w.u64(self.usage.input_tokens);
        w.raw(", \"output_tokens\": ");
        w.u64(self.usage.output_tokens);
        w.raw("}, \"final_output\": ");
        write_opt_str(w, self.final_output.as_deref());
        w.raw("}");
        Ok(())
    }

    /// `from_dict(json.loads(text))`.
    pub fn from_json(text: &str) -> Result<Self, StateError> {
        let value = pyjson::loads(text)?;
        if !matches!(value, Value::Dict(_)) {
            return Err(StateError::NotAnObject {
                found: value.type_name(),
            });
        }
        Self::from_value(value)
    }

    /// Approves a pending call. Records audit metadata only when `approver_id` or `reason` is given.
    /// `deferred_tool_requests` is left as is.
    pub fn approve(&mut self, tool_call_id: &str, decision: Approval) -> Result<(), DecisionError> {
        self.check_pending(tool_call_id)?;
        self.approved_tools.push(tool_call_id.to_owned());
        self.record(
            tool_call_id,
            decision.approver_id,
            decision.reason,
            decision.timestamp,
        );
        Ok(())
    }

    /// Rejects a pending call, storing its message as given. Records audit metadata only when
    /// `approver_id` or `reason` is given. `deferred_tool_requests` is left as is.
    pub fn reject(&mut self, tool_call_id: &str, decision: Rejection) -> Result<(), DecisionError> {
        self.check_pending(tool_call_id)?;
        self.rejected_tools.push(RejectedTool {
            tool_call_id: tool_call_id.to_owned(),
            message: decision.message,
        });
        self.record(
            tool_call_id,
            decision.approver_id,
            decision.reason,
            decision.timestamp,
        );
        Ok(())
    }

    /// Deferred approvals that are neither approved nor rejected, in order.
    pub fn pending_approvals(&self) -> Vec<&DeferredToolCall> {
        self.deferred_tool_requests
            .approvals
            .iter()
            .filter(|call| {
                !self.is_approved(&call.tool_call_id)
                    && self.rejection(&call.tool_call_id).is_none()
            })
            .collect()
    }

    /// `true` when the call was approved.
    pub fn is_approved(&self, id: &str) -> bool {
        self.approved_tools.iter().any(|a| a == id)
    }

    /// The rejection of the call, if it was rejected.
    pub fn rejection(&self, id: &str) -> Option<&RejectedTool> {
        self.rejected_tools.iter().find(|r| r.tool_call_id == id)
    }

    fn check_pending(&self, id: &str) -> Result<(), DecisionError> {
        if self.is_approved(id) {
            Err(DecisionError::AlreadyApproved(id.to_owned()))
        } else if self.rejection(id).is_some() {
            Err(DecisionError::AlreadyRejected(id.to_owned()))
        } else if !self
            .deferred_tool_requests
            .approvals
            .iter()
            .any(|call| call.tool_call_id == id)
        {
            Err(DecisionError::Unknown(id.to_owned()))
        } else {
            Ok(())
        }
    }

    fn record(
        &mut self,
        id: &str,
        approver_id: Option<String>,
        reason: Option<String>,
        timestamp: Option<DateTime<Utc>>,
    ) {
        if approver_id.is_none() && reason.is_none() {
            return;
        }
        let timestamp = truncate_to_micros(timestamp.unwrap_or_else(Utc::now));
        self.approval_metadata.insert(
            id.to_owned(),
            ApprovalMetadata {
                approver_id,
                reason,
                timestamp,
            },
        );
    }

    /// Reads a state from an owned dict value (moving the messages rather than copying them).
    fn from_value(value: Value) -> Result<Self, StateError> {
        let Value::Dict(mut d) = value else {
            return Err(StateError::NotAnObject {
                found: value.type_name(),
            });
        };
        let mut state = RunState {
            run_id: take_str(&mut d, "run_id", "")?.unwrap_or_default(),
            agent_name: take_str(&mut d, "agent_name", "")?.unwrap_or_default(),
            input: take_str(&mut d, "input", "")?.unwrap_or_default(),
            messages: take_list(&mut d, "messages", "")?.unwrap_or_default(),
            current_turn: take_u64(&mut d, "current_turn", "")?.unwrap_or_default(),
            final_output: take_str(&mut d, "final_output", "")?,
            ..RunState::default()
        };
        if let Some(mut deferred) = take_dict(&mut d, "deferred_tool_requests", "")? {
            const AT: &str = "deferred_tool_requests.";
            state.deferred_tool_requests.calls =
                take_list(&mut deferred, "calls", AT)?.unwrap_or_default();
            for (i, item) in take_list(&mut deferred, "approvals", AT)?
                .unwrap_or_default()
                .into_iter()
                .enumerate()
            {
                let at = format!("{AT}approvals[{i}]");
                let mut call = expect_dict(item, &at)?;
                let at = format!("{at}.");
                state
                    .deferred_tool_requests
                    .approvals
                    .push(DeferredToolCall {
                        tool_call_id: required(
                            take_str(&mut call, "tool_call_id", &at)?,
                            &at,
                            "tool_call_id",
                        )?,
                        tool_name: required(
                            take_str(&mut call, "tool_name", &at)?,
                            &at,
                            "tool_name",
                        )?,
                        // Any JSON is valid arguments (`null` included); only a missing key
                        // defaults, to an empty dict.
                        args: call
                            .get_mut("args")
                            .map_or_else(|| Value::Dict(Dict::new()), std::mem::take),
                    });
            }
        }
        for (i, item) in take_list(&mut d, "approved_tools", "")?
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            match item {
                Value::Str(id) => state.approved_tools.push(id),
                other => {
                    return Err(wrong_type(format!("approved_tools[{i}]"), "a str", &other));
                }
            }
        }
        for (i, item) in take_list(&mut d, "rejected_tools", "")?
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let at = format!("rejected_tools[{i}]");
            let mut entry = expect_dict(item, &at)?;
            let at = format!("{at}.");
            state.rejected_tools.push(RejectedTool {
                tool_call_id: required(
                    take_str(&mut entry, "tool_call_id", &at)?,
                    &at,
                    "tool_call_id",
                )?,
                message: take_str(&mut entry, "message", &at)?,
            });
        }
        if let Some(metadata) = take_dict(&mut d, "approval_metadata", "")? {
            for (id, entry) in metadata {
                let at = format!("approval_metadata[{}]", quote_key(&id));
                let mut entry = expect_dict(entry, &at)?;
                let at = format!("{at}.");
                let approver_id = take_str(&mut entry, "approver_id", &at)?;
                let reason = take_str(&mut entry, "reason", &at)?;
                let raw = required(take_str(&mut entry, "timestamp", &at)?, &at, "timestamp")?;
                let timestamp =
                    parse_timestamp(&raw).map_err(|problem| StateError::InvalidValue {
                        path: format!("{at}timestamp"),
                        problem: format!("invalid timestamp {}: {problem}", quote_key(&raw)),
                    })?;
                state.approval_metadata.insert(
                    id,
                    ApprovalMetadata {
                        approver_id,
                        reason,
                        timestamp,
                    },
                );
            }
        }
        if let Some(mut usage) = take_dict(&mut d, "usage", "")? {
            const AT: &str = "usage.";
            state.usage = Usage {
                requests: take_u64(&mut usage, "requests", AT)?.unwrap_or_default(),
                input_tokens: take_u64(&mut usage, "input_tokens", AT)?.unwrap_or_default(),
                output_tokens: take_u64(&mut usage, "output_tokens", AT)?.unwrap_or_default(),
            };
        }
        Ok(state)
    }
}

/// Writes a list whose items sit inside `open` containers (counting the list itself).
fn write_list(w: &mut pyjson::Writer, items: &[Value], open: usize) -> Result<(), JsonError> {
    if items.is_empty() {
        w.raw("[]");
        return Ok(());
    }
    w.raw("[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            w.raw(", ");
        }
        w.nested_value(item, open)?;
    }
    w.raw("]");
    Ok(())
}

fn write_opt_str(w: &mut pyjson::Writer, s: Option<&str>) {
    match s {
        Some(s) => w.str(s),
        None => w.raw("null"),
    }
}

/// Removes `key` from `d`; `None` when missing or null.
fn take_any(d: &mut Dict, key: &str) -> Option<Value> {
    match d.get_mut(key).map(std::mem::take) {
        None | Some(Value::Null) => None,
        Some(v) => Some(v),
    }
}

fn wrong_type(path: String, expected: &'static str, found: &Value) -> StateError {
    StateError::WrongType {
        path,
        expected,
        found: found.type_name(),
    }
}

fn take_str(d: &mut Dict, key: &str, at: &str) -> Result<Option<String>, StateError> {
    match take_any(d, key) {
        None => Ok(None),
        Some(Value::Str(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(format!("{at}{key}"), "a str", &other)),
    }
}

fn take_list(d: &mut Dict, key: &str, at: &str) -> Result<Option<Vec<Value>>, StateError> {
    match take_any(d, key) {
        None => Ok(None),
        Some(Value::List(items)) => Ok(Some(items)),
        Some(other) => Err(wrong_type(format!("{at}{key}"), "a list", &other)),
    }
}

fn take_dict(d: &mut Dict, key: &str, at: &str) -> Result<Option<Dict>, StateError> {
    match take_any(d, key) {
        None => Ok(None),
        Some(Value::Dict(dict)) => Ok(Some(dict)),
        Some(other) => Err(wrong_type(format!("{at}{key}"), "a dict", &other)),
    }
}

fn take_u64(d: &mut Dict, key: &str, at: &str) -> Result<Option<u64>, StateError> {
    match take_any(d, key) {
        None => Ok(None),
        Some(Value::Int(i)) => match i.to_u64() {
            Some(v) => Ok(Some(v)),
            None => Err(StateError::InvalidValue {
                path: format!("{at}{key}"),
                problem: if i.is_negative() {
                    format!("expected a non-negative int, found {i}")
                } else {
                    format!("{i} is too large (the maximum is {})", u64::MAX)
                },
            }),
        },
        Some(other) => Err(wrong_type(format!("{at}{key}"), "an int", &other)),
    }
}

fn expect_dict(value: Value, path: &str) -> Result<Dict, StateError> {
    match value {
        Value::Dict(d) => Ok(d),
        other => Err(wrong_type(path.to_owned(), "a dict", &other)),
    }
}

fn required<T>(value: Option<T>, at: &str, key: &str) -> Result<T, StateError> {
    value.ok_or_else(|| StateError::Missing {
        path: format!("{at}{key}"),
    })
}

/// A string as a JSON literal (always one line, ASCII).
fn quote_key(key: &str) -> String {
    pyjson::dumps(&Value::from(key)).unwrap_or_default()
}

fn truncate_to_micros(ts: DateTime<Utc>) -> DateTime<Utc> {
    let nanos = ts.nanosecond();
    // Leap-second nanos (>= 1e9) are folded into the last microsecond of the second.
    let micros_nanos = (nanos.min(999_999_999) / 1_000) * 1_000;
    ts.with_nanosecond(micros_nanos).unwrap_or(ts)
}

/// `datetime.isoformat()` of an aware UTC datetime.
pub fn format_timestamp(ts: &DateTime<Utc>) -> String {
    let ts = truncate_to_micros(*ts);
    let micros = ts.nanosecond() / 1_000;
    if micros == 0 {
        ts.format("%Y-%m-%dT%H:%M:%S+00:00").to_string()
    } else {
        format!("{}.{micros:06}+00:00", ts.format("%Y-%m-%dT%H:%M:%S"))
    }
}

/// Parses a timestamp as written by Python's `datetime.isoformat()`: any UTC offset (converted to
/// UTC), `Z`, `T` or a space between date and time, 0 to 9 fraction digits (truncated to
/// microseconds), or no offset at all (a naive timestamp from an older payload, taken as UTC).
/// The error says what is wrong; the caller adds the field path.
fn parse_timestamp(t: &str) -> Result<DateTime<Utc>, String> {
    let parsed = DateTime::parse_from_rfc3339(t)
        .map(|dt| dt.with_timezone(&Utc))
        .or_else(|_| {
            // Offsets without a colon (`+0530`) or without seconds in the time.
            [
                "%Y-%m-%dT%H:%M:%S%.f%z",
                "%Y-%m-%d %H:%M:%S%.f%z",
                "%Y-%m-%dT%H:%M%z",
            ]
            .iter()
            .find_map(|fmt| DateTime::parse_from_str(t, fmt).ok())
            .map(|dt| dt.with_timezone(&Utc))
            .ok_or(())
        })
        .or_else(|_| {
            [
                "%Y-%m-%dT%H:%M:%S%.f",
                "%Y-%m-%d %H:%M:%S%.f",
                "%Y-%m-%dT%H:%M",
                "%Y-%m-%d %H:%M",
            ]
            .iter()
            .find_map(|fmt| NaiveDateTime::parse_from_str(t, fmt).ok())
            .map(|naive| naive.and_utc())
            .ok_or(())
        })
        .map_err(|()| {
            "expected an ISO 8601 date-time such as 2026-12-02T19:30:25.123456+00:00".to_owned()
        })?;
    if parsed.nanosecond() >= 1_000_000_000 {
        return Err("leap seconds are not supported".to_owned());
    }
    let year = chrono::Datelike::year(&parsed);
    if !(1..=9999).contains(&year) {
        return Err(format!("year {year} is outside 1..=9999"));
    }
    Ok(truncate_to_micros(parsed))
}
