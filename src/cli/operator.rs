//! `agentrun controller`, `agentrun worker` and `agentrun dev-kubelet`: the in-cluster commands.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use kube::Client;
use kube::config::Kubeconfig;

use crate::controller::{ControllerConfig, worker_pod::WorkerSettings};
use crate::dev_kubelet::{ClusterAccess, DevKubeletConfig};

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
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,kube=warn"));
    // No colour codes unless a terminal shows them (container logs, files, pipes).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
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

/// `agentrun dev-kubelet`.
#[derive(Args, Debug)]
pub struct DevKubeletArgs {
    /// Run only Pods of this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Where Pod folders are made (default: a folder in the system temp dir).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// The agentrun binary that stands for the image's command (default: this binary).
    #[arg(long)]
    pub agentrun_binary: Option<PathBuf>,
    /// How many worker Pods run at once, like a node's maxPods (0: no limit); further Pods stay
    /// Pending until one finishes.
    #[arg(long, default_value_t = 0)]
    pub max_pods: usize,
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
    init_logging(args.log_format);
    install_crypto();
    runtime().block_on(async move {
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
        let config = ControllerConfig {
            namespace: args.namespace,
            worker,
            policy: crate::controller::decide::Policy {
                max_retries: args.max_retries,
                retry_backoff: std::time::Duration::from_secs_f64(
                    args.retry_backoff_seconds.max(0.0),
                ),
                ..Default::default()
            },
            metrics_addr: args.metrics_addr,
            concurrency: Some(args.concurrency),
            state_cache_bytes: Some(args.state_cache_mib << 20),
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
    })
}

/// Runs one worker step.
pub fn worker(args: WorkerArgs) -> ExitCode {
    init_logging(args.log_format);
    install_crypto();
    runtime().block_on(async move {
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
                ExitCode::FAILURE
            }
        }
    })
}

/// Runs the dev kubelet.
pub fn dev_kubelet(args: DevKubeletArgs) -> ExitCode {
    init_logging(args.log_format);
    install_crypto();
    runtime().block_on(async move {
        let kubeconfig = match Kubeconfig::read() {
            Ok(k) => k,
            Err(e) => {
                eprintln!("error: the dev kubelet needs a kubeconfig (KUBECONFIG): {e}");
                return ExitCode::FAILURE;
            }
        };
        let cluster = match ClusterAccess::from_kubeconfig(&kubeconfig) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        let client = match Client::try_default().await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: cannot configure a Kubernetes client: {e}");
                return ExitCode::FAILURE;
            }
        };
        let binary = args
            .agentrun_binary
            .or_else(|| std::env::current_exe().ok())
            .unwrap_or_else(|| PathBuf::from("agentrun"));
        let work_dir = args.work_dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("agentrun-dev-kubelet-{}", std::process::id()))
        });
        let config = DevKubeletConfig {
            agentrun_binary: binary,
            namespace: args.namespace,
            work_dir,
            cluster,
            max_pods: args.max_pods,
        };
        tokio::select! {
            result = crate::dev_kubelet::run(client, config) => match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            },
            _ = tokio::signal::ctrl_c() => ExitCode::SUCCESS,
        }
    })
}
