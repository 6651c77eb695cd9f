//! One approval cycle: N runs halt, are approved in one burst, and resume (by our controller, or
//! by the ideal one).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agentrun::crd::{ApprovalRequest, worker_pod_name};
use agentrun_testkit::tool_server::ToolServer;
use futures::{StreamExt, stream};
use kube::api::{Api, Patch, PatchParams};

use crate::audit::{audit_size, controller_events};
use crate::baseline::{baseline_during, baseline_sample};
use crate::cluster::{BenchNamespace, Cluster, client_from};
use crate::cpu::{CpuClock, Probe, control_plane_probes};
use crate::lane::{Before, Lane, Shared};
use crate::objects::{approval_patch, tool_path};
use crate::observe::{Observations, latencies};
use crate::report::CycleReport;
use crate::run::{Progress, wait_for};
use crate::stats::Percentiles;
use crate::{APPROVER, BenchConfig, BenchError, TOOL_CALL_ID};

/// Who acts on the approvals of a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Driver {
    /// Our controller (a child process).
    Ours,
    /// The [`IdealController`], in the benchmark process, after ours halted the runs.
    Ideal,
}

/// One approval cycle of `n` runs in `ns`, its approvals acted on by `driver`.
pub(crate) async fn cycle(
    config: &BenchConfig,
    cluster: &Cluster,
    tools: &ToolServer,
    progress: &Progress,
    ns: &BenchNamespace,
    n: usize,
    driver: Driver,
) -> Result<CycleReport, BenchError> {
    let mut reports = cycles(config, cluster, tools, progress, &[(ns, driver)], n).await?;
    Ok(reports.remove(0))
}

