//! The wire format of a [`RunState`] (see the [module docs](super)): the dict Python's
//! `RunState.to_dict()` builds, its JSON text, and the tolerant reader.

use super::pyjson::{self, Dict, JsonError, Value};
use super::timestamp::{format_timestamp, parse_timestamp};
use super::{ApprovalMetadata, DeferredToolCall, RejectedTool, RunState, StateError, Usage};

impl RunState {
    /// The state as the dict Python's `RunState.to_dict()` returns.
    pub fn to_dict(&self) -> Dict {
        let mut d = Dict::with_capacity(11);
        d.insert("run_id", Value::from(self.run_id.as_str()));
        d.insert("agent_name", Value::from(self.agent_name.as_str()));
        d.insert("input", Value::from(self.input.as_str()));
        d.insert("messages", Value::List(self.messages.clone()));
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
            "deferred_tool_requests",
            Value::from_iter([
                (
                    "calls",
                    Value::List(self.deferred_tool_requests.calls.clone()),
                ),
                ("approvals", approvals),
            ]),
        );
        d.insert(
            "approved_tools",
            self.approved_tools
                .iter()
                .map(|id| Value::from(id.as_str()))
                .collect(),
        );
        d.insert(
            "rejected_tools",
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
            "approval_metadata",
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
        d.insert("current_turn", Value::from(self.current_turn));
        d.insert(
            "usage",
            Value::from_iter([
                ("requests", Value::from(self.usage.requests)),
                ("input_tokens", Value::from(self.usage.input_tokens)),
                ("output_tokens", Value::from(self.usage.output_tokens)),
            ]),
        );
        d.insert("final_output", Value::from(self.final_output.clone()));
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
                            .map_or_else(|| Value::Dict(Dict::default()), std::mem::take),
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
                    id.into_string(),
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
