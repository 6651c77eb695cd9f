//! One approval cycle: N runs halt, are approved in one burst, and resume.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agentrun::crd::{AgentRun, ApprovalRequest};
use agentrun_testkit::tool_server::ToolServer;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::audit::{
    audit_size, controller_events, count_audit_since, event_writes, event_writes_between,
    event_writes_where, is_completion_reason,
};
use crate::baseline::{baseline_during, baseline_sample};
use crate::cluster::{BenchNamespace, Cluster, client_from};
use crate::error::kube_error;
use crate::objects::{create_agent, run_name, run_object};
use crate::observe::{Observations, latencies, lock, watch_pods, watch_runs};
use crate::process::{ChildProcess, Controller};
use crate::report::{CycleReport, mib, ms, opt};
use crate::run::{Progress, wait_for};
use crate::stats::Percentiles;
use crate::{
    APPROVER, BASELINE_CONFIGMAPS, BenchConfig, BenchError, EVENT_REPORTER, RUN_PREFIX,
    TOOL_CALL_ID,
};

/// One approval cycle of `n` runs in `ns`.
pub(crate) async fn cycle(
    config: &BenchConfig,
    cluster: &Cluster,
    tools: &ToolServer,
    progress: &Progress,
    ns: &BenchNamespace,
    n: usize,
) -> Result<CycleReport, BenchError> {
    let say = |m: String| progress.say(format!("N={n}: {m}"));
    create_agent(cluster, &ns.name, tools).await?;
    let maps: Api<ConfigMap> = Api::namespaced(cluster.admin.clone(), &ns.name);
    for i in 0..BASELINE_CONFIGMAPS {
        let map: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("baseline-{i}")}, "data": {"seq": "0"}
        }))
        .unwrap_or_default();
        maps.create(&PostParams::default(), &map)
            .await
            .map_err(kube_error("creating the baseline ConfigMaps"))?;
    }

    let seen = Arc::new(Observations::default());
    let _pod_watch = watch_pods(cluster.admin_client().await?, &ns.name, seen.clone());
    let _run_watch = watch_runs(cluster.admin_client().await?, &ns.name, seen.clone());
    wait_for("the benchmark's watches", Duration::from_secs(60), || {
        let ready =
            seen.pods_synced.load(Ordering::Relaxed) && seen.runs_synced.load(Ordering::Relaxed);
        Ok((!ready).then(|| "not synced".to_owned()))
    })
    .await?;

    let rust_log = std::env::var_os("RUST_LOG").unwrap_or_else(|| "warn".into());
    let pod_dir = ns.dir.join("pods");
    let mut kubelet = ChildProcess::spawn(
        "dev kubelet",
        &config.dev_kubelet_binary,
        &[
            "--agentrun-binary",
            &config.agentrun_binary.to_string_lossy(),
            "--namespace",
            &ns.name,
            "--work-dir",
            &pod_dir.to_string_lossy(),
            "--max-pods",
            &config.kubelet_max_pods.to_string(),
        ],
        &[
            ("KUBECONFIG", cluster.admin_kubeconfig.as_os_str()),
            ("RUST_LOG", rust_log.as_os_str()),
        ],
        ns.dir.join("dev-kubelet.log"),
    )?;
    let (mut controller, _) = Controller::start(config, ns, "controller.log").await?;
    controller.wait_ready(config.timeout).await?;
    say("controller ready; creating runs".into());

    let names: Vec<String> = (0..n).map(run_name).collect();
    let runs: Api<AgentRun> = Api::namespaced(cluster.admin.clone(), &ns.name);
    let created = Instant::now();
    // Runs are created in waves, at most two waves in flight before they halt: this bounds the
    // worker processes of step 0 that run at once (the dev kubelet runs each Pod at once).
    let wave = (config.concurrency * 4).max(1);
    for (index, chunk) in names.chunks(wave).enumerate() {
        let started = index * wave;
        wait_for("runs to halt before the next wave", config.timeout, || {
            controller.process.check_alive()?;
            kubelet.check_alive()?;
            let runs = seen.runs();
            let done = names[..started]
                .iter()
                .filter(|r| {
                    runs.get(*r)
                        .is_some_and(|s| s.awaiting.is_some() || s.terminal.is_some())
                })
                .count();
            Ok((started - done > wave).then(|| format!("{done}/{started} halted")))
        })
        .await?;
        stream::iter(chunk)
            .map(|name| {
                let runs = &runs;
                async move {
                    let run = run_object(&ns.name, name)?;
                    runs.create(&PostParams::default(), &run)
                        .await
                        .map_err(kube_error(format!("creating AgentRun {name}")))
                }
            })
            .buffer_unordered(config.concurrency)
            .try_for_each(|_| futures::future::ready(Ok(())))
            .await?;
    }
    say(format!(
        "{n} runs created in {:.1} s (in waves of {wave}); waiting for them to halt",
        created.elapsed().as_secs_f64()
    ));

    wait_for("every run to halt for approval", config.timeout, || {
        controller.process.check_alive()?;
        kubelet.check_alive()?;
        let runs = seen.runs();
        let done = names
            .iter()
            .filter(|r| {
                runs.get(*r)
                    .is_some_and(|s| s.awaiting.is_some() || s.terminal.is_some())
            })
            .count();
        Ok((done < n).then(|| format!("{done}/{n} halted or finished")))
    })
    .await?;
    let halt_seconds = created.elapsed().as_secs_f64();
    let runs_seen = seen.runs();
    let halted: Vec<String> = names
        .iter()
        .filter(|r| {
            runs_seen
                .get(*r)
                .is_some_and(|s| s.awaiting.is_some() && s.terminal.is_none())
        })
        .cloned()
        .collect();
    if halted.is_empty() {
        return Err(BenchError::NothingToMeasure(format!(
            "no run halted for approval; see {}",
            ns.dir.display()
        )));
    }
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
    let decision = json!({"spec": {
        "decision": "Approved",
        "approverId": APPROVER,
        "reason": "benchmark: approved in one burst",
    }});
    let outcomes: Vec<(String, Result<Instant, kube::Error>)> = stream::iter(halted.iter())
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
    let approve_seconds = burst.elapsed().as_secs_f64();
    let mut approvals = Vec::new();
    let mut approval_errors = Vec::new();
    for (run, result) in outcomes {
        match result {
            Ok(at) => approvals.push((agentrun::crd::worker_pod_name(&run, 1, 0), run, at)),
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
            controller.process.check_alive()?;
            let missing = approvals
                .iter()
                .filter(|(pod, _, _)| seen.pod_seen(pod).is_none())
                .count();
            Ok((missing > 0).then(|| format!("{missing}/{} missing", approvals.len())))
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let (live_samples, live_errors) = live.await.unwrap_or_default();
    baseline_errors += live_errors;
    pods_result?;
    say("every next worker Pod created; waiting for the runs to finish".into());

    wait_for("every approved run to finish", config.timeout, || {
        controller.process.check_alive()?;
        kubelet.check_alive()?;
        let runs = seen.runs();
        let done = approvals
            .iter()
            .filter(|(_, run, _)| runs.get(run).is_some_and(|s| s.terminal.is_some()))
            .count();
        Ok((done < approvals.len()).then(|| format!("{done}/{} finished", approvals.len())))
    })
    .await?;
    let runs_seen = seen.runs();
    let finished_at = approvals
        .iter()
        .filter_map(|(_, run, _)| runs_seen.get(run)?.terminal)
        .filter(|(_, ok)| *ok)
        .map(|(at, _)| at)
        .max();
    let complete_seconds = finished_at.map_or(0.0, |at| (at - burst).as_secs_f64());
    // Let the last Events and status writes land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let controller_memory = controller.process.memory()?;
    let tool_calls = tools.request_count() as u64 - calls_before;

    let starts: Vec<(String, Instant)> = approvals
        .iter()
        .map(|(pod, _, at)| (pod.clone(), *at))
        .collect();
    let (latency_ms, early_pods) = latencies(&seen, &starts, Duration::from_secs(1)).await;
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

    controller.process.stop().await;
    kubelet.stop().await;

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
        controller_memory,
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
