//! `agentrun controller` and `agentrun worker`: the in-cluster commands.

use std::process::ExitCode;

use clap::{Args, ValueEnum};
use kube::Client;

use crate::controller::{ControllerConfig, SigningConfig, WorkerPodDeletion, WorkerSettings};
use crate::telemetry::Telemetry;

/// Log output format.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Sets up `tracing` for a long-running command (filter from `RUST_LOG`, default `info`).
pub fn init_logging(format: LogFormat) {
    init_tracing(format, &Telemetry::default());
}

/// [`init_logging`], plus the export of agentrun's spans when `telemetry` is enabled. `RUST_LOG`
/// filters the log lines only: the exported spans do not depend on it.
pub fn init_tracing(format: LogFormat, telemetry: &Telemetry) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    // No colour codes unless a terminal shows them (container logs, files, pipes).
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let lines = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .with(telemetry.layer())
        .try_init();
}

/// Sets up the span export from the standard `OTEL_*` environment; an invalid setting is reported
/// and export stays off (the command still runs).
fn telemetry(service: &str) -> Telemetry {
    Telemetry::from_env(service).unwrap_or_else(|e| {
        eprintln!("warning: traces are not exported: {e}");
        Telemetry::default()
    })
}

/// The `OTEL_*` settings of this process that worker Pods get too (their `service.name` is
/// `agentrun-worker`), so that their spans go where the controller's go. Left out: the export's
/// headers (often a credential, which would be readable in every worker Pod's spec) and paths of
/// certificate and key files (not in the worker's file system): a collector that needs either is
/// reached by workers through one that does not.
fn worker_telemetry_env() -> Vec<(String, String)> {
    worker_telemetry_env_of(std::env::vars())
}

fn worker_telemetry_env_of(vars: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    let kept = |k: &str| {
        k.starts_with("OTEL_")
            && k != "OTEL_SERVICE_NAME"
            && !k.ends_with("_HEADERS")
            && !k.ends_with("_CERTIFICATE")
            && !k.ends_with("_CLIENT_KEY")
    };
    let mut env: Vec<(String, String)> = vars.filter(|(k, _)| kept(k)).collect();
    if !env.is_empty() {
        env.push(("OTEL_SERVICE_NAME".into(), "agentrun-worker".into()));
    }
    env.sort();
    env
}

