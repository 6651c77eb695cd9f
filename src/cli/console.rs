//! `agentrun console`: the approval console's web server (see [`crate::console`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use super::operator::{LogFormat, init_logging};
use crate::console::access::{ApiServer, IN_CLUSTER_CA};
use crate::console::{Console, ConsoleConfig, ConsoleError, TlsFiles};

/// `agentrun console`.
#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// The address to listen on.
    #[arg(
        long,
        env = "AGENTRUN_CONSOLE_LISTEN",
        default_value = "127.0.0.1:8090"
    )]
    pub listen: SocketAddr,
    /// The kubeconfig naming the API server (only its server and CA are used, never its
    /// credentials). Default: `$KUBECONFIG` or `~/.kube/config`, or in a Pod the in-cluster
    /// API server with the CA of `--api-ca-file`.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context.
    #[arg(long)]
    pub context: Option<String>,
    /// In a Pod: the API server's CA bundle (the chart mounts the `kube-root-ca.crt` ConfigMap
    /// here; the console's ServiceAccount token is not mounted).
    #[arg(long, env = "AGENTRUN_CONSOLE_API_CA_FILE", default_value = IN_CLUSTER_CA)]
    pub api_ca_file: PathBuf,
    /// A namespace the inbox looks in for people who may not list ApprovalRequests in all
    /// namespaces (repeat the flag, or separate with commas).
    #[arg(
        long = "namespace",
        env = "AGENTRUN_CONSOLE_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,
    /// Serve HTTPS with this certificate chain (PEM); needs `--tls-key`.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Mark the session cookie Secure although the console serves plain HTTP: TLS terminates in
    /// a proxy or an Ingress in front of it (always on with `--tls-cert`).
    #[arg(long, env = "AGENTRUN_CONSOLE_SECURE_COOKIES")]
    pub secure_cookies: bool,
    /// Minutes without opening a page after which a session ends.
    #[arg(long, env = "AGENTRUN_CONSOLE_SESSION_IDLE_MINUTES", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=1440))]
    pub session_idle_minutes: u64,
    /// Hours after login after which a session ends, whatever happens.
    #[arg(long, env = "AGENTRUN_CONSOLE_SESSION_LIFETIME_HOURS", default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=168))]
    pub session_lifetime_hours: u64,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

impl ConsoleArgs {
    /// Where the API server is: `--kubeconfig`, else `$KUBECONFIG`/`~/.kube/config`, else (in a
    /// Pod) the in-cluster address.
    pub fn api_server(&self) -> ApiServer {
        let in_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        if self.kubeconfig.is_none() && std::env::var_os("KUBECONFIG").is_none() && in_pod {
            return ApiServer::InCluster {
                ca_file: self.api_ca_file.clone(),
            };
        }
        ApiServer::Kubeconfig {
            path: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }
}

async fn run(args: ConsoleArgs) -> Result<(), ConsoleError> {
    let api = args.api_server().config().await?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        }),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let config = ConsoleConfig {
        listen: args.listen,
        api,
        namespaces: args
            .namespaces
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect(),
        tls,
        secure_cookies: args.secure_cookies,
        idle_timeout: Duration::from_secs(args.session_idle_minutes * 60),
        lifetime: Duration::from_secs(args.session_lifetime_hours * 3600),
    };
    let api_url = config.api.cluster_url.to_string();
    let console = Console::bind(config).await?;
    tracing::info!(
        address = %console.local_addr()?,
        %scheme,
        api_server = %api_url,
        "the console is serving; it acts only with its users' credentials"
    );
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        signal.cancel();
    });
    console.serve(shutdown).await
}

/// Resolves at SIGTERM (as Kubernetes stops a Pod) or Ctrl-C.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}

/// Runs `agentrun console` until SIGTERM or Ctrl-C.
pub fn main(args: ConsoleArgs) -> ExitCode {
    init_logging(args.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "the console stopped");
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
