//! [`run`]: the benchmark's phases in order, against a control plane.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use agentrun_testkit::tool_server::ToolServer;
use agentrun_testkit::wait::poll_until;

use crate::cluster::{BenchNamespace, Cluster, create_namespace, remove_namespace};
use crate::cycle::{Driver, cycle, cycles};
use crate::error::io_error;
use crate::idle::idle;
use crate::report::IdealMeasured;
use crate::single::single;
use crate::{BenchConfig, BenchError, BenchReport};

/// Progress lines on stderr, stamped with the time since the start.
#[derive(Clone, Copy)]
pub(crate) struct Progress {
    start: Instant,
}

impl Progress {
    pub(crate) fn say(&self, message: impl std::fmt::Display) {
        eprintln!(
            "[bench +{:>6.1}s] {message}",
            self.start.elapsed().as_secs_f64()
        );
    }
}

/// Runs the benchmark: each approval cycle, then the idle measurement.
pub async fn run(config: &BenchConfig) -> Result<BenchReport, BenchError> {
    config.validate()?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let progress = Progress {
        start: Instant::now(),
    };
    let cluster = Cluster::connect(&config.cluster_dir).await?;
    progress.say(format!("control plane {}", cluster.env.api_url));
    if let Some(dir) = &config.crds_dir {
        progress.say(format!(
            "installing the CRDs, policies and roles from {}",
            dir.display()
        ));
        cluster.install_crds(dir).await?;
    }
    std::fs::create_dir_all(&config.work_dir)
        .map_err(io_error(format!("creating {}", config.work_dir.display())))?;
    let tools = ToolServer::try_start()
        .await
        .map_err(io_error("starting the tool server on 127.0.0.1"))?;
    let mut report = BenchReport {
        kubelet_max_pods: config.kubelet_max_pods,
        ..Default::default()
    };
    let (cluster, tools, progress) = (&cluster, &tools, &progress);
    if config.warmup_runs > 0 {
        let n = config.warmup_runs;
        phase(config, cluster, progress, "bench-warmup", |ns| async move {
            cycle(config, cluster, tools, progress, &ns, n, Driver::Ours).await
        })
        .await?;
        progress.say(format!(
            "warm-up: one approval cycle of {n} runs done (not reported)"
        ));
    }
    for (pair, &n) in config.runs.iter().filter(|&&n| n > 0).enumerate() {
        let ours = |ns: BenchNamespace| async move {
            cycle(config, cluster, tools, progress, &ns, n, Driver::Ours).await
        };
        let ideal = |ns: BenchNamespace| async move {
            cycle(config, cluster, tools, progress, &ns, n, Driver::Ideal).await
        };
        let (ours_prefix, ideal_prefix) = (format!("bench-{n}"), format!("bench-ideal-{n}"));
        let ours = if config.ideal && config.side_by_side {
            progress.say(format!(
                "pair {}: ours and the ideal controller in the same approval burst",
                pair + 1
            ));
            phase(
                config,
                cluster,
                progress,
                &ours_prefix,
                |ours_ns| async move {
                    phase(
                        config,
                        cluster,
                        progress,
                        &ideal_prefix,
                        |ideal_ns| async move {
                            let lanes = [(&ours_ns, Driver::Ours), (&ideal_ns, Driver::Ideal)];
                            let mut reports =
                                cycles(config, cluster, tools, progress, &lanes, n).await?;
                            let ideal = reports.pop();
                            let mut ours = reports.remove(0);
                            ours.ideal = ideal.map(Box::new);
                            ours.ideal_measured = IdealMeasured::SameBurst;
                            Ok(ours)
                        },
                    )
                    .await
                },
            )
            .await?
        } else if config.ideal && pair % 2 == 1 {
            // Every other pair runs the ideal first, so that neither controller always meets
            // the control plane as the other one left it.
            progress.say(format!("pair {}: the ideal controller first", pair + 1));
            let ideal = phase(config, cluster, progress, &ideal_prefix, ideal).await?;
            let mut ours = phase(config, cluster, progress, &ours_prefix, ours).await?;
            ours.ideal = Some(Box::new(ideal));
            ours.ideal_measured = IdealMeasured::Before;
            ours
        } else {
            let mut ours = phase(config, cluster, progress, &ours_prefix, ours).await?;
            if config.ideal {
                let ideal = phase(config, cluster, progress, &ideal_prefix, ideal).await?;
                ours.ideal = Some(Box::new(ideal));
            }
            ours
        };
        report.cycles.push(ours);
    }
    if config.single_approvals > 0 {
        let n = config.single_approvals;
        let mut ours = phase(config, cluster, progress, "bench-single", |ns| async move {
            single(config, cluster, tools, progress, &ns, n, Driver::Ours).await
        })
        .await?;
        if config.ideal {
            let ideal = phase(
                config,
                cluster,
                progress,
                "bench-single-ideal",
                |ns| async move {
                    single(config, cluster, tools, progress, &ns, n, Driver::Ideal).await
                },
            )
            .await?;
            ours.ideal = Some(Box::new(ideal));
        }
        report.single = Some(ours);
    }
    if config.idle_runs > 0 {
        report.idle = Some(
            phase(config, cluster, progress, "bench-idle", |ns| async move {
                idle(config, cluster, tools, progress, &ns).await
            })
            .await?,
        );
    }
    // The work folder is empty once every phase succeeded.
    let _ = std::fs::remove_dir(&config.work_dir);
    Ok(report)
}

/// Runs one phase in a namespace of its own, removed afterwards; the phase's work folder is
/// removed when it succeeded and kept (with its logs) when it failed.
async fn phase<T, F, Fut>(
    config: &BenchConfig,
    cluster: &Cluster,
    progress: &Progress,
    prefix: &str,
    measure: F,
) -> Result<T, BenchError>
where
    F: FnOnce(BenchNamespace) -> Fut,
    Fut: std::future::Future<Output = Result<T, BenchError>>,
{
    let ns = create_namespace(cluster, config, prefix).await?;
    progress.say(format!("{prefix}: namespace {}", ns.name));
    let result = measure(ns.clone()).await;
    remove_namespace(cluster, config, &ns.name, progress).await;
    match &result {
        Ok(_) => {
            let _ = std::fs::remove_dir_all(&ns.dir);
        }
        Err(_) => progress.say(format!("{prefix}: logs kept in {}", ns.dir.display())),
    }
    result
}

/// Waits up to `timeout` for `check` to report nothing left to wait for (`None`); it reports the
/// progress so far otherwise (`Some`), which a timeout error then names.
pub(crate) async fn wait_for<F>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<(), BenchError>
where
    F: FnMut() -> Result<Option<String>, BenchError>,
{
    let waited = poll_until(timeout, Duration::from_millis(100), || {
        let step = match check() {
            Ok(None) => ControlFlow::Break(Ok(())),
            Ok(Some(progress)) => ControlFlow::Continue(progress),
            Err(e) => ControlFlow::Break(Err(e)),
        };
        std::future::ready(step)
    })
    .await;
    waited.unwrap_or_else(|progress| {
        Err(BenchError::Timeout {
            what: what.to_owned(),
            seconds: timeout.as_secs(),
            progress,
        })
    })
}