/// `agentrun controller`.
#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "AGENTRUN_NAMESPACE")]
    pub namespace: Option<String>,
    /// The image of worker Pods.
    #[arg(long, env = "AGENTRUN_WORKER_IMAGE")]
    pub worker_image: Option<String>,
    /// How many times a failed worker step is retried before the run fails.
    #[arg(long, default_value_t = 3)]
    pub max_retries: u32,
    /// Seconds before the first retry of a failed worker (doubled for each further retry).
    #[arg(long, default_value_t = 5.0)]
    pub retry_backoff_seconds: f64,
    /// How many runs are reconciled at once.
    #[arg(long, env = "AGENTRUN_CONCURRENCY", default_value_t = crate::controller::DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// MiB of small RunStates kept in memory, so that applying a decision needs no extra read
    /// (0 disables).
    #[arg(long, env = "AGENTRUN_STATE_CACHE_MIB", default_value_t = 32)]
    pub state_cache_mib: usize,
    /// Fill the caches from watches that stream the existing objects (Kubernetes streaming
    /// lists) instead of paged lists; needs the API server's `WatchList` feature (on by default
    /// from Kubernetes 1.34).
    #[arg(long, env = "AGENTRUN_STREAMING_LISTS")]
    pub streaming_lists: bool,
    /// Which finished runs' worker Pods are deleted when they finish: `succeeded` (a failed run
    /// keeps its Pods and their logs), `finished` or `never` (every Pod stays until its run is
    /// deleted).
    #[arg(long, env = "AGENTRUN_DELETE_WORKER_PODS", value_enum, default_value_t = WorkerPodDeletion::default())]
    pub delete_worker_pods: WorkerPodDeletion,
    /// Let a run's creator decide its own ApprovalRequests (separation of duties off). An admin
    /// setting: no Agent or run can switch it.
    #[arg(long, env = "AGENTRUN_ALLOW_SELF_APPROVAL")]
    pub allow_self_approval: bool,
    /// Apply decisions that no admission policy stamped (only for clusters without
    /// ValidatingAdmissionPolicy/MutatingAdmissionPolicy): the approverId is then recorded as
    /// claimed, never as verified, and anyone who can patch an ApprovalRequest can claim any name.
    #[arg(long, env = "AGENTRUN_ALLOW_UNVERIFIED_DECISIONS")]
    pub allow_unverified_decisions: bool,
    /// Refuse decisions by approvers who may create AgentRuns or impersonate ServiceAccounts in
    /// the run's namespace (checked with SubjectAccessReviews): they could have requested the run
    /// under another name.
    #[arg(long, env = "AGENTRUN_STRICT_SEPARATION_OF_DUTIES")]
    pub strict_separation_of_duties: bool,
    /// The group whose members may apply decisions claimed for someone else (GitOps), as the
    /// admission policies are configured.
    #[arg(long, env = "AGENTRUN_GITOPS_GROUP", default_value = crate::crd::policy::GITOPS_GROUP)]
    pub gitops_group: String,
    /// The prefix of the admission policies' names (`<prefix>-stamp-decider`,
    /// `<prefix>-approval-identity`; the chart names them after its release).
    #[arg(
        long,
        env = "AGENTRUN_ADMISSION_POLICY_PREFIX",
        default_value = "agentrun"
    )]
    pub admission_policy_prefix: String,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:8080).
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Take a Lease before reconciling, so that several replicas are safe.
    #[arg(long)]
    pub leader_elect: bool,
    /// The namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,
    /// The name of the leader Lease.
    #[arg(long, default_value = "agentrun-controller")]
    pub leader_election_lease: String,
    /// This replica's identity in the Lease (default: the Pod name, or host and process id).
    #[arg(long, env = "POD_NAME")]
    pub leader_election_identity: Option<String>,
    /// Do not sign approval assertions (tools that require them then refuse approved calls).
    #[arg(long)]
    pub no_approval_assertions: bool,
    /// The controller's own namespace, where the signing-key Secret and the JWKS ConfigMap live.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub controller_namespace: String,
    /// The Secret holding the Ed25519 keys that sign approval assertions (`*.pem` entries and
    /// `current`); created with one new key when missing.
    #[arg(long, env = "AGENTRUN_SIGNING_KEY_SECRET", default_value = crate::controller::signing::DEFAULT_SECRET)]
    pub signing_key_secret: String,
    /// The ConfigMap in which the public keys are published as a JWKS (key `jwks.json`).
    #[arg(long, default_value = crate::controller::signing::DEFAULT_CONFIG_MAP)]
    pub jwks_config_map: String,
    /// Seconds between two listings (`tools/list`) of each Agent's MCP servers.
    #[arg(long, env = "AGENTRUN_MCP_REDISCOVERY_SECONDS", default_value_t = crate::controller::agent_status::DEFAULT_REDISCOVERY.as_secs(), value_parser = clap::value_parser!(u64).range(5..=86_400))]
    pub mcp_rediscovery_seconds: u64,
    /// Seconds an approval assertion stays valid after the controller issues it.
    #[arg(long, default_value_t = crate::controller::signing::DEFAULT_LIFETIME.as_secs(), value_parser = clap::value_parser!(u64).range(30..=86_400))]
    pub assertion_lifetime_seconds: u64,
    /// Send no notifications to NotificationSinks.
    #[arg(long)]
    pub no_notifications: bool,
    /// The ConfigMap (in the controller's namespace) holding the notification outbox.
    #[arg(long, default_value = crate::notify::DEFAULT_OUTBOX_CONFIG_MAP)]
    pub notification_outbox: String,
    /// Seconds an event may wait for delivery before it is dropped (and how long deliveries are
    /// remembered for deduplication).
    #[arg(long, default_value_t = crate::notify::DEFAULT_HORIZON.as_secs(), value_parser = clap::value_parser!(u64).range(60..=604_800))]
    pub notification_horizon_seconds: u64,
}

/// `agentrun worker`.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// The run's namespace.
    #[arg(long)]
    pub namespace: String,
    /// The AgentRun's name.
    #[arg(long)]
    pub run: String,
    /// The step this worker runs.
    #[arg(long)]
    pub step: u32,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Runs the controller.
