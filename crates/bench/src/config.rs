//! [`BenchConfig`]: how the benchmark runs.

use std::path::PathBuf;
use std::time::Duration;

use crate::BenchError;

/// How the benchmark runs.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The local control plane's folder (`scripts/local-cluster start --dir DIR`).
    pub cluster_dir: PathBuf,
    /// The run counts measured, one approval cycle each (zeros are skipped).
    pub runs: Vec<usize>,
    /// Approvals per burst (0: all at once); a burst starts once the previous one's Pods exist.
    pub burst_size: usize,
    /// Replay each approval cycle through the ideal controller (same N, burst and kubelet).
    pub ideal: bool,
    /// Measure ours and the ideal in the same approval burst (each in its namespace, with its
    /// dev kubelet, their approvals interleaved) instead of one after the other.
    pub side_by_side: bool,
    /// Single approvals made one at a time on an idle system (0 skips them).
    pub single_approvals: usize,
    /// Idle AwaitingApproval runs for the memory measurement (0 skips it).
    pub idle_runs: usize,
    /// The size of each idle run's RunState, in KiB.
    pub idle_state_kib: usize,
    /// Apply the CRDs, policies and roles from this folder first (`None`: already installed).
    pub crds_dir: Option<PathBuf>,
    /// The `agentrun` binary started as controller and workers.
    pub agentrun_binary: PathBuf,
    /// The `agentrun-dev-kubelet` binary started as the dev kubelet.
    pub dev_kubelet_binary: PathBuf,
    /// Requests in flight when creating runs, approving and sampling the baseline.
    pub concurrency: usize,
    /// Samples of the quiet baseline (before the approval burst).
    pub baseline_samples: usize,
    /// The interval between samples of the baseline taken during the approval burst.
    pub baseline_interval: Duration,
    /// The most samples of the baseline taken during the approval burst.
    pub baseline_max_live: usize,
    /// The limit of each wait (all halted, all Pods, all finished, caches synced).
    pub timeout: Duration,
    /// How long the idle controller is observed after its caches synced.
    pub idle_observe: Duration,
    /// How long to wait for the idle controller to settle (every run's request pending).
    pub idle_settle: Duration,
    /// Where namespaces' logs, kubeconfigs and Pod folders go (removed after a phase succeeds).
    pub work_dir: PathBuf,
    /// Worker Pods the dev kubelet runs at once (its `--max-pods`; 0: no limit).
    pub kubelet_max_pods: usize,
    /// Runs of an unreported approval cycle by our controller before the measured ones (0: none).
    pub warmup_runs: usize,
}

impl BenchConfig {
    pub(crate) fn validate(&self) -> Result<(), BenchError> {
        if self.runs.iter().all(|&n| n == 0) && self.idle_runs == 0 && self.single_approvals == 0 {
            return Err(BenchError::Config(
                "nothing to measure: --runs has no count above 0, and --idle-runs and --single-approvals are 0".into(),
            ));
        }
        if self.concurrency == 0 {
            return Err(BenchError::Config(
                "--concurrency must be at least 1".into(),
            ));
        }
        if self.idle_runs > 0 && self.idle_state_kib == 0 {
            return Err(BenchError::Config(
                "--idle-state-kib must be at least 1".into(),
            ));
        }
        if self.work_dir.to_str().is_none() {
            return Err(BenchError::Config(format!(
                "the work folder {} is not UTF-8",
                self.work_dir.display()
            )));
        }
        if self.timeout.is_zero() {
            return Err(BenchError::Config(
                "--timeout-seconds must be above 0".into(),
            ));
        }
        Ok(())
    }
}