/// One approval cycle of `n` runs in each lane's namespace, in one approval burst: the lanes'
/// approvals interleaved, `config.concurrency` patches in flight in all. The baseline is sampled
/// once, in the first lane's namespace, and the CPU of the burst is reported with the first lane.
pub(crate) async fn cycles(
    config: &BenchConfig,
    cluster: &Cluster,
    tools: &ToolServer,
    progress: &Progress,
    lanes: &[(&BenchNamespace, Driver)],
    n: usize,
) -> Result<Vec<CycleReport>, BenchError> {
    let mut set = Vec::with_capacity(lanes.len());
    for &(ns, driver) in lanes {
        set.push(Lane::prepare(config, cluster, tools, progress, (ns, driver), n).await?);
    }
    let lanes = set;
    let first = lanes
        .first()
        .ok_or_else(|| BenchError::Config("an approval cycle without a namespace".into()))?;
    first.say(format!(
        "baseline before the burst ({} samples)",
        config.baseline_samples
    ));
    let baseline_ns = first.ns.clone();
    let baseline_client = client_from(&baseline_ns.baseline_kubeconfig).await?;
    let quiet: Vec<Result<(String, Instant), kube::Error>> =
        stream::iter(0..config.baseline_samples)
            .map(|seq| {
                let client = &baseline_client;
                let ns = &baseline_ns.name;
                async move {
                    let pod = format!("baseline-quiet-{seq:05}");
                    baseline_sample(client, ns, seq, &pod)
                        .await
                        .map(|t| (pod, t))
                }
            })
            .buffer_unordered(config.concurrency)
            .collect()
            .await;
    let mut baseline_errors = quiet.iter().filter(|r| r.is_err()).count();
    let quiet: Vec<(String, Instant)> = quiet.into_iter().filter_map(Result::ok).collect();
    let (quiet_ms, _) = latencies(&first.bed.seen, &quiet, Duration::from_secs(120)).await;

    let mut before = Vec::with_capacity(lanes.len());
    for lane in &lanes {
        before.push(Before {
            events: controller_events(cluster, &lane.ns.name).await?,
            tool_calls: tools.requests_to(&tool_path(&lane.ns.name)).len(),
        });
        lane.say(format!(
            "approving {} runs as {APPROVER}",
            lane.halted.len()
        ));
    }
    let audit_offset = audit_size(&cluster.env.audit_log)?;

    let cpu = CpuClock::start(path_probes(config, &lanes));
    let burst = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let live = tokio::spawn(baseline_during(
        client_from(&baseline_ns.baseline_kubeconfig).await?,
        baseline_ns.name.clone(),
        config.baseline_interval,
        config.baseline_max_live,
        config.concurrency,
        stop.clone(),
    ));
    let decision = approval_patch();
    let apis: Vec<Api<ApprovalRequest>> = lanes
        .iter()
        .map(|lane| Api::namespaced(cluster.alice.clone(), &lane.ns.name))
        .collect();
    // The lanes' runs taken in turn: run i of every lane, then run i + 1.
    let longest = lanes.iter().map(|l| l.halted.len()).max().unwrap_or(0);
    let order: Vec<(usize, String)> = (0..longest)
        .flat_map(|i| {
            lanes
                .iter()
                .enumerate()
                .filter_map(move |(l, lane)| lane.halted.get(i).map(|run| (l, run.clone())))
        })
        .collect();
    let burst_size = match config.burst_size {
        0 => order.len(),
        size => size * lanes.len(),
    };
    let mut outcomes: Vec<(usize, String, Result<Instant, kube::Error>)> = Vec::new();
    let mut lanes = lanes;
    for (index, chunk) in order.chunks(burst_size.max(1)).enumerate() {
        if index > 0 {
            // The next burst once every Pod of the previous one exists.
            wait_for(
                "the worker Pods of the previous burst",
                config.timeout,
                || {
                    for lane in &mut lanes {
                        lane.check()?;
                    }
                    let missing = outcomes
                        .iter()
                        .filter(|(l, run, _)| {
                            lanes[*l]
                                .bed
                                .seen
                                .pod_seen(&worker_pod_name(run, 1, 0))
                                .is_none()
                        })
                        .count();
                    Ok((missing > 0).then(|| format!("{missing} missing")))
                },
            )
            .await?;
        }
        let results: Vec<(usize, String, Result<Instant, kube::Error>)> = stream::iter(chunk)
            .map(|(l, run)| {
                let (l, requests, decision) = (*l, &apis[*l], &decision);
                async move {
                    let name = agentrun::crd::approval_request_name(run, TOOL_CALL_ID);
                    let result = requests
                        .patch(&name, &PatchParams::default(), &Patch::Merge(decision))
                        .await
                        .map(|_| Instant::now());
                    (l, run.clone(), result)
                }
            })
            .buffer_unordered(config.concurrency)
            .collect()
            .await;
        outcomes.extend(results);
    }
    let approve_seconds = burst.elapsed().as_secs_f64();
    for (l, run, result) in outcomes {
        match result {
            Ok(at) => lanes[l]
                .approvals
                .push((worker_pod_name(&run, 1, 0), run, at)),
            Err(e) => lanes[l].approval_errors.push(format!("{run}: {e}")),
        }
    }
    for lane in &lanes {
        lane.say(format!(
            "{} approvals returned in {approve_seconds:.1} s ({} refused); waiting for the worker Pods",
            lane.approvals.len(),
            lane.approval_errors.len()
        ));
    }

    let pods_result = wait_for(
        "the next worker Pod of every approved run",
        config.timeout,
        || {
            let mut missing = 0;
            for lane in &mut lanes {
                lane.check()?;
                missing += lane
                    .approvals
                    .iter()
                    .filter(|(pod, _, _)| lane.bed.seen.pod_seen(pod).is_none())
                    .count();
            }
            Ok((missing > 0).then(|| format!("{missing} missing")))
        },
    )
    .await;
    let cpu = cpu.finish();
    stop.store(true, Ordering::Relaxed);
    let (live_samples, live_errors) = live.await.unwrap_or_default();
    baseline_errors += live_errors;
    pods_result?;
    for lane in &lanes {
        lane.say("every next worker Pod created; waiting for the runs to finish".into());
    }
    wait_for("every approved run to finish", config.timeout, || {
        let mut left = 0;
        for lane in &mut lanes {
            lane.check()?;
            let approved = lane.approved();
            left += approved.len() - lane.bed.finished(&approved).0;
        }
        Ok((left > 0).then(|| format!("{left} not finished")))
    })
    .await?;
    // Let the last Events and status writes land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (live_ms, _) =
        latencies(&first_seen(&lanes), &live_samples, Duration::from_secs(120)).await;
    let shared = Shared {
        burst,
        audit_offset,
        approve_seconds,
        baseline: Percentiles::of(&live_ms),
        baseline_quiet: Percentiles::of(&quiet_ms),
        baseline_errors,
    };
    let mut cpu = Some(cpu);
    let mut reports = Vec::with_capacity(lanes.len());
    for (lane, before) in lanes.into_iter().zip(before) {
        reports.push(
            lane.finish(config, cluster, tools, &shared, before, cpu.take())
                .await?,
        );
    }
    Ok(reports)
}

fn first_seen(lanes: &[Lane]) -> Arc<Observations> {
    lanes
        .first()
        .map(|l| l.bed.seen.clone())
        .unwrap_or_default()
}

/// The processes on the approval path: the control plane's, our controller (when it runs), the
/// dev kubelets with the workers they reaped, and this process (the approvals, the watches, the
/// baseline and, in the ideal's lane, the ideal controller).
fn path_probes(config: &BenchConfig, lanes: &[Lane]) -> Vec<Probe> {
    let mut probes = control_plane_probes(&config.cluster_dir);
    let probe = |role: String, pid: Option<u32>, with_children: bool| {
        pid.map(|pid| Probe {
            role,
            pid,
            with_children,
        })
    };
    for (index, lane) in lanes.iter().enumerate() {
        let of_lane = if index == 0 {
            String::new()
        } else {
            format!(" ({})", lane.label)
        };
        probes.extend(probe(
            format!("controller{of_lane}"),
            lane.bed.controller.as_ref().and_then(|c| c.process.pid()),
            false,
        ));
        probes.extend(probe(
            format!("dev-kubelet+workers{of_lane}"),
            lane.bed.kubelet.pid(),
            true,
        ));
    }
    probes.extend(probe("bench".into(), Some(std::process::id()), false));
    probes
}
