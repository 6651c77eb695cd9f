//! The `agentrun-bench` command: the operator benchmark against a local control plane (see
//! [`crate`] and `docs/benchmark.md`). Progress goes to stderr, the table to stdout.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::BenchConfig;

/// Benchmark the agentrun operator against a local control plane and print the figures.
#[derive(Parser, Debug)]
#[command(name = "agentrun-bench", version)]
pub struct BenchArgs {
    /// The local control plane's folder (from `scripts/local-cluster start --dir DIR`).
    #[arg(long, value_name = "DIR")]
    pub cluster_dir: PathBuf,
    /// Run counts to measure, one approval cycle each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub runs: Vec<usize>,
    /// Runs of an approval cycle made by our controller before the measured ones and not
    /// reported (0: none), so that the first measured cycle does not also pay for a freshly
    /// started control plane.
    #[arg(long, default_value_t = 0)]
    pub warmup_runs: usize,
    /// Approvals per burst: the next burst starts once every worker Pod of the previous one
    /// exists (0: all runs in one burst).
    #[arg(long, default_value_t = 0)]
    pub burst_size: usize,
    /// Do not replay the approval cycles through the ideal controller.
    #[arg(long)]
    pub no_ideal: bool,
    /// Measure ours and the ideal controller in the same approval burst (the default): each
    /// pair's runs in two namespaces, each with its controller and dev kubelet, alice's
    /// approvals of the two interleaved (`--concurrency` in flight in all).
    #[arg(long, conflicts_with = "no_ideal")]
    pub side_by_side: bool,
    /// Measure the ideal controller's approval cycle right after ours (before it in every other
    /// pair) instead of in the same approval burst.
    #[arg(long, conflicts_with_all = ["no_ideal", "side_by_side"])]
    pub one_after_the_other: bool,
    /// Single approvals made one at a time on an idle system (0 skips them).
    #[arg(long, default_value_t = 50)]
    pub single_approvals: usize,
    /// Idle AwaitingApproval runs for the memory measurement (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub idle_runs: usize,
    /// The size of each idle run's RunState, in KiB.
    #[arg(long, default_value_t = 64)]
    pub idle_state_kib: usize,
    /// Apply the CRDs, admission policies and roles from this folder first.
    #[arg(long, value_name = "DIR", default_value = "crds")]
    pub crds: PathBuf,
    /// Do not apply the CRDs (they are installed already).
    #[arg(long)]
    pub skip_crds: bool,
    /// Requests in flight when creating runs, approving and sampling the baseline.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Samples of the baseline taken just before the approval burst.
    #[arg(long, default_value_t = 200)]
    pub baseline_samples: usize,
    /// Milliseconds between baseline samples during the approval burst.
    #[arg(long, default_value_t = 50)]
    pub baseline_interval_ms: u64,
    /// The most baseline samples taken during the approval burst.
    #[arg(long, default_value_t = 2000)]
    pub baseline_max_live: usize,
    /// The limit of each wait (runs halted, Pods created, runs finished, caches synced).
    #[arg(long, default_value_t = 1800)]
    pub timeout_seconds: u64,
    /// Seconds the idle controller is observed after its caches synced.
    #[arg(long, default_value_t = 30)]
    pub idle_observe_seconds: u64,
    /// Seconds to wait for the idle controller to have every run's request pending.
    #[arg(long, default_value_t = 600)]
    pub idle_settle_seconds: u64,
    /// Where logs, kubeconfigs and Pod folders go (default: a folder in the system temp dir);
    /// a phase's folder is removed when it succeeds and kept when it fails.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// The agentrun binary run as controller and workers (default: `agentrun` beside this
    /// binary).
    #[arg(long, value_name = "PATH")]
    pub agentrun_binary: Option<PathBuf>,
    /// The dev kubelet binary (default: `agentrun-dev-kubelet` beside this binary).
    #[arg(long, value_name = "PATH")]
    pub dev_kubelet_binary: Option<PathBuf>,
    /// Worker Pods the dev kubelet runs at once, like one small node's maxPods (0: no limit).
    /// Workers run on the benchmark's own two cores; in a cluster they run on other nodes.
    #[arg(long, default_value_t = 16)]
    pub kubelet_max_pods: usize,
}

impl BenchArgs {
    /// The benchmark settings these arguments describe.
    pub fn config(&self) -> Result<BenchConfig, String> {
        let beside_this = |name: &str| -> Result<PathBuf, String> {
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot find {name} beside this binary: {e}"))?;
            Ok(exe.with_file_name(name))
        };
        let agentrun_binary = match &self.agentrun_binary {
            Some(path) => path.clone(),
            None => beside_this("agentrun")?,
        };
        let dev_kubelet_binary = match &self.dev_kubelet_binary {
            Some(path) => path.clone(),
            None => beside_this("agentrun-dev-kubelet")?,
        };
        Ok(BenchConfig {
            cluster_dir: self.cluster_dir.clone(),
            runs: self.runs.clone(),
            ideal: !self.no_ideal,
            side_by_side: !self.one_after_the_other,
            burst_size: self.burst_size,
            single_approvals: self.single_approvals,
            idle_runs: self.idle_runs,
            idle_state_kib: self.idle_state_kib,
            crds_dir: (!self.skip_crds).then(|| self.crds.clone()),
            agentrun_binary,
            dev_kubelet_binary,
            concurrency: self.concurrency,
            baseline_samples: self.baseline_samples,
            baseline_interval: Duration::from_millis(self.baseline_interval_ms),
            baseline_max_live: self.baseline_max_live,
            timeout: Duration::from_secs(self.timeout_seconds),
            idle_observe: Duration::from_secs(self.idle_observe_seconds),
            idle_settle: Duration::from_secs(self.idle_settle_seconds),
            work_dir: self.work_dir.clone().unwrap_or_else(|| {
                std::env::temp_dir().join(format!("agentrun-bench-{}", std::process::id()))
            }),
            kubelet_max_pods: self.kubelet_max_pods,
            warmup_runs: self.warmup_runs,
        })
    }
}

/// Runs the benchmark and prints its table. Exit code 0 when it measured everything (whether or
/// not the goals were met: the table says), 1 on an error, 130 when interrupted.
pub fn main(args: BenchArgs) -> ExitCode {
    let config = match args.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agentrun-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentrun-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        tokio::select! {
            result = crate::run(&config) => match result {
                Ok(report) => {
                    print!("{}", report.render());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("agentrun-bench: {e}");
                    ExitCode::FAILURE
                }
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!(
                    "agentrun-bench: interrupted; namespaces labelled agentrun.dev/bench=true may be left (kubectl delete ns -l agentrun.dev/bench=true)"
                );
                ExitCode::from(130)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::BenchArgs;

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        BenchArgs::try_parse_from(["agentrun-bench", "--cluster-dir", "/c"].iter().chain(args))
    }

    #[test]
    fn both_controllers_share_one_approval_burst_unless_asked_otherwise() {
        let side_by_side = |args: &[&str]| parse(args).unwrap().config().unwrap().side_by_side;
        assert!(side_by_side(&[]));
        assert!(side_by_side(&["--side-by-side"]));
        assert!(!side_by_side(&["--one-after-the-other"]));
        for conflicting in [
            &["--side-by-side", "--one-after-the-other"][..],
            &["--no-ideal", "--one-after-the-other"],
            &["--no-ideal", "--side-by-side"],
        ] {
            let error = parse(conflicting).expect_err("conflicting flags refused");
            assert_eq!(error.kind(), clap::error::ErrorKind::ArgumentConflict);
        }
    }
}
