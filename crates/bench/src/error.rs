//! [`BenchError`]: what can go wrong in a benchmark.

use std::path::PathBuf;

use agentrun_testkit::namespaces::SetupError;

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// `cluster.env` of the cluster folder is missing or incomplete.
    #[error("{path}: {message}")]
    ClusterEnv {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A Kubernetes API request failed.
    #[error("kubernetes API, {what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A local file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An external command (kubectl) failed.
    #[error("{what} failed: {message}")]
    Command {
        /// The command.
        what: String,
        /// Its error output.
        message: String,
    },
    /// A write of the ideal controller failed.
    #[error("the ideal controller failed: {0}")]
    Ideal(String),
    /// Something did not happen in time.
    #[error("timed out after {seconds} s waiting for {what} ({progress})")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The timeout.
        seconds: u64,
        /// How far it got.
        progress: String,
    },
    /// A child process (controller, dev kubelet) exited while the benchmark needed it.
    #[error("the {what} exited early ({status}); last lines of {log}:\n{tail}")]
    ChildExited {
        /// Which child.
        what: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: String,
        /// The end of its log.
        tail: String,
    },
    /// The halted RunState for the idle runs could not be built.
    #[error("building the idle runs' RunState: {0}")]
    State(String),
    /// The runs did not get far enough to measure anything.
    #[error("{0}")]
    NothingToMeasure(String),
    /// A namespace or an identity could not be set up.
    #[error(transparent)]
    Setup(#[from] SetupError),
}

pub(crate) fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Kube { what, source }
}

pub(crate) fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, source }
}
