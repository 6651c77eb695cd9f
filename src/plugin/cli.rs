//! The command line of `kubectl agentrun` (clap).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `kubectl agentrun`: inspect AgentRuns, decide their ApprovalRequests and audit every tool call.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-agentrun",
    bin_name = "kubectl agentrun",
    version,
    about = "Inspect AgentRuns, approve or reject their tool calls, and audit every decision",
    long_about = "Inspect AgentRuns, approve or reject their tool calls, and audit every decision.\n\n\
                  Install by copying the kubectl-agentrun binary onto PATH; kubectl then runs it as \
                  `kubectl agentrun`. Cluster access works like kubectl's: --kubeconfig (default: \
                  $KUBECONFIG, then ~/.kube/config), --context and -n/--namespace (default: the \
                  context's namespace)."
)]
pub struct Cli {
    /// How to reach the cluster.
    #[command(flatten)]
    pub connection: ConnectionArgs,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Cluster access, like kubectl's flags of the same names.
#[derive(Clone, Debug, Default, Args)]
pub struct ConnectionArgs {
    /// Path to the kubeconfig file to use (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// The namespace (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List runs with their phase, agent, step and pending approvals (or, with --pending, the
    /// ApprovalRequests waiting for a decision).
    List(ListArgs),
    /// Show a run's conversation so far and the tool calls waiting for a decision.
    Show(ShowArgs),
    /// Approve an ApprovalRequest as the current identity (what `kubectl auth whoami` shows); on a
    /// request that needs several approvals, add your vote.
    Approve(ApproveArgs),
    /// Reject an ApprovalRequest as the current identity; the model is told --message.
    Reject(RejectArgs),
    /// One table of every tool call of a run: decision, claimed approver, verified identity,
    /// reason, message, time and whether it executed. Without RUN, the export of every run of the
    /// namespace (or, with -A, of the cluster), deleted runs included (from their ApprovalRecords);
    /// `-o jsonl` prints one JSON line per decision and per execution.
    Audit(AuditArgs),
}

/// How a report is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Human-readable text (aligned columns).
    #[default]
    #[value(alias = "text", alias = "wide")]
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// How an object or manifest is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum ManifestFormat {
    /// YAML.
    #[default]
    Yaml,
    /// JSON.
    Json,
}

