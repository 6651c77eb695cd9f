//! `agentrun state`: read a serialized RunState on stdin, decide pending tool calls, write it back, or
//! summarize it.
//!
//! Every subcommand reads one RunState JSON document from stdin. On success `roundtrip`, `approve` and
//! `reject` write exactly `RunState::to_json()` to stdout (no trailing newline) and `show` writes a
//! human-readable summary. On malformed input or an invalid decision the exit code is 2, stdout is left
//! empty and stderr gets one line naming what is wrong and where.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::process::ExitCode;

use crate::state::pyjson::{self, Value};
use crate::state::{
    Approval, DEFAULT_REJECTION_MESSAGE, DecisionError, Rejection, RunState, StateError,
    format_timestamp,
};

/// How many of the last messages `show` prints.
const SHOWN_MESSAGES: usize = 5;
/// Longest text `show` prints for one message, argument list or reason (in characters).
const SHOWN_CHARS: usize = 160;

/// `agentrun state` subcommands. Each reads a RunState JSON document on stdin.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum StateCommand {
    /// Load the RunState on stdin and write it back (canonical, Python-compatible JSON).
    Roundtrip,
    /// Approve a pending tool call and write the updated RunState.
    Approve {
        /// The `tool_call_id` of the pending call.
        #[arg(long)]
        tool_call_id: String,
        /// Who approves (audit metadata, not shown to the model).
        #[arg(long)]
        approver_id: Option<String>,
        /// Why (audit metadata, not shown to the model).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Reject a pending tool call and write the updated RunState.
    Reject {
        /// The `tool_call_id` of the pending call.
        #[arg(long)]
        tool_call_id: String,
        /// What the model is told (default at resume time: the standard rejection message).
        #[arg(long)]
        message: Option<String>,
        /// Who rejects (audit metadata, not shown to the model).
        #[arg(long)]
        approver_id: Option<String>,
        /// Why (audit metadata, not shown to the model).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Print a readable summary: run, usage, pending and decided calls, last messages.
    Show,
}

/// Why an `agentrun state` command failed.
#[derive(Debug, thiserror::Error)]
pub enum StateCliError {
    /// Stdin could not be read.
    #[error("cannot read stdin: {0}")]
    ReadStdin(#[source] std::io::Error),
    /// Stdin is not UTF-8 text.
    #[error("stdin is not valid UTF-8 (invalid byte at offset {offset})")]
    NotUtf8 {
        /// Byte offset of the first invalid byte.
        offset: usize,
    },
    /// Stdin is not a valid RunState.
    #[error("{0}")]
    State(#[from] StateError),
    /// The decision is not possible.
    #[error("cannot decide: {0}")]
    Decision(#[from] DecisionError),
    /// Stdout could not be written.
    #[error("cannot write stdout: {0}")]
    WriteStdout(#[source] std::io::Error),
}

/// Runs an `agentrun state` subcommand with the process's stdin and stdout; returns the exit code
/// (0 on success, 2 on any error, reported as one line on stderr).
pub fn main(cmd: StateCommand) -> ExitCode {
    let mut input = Vec::new();
    let result = std::io::stdin()
        .read_to_end(&mut input)
        .map_err(StateCliError::ReadStdin)
        .and_then(|_| run(&cmd, &input))
        .and_then(|output| {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(output.as_bytes())
                .and_then(|()| stdout.flush())
                .map_err(StateCliError::WriteStdout)
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("agentrun state: {}", one_line(&err.to_string(), usize::MAX));
            ExitCode::from(2)
        }
    }
}

/// Runs `cmd` on `input` (the bytes of stdin) and returns what to print on stdout.
pub fn run(cmd: &StateCommand, input: &[u8]) -> Result<String, StateCliError> {
    let text = std::str::from_utf8(input).map_err(|e| StateCliError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let mut state = RunState::from_json(text)?;
    match cmd {
        StateCommand::Roundtrip => {}
        StateCommand::Approve {
            tool_call_id,
            approver_id,
            reason,
        } => {
            let decision = Approval {
                approver_id: approver_id.clone(),
                reason: reason.clone(),
                timestamp: None,
            };
            state.approve(tool_call_id, decision)?;
        }
        StateCommand::Reject {
            tool_call_id,
            message,
            approver_id,
            reason,
        } => {
            let decision = Rejection {
                message: message.clone(),
                approver_id: approver_id.clone(),
                reason: reason.clone(),
                timestamp: None,
            };
            state.reject(tool_call_id, decision)?;
        }
        StateCommand::Show => return Ok(summary(&state)),
    }
    Ok(state.try_to_json()?)
}

/// A readable, multi-line summary of `state`.
pub fn summary(state: &RunState) -> String {
    let mut out = String::new();
    let opt = |s: &Option<String>| match s {
        Some(s) => one_line(s, SHOWN_CHARS),
        None => "-".to_owned(),
    };
    let _ = writeln!(
        out,
        "run:          {}",
        one_line(&state.run_id, SHOWN_CHARS)
    );
    let _ = writeln!(
        out,
        "agent:        {}",
        one_line(&state.agent_name, SHOWN_CHARS)
    );
    let _ = writeln!(out, "input:        {}", one_line(&state.input, SHOWN_CHARS));
    let _ = writeln!(out, "turn:         {}", state.current_turn);
    let _ = writeln!(
        out,
        "usage:        {} requests, {} input tokens, {} output tokens",
        state.usage.requests, state.usage.input_tokens, state.usage.output_tokens
    );
    let _ = writeln!(out, "final output: {}", opt(&state.final_output));

    let pending = state.pending_approvals();
    let _ = writeln!(out, "\npending approvals ({}):", pending.len());
    if pending.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for call in &pending {
        let _ = writeln!(
            out,
            "  {}  {}  {}",
            one_line(&call.tool_call_id, SHOWN_CHARS),
            one_line(&call.tool_name, SHOWN_CHARS),
            one_line(&display_value(&call.args), SHOWN_CHARS)
        );
    }

    let decided = state.approved_tools.len() + state.rejected_tools.len();
    let _ = writeln!(out, "\ndecided calls ({decided}):");
    if decided == 0 {
        let _ = writeln!(out, "  (none)");
    }
    let tool_name = |id: &str| {
        called_tool(state, id).map_or_else(|| "?".to_owned(), |name| one_line(&name, SHOWN_CHARS))
    };
    let audit = |id: &str| match state.approval_metadata.get(id) {
        Some(m) => format!(
            "by {} at {}, reason: {}",
            opt(&m.approver_id),
            format_timestamp(&m.timestamp),
            opt(&m.reason)
        ),
        None => "no audit metadata".to_owned(),
    };
    for id in &state.approved_tools {
        let _ = writeln!(
            out,
            "  {}  {}  approved  ({})",
            one_line(id, SHOWN_CHARS),
            tool_name(id),
            audit(id)
        );
    }
    for rejected in &state.rejected_tools {
        let id = rejected.tool_call_id.as_str();
        let message = match &rejected.message {
            Some(m) => format!("message: {}", one_line(m, SHOWN_CHARS)),
            None => format!("message: (default) {DEFAULT_REJECTION_MESSAGE}"),
        };
        let _ = writeln!(
            out,
            "  {}  {}  rejected  {message}  ({})",
            one_line(id, SHOWN_CHARS),
            tool_name(id),
            audit(id)
        );
    }

    let total = state.messages.len();
    let shown = total.min(SHOWN_MESSAGES);
    let _ = writeln!(out, "\nlast messages ({shown} of {total}):");
    if total == 0 {
        let _ = writeln!(out, "  (none)");
    }
    for message in &state.messages[total - shown..] {
        let _ = writeln!(out, "  {}", describe_message(message));
    }
    out
}

/// The tool that call `id` names: from the calls awaiting approval or, once decided (they leave
/// `deferred_tool_requests` then), from the assistant message that made the call.
fn called_tool(state: &RunState, id: &str) -> Option<String> {
    if let Some(call) = state
        .deferred_tool_requests
        .approvals
        .iter()
        .find(|c| c.tool_call_id == id)
    {
        return Some(call.tool_name.clone());
    }
    state
        .messages
        .iter()
        .rev()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .filter_map(|m| m.get("tool_calls").and_then(Value::as_list))
        .flatten()
        .find(|call| call.get("id").and_then(Value::as_str) == Some(id))
        .and_then(|call| call.get("function")?.get("name")?.as_str())
        .map(str::to_owned)
}

/// One line describing a chat-completions message: `[role] content`, tool calls, tool results.
fn describe_message(message: &Value) -> String {
    let Some(dict) = message.as_dict() else {
        return format!("[?] {}", one_line(&display_value(message), SHOWN_CHARS));
    };
    let role = dict.get("role").and_then(Value::as_str).unwrap_or("?");
    let mut label = one_line(role, 40);
    if let Some(id) = dict.get("tool_call_id").and_then(Value::as_str) {
        let _ = write!(label, " {}", one_line(id, 60));
    }
    let mut parts = Vec::new();
    match dict.get("content") {
        None | Some(Value::Null) => {}
        Some(Value::Str(text)) => parts.push(text.clone()),
        Some(Value::List(items)) => {
            // Content parts: keep the text ones, name the others.
            for item in items {
                match item.get("text").and_then(Value::as_str) {
                    Some(text) => parts.push(text.to_owned()),
                    None => parts.push(format!(
                        "<{}>",
                        item.get("type").and_then(Value::as_str).unwrap_or("part")
                    )),
                }
            }
        }
        Some(other) => parts.push(display_value(other)),
    }
    if let Some(calls) = dict.get("tool_calls").and_then(Value::as_list) {
        for call in calls {
            let function = call.get("function");
            let name = function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("?");
            let args = match function.and_then(|f| f.get("arguments")) {
                Some(Value::Str(raw)) => raw.clone(),
                Some(other) => display_value(other),
                None => String::new(),
            };
            parts.push(format!("call {name}({args})"));
        }
    }
    format!("[{label}] {}", one_line(&parts.join(" | "), SHOWN_CHARS))
}

/// A value as compact JSON for people (non-ASCII kept as is).
fn display_value(value: &Value) -> String {
    serde_json::to_string(value)
        .or_else(|_| pyjson::dumps(value))
        .unwrap_or_else(|e| format!("<{e}>"))
}

/// `text` on one line (newlines and other controls escaped), cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    for (count, c) in text.chars().enumerate() {
        if count == max {
            out.push('…');
            break;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes_and_cuts() {
        assert_eq!(one_line("a\nb\tc\u{1}", 100), "a\\nb\\tc\\u{1}");
        assert_eq!(one_line("ééééé", 3), "ééé…");
    }

    #[test]
    fn errors_name_the_problem() {
        let err = run(&StateCommand::Roundtrip, b"{\"messages\": \"x\"}").unwrap_err();
        assert_eq!(
            err.to_string(),
            "runState: field `messages`: expected a list, found str"
        );
        let err = run(&StateCommand::Roundtrip, b"\xff").unwrap_err();
        assert!(err.to_string().contains("UTF-8"), "{err}");
        let cmd = StateCommand::Approve {
            tool_call_id: "call_9".into(),
            approver_id: None,
            reason: None,
        };
        let err = run(&cmd, b"{}").unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot decide: tool call `call_9` is not awaiting approval (unknown id)"
        );
    }
}
