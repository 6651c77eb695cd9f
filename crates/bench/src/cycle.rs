//! One approval cycle: N runs halt, are approved in one burst, and resume (by our controller, or
//! by the ideal one).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agentrun::crd::{ApprovalRequest, worker_pod_name};
use agentrun_testkit::tool_server::ToolServer;
use futures::{StreamExt, stream};
use kube::api::{Api, Patch, PatchParams};

use crate::audit::{
    audit_size, controller_events, count_audit_since, event_writes, event_writes_between,
    event_writes_where, is_completion_reason,
};
use crate::baseline::{baseline_during, baseline_sample};
use crate::bed::Bed;
use crate::cluster::{BenchNamespace, Cluster, client_from};
use crate::cpu::{CpuClock, Probe, control_plane_probes};
use crate::ideal::{IdealController, check_ideal, start_ideal};
use crate::objects::approval_patch;
use crate::observe::{latencies, lock, phases};
use crate::process::{Controller, Memory};
use crate::report::{CycleReport, ReadyAgain, mib, ms, opt};
use crate::run::{Progress, wait_for};
use crate::stats::Percentiles;
use crate::{APPROVER, BenchConfig, BenchError, EVENT_REPORTER, RUN_PREFIX, TOOL_CALL_ID};

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
    let label = match driver {
        Driver::Ours => format!("N={n}"),
        Driver::Ideal => format!("N={n} ideal"),
    };
    let say = |m: String| progress.say(format!("{label}: {m}"));
    let mut bed = Bed::start(config, cluster, tools, ns).await?;
    say("controller ready; creating runs".into());
    let halted = bed.create_and_halt(config, cluster, ns, n).await?;
    let (halt_seconds, halted) = (halted.seconds, halted.runs);
    let ideal = match driver {
        Driver::Ours => None,
        Driver::Ideal => {
            bed.stop_controller().await;
            let ideal = start_ideal(ns).await?;
            say("our controller stopped; the ideal controller acts on the approvals".into());
            Some(ideal)
        }
    };
    let seen = bed.seen.clone();
    let check = |bed: &mut Bed| -> Result<(), BenchError> {
        bed.check_alive()?;
        check_ideal(ideal.as_ref())
    };
    say(format!(
        "{}/{n} halted in {halt_seconds:.1} s; baseline before the burst ({} samples)",
        halted.len(),
        config.baseline_samples
    ));

    let baseline_client = client_from(&ns.baseline_kubeconfig).await?;
    let quiet: Vec<Result<(String, Instant), kube::Error>> =
        stream::iter(0..config.baseline_samples)
            .map(|seq| {
                let client = &baseline_client;
                let ns = &ns.name;
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
    let (quiet_ms, _) = latencies(&seen, &quiet, Duration::from_secs(120)).await;

    let events_before = controller_events(cluster, &ns.name).await?;
    let audit_offset = audit_size(&cluster.env.audit_log)?;
    let calls_before = tools.request_count() as u64;
    say(format!("approving {} runs as {APPROVER}", halted.len()));

    let cpu = CpuClock::start(path_probes(config, &bed));
    let burst = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let live = tokio::spawn(baseline_during(
        client_from(&ns.baseline_kubeconfig).await?,
        ns.name.clone(),
        config.baseline_interval,
        config.baseline_max_live,
        config.concurrency,
        stop.clone(),
    ));
    let requests: Api<ApprovalRequest> = Api::namespaced(cluster.alice.clone(), &ns.name);
    let decision = approval_patch();
    let burst_size = match config.burst_size {
        0 => halted.len(),
        size => size,
    };
    let mut outcomes: Vec<(String, Result<Instant, kube::Error>)> = Vec::new();
    for (index, chunk) in halted.chunks(burst_size).enumerate() {
        if index > 0 {
            // The next burst once every Pod of the previous one exists.
            wait_for(
                "the worker Pods of the previous burst",
                config.timeout,
                || {
                    check(&mut bed)?;
                    let missing = outcomes
                        .iter()
                        .filter(|(run, _)| seen.pod_seen(&worker_pod_name(run, 1, 0)).is_none())
                        .count();
                    Ok((missing > 0).then(|| format!("{missing} missing")))
                },
            )
            .await?;
        }
        let results: Vec<(String, Result<Instant, kube::Error>)> = stream::iter(chunk)
            .map(|run| {
                let (requests, decision) = (&requests, &decision);
                async move {
                    let name = agentrun::crd::approval_request_name(run, TOOL_CALL_ID);
                    let result = requests
                        .patch(&name, &PatchParams::default(), &Patch::Merge(decision))
                        .await
                        .map(|_| Instant::now());
                    (run.clone(), result)
                }
            })
            .buffer_unordered(config.concurrency)
            .collect()
            .await;
        outcomes.extend(results);
    }
    let approve_seconds = burst.elapsed().as_secs_f64();
    let mut approvals = Vec::new();
    let mut approval_errors = Vec::new();
    for (run, result) in outcomes {
        match result {
            Ok(at) => approvals.push((worker_pod_name(&run, 1, 0), run, at)),
            Err(e) => approval_errors.push(format!("{run}: {e}")),
        }
    }
    say(format!(
        "{} approvals returned in {approve_seconds:.1} s ({} refused); waiting for the worker Pods",
        approvals.len(),
        approval_errors.len()
    ));

    let pods_result = wait_for(
        "the next worker Pod of every approved run",
        config.timeout,
        || {
            check(&mut bed)?;
            let missing = approvals
                .iter()
                .filter(|(pod, _, _)| seen.pod_seen(pod).is_none())
                .count();
            Ok((missing > 0).then(|| format!("{missing}/{} missing", approvals.len())))
        },
    )
    .await;
    let cpu = cpu.finish();
    stop.store(true, Ordering::Relaxed);
    let (live_samples, live_errors) = live.await.unwrap_or_default();
    baseline_errors += live_errors;
    pods_result?;
    say("every next worker Pod created; waiting for the runs to finish".into());

    let approved: Vec<String> = approvals.iter().map(|(_, run, _)| run.clone()).collect();
    wait_for("every approved run to finish", config.timeout, || {
        check(&mut bed)?;
        let (done, _) = bed.finished(&approved);
        Ok((done < approved.len()).then(|| format!("{done}/{} finished", approved.len())))
    })
    .await?;
    let runs_seen = seen.runs();
    let (_, finished_at) = bed.finished(&approved);
    let complete_seconds = finished_at.map_or(0.0, |at| (at - burst).as_secs_f64());
    // Let the last Events and status writes land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let controller_memory = match &bed.controller {
        Some(controller) => controller.process.memory()?,
        None => Memory::default(),
    };
    let tool_calls = tools.request_count() as u64 - calls_before;

    let starts: Vec<(String, Instant)> = approvals
        .iter()
        .map(|(pod, _, at)| (pod.clone(), *at))
        .collect();
    let (latency_ms, early_pods) = latencies(&seen, &starts, Duration::from_secs(1)).await;
    let approved_at: Vec<(String, Instant)> = approvals
        .iter()
        .map(|(_, run, at)| (run.clone(), *at))
        .collect();
    let (to_resumed, resumed_to_pod) = phases(&seen, &approved_at);
    let (live_ms, _) = latencies(&seen, &live_samples, Duration::from_secs(120)).await;
    let requests = count_audit_since(
        &cluster.env.audit_log,
        audit_offset,
        ns.controller_username(),
    )
    .await?;
    let events_after = controller_events(cluster, &ns.name).await?;
    let pods_seen = lock(&seen.pods).clone();
    let pod_creates = pods_seen
        .iter()
        .filter(|(name, at)| name.starts_with(RUN_PREFIX) && **at >= burst)
        .count() as u64;

    // A fresh controller with every run of the cycle present: how long until it is ready.
    let ready_again = match driver {
        Driver::Ours => {
            bed.stop_controller().await;
            let (mut controller, started) =
                Controller::start(config, ns, "controller-restarted.log").await?;
            controller.wait_ready(config.timeout).await?;
            let seconds = started.elapsed().as_secs_f64();
            let memory = controller.process.memory()?;
            let caches = controller.cache_sync_times();
            controller.process.stop().await;
            Some(ReadyAgain {
                seconds,
                memory,
                caches,
            })
        }
        Driver::Ideal => None,
    };
    bed.stop_controller().await;
    let ideal_writes = ideal.as_ref().map(IdealController::writes);
    drop(ideal);
    bed.kubelet.stop().await;

    let succeeded = runs_seen
        .values()
        .filter(|s| s.terminal.is_some_and(|(_, ok)| ok))
        .count();
    let failed = runs_seen
        .values()
        .filter(|s| s.terminal.is_some_and(|(_, ok)| !ok))
        .count();
    let report = CycleReport {
        runs: n,
        halted: halted.len(),
        approved: approvals.len(),
        approval_errors,
        succeeded,
        failed,
        halt_seconds,
        approve_seconds,
        latency: Percentiles::of(&latency_ms),
        to_resumed: Percentiles::of(&to_resumed),
        resumed_to_pod: Percentiles::of(&resumed_to_pod),
        early_pods,
        baseline: Percentiles::of(&live_ms),
        baseline_quiet: Percentiles::of(&quiet_ms),
        baseline_errors,
        complete_seconds,
        requests,
        pod_creates,
        event_writes: event_writes_between(
            &event_writes(&events_before, EVENT_REPORTER),
            &event_writes(&events_after, EVENT_REPORTER),
        ),
        completion_event_writes: event_writes_between(
            &event_writes_where(&events_before, EVENT_REPORTER, is_completion_reason),
            &event_writes_where(&events_after, EVENT_REPORTER, is_completion_reason),
        ),
        tool_calls,
        cpu: Some(cpu),
        controller_memory,
        ready_again,
        ideal_writes,
        ideal: None,
        ideal_first: false,
    };
    say(format!(
        "done: p99 {} (baseline {}), {} runs/s, {} writes per cycle, controller peak {}",
        report.latency.map_or("n/a".into(), |p| ms(p.p99)),
        report.baseline.map_or("n/a".into(), |p| ms(p.p99)),
        opt(report.runs_per_second(), ""),
        opt(report.writes_per_cycle(), ""),
        mib(report.controller_memory.peak_kib)
    ));
    Ok(report)
}

/// The processes on the approval path: the control plane's, our controller (when it runs), the
/// dev kubelet with the workers it reaped, and this process (the approvals, the watches, the
/// baseline and, in the ideal's cycle, the ideal controller).
fn path_probes(config: &BenchConfig, bed: &Bed) -> Vec<Probe> {
    let mut probes = control_plane_probes(&config.cluster_dir);
    let probe = |role: &str, pid: Option<u32>, with_children: bool| {
        pid.map(|pid| Probe {
            role: role.to_owned(),
            pid,
            with_children,
        })
    };
    probes.extend(probe(
        "controller",
        bed.controller.as_ref().and_then(|c| c.process.pid()),
        false,
    ));
    probes.extend(probe("dev-kubelet+workers", bed.kubelet.pid(), true));
    probes.extend(probe("bench", Some(std::process::id()), false));
    probes
}
