//! The `agentrun-dev-kubelet` command: its flags and its main function.

use std::path::PathBuf;
use std::process::ExitCode;

use agentrun::cli::operator::{LogFormat, init_logging};
use clap::Parser;
use kube::Client;
use kube::config::Kubeconfig;

use crate::{ClusterAccess, DevKubeletConfig};

/// Dev only: play the kubelet's part for worker Pods on a cluster without nodes.
#[derive(Parser, Debug)]
#[command(name = "agentrun-dev-kubelet", version)]
pub struct DevKubeletArgs {
    /// Run only Pods of this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Where Pod folders are made (default: a folder in the system temp dir).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// The agentrun binary that stands for the image's command (default: `agentrun` beside this
    /// binary, else on PATH).
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

/// `agentrun` beside the running binary (as cargo builds them), else `agentrun` on PATH.
pub fn default_agentrun_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("agentrun")))
        .filter(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("agentrun"))
}

/// Runs the dev kubelet until it fails or is interrupted.
pub fn main(args: DevKubeletArgs) -> ExitCode {
    init_logging(args.log_format);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
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
        let work_dir = args.work_dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("agentrun-dev-kubelet-{}", std::process::id()))
        });
        let config = DevKubeletConfig {
            agentrun_binary: args.agentrun_binary.unwrap_or_else(default_agentrun_binary),
            namespace: args.namespace,
            work_dir,
            cluster,
            max_pods: args.max_pods,
        };
        tokio::select! {
            result = crate::run(client, config) => match result {
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
