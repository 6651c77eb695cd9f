//! One namespace of an approval cycle ([`Lane`]): its bed, its runs halted by our controller, who
//! acts on their approvals, and what it measured once the burst is over.

use std::time::{Duration, Instant};

use agentrun_testkit::tool_server::ToolServer;
use k8s_openapi::api::events::v1::Event as KubeEvent;

use crate::audit::{
    POD_CREATES, controller_events, count_audit_since, event_writes, event_writes_between,
    event_writes_where, is_completion_reason,
};
use crate::bed::Bed;
use crate::cluster::{BenchNamespace, Cluster};
use crate::cpu::{CpuClock, CpuUse, Probe, control_plane_probes};
use crate::cycle::Driver;
use crate::ideal::{IdealController, check_ideal, start_ideal};
use crate::objects::tool_path;
use crate::observe::{latencies, lock, phases};
use crate::process::{Controller, CpuPriority, Memory};
use crate::report::{CycleReport, IdealMeasured, ReadyAgain, mib, ms, opt};
use crate::run::Progress;
use crate::stats::Percentiles;
use crate::{BenchConfig, BenchError, EVENT_REPORTER, RUN_PREFIX};

/// What the lanes of one burst share.
pub(crate) struct Shared {
    pub(crate) burst: Instant,
    pub(crate) audit_offset: u64,
    pub(crate) approve_seconds: f64,
    pub(crate) baseline: Option<Percentiles>,
    pub(crate) baseline_quiet: Option<Percentiles>,
    pub(crate) baseline_errors: usize,
}

/// A lane's counters just before the burst.
pub(crate) struct Before {
    pub(crate) events: Vec<KubeEvent>,
    pub(crate) tool_calls: usize,
}

/// One namespace of an approval cycle: its runs, halted by our controller, and who acts on their
/// approvals.
pub(crate) struct Lane {
    pub(crate) label: String,
    pub(crate) progress: Progress,
    pub(crate) ns: BenchNamespace,
    pub(crate) n: usize,
    pub(crate) driver: Driver,
    pub(crate) bed: Bed,
    pub(crate) ideal: Option<IdealController>,
    pub(crate) halted: Vec<String>,
    pub(crate) halt_seconds: f64,
    /// (next worker Pod, run, when alice's patch returned)
    pub(crate) approvals: Vec<(String, String, Instant)>,
    pub(crate) approval_errors: Vec<String>,
}

impl Lane {
    /// Starts the lane's bed, creates and halts its runs, and hands them to the ideal controller
    /// when it is the ideal's lane.
    pub(crate) async fn prepare(
        config: &BenchConfig,
        cluster: &Cluster,
        tools: &ToolServer,
        progress: &Progress,
        (ns, driver): (&BenchNamespace, Driver),
        n: usize,
    ) -> Result<Lane, BenchError> {
        let label = match driver {
            Driver::Ours => format!("N={n}"),
            Driver::Ideal => format!("N={n} ideal"),
        };
        let mut lane = Lane {
            label,
            progress: *progress,
            ns: ns.clone(),
            n,
            driver,
            bed: Bed::start(config, cluster, tools, ns, CpuPriority::Normal).await?,
            ideal: None,
            halted: vec![],
            halt_seconds: 0.0,
            approvals: vec![],
            approval_errors: vec![],
        };
        lane.say("controller ready; creating runs".into());
        let halted = lane.bed.create_and_halt(config, cluster, ns, n).await?;
        (lane.halt_seconds, lane.halted) = (halted.seconds, halted.runs);
        if driver == Driver::Ideal {
            lane.bed.stop_controller().await;
            lane.ideal = Some(start_ideal(ns).await?);
            lane.say("our controller stopped; the ideal controller acts on the approvals".into());
        }
        lane.say(format!(
            "{}/{n} halted in {:.1} s",
            lane.halted.len(),
            lane.halt_seconds
        ));
        Ok(lane)
    }

    pub(crate) fn say(&self, message: String) {
        self.progress.say(format!("{}: {message}", self.label));
    }

    pub(crate) fn check(&mut self) -> Result<(), BenchError> {
        self.bed.check_alive()?;
        check_ideal(self.ideal.as_ref())
    }

    pub(crate) fn approved(&self) -> Vec<String> {
        self.approvals
            .iter()
            .map(|(_, run, _)| run.clone())
            .collect()
    }

