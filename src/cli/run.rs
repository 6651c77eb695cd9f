//! `agentrun run`: run an agent locally from an input, or resume a saved RunState after the
//! pending tool calls were decided with `agentrun state approve` / `agentrun state reject`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::agent::model::{self, ToolArguments};
use crate::agent::runner::new_run_id;
use crate::agent::{Agent, RunStatus, Runner};
use crate::state::RunState;
use crate::state::pyjson::Value;

/// Where a halted state is written when `--state-out` is not given.
pub const DEFAULT_STATE_OUT: &str = "agentrun-state.json";

/// Arguments of `agentrun run`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("start").required(true).args(["input", "resume"])))]
pub struct RunArgs {
    /// The agent definition: YAML, or JSON when the file name ends in `.json`.
    #[arg(long, value_name = "FILE")]
    pub agent: PathBuf,
    /// Start a new run with this user input.
    #[arg(long, value_name = "TEXT")]
    pub input: Option<String>,
    /// Resume the run saved in this RunState JSON file (after its pending calls were decided).
    #[arg(long, value_name = "FILE")]
    pub resume: Option<PathBuf>,
    /// Where to write the state when the run halts for approval (default
    /// `./agentrun-state.json`). When given, the state is also written when the run completes.
    #[arg(long, value_name = "FILE")]
    pub state_out: Option<PathBuf>,
}

/// A failure of `agentrun run`, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunCliError {
    /// An input file (agent or state) is missing or invalid: exit code 2.
    #[error("{0}")]
    BadInput(String),
    /// The run failed: exit code 1.
    #[error("{0}")]
    Failed(String),
}

impl RunCliError {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            RunCliError::BadInput(_) => ExitCode::from(2),
            RunCliError::Failed(_) => ExitCode::from(1),
        }
    }
}

/// Runs `agentrun run`; prints what happened on stdout, an error as one line on stderr.
pub fn main(args: RunArgs) -> ExitCode {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .try_init();
    let mut report = String::new();
    let result = execute(&args, &mut report);
    print!("{report}");
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentrun run: {e}");
            e.exit_code()
        }
    }
}

/// Runs the command, appending what happened to `report` (also when it fails part way).
pub fn execute(args: &RunArgs, report: &mut String) -> Result<(), RunCliError> {
    let agent = Agent::load_file(&args.agent).map_err(|e| RunCliError::BadInput(e.to_string()))?;
    let agent = agent
        .with_api_key_from_env()
        .map_err(|e| RunCliError::Failed(e.to_string()))?;
    let mut state = match (&args.resume, &args.input) {
        (Some(path), _) => load_state(path)?,
        (None, Some(input)) => RunState::new(new_run_id(), agent.name().to_owned(), input.clone()),
        (None, None) => {
            return Err(RunCliError::BadInput(
                "give --input TEXT to start a run or --resume FILE to continue one".to_owned(),
            ));
        }
    };
    let first_new = state.messages.len();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RunCliError::Failed(format!("cannot start the async runtime: {e}")))?;
    let runner = Runner::new().map_err(|e| RunCliError::Failed(e.to_string()))?;
    let result = runtime.block_on(runner.step(&agent, &mut state));

    let _ = writeln!(report, "run {} (agent {})", state.run_id, agent.name());
    describe_messages(
        report,
        &state.messages[first_new.min(state.messages.len())..],
    );
    let status = result.map_err(|e| RunCliError::Failed(e.to_string()))?;
    let state_out = args.state_out.clone();
    match status {
        RunStatus::Completed => {
            let _ = writeln!(
                report,
                "\ncompleted after {} model turn(s)",
                state.current_turn
            );
            let _ = writeln!(
                report,
                "final output:\n{}",
                state.final_output.as_deref().unwrap_or("")
            );
            if let Some(path) = state_out {
                write_state(&path, &state)?;
                let _ = writeln!(report, "\nstate written to {}", path.display());
            }
        }
        RunStatus::AwaitingApproval => {
            let path = state_out.unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_OUT));
            write_state(&path, &state)?;
            describe_pending(report, &state, &path, &args.agent);
        }
    }
    Ok(())
}

fn load_state(path: &Path) -> Result<RunState, RunCliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        RunCliError::BadInput(format!("cannot read run state {}: {e}", path.display()))
    })?;
    RunState::from_json(&text).map_err(|e| {
        RunCliError::BadInput(format!("cannot load run state {}: {e}", path.display()))
    })
}

fn write_state(path: &Path, state: &RunState) -> Result<(), RunCliError> {
    std::fs::write(path, state.to_json()).map_err(|e| {
        RunCliError::Failed(format!(
            "cannot write the run state to {}: {e}",
            path.display()
        ))
    })
}

/// Lists the tool calls, tool results and assistant text of the new messages.
fn describe_messages(report: &mut String, messages: &[Value]) {
    for message in messages {
        match model::role(message) {
            Some("assistant") => {
                let text = model::content_text(message);
                let calls = model::tool_calls(message).unwrap_or_default();
                if !calls.is_empty() && !text.trim().is_empty() {
                    let _ = writeln!(report, "assistant: {}", one_line(&text, 500));
                }
                for call in calls {
                    let args = match &call.arguments {
                        ToolArguments::Text(text) => text.clone(),
                        ToolArguments::Value(value) => value.to_json().unwrap_or_default(),
                    };
                    let _ = writeln!(
                        report,
                        "→ tool call {} {} {}",
                        call.id,
                        call.name,
                        one_line(&args, 500)
                    );
                }
            }
            Some("tool") => {
                let id = message
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                let text = model::content_text(message);
                let _ = writeln!(report, "← result {id}: {}", one_line(&text, 500));
            }
            _ => {}
        }
    }
}

/// Lists the calls awaiting a decision and the commands that decide them.
fn describe_pending(report: &mut String, state: &RunState, state_path: &Path, agent_path: &Path) {
    let pending = state.pending_approvals();
    let file = shell_quote(&state_path.display().to_string());
    let _ = writeln!(
        report,
        "\nhalted: {} tool call(s) await approval; state written to {}",
        pending.len(),
        state_path.display()
    );
    for call in &pending {
        let args = call.args.to_json().unwrap_or_default();
        let id = shell_quote(&call.tool_call_id);
        let _ = writeln!(
            report,
            "\n  {} {} {}",
            call.tool_call_id,
            call.tool_name,
            one_line(&args, 500)
        );
        let _ = writeln!(
            report,
            "    approve: agentrun state approve --tool-call-id {id} --approver-id YOU \
             --reason 'WHY' < {file} > approved.json"
        );
        let _ = writeln!(
            report,
            "    reject:  agentrun state reject --tool-call-id {id} --approver-id YOU \
             --reason 'WHY' --message 'SHOWN TO THE MODEL' < {file} > rejected.json"
        );
    }
    let _ = writeln!(
        report,
        "\nthen resume from the decided state: agentrun run --agent {} --resume approved.json",
        shell_quote(&agent_path.display().to_string())
    );
    if pending.len() > 1 {
        let _ = writeln!(
            report,
            "(decide every call before resuming: chain the commands, each reading the previous output)"
        );
    }
}

/// `text` on one line, cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect();
    if text.chars().count() > max {
        out.push('…');
    }
    out
}

/// Quotes a word for a POSIX shell when it needs it.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@=+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("call_1"), "call_1");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }

    #[test]
    fn one_line_cuts_and_flattens() {
        assert_eq!(one_line("a\nb", 10), "a b");
        assert_eq!(one_line("abcdef", 3), "abc…");
    }
}