pub fn controller(args: ControllerArgs) -> ExitCode {
    install_crypto();
    let telemetry = telemetry("agentrun-controller");
    init_tracing(args.log_format, &telemetry);
    let code = runtime().block_on(async move {
        let client = match Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: cannot configure a Kubernetes client: {e}");
                return ExitCode::FAILURE;
            }
        };
        let mut worker = WorkerSettings::default();
        if let Some(image) = args.worker_image {
            worker.image = image;
        }
        worker.env.extend(worker_telemetry_env());
        worker.pod_deletion = args.delete_worker_pods;
        let config = ControllerConfig {
            namespace: args.namespace,
            worker,
            policy: crate::controller::Policy {
                max_retries: args.max_retries,
                retry_backoff: std::time::Duration::from_secs_f64(
                    args.retry_backoff_seconds.max(0.0),
                ),
                decisions: crate::controller::DecisionRules {
                    allow_self_approval: args.allow_self_approval,
                    allow_unverified_decisions: args.allow_unverified_decisions,
                    strict_separation_of_duties: args.strict_separation_of_duties,
                    gitops_group: args.gitops_group,
                },
                ..Default::default()
            },
            metrics_addr: args.metrics_addr,
            admission_policy_prefix: Some(args.admission_policy_prefix),
            concurrency: Some(args.concurrency),
            state_cache_bytes: Some(args.state_cache_mib << 20),
            streaming_lists: args.streaming_lists,
            mcp_rediscovery: Some(std::time::Duration::from_secs(args.mcp_rediscovery_seconds)),
            signing: (!args.no_approval_assertions).then(|| SigningConfig {
                namespace: args.controller_namespace.clone(),
                secret_name: args.signing_key_secret.clone(),
                config_map_name: args.jwks_config_map.clone(),
                lifetime: std::time::Duration::from_secs(args.assertion_lifetime_seconds),
            }),
            notifications: (!args.no_notifications).then(|| crate::notify::NotifyConfig {
                outbox_config_map: args.notification_outbox.clone(),
                horizon: std::time::Duration::from_secs(args.notification_horizon_seconds),
                ..crate::notify::NotifyConfig::new(&args.controller_namespace)
            }),
            leader_election: args
                .leader_elect
                .then(|| crate::controller::LeaderElection {
                    namespace: args.leader_election_namespace.clone(),
                    lease_name: args.leader_election_lease.clone(),
                    identity: args.leader_election_identity.clone().unwrap_or_else(|| {
                        format!(
                            "{}-{}",
                            std::env::var("HOSTNAME").unwrap_or_else(|_| "agentrun".into()),
                            std::process::id()
                        )
                    }),
                    lease_duration: std::time::Duration::from_secs(15),
                    grace: std::time::Duration::from_secs(5),
                }),
        };
        match crate::controller::run(client, config).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    });
    telemetry.shutdown();
    code
}

/// Runs one worker step.
pub fn worker(args: WorkerArgs) -> ExitCode {
    install_crypto();
    let telemetry = telemetry("agentrun-worker");
    init_tracing(args.log_format, &telemetry);
    let code = runtime().block_on(async move {
        let client = match Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: cannot configure a Kubernetes client: {e}");
                return ExitCode::FAILURE;
            }
        };
        match crate::worker::run_step(client, &args.namespace, &args.run, args.step).await {
            Ok(result) => {
                tracing::info!(?result, "step finished");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "error: step {} of {}/{}: {e}",
                    args.step, args.namespace, args.run
                );
                match e {
                    crate::worker::WorkerError::Tampered(_) => {
                        ExitCode::from(crate::worker::TAMPERED_EXIT_CODE)
                    }
                    _ => ExitCode::FAILURE,
                }
            }
        }
    });
    // A worker lives for one step: its spans are sent before it exits.
    telemetry.shutdown();
    code
}

#[cfg(test)]
mod tests {
    use super::worker_telemetry_env_of;

    #[test]
    fn workers_get_the_export_settings_but_no_credentials() {
        let vars = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-key=s3cret"),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", "/etc/ca.pem"),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", "/etc/key.pem"),
            ("OTEL_SERVICE_NAME", "my-controller"),
            ("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
            ("RUST_LOG", "info"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let env = worker_telemetry_env_of(vars.into_iter());
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_SERVICE_NAME",
                "OTEL_TRACES_SAMPLER"
            ]
        );
        assert!(env.contains(&("OTEL_SERVICE_NAME".into(), "agentrun-worker".into())));
        assert!(worker_telemetry_env_of(std::iter::empty()).is_empty());
    }
}