/// `kubectl agentrun list`.
#[derive(Clone, Debug, Args)]
pub struct ListArgs {
    /// List the ApprovalRequests waiting for a decision instead of the runs.
    #[arg(long)]
    pub pending: bool,
    /// List across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// `kubectl agentrun show RUN`.
#[derive(Clone, Debug, Args)]
pub struct ShowArgs {
    /// The AgentRun's name.
    pub run: String,
    /// Output format (`table`: the conversation as text).
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// Preparing a decision for GitOps instead of writing it.
#[derive(Clone, Debug, Default, Args)]
pub struct DryRunArgs {
    /// Do not change anything: print the ApprovalRequest manifest to commit for a GitOps
    /// decision (apply it with `kubectl apply --server-side`).
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: the commit to record in the `agentrun.dev/gitops-commit` annotation
    /// (default: a placeholder to replace).
    #[arg(long, requires = "dry_run", value_name = "SHA")]
    pub commit: Option<String>,
    /// With --dry-run: the approverId to write (default: the current identity).
    #[arg(long, requires = "dry_run", value_name = "USER")]
    pub approver_id: Option<String>,
}

/// `kubectl agentrun approve APR --reason R`.
#[derive(Clone, Debug, Args)]
pub struct ApproveArgs {
    /// The ApprovalRequest's name.
    pub request: String,
    /// Why, for the audit trail (e.g. a change ticket); never shown to the model.
    #[arg(long)]
    pub reason: String,
    /// Approve the call with these arguments instead of the model's (a JSON object, e.g.
    /// '{"amount": 50}'); checked against the tool's schema and the ApprovalPolicies again.
    #[arg(long, value_name = "JSON")]
    pub edit_arguments: Option<String>,
    /// GitOps preparation instead of a change.
    #[command(flatten)]
    pub dry_run: DryRunArgs,
    /// Print the manifest (--dry-run) or the updated ApprovalRequest in this format.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<ManifestFormat>,
}

/// `kubectl agentrun reject APR --message M --reason R`.
#[derive(Clone, Debug, Args)]
pub struct RejectArgs {
    /// The ApprovalRequest's name.
    pub request: String,
    /// What the model is told instead of the tool's result.
    #[arg(long)]
    pub message: String,
    /// Why, for the audit trail; never shown to the model.
    #[arg(long)]
    pub reason: String,
    /// GitOps preparation instead of a change.
    #[command(flatten)]
    pub dry_run: DryRunArgs,
    /// Print the manifest (--dry-run) or the updated ApprovalRequest in this format.
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<ManifestFormat>,
}

/// How an audit is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AuditFormat {
    /// Human-readable text (aligned columns).
    #[default]
    #[value(alias = "text", alias = "wide")]
    Table,
    /// JSON: the report of the run (without RUN: a list of reports, one per run).
    Json,
    /// YAML, like JSON.
    Yaml,
    /// JSON Lines: one object per decision and per execution, for log pipelines and SIEMs.
    Jsonl,
}

impl AuditFormat {
    /// The report format, `None` for JSON Lines.
    pub fn report_format(self) -> Option<OutputFormat> {
        match self {
            AuditFormat::Table => Some(OutputFormat::Table),
            AuditFormat::Json => Some(OutputFormat::Json),
            AuditFormat::Yaml => Some(OutputFormat::Yaml),
            AuditFormat::Jsonl => None,
        }
    }
}

/// `kubectl agentrun audit [RUN] [-A] [-o table|json|yaml|jsonl]`.
#[derive(Clone, Debug, Args)]
pub struct AuditArgs {
    /// The AgentRun's name; without it, every run of the namespace (or of every namespace with
    /// -A), the deleted ones included.
    #[arg(conflicts_with = "all_namespaces")]
    pub run: Option<String>,
    /// Audit every run of every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = AuditFormat::Table)]
    pub output: AuditFormat,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn namespace_flags_are_global() {
        let cli =
            Cli::try_parse_from(["kubectl-agentrun", "list", "-n", "ops", "--pending"]).unwrap();
        assert_eq!(cli.connection.namespace.as_deref(), Some("ops"));
        let cli =
            Cli::try_parse_from(["kubectl-agentrun", "-n", "ops", "show", "r1", "-o", "json"])
                .unwrap();
        assert_eq!(cli.connection.namespace.as_deref(), Some("ops"));
        assert!(matches!(
            cli.command,
            Command::Show(ShowArgs {
                output: OutputFormat::Json,
                ..
            })
        ));
    }

    #[test]
    fn approve_requires_a_reason_and_commit_requires_dry_run() {
        let err = Cli::try_parse_from(["kubectl-agentrun", "approve", "apr-1"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let err = Cli::try_parse_from([
            "kubectl-agentrun",
            "approve",
            "apr-1",
            "--reason",
            "r",
            "--commit",
            "abc",
        ])
        .unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let cli = Cli::try_parse_from([
            "kubectl-agentrun",
            "approve",
            "apr-1",
            "--reason",
            "r",
            "--dry-run",
            "-o",
            "yaml",
            "--commit",
            "abc",
        ])
        .unwrap();
        let Command::Approve(args) = cli.command else {
            panic!("not approve");
        };
        assert!(args.dry_run.dry_run);
        assert_eq!(args.dry_run.commit.as_deref(), Some("abc"));
        assert_eq!(args.output, Some(ManifestFormat::Yaml));
    }

    #[test]
    fn audit_takes_a_run_or_all_namespaces_and_jsonl() {
        let cli = Cli::try_parse_from(["kubectl-agentrun", "audit", "r1", "-o", "json"]).unwrap();
        let Command::Audit(args) = cli.command else {
            panic!("not audit");
        };
        assert_eq!(args.run.as_deref(), Some("r1"));
        assert_eq!(args.output, AuditFormat::Json);
        let cli = Cli::try_parse_from([
            "kubectl-agentrun",
            "audit",
            "--all-namespaces",
            "-o",
            "jsonl",
        ])
        .unwrap();
        let Command::Audit(args) = cli.command else {
            panic!("not audit");
        };
        assert!(args.all_namespaces && args.run.is_none());
        assert_eq!(args.output.report_format(), None);
        let err = Cli::try_parse_from(["kubectl-agentrun", "audit", "r1", "-A"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn reject_requires_message_and_reason() {
        assert!(
            Cli::try_parse_from(["kubectl-agentrun", "reject", "apr-1", "--reason", "r"]).is_err()
        );
        assert!(
            Cli::try_parse_from([
                "kubectl-agentrun",
                "reject",
                "apr-1",
                "--reason",
                "r",
                "--message",
                "m"
            ])
            .is_ok()
        );
    }
}
