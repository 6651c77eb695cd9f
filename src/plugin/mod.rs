//! `kubectl agentrun`: the kubectl plugin for people who watch, decide and audit agent runs.
//!
//! - `list [--pending] [-A]`: runs with phase, agent, step, pending approvals and age; with
//!   `--pending`, the ApprovalRequests waiting for a decision.
//! - `show RUN`: the conversation so far and the pending tool calls with their arguments and the
//!   names of their ApprovalRequests.
//! - `approve APR --reason R` and `reject APR --message M --reason R`: take `approverId` from the
//!   current identity (a SelfSubjectReview, as `kubectl auth whoami` does) and write exactly the
//!   merge patch a person would write by hand; a request that already has a decision is refused.
//!   `--dry-run -o yaml` prints the manifest to commit for a GitOps decision instead.
//! - `audit RUN`: every tool call of the run with its decision, claimed approver, verified
//!   identity, reason, message, time and whether it executed; `audit [-A] -o jsonl`: the export
//!   of every run of the namespace (or cluster), deleted ones included, one JSON line per decision
//!   and per execution.
//!
//! The binary is `src/bin/kubectl-agentrun.rs`; copied onto `PATH`, kubectl runs it as
//! `kubectl agentrun`. Errors are one line on stderr and exit code 1 (2 for usage errors).

pub mod audit;
pub mod cli;
pub mod connect;
pub mod decide;
pub mod listing;
pub mod show;
pub mod text;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use serde::Serialize;

use crate::crd::stored_state::StoredStateError;
use cli::{Cli, Command, ManifestFormat, OutputFormat};
pub use connect::Session;

/// The field manager of the plugin's writes (as kubectl uses `kubectl-patch`).
pub const FIELD_MANAGER: &str = "kubectl-agentrun";

/// Errors of the kubectl plugin. Each is shown as one line on stderr.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The kubeconfig could not be read or has no usable context.
    #[error("cannot load the kubeconfig: {message}")]
    Kubeconfig {
        /// Why.
        message: String,
    },
    /// The client could not be built from the configuration.
    #[error("cannot create a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// An API request failed.
    #[error("cannot {action}: {message}")]
    Api {
        /// What was attempted, e.g. `patch approvalrequest r1-call-1`.
        action: String,
        /// The API server's message.
        message: String,
    },
    /// An object does not exist.
    #[error("{kind} {name} not found in namespace {namespace}")]
    NotFound {
        /// `agentrun` or `approvalrequest`.
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// The namespace looked in.
        namespace: String,
    },
    /// The ApprovalRequest already has a decision; decisions are final.
    #[error(
        "approvalrequest {name} already has a decision ({decision} by {approver}): a decision is final and cannot be changed"
    )]
    AlreadyDecided {
        /// The request.
        name: String,
        /// Its decision.
        decision: String,
        /// Its approverId (`unknown` when missing).
        approver: String,
    },
    /// The ApprovalRequest expired or was superseded.
    #[error("approvalrequest {name} is {phase}: it can no longer be decided")]
    NotDecidable {
        /// The request.
        name: String,
        /// Its phase.
        phase: String,
    },
    /// The current identity could not be determined.
    #[error("cannot determine the current identity (SelfSubjectReview): {message}")]
    Identity {
        /// Why.
        message: String,
    },
    /// A run's stored RunState could not be read.
    #[error("agentrun {run}: {source}")]
    RunState {
        /// The run.
        run: String,
        /// Why.
        #[source]
        source: StoredStateError,
    },
    /// A flag's value is unusable (exit code 2).
    #[error("invalid {flag}: {problem}")]
    Usage {
        /// The flag, e.g. `--reason`.
        flag: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// Output could not be rendered.
    #[error("cannot render {what} as {format}: {message}")]
    Render {
        /// What was rendered.
        what: &'static str,
        /// `JSON` or `YAML`.
        format: &'static str,
        /// Why.
        message: String,
    },
    /// Output could not be written.
    #[error("cannot write to stdout: {0}")]
    Output(#[source] std::io::Error),
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl PluginError {
    /// An API failure while doing `action`.
    pub fn api(action: impl Into<String>, error: &kube::Error) -> PluginError {
        PluginError::Api {
            action: action.into(),
            message: api_message(error),
        }
    }

    /// The process exit code: 2 for usage errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            PluginError::Usage { .. } => 2,
            _ => 1,
        }
    }
}

/// The API server's own message for a failed request (falls back to the client's error text).
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        kube::Error::Api(status) => format!("{} (HTTP {})", status.reason, status.code),
        other => other.to_string(),
    }
}

/// Renders `value` as pretty JSON or YAML, ending with a line break.
pub fn render<T: Serialize>(
    value: &T,
    json: bool,
    what: &'static str,
) -> Result<String, PluginError> {
    if json {
        let mut text = serde_json::to_string_pretty(value).map_err(|e| PluginError::Render {
            what,
            format: "JSON",
            message: e.to_string(),
        })?;
        text.push('\n');
        Ok(text)
    } else {
        serde_yaml_ng::to_string(value).map_err(|e| PluginError::Render {
            what,
            format: "YAML",
            message: e.to_string(),
        })
    }
}

/// [`render`] for a report format; `None` for [`OutputFormat::Table`] (the caller renders text).
pub fn render_report<T: Serialize>(
    value: &T,
    format: OutputFormat,
    what: &'static str,
) -> Option<Result<String, PluginError>> {
    match format {
        OutputFormat::Table => None,
        OutputFormat::Json => Some(render(value, true, what)),
        OutputFormat::Yaml => Some(render(value, false, what)),
    }
}

/// [`render`] for a manifest format.
pub fn render_manifest<T: Serialize>(
    value: &T,
    format: ManifestFormat,
    what: &'static str,
) -> Result<String, PluginError> {
    render(value, format == ManifestFormat::Json, what)
}

/// Runs one command and returns what it prints on stdout.
pub async fn run(cli: Cli) -> Result<String, PluginError> {
    let session = Session::connect(&cli.connection).await?;
    let now = chrono::Utc::now();
    match cli.command {
        Command::List(args) => listing::list(&session, &args, now).await,
        Command::Show(args) => show::show(&session, &args).await,
        Command::Approve(args) => decide::approve(&session, &args).await,
        Command::Reject(args) => decide::reject(&session, &args).await,
        Command::Audit(args) => audit::audit(&session, &args).await,
    }
}

/// The whole program: parses the command line (usage errors exit 2), runs the command on a
/// tokio runtime, prints its output, or prints one error line on stderr and exits 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(PluginError::Runtime)
        .and_then(|runtime| runtime.block_on(run(cli)))
        .and_then(|output| {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(output.as_bytes())
                .and_then(|()| stdout.flush())
            {
                // A closed pipe (`| head`) is not an error of the command.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(PluginError::Output(e)),
                _ => Ok(()),
            }
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let message = error.to_string();
            let line = text::one_line(&message.split_whitespace().collect::<Vec<_>>().join(" "));
            eprintln!("error: {line}");
            ExitCode::from(error.exit_code())
        }
    }
}
