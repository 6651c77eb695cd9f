//! Single approvals on an idle system: N runs halt, then alice approves them one at a time, each
//! after the previous run finished; approval -> next worker Pod, against one patch + one create
//! timed the same way, also one at a time. Each baseline sample follows an approval, so the two
//! meet the same machine (one taken after all the approvals would meet a quieter one).

use std::time::{Duration, Instant};

use agentrun::crd::{ApprovalRequest, approval_request_name, worker_pod_name};
use agentrun_testkit::tool_server::ToolServer;
use kube::api::{Api, Patch, PatchParams};

use crate::baseline::baseline_sample;
use crate::bed::Bed;
use crate::cluster::{BenchNamespace, Cluster, client_from};
use crate::cpu::{CpuClock, control_plane_probes};
use crate::cycle::Driver;
use crate::error::kube_error;
use crate::ideal::{check_ideal, start_ideal};
use crate::objects::approval_patch;
use crate::observe::{latencies, phases};
use crate::process::CpuPriority;
use crate::report::{SingleReport, ms};
use crate::run::{Progress, wait_for};
use crate::stats::Percentiles;
use crate::{APPROVER, BenchConfig, BenchError, TOOL_CALL_ID};

/// How long the system is left alone before each approval and each baseline sample.
const SETTLE: Duration = Duration::from_millis(300);

/// `n` single approvals and `n` single baseline samples in `ns`.
pub(crate) async fn single(
    config: &BenchConfig,
    cluster: &Cluster,
    tools: &ToolServer,
    progress: &Progress,
    ns: &BenchNamespace,
    n: usize,
    driver: Driver,
) -> Result<SingleReport, BenchError> {
    let label = match driver {
        Driver::Ours => "single",
        Driver::Ideal => "single ideal",
    };
    let say = |m: String| progress.say(format!("{label}: {m}"));
    // The approved run's worker starts the moment its Pod exists, that is within the measured
    // time, and on a cluster it would start on another node; here it shares the two cores with
    // the API server, the controller and the benchmark's watch, which the baseline's Pods (never
    // run) do not. At the lowest priority it takes only the CPU they leave.
    let mut bed = Bed::start(config, cluster, tools, ns, CpuPriority::Lowest).await?;
    let halted = bed.create_and_halt(config, cluster, ns, n).await?;
    let ideal = match driver {
        Driver::Ours => None,
        Driver::Ideal => {
            bed.stop_controller().await;
            Some(start_ideal(ns).await?)
        }
    };
    say(format!(
        "{} runs halted; approving them one at a time as {APPROVER}, each followed by a baseline sample",
        halted.runs.len()
    ));
    let requests: Api<ApprovalRequest> = Api::namespaced(cluster.alice.clone(), &ns.name);
    let baseline = client_from(&ns.baseline_kubeconfig).await?;
    let decision = approval_patch();
    let cpu = CpuClock::start(control_plane_probes(&config.cluster_dir));
    let (mut starts, mut approved_at, mut samples) = (Vec::new(), Vec::new(), Vec::new());
    for (seq, run) in halted.runs.iter().enumerate() {
        tokio::time::sleep(SETTLE).await;
        let name = approval_request_name(run, TOOL_CALL_ID);
        requests
            .patch(&name, &PatchParams::default(), &Patch::Merge(&decision))
            .await
            .map_err(kube_error(format!("approving {name}")))?;
        let at = Instant::now();
        starts.push((worker_pod_name(run, 1, 0), at));
        approved_at.push((run.clone(), at));
        let one = [run.clone()];
        wait_for("the approved run to finish", config.timeout, || {
            bed.check_alive()?;
            check_ideal(ideal.as_ref())?;
            let (done, _) = bed.finished(&one);
            Ok((done == 0).then(|| format!("{run} running")))
        })
        .await?;

        tokio::time::sleep(SETTLE).await;
        let pod = format!("baseline-single-{seq:05}");
        let at = baseline_sample(&baseline, &ns.name, seq, &pod)
            .await
            .map_err(kube_error("a baseline sample"))?;
        let seen = bed.seen.clone();
        wait_for("the baseline Pod", config.timeout, || {
            Ok(seen.pod_seen(&pod).is_none().then(|| pod.clone()))
        })
        .await?;
        samples.push((pod, at));
    }
    let cpu = cpu.finish();
    let (latency_ms, _) = latencies(&bed.seen, &starts, Duration::from_secs(1)).await;
    let (baseline_ms, _) = latencies(&bed.seen, &samples, Duration::from_secs(1)).await;
    let (to_resumed, resumed_to_pod) = phases(&bed.seen, &approved_at);
    let (finished, _) = bed.finished(&halted.runs);
    drop(ideal);
    bed.stop_controller().await;
    bed.kubelet.stop().await;
    let report = SingleReport {
        approvals: starts.len(),
        finished,
        latency: Percentiles::of(&latency_ms),
        baseline: Percentiles::of(&baseline_ms),
        to_resumed: Percentiles::of(&to_resumed),
        resumed_to_pod: Percentiles::of(&resumed_to_pod),
        ideal: None,
        cpu: Some(cpu),
    };
    say(format!(
        "done: p99 {} (one patch + create {})",
        report.latency.map_or("n/a".into(), |p| ms(p.p99)),
        report.baseline.map_or("n/a".into(), |p| ms(p.p99)),
    ));
    Ok(report)
}