    /// Counts and times what the lane's controller did, measures how fast a fresh controller is
    /// ready with the lane's runs (ours), stops the lane's processes and reports.
    pub(crate) async fn finish(
        mut self,
        config: &BenchConfig,
        cluster: &Cluster,
        tools: &ToolServer,
        shared: &Shared,
        before: Before,
        cpu: Option<CpuUse>,
    ) -> Result<CycleReport, BenchError> {
        let (ns, seen, burst) = (&self.ns, self.bed.seen.clone(), shared.burst);
        let approved = self.approved();
        let runs_seen = seen.runs();
        let (_, finished_at) = self.bed.finished(&approved);
        let complete_seconds = finished_at.map_or(0.0, |at| (at - burst).as_secs_f64());
        let controller_memory = match &self.bed.controller {
            Some(controller) => controller.process.memory()?,
            None => Memory::default(),
        };
        let tool_calls = (tools.requests_to(&tool_path(&ns.name)).len() - before.tool_calls) as u64;
        let starts: Vec<(String, Instant)> = self
            .approvals
            .iter()
            .map(|(pod, _, at)| (pod.clone(), *at))
            .collect();
        let (latency_ms, early_pods) = latencies(&seen, &starts, Duration::from_secs(1)).await;
        let approved_at: Vec<(String, Instant)> = self
            .approvals
            .iter()
            .map(|(_, run, at)| (run.clone(), *at))
            .collect();
        let (to_resumed, resumed_to_pod) = phases(&seen, &approved_at);
        let mut requests = count_audit_since(
            &cluster.env.audit_log,
            shared.audit_offset,
            ns.controller_username(),
        )
        .await?;
        let events_after = controller_events(cluster, &ns.name).await?;
        // Every Pod create request, a repeated one answered 409 included, when the audit log
        // holds them (the local control plane logs them); else the Pods that came to exist.
        let pod_creates = requests.by_kind.remove(POD_CREATES).unwrap_or_else(|| {
            lock(&seen.pods)
                .iter()
                .filter(|(name, at)| name.starts_with(RUN_PREFIX) && **at >= burst)
                .count() as u64
        });

        // A fresh controller with every run of the cycle present: how long until it is ready.
        let ready_again = match self.driver {
            Driver::Ours => {
                self.bed.stop_controller().await;
                let (mut controller, started) =
                    Controller::start(config, ns, "controller-restarted.log").await?;
                let mut probes = control_plane_probes(&config.cluster_dir);
                probes.extend(controller.process.pid().map(|pid| Probe {
                    role: "controller".into(),
                    pid,
                    with_children: false,
                }));
                let cpu = CpuClock::start(probes);
                controller.wait_ready(config.timeout).await?;
                let seconds = started.elapsed().as_secs_f64();
                let cpu = Some(cpu.finish());
                let memory = controller.process.memory()?;
                let caches = controller.cache_sync_times();
                controller.process.stop().await;
                Some(ReadyAgain {
                    seconds,
                    memory,
                    caches,
                    cpu,
                })
            }
            Driver::Ideal => None,
        };
        self.bed.stop_controller().await;
        let ideal_writes = self.ideal.as_ref().map(IdealController::writes);
        drop(self.ideal.take());
        let (label, progress) = (self.label.clone(), self.progress);
        self.bed.kubelet.stop().await;

        let ended = |ok: bool| {
            runs_seen
                .values()
                .filter(|s| s.terminal.is_some_and(|(_, o)| o == ok))
                .count()
        };
        let report = CycleReport {
            runs: self.n,
            halted: self.halted.len(),
            approved: self.approvals.len(),
            approval_errors: self.approval_errors.clone(),
            succeeded: ended(true),
            failed: ended(false),
            halt_seconds: self.halt_seconds,
            approve_seconds: shared.approve_seconds,
            latency: Percentiles::of(&latency_ms),
            to_resumed: Percentiles::of(&to_resumed),
            resumed_to_pod: Percentiles::of(&resumed_to_pod),
            early_pods,
            baseline: shared.baseline,
            baseline_quiet: shared.baseline_quiet,
            baseline_errors: shared.baseline_errors,
            complete_seconds,
            requests,
            pod_creates,
            event_writes: event_writes_between(
                &event_writes(&before.events, EVENT_REPORTER),
                &event_writes(&events_after, EVENT_REPORTER),
            ),
            completion_event_writes: event_writes_between(
                &event_writes_where(&before.events, EVENT_REPORTER, is_completion_reason),
                &event_writes_where(&events_after, EVENT_REPORTER, is_completion_reason),
            ),
            tool_calls,
            cpu,
            controller_memory,
            ready_again,
            ideal_writes,
            ideal: None,
            ideal_measured: IdealMeasured::After,
        };
        progress.say(format!(
            "{label}: done: p99 {} (baseline {}), {} runs/s, {} writes per cycle, controller peak {}",
            report.latency.map_or("n/a".into(), |p| ms(p.p99)),
            report.baseline.map_or("n/a".into(), |p| ms(p.p99)),
            opt(report.runs_per_second(), ""),
            opt(report.writes_per_cycle(), ""),
            mib(report.controller_memory.peak_kib)
        ));
        Ok(report)
    }
}
