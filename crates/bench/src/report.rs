//! What a benchmark measured, and its side-by-side table against the goals.

use std::fmt::Write as _;

use crate::audit::RequestCounts;
use crate::cpu::CpuUse;
use crate::process::Memory;
use crate::stats::{Percentiles, ratio};
use crate::table::Table;
use crate::{
    GOAL_IDEAL_P99_RATIO, GOAL_IDEAL_RUNS_PER_SECOND, GOAL_IDLE_RSS_MIB, GOAL_P99_RATIO,
    GOAL_READY_SECONDS, GOAL_SINGLE_P99_RATIO, GOAL_WRITES_PER_CYCLE,
};

/// The run count at which the ideal-controller goals apply (and above).
const IDEAL_GOAL_AT: usize = 1000;

/// The figures of one approval cycle of N runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CycleReport {
    /// Runs created.
    pub runs: usize,
    /// Runs that reached AwaitingApproval.
    pub halted: usize,
    /// Approvals that went through.
    pub approved: usize,
    /// Approvals the API server refused (with the first error).
    pub approval_errors: Vec<String>,
    /// Approved runs that reached Succeeded.
    pub succeeded: usize,
    /// Runs that failed (before or after the approval).
    pub failed: usize,
    /// Seconds from the first create to every run halted (or failed).
    pub halt_seconds: f64,
    /// Seconds the approval burst took (all patches returned).
    pub approve_seconds: f64,
    /// Approval → next worker Pod, milliseconds.
    pub latency: Option<Percentiles>,
    /// Approval -> the run first seen with its new state (the decision applied), ms.
    pub to_resumed: Option<Percentiles>,
    /// The run first seen with its new state -> its next worker Pod first seen, ms.
    pub resumed_to_pod: Option<Percentiles>,
    /// Pods seen before their approval's patch returned (counted as 0 ms).
    pub early_pods: usize,
    /// The baseline sampled during the approval burst (same moment), milliseconds.
    pub baseline: Option<Percentiles>,
    /// The baseline sampled just before the burst (N runs pending, controller idle), ms.
    pub baseline_quiet: Option<Percentiles>,
    /// Baseline samples that failed.
    pub baseline_errors: usize,
    /// Seconds from the burst start to the last approved run finished.
    pub complete_seconds: f64,
    /// The controller's `agentrun.dev` requests during the cycle (from the audit log).
    pub requests: RequestCounts,
    /// Worker Pods the controller created during the cycle.
    pub pod_creates: u64,
    /// Event writes of the controller during the cycle.
    pub event_writes: u64,
    /// Of those, the Events of runs finishing (`Succeeded`, `Failed`).
    pub completion_event_writes: u64,
    /// Tool calls the loopback tool server received during the cycle.
    pub tool_calls: u64,
    /// CPU of each process on the path from the burst's start until every next Pod was seen.
    pub cpu: Option<CpuUse>,
    /// The controller's memory at the end of the cycle (ours only).
    pub controller_memory: Memory,
    /// A fresh controller started after the cycle, with every run present (ours only).
    pub ready_again: Option<ReadyAgain>,
    /// The writes the ideal controller counted itself (the ideal replay only).
    pub ideal_writes: Option<u64>,
    /// The same cycle with the ideal controller acting on the approvals, if it was replayed.
    pub ideal: Option<Box<CycleReport>>,
    /// When the ideal's cycle ran, against ours.
    pub ideal_measured: IdealMeasured,
}

/// When the ideal controller's cycle of a pair was measured, against ours.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdealMeasured {
    /// Right after ours.
    #[default]
    After,
    /// Right before ours (every other pair).
    Before,
    /// In the same approval burst, each controller with its own namespace and dev kubelet
    /// (`--side-by-side`).
    SameBurst,
}

/// A fresh controller started after a cycle, with every run present.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReadyAgain {
    /// Seconds from its start until `/readyz` answered 200 (every cache synced).
    pub seconds: f64,
    /// Its memory then.
    pub memory: Memory,
    /// When each cache synced (milliseconds after its watches started), from its log.
    pub caches: Vec<(String, u64)>,
    /// The CPU the control plane and the fresh controller spent from its start until ready.
    pub cpu: Option<CpuUse>,
}

impl CycleReport {
    /// Runs finished per second, from the burst start.
    pub fn runs_per_second(&self) -> Option<f64> {
        (self.complete_seconds > 0.0 && self.succeeded > 0)
            .then(|| self.succeeded as f64 / self.complete_seconds)
    }

    fn per_cycle(&self, n: u64) -> Option<f64> {
        (self.approved > 0).then(|| n as f64 / self.approved as f64)
    }

    /// Every API write of the controller per approved run, from the approval to the run's end
    /// (status patches, Pod creates, Events).
    pub fn writes_per_run(&self) -> Option<f64> {
        self.per_cycle(self.requests.writes() + self.pod_creates + self.event_writes)
    }

    /// The writes that finish a run (its final status and Event, the deletion of its worker Pods),
    /// per approved run.
    pub fn completion_writes_per_run(&self) -> Option<f64> {
        self.per_cycle(self.requests.completion_writes() + self.completion_event_writes)
    }

    /// The API writes of the controller per approval cycle: from the decision to the resumed
    /// worker Pod (the request's resolution, the run's new state, the Pod, the decision's Event),
    /// that is every write but those that finish the run.
    pub fn writes_per_cycle(&self) -> Option<f64> {
        self.per_cycle(
            self.requests.writes() - self.requests.completion_writes()
                + self.pod_creates
                + self.event_writes
                - self.completion_event_writes,
        )
    }

    /// Every API request of the controller per approval cycle (reads and writes).
    pub fn requests_per_cycle(&self) -> Option<f64> {
        self.per_cycle(self.requests.total() + self.pod_creates + self.event_writes)
    }
}

/// Single approvals on an idle system, one at a time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SingleReport {
    /// Approvals made.
    pub approvals: usize,
    /// Runs that finished.
    pub finished: usize,
    /// Approval -> next worker Pod, milliseconds.
    pub latency: Option<Percentiles>,
    /// One patch + one create, one at a time, timed the same way, milliseconds.
    pub baseline: Option<Percentiles>,
    /// Approval -> the run first seen with its new state, ms.
    pub to_resumed: Option<Percentiles>,
    /// The run first seen with its new state -> its next worker Pod first seen, ms.
    pub resumed_to_pod: Option<Percentiles>,
    /// The same single approvals acted on by the ideal controller, if replayed.
    pub ideal: Option<Box<SingleReport>>,
    /// What the control plane spent while the approvals and their baseline samples were made.
    pub cpu: Option<CpuUse>,
}

impl SingleReport {
    /// The p99 ratio against one patch + create.
    pub fn p99_ratio(&self) -> Option<f64> {
        ratio(self.latency?.p99, self.baseline?.p99)
    }

    /// Its own table: metric, value, goal, met.
    pub fn table(&self) -> Table {
        let mut table = Table::new(
            ["single approvals on an idle system", "value", "goal", "met"]
                .map(str::to_owned)
                .to_vec(),
        );
        table.row(vec![
            "approvals made one at a time / runs finished".into(),
            format!("{} / {}", self.approvals, self.finished),
            String::new(),
            String::new(),
        ]);
        table.row(vec![
            "approval -> worker Pod p50 / p99".into(),
            p50_p99(self.latency),
            String::new(),
            String::new(),
        ]);
        table.row(vec![
            "one patch + create p50 / p99".into(),
            p50_p99(self.baseline),
            String::new(),
            String::new(),
        ]);
        table.row(vec![
            "  approval -> run state written p50 / p99".into(),
            p50_p99(self.to_resumed),
            String::new(),
            String::new(),
        ]);
        table.row(vec![
            "  run state written -> worker Pod p50 / p99".into(),
            p50_p99(self.resumed_to_pod),
            String::new(),
            String::new(),
        ]);
        if let Some(cpu) = &self.cpu {
            table.row(vec![
                "control plane CPU seconds over the approvals and samples".into(),
                cpu.summary(),
                String::new(),
                String::new(),
            ]);
        }
        if let Some(ideal) = self.ideal.as_deref() {
            for (name, value) in [
                (
                    "ideal controller: approval -> worker Pod p50 / p99",
                    ideal.latency,
                ),
                (
                    "  approval -> run state written p50 / p99",
                    ideal.to_resumed,
                ),
                (
                    "  run state written -> worker Pod p50 / p99",
                    ideal.resumed_to_pod,
                ),
            ] {
                table.row(vec![
                    name.into(),
                    p50_p99(value),
                    String::new(),
                    String::new(),
                ]);
            }
            table.row(vec![
                "ratio ours/ideal p99 (single approvals)".into(),
                times(
                    self.latency
                        .zip(ideal.latency)
                        .and_then(|(o, i)| ratio(o.p99, i.p99)),
                ),
                String::new(),
                String::new(),
            ]);
        }
        let ratio = self.p99_ratio();
        table.row(vec![
            "ratio single approval / patch+create p99".into(),
            times(ratio),
            format!("<= {GOAL_SINGLE_P99_RATIO}x"),
            verdict(&[(
                "single".to_owned(),
                ratio.map(|r| r <= GOAL_SINGLE_P99_RATIO),
            )]),
        ]);
        table
    }
}

/// The figures of the idle-runs memory measurement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IdleReport {
    /// Idle runs.
    pub runs: usize,
    /// Bytes of each run's stored RunState.
    pub state_bytes: usize,
    /// Seconds from the controller's start to its caches synced (`/readyz`).
    pub synced_seconds: f64,
    /// Memory when the caches synced.
    pub at_synced: Memory,
    /// Seconds observed after that.
    pub observe_seconds: f64,
    /// Memory after the observation.
    pub after_observe: Memory,
    /// When every run's ApprovalRequest was pending (settled), or when the wait for that ended.
    pub end: IdleEnd,
    /// The peak over the controller's life.
    pub peak_kib: u64,
}

/// The idle controller at the end of its settling wait.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IdleEnd {
    /// Seconds since the controller started.
    pub seconds: f64,
    /// ApprovalRequests pending then (`agentrun_pending_approvals`); settled when it equals the
    /// number of idle runs.
    pub pending: u64,
    /// The controller's memory then.
    pub memory: Memory,
}

/// Everything one `agentrun-bench` run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BenchReport {
    /// One per run count.
    pub cycles: Vec<CycleReport>,
    /// The idle measurement, if made.
    pub idle: Option<IdleReport>,
    /// The single approvals, if made.
    pub single: Option<SingleReport>,
    /// Worker Pods the dev kubelet ran at once (0: no limit).
    pub kubelet_max_pods: usize,
}

/// Whether a cycle meets a goal (`None`: not measured).
type GoalCheck = dyn Fn(&CycleReport) -> Option<bool>;

/// Adds a row of per-cycle cells: `(name, cell, goal, check)`.
type RowSink<'a> = dyn FnMut(&str, &dyn Fn(&CycleReport) -> String, &str, Option<&GoalCheck>) + 'a;

pub(crate) fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0} ms")
    } else {
        format!("{value:.1} ms")
    }
}

/// `p50 / p99` of `p`, or `n/a`.
fn p50_p99(p: Option<Percentiles>) -> String {
    match p {
        Some(p) => format!("{} / {}", ms(p.p50), ms(p.p99)),
        None => "n/a".into(),
    }
}

pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn times(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.2}x"))
}

pub(crate) fn opt(value: Option<f64>, unit: &str) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.2}{unit}"))
}

/// Whether a goal holds in each column: `yes`, `no (where)` or `n/a`.
fn verdict(checks: &[(String, Option<bool>)]) -> String {
    let measured: Vec<&(String, Option<bool>)> =
        checks.iter().filter(|(_, ok)| ok.is_some()).collect();
    if measured.is_empty() {
        return "n/a".into();
    }
    let failed: Vec<&str> = measured
        .iter()
        .filter(|(_, ok)| *ok == Some(false))
        .map(|(c, _)| c.as_str())
        .collect();
    if failed.is_empty() {
        "yes".into()
    } else {
        format!("no ({})", failed.join(", "))
    }
}

impl BenchReport {
    /// The side-by-side table: one column per run count, one for the idle runs, then the goal
    /// and whether it was met.
    pub fn table(&self) -> Table {
        let idle_title = self.idle.as_ref().map(|i| {
            format!(
                "idle {} x {} KiB",
                i.runs,
                (i.state_bytes as f64 / 1024.0).round()
            )
        });
        let mut header = vec!["metric".to_owned()];
        header.extend(self.cycles.iter().map(|c| format!("N={}", c.runs)));
        header.extend(idle_title.clone());
        header.extend(["goal".to_owned(), "met".to_owned()]);
        let mut table = Table::new(header);
        let dash = || "-".to_owned();
        let has_idle = self.idle.is_some();
        let cycle_row = |table: &mut Table,
                         name: &str,
                         cell: &dyn Fn(&CycleReport) -> String,
                         goal: &str,
                         check: Option<&GoalCheck>| {
            let mut row = vec![name.to_owned()];
            row.extend(self.cycles.iter().map(cell));
            if has_idle {
                row.push(dash());
            }
            row.push(goal.to_owned());
            row.push(match check {
                Some(check) => verdict(
                    &self
                        .cycles
                        .iter()
                        .map(|c| (format!("N={}", c.runs), check(c)))
                        .collect::<Vec<_>>(),
                ),
                None => String::new(),
            });
            table.row(row);
        };
        let pct = |p: Option<Percentiles>, f: fn(&Percentiles) -> f64| {
            p.as_ref().map_or_else(|| "n/a".into(), |p| ms(f(p)))
        };
        cycle_row(
            &mut table,
            "runs halted / approved / succeeded / failed",
            &|c| format!("{}/{}/{}/{}", c.halted, c.approved, c.succeeded, c.failed),
            "",
            None,
        );
        cycle_row(
            &mut table,
            "create -> all halted (in waves)",
            &|c| format!("{:.1} s", c.halt_seconds),
            "",
            None,
        );
        cycle_row(
            &mut table,
            "approval burst (all patches returned)",
            &|c| format!("{:.1} s", c.approve_seconds),
            "",
            None,
        );
        type Pick = fn(&Percentiles) -> f64;
        let picks: [(&str, Pick); 3] = [("p50", |p| p.p50), ("p95", |p| p.p95), ("p99", |p| p.p99)];
        for (name, pick) in picks {
            cycle_row(
                &mut table,
                &format!("approval -> worker Pod {name}"),
                &|c| pct(c.latency, pick),
                "",
                None,
            );
        }
        cycle_row(
            &mut table,
            "  approval -> run state written p50 / p99",
            &|c| p50_p99(c.to_resumed),
            "",
            None,
        );
        cycle_row(
            &mut table,
            "  run state written -> worker Pod p50 / p99",
            &|c| p50_p99(c.resumed_to_pod),
            "",
            None,
        );
        for (name, pick) in picks {
            cycle_row(
                &mut table,
                &format!("baseline patch+create {name} (same moment)"),
                &|c| pct(c.baseline, pick),
                "",
                None,
            );
        }
        for (name, pick) in picks {
            let ratio_of = move |c: &CycleReport| -> Option<f64> {
                ratio(pick(&c.latency?), pick(&c.baseline?))
            };
            let goal = move |c: &CycleReport| ratio_of(c).map(|r| r <= GOAL_P99_RATIO);
            let is_p99 = name == "p99";
            let check: Option<&GoalCheck> = if is_p99 { Some(&goal) } else { None };
            cycle_row(
                &mut table,
                &format!("ratio ours/baseline {name}"),
                &|c| times(ratio_of(c)),
                if is_p99 { "<= 2x at N=1000" } else { "" },
                check,
            );
        }
        cycle_row(
            &mut table,
            "baseline before burst p50 / p99",
            &|c| match c.baseline_quiet {
                Some(p) => format!("{} / {}", ms(p.p50), ms(p.p99)),
                None => "n/a".into(),
            },
            "",
            None,
        );
        cycle_row(
            &mut table,
            "ratio ours/baseline-before-burst p99",
            &|c| {
                times(
                    c.latency
                        .zip(c.baseline_quiet)
                        .and_then(|(l, b)| ratio(l.p99, b.p99)),
                )
            },
            "",
            None,
        );
        cycle_row(
            &mut table,
            "runs completed per second",
            &|c| opt(c.runs_per_second(), "/s"),
            "",
            None,
        );
        self.ideal_rows(&mut |name, cell, goal, check| {
            cycle_row(&mut table, name, cell, goal, check)
        });
        cycle_row(
            &mut table,
            "controller API writes per approval cycle",
            &|c| opt(c.writes_per_cycle(), ""),
            "<= 4",
            Some(&|c| c.writes_per_cycle().map(|w| w <= GOAL_WRITES_PER_CYCLE)),
        );
        cycle_row(
            &mut table,
            "  of which agentrun.dev / Pod / Event",
            &|c| {
                let per = |n: u64| opt(c.per_cycle(n), "");
                format!(
                    "{} / {} / {}",
                    per(c.requests.writes() - c.requests.completion_writes()),
                    per(c.pod_creates),
                    per(c.event_writes - c.completion_event_writes)
                )
            },
            "",
            None,
        );
        cycle_row(
            &mut table,
            "controller API writes finishing a run (status, Event, Pods)",
            &|c| opt(c.completion_writes_per_run(), ""),
            "",
            None,
        );
        cycle_row(
            &mut table,
            "controller API writes per approved run, in all",
            &|c| opt(c.writes_per_run(), ""),
            "",
            None,
        );
        cycle_row(
            &mut table,
            "controller API requests per approved run, in all",
            &|c| opt(c.requests_per_cycle(), ""),
            "",
            None,
        );
        cycle_row(
            &mut table,
            "controller peak RSS (VmHWM)",
            &|c| mib(c.controller_memory.peak_kib),
            "",
            None,
        );
        cycle_row(
            &mut table,
            "fresh controller ready with the N runs present",
            &|c| {
                c.ready_again.as_ref().map_or("n/a".into(), |r| {
                    format!("{:.1} s, {}", r.seconds, mib(r.memory.rss_kib))
                })
            },
            &format!("< {GOAL_READY_SECONDS:.0} s"),
            Some(&|c| {
                c.ready_again
                    .as_ref()
                    .map(|r| r.seconds < GOAL_READY_SECONDS)
            }),
        );
        cycle_row(
            &mut table,
            "fresh controller: each cache synced after (s)",
            &|c| {
                c.ready_again.as_ref().map_or("n/a".into(), |r| {
                    if r.caches.is_empty() {
                        return "n/a".into();
                    }
                    r.caches
                        .iter()
                        .map(|(cache, ms)| format!("{cache} {:.1}", *ms as f64 / 1000.0))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
            },
            "",
            None,
        );
        cycle_row(
            &mut table,
            "fresh controller: CPU seconds until ready",
            &|c| {
                c.ready_again
                    .as_ref()
                    .and_then(|r| r.cpu.as_ref())
                    .map_or("n/a".into(), CpuUse::summary)
            },
            "",
            None,
        );
        if let Some(idle) = &self.idle {
            let idle_row = |table: &mut Table, name: &str, value: String, ok: Option<bool>| {
                let mut row = vec![name.to_owned()];
                row.extend(self.cycles.iter().map(|_| dash()));
                row.push(value);
                row.push(format!("< {GOAL_IDLE_RSS_MIB:.0} MiB"));
                row.push(verdict(&[("idle".to_owned(), ok)]));
                table.row(row);
            };
            let under = |kib: u64| Some((kib as f64 / 1024.0) < GOAL_IDLE_RSS_MIB);
            idle_row(
                &mut table,
                &format!("idle RSS at caches synced ({:.1} s)", idle.synced_seconds),
                mib(idle.at_synced.rss_kib),
                under(idle.at_synced.rss_kib),
            );
            idle_row(
                &mut table,
                &format!("idle RSS {:.0} s later", idle.observe_seconds),
                mib(idle.after_observe.rss_kib),
                under(idle.after_observe.rss_kib),
            );
            let end = idle.end;
            let title = if end.pending >= idle.runs as u64 {
                format!(
                    "idle RSS settled (all requests pending, {:.0} s)",
                    end.seconds
                )
            } else {
                format!(
                    "idle RSS at {:.0} s, not settled ({}/{} requests pending)",
                    end.seconds, end.pending, idle.runs
                )
            };
            idle_row(
                &mut table,
                &title,
                mib(end.memory.rss_kib),
                under(end.memory.rss_kib),
            );
            idle_row(
                &mut table,
                "idle peak RSS (VmHWM)",
                mib(idle.peak_kib),
                under(idle.peak_kib),
            );
        }
        table
    }

    /// The rows comparing ours with the ideal controller, through `row(name, cell, goal, check)`.
    fn ideal_rows(&self, row: &mut RowSink<'_>) {
        if self.cycles.iter().all(|c| c.ideal.is_none()) {
            return;
        }
        row(
            "ideal controller: measured",
            &|c| match (&c.ideal, c.ideal_measured) {
                (None, _) => "n/a".into(),
                (Some(_), IdealMeasured::Before) => "before ours".into(),
                (Some(_), IdealMeasured::After) => "after ours".into(),
                (Some(_), IdealMeasured::SameBurst) => "in the same burst".into(),
            },
            "",
            None,
        );
        type Pick = fn(&Percentiles) -> f64;
        let picks: [(&str, Pick); 3] = [("p50", |p| p.p50), ("p95", |p| p.p95), ("p99", |p| p.p99)];
        for (name, pick) in picks {
            row(
                &format!("ideal controller: approval -> worker Pod {name}"),
                &|c| match c.ideal.as_ref().and_then(|i| i.latency) {
                    Some(p) => ms(pick(&p)),
                    None => "n/a".into(),
                },
                "",
                None,
            );
        }
        row(
            "  ideal: approval -> run state written p50 / p99",
            &|c| p50_p99(c.ideal.as_ref().and_then(|i| i.to_resumed)),
            "",
            None,
        );
        row(
            "  ideal: run state written -> worker Pod p50 / p99",
            &|c| p50_p99(c.ideal.as_ref().and_then(|i| i.resumed_to_pod)),
            "",
            None,
        );
        row(
            "  ideal: baseline patch+create p50 / p99 (same moment)",
            &|c| p50_p99(c.ideal.as_ref().and_then(|i| i.baseline)),
            "",
            None,
        );
        let at_goal =
            |c: &CycleReport, ok: Option<bool>| (c.runs >= IDEAL_GOAL_AT).then_some(ok).flatten();
        for (name, pick) in picks {
            let ratio_of = move |c: &CycleReport| -> Option<f64> {
                ratio(pick(&c.latency?), pick(&c.ideal.as_ref()?.latency?))
            };
            let goal =
                move |c: &CycleReport| at_goal(c, ratio_of(c).map(|r| r <= GOAL_IDEAL_P99_RATIO));
            let is_p99 = name == "p99";
            row(
                &format!("ratio ours/ideal {name}"),
                &|c| times(ratio_of(c)),
                if is_p99 { "<= 1.25x at N=1000" } else { "" },
                if is_p99 { Some(&goal) } else { None },
            );
        }
        // Each controller against the baseline sampled during its own burst: how loaded the API
        // server happened to be differs between the two bursts.
        let against_baselines = |c: &CycleReport| -> Option<f64> {
            let ideal = c.ideal.as_deref()?;
            ratio(
                ratio(c.latency?.p99, c.baseline?.p99)?,
                ratio(ideal.latency?.p99, ideal.baseline?.p99)?,
            )
        };
        row(
            "ratio (ours/baseline) / (ideal/its baseline) p99",
            &|c| times(against_baselines(c)),
            "",
            None,
        );
        row(
            "ideal controller: runs completed per second",
            &|c| opt(c.ideal.as_ref().and_then(|i| i.runs_per_second()), "/s"),
            "",
            None,
        );
        let share = |c: &CycleReport| -> Option<f64> {
            ratio(c.runs_per_second()?, c.ideal.as_ref()?.runs_per_second()?)
        };
        row(
            "ratio ours/ideal runs/s",
            &|c| times(share(c)),
            ">= 0.9x at N=1000",
            Some(&move |c| at_goal(c, share(c).map(|r| r >= GOAL_IDEAL_RUNS_PER_SECOND))),
        );
        row(
            "ideal controller: writes per approval cycle / finishing a run",
            &|c| match c.ideal.as_deref() {
                Some(i) => format!(
                    "{} / {}",
                    opt(i.writes_per_cycle(), ""),
                    opt(i.completion_writes_per_run(), "")
                ),
                None => "n/a".into(),
            },
            "",
            None,
        );
        row(
            "ideal controller: runs halted / approved / succeeded / failed",
            &|c| match c.ideal.as_deref() {
                Some(i) => format!("{}/{}/{}/{}", i.halted, i.approved, i.succeeded, i.failed),
                None => "n/a".into(),
            },
            "",
            None,
        );
    }

    /// The table, then per run count the controller's requests by verb and resource.
    pub fn render(&self) -> String {
        let mut out = self.table().render();
        if let Some(single) = &self.single {
            out.push('\n');
            out.push_str(&single.table().render());
        }
        let _ = write!(
            out,
            "\nworker Pods run at once by the dev kubelet (its node's maxPods): {}",
            match self.kubelet_max_pods {
                0 => "no limit".to_owned(),
                n => n.to_string(),
            }
        );
        for c in &self.cycles {
            let _ = write!(
                out,
                "\nN={}: controller requests during the approval cycle ({} approvals): ",
                c.runs, c.approved
            );
            let mut parts: Vec<String> = c
                .requests
                .by_kind
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            parts.push(format!("create pods {}", c.pod_creates));
            parts.push(format!("write events {}", c.event_writes));
            out.push_str(&parts.join(", "));
            let _ = write!(
                out,
                "\nN={}: tool calls {}; Pods seen before their approval returned {}; baseline samples {} during / {} before the burst ({} failed)",
                c.runs,
                c.tool_calls,
                c.early_pods,
                c.baseline.map_or(0, |p| p.count),
                c.baseline_quiet.map_or(0, |p| p.count),
                c.baseline_errors
            );
            if let Some(i) = c.ideal.as_deref() {
                let mut parts: Vec<String> = i
                    .requests
                    .by_kind
                    .iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect();
                parts.push(format!("create pods {}", i.pod_creates));
                let _ = write!(
                    out,
                    "\nN={}: ideal controller requests ({} approvals): {}; writes it counted itself {}; tool calls {}",
                    c.runs,
                    i.approved,
                    parts.join(", "),
                    i.ideal_writes.unwrap_or_default(),
                    i.tool_calls
                );
            }
            let cpu_lines = [("", Some(c)), (" ideal", c.ideal.as_deref())];
            for (who, cycle) in cpu_lines {
                if let Some(cpu) = cycle.and_then(|c| c.cpu.as_ref()) {
                    let _ = write!(
                        out,
                        "\nN={}{who}: CPU seconds from the burst until every next Pod was seen: {}",
                        c.runs,
                        cpu.summary()
                    );
                }
            }
            if let Some(first) = c.approval_errors.first() {
                let _ = write!(
                    out,
                    "\nN={}: {} approvals refused, first: {first}",
                    c.runs,
                    c.approval_errors.len()
                );
            }
            if c.requests.unreadable_lines > 0 {
                let _ = write!(
                    out,
                    "\nN={}: {} audit lines could not be parsed",
                    c.runs, c.requests.unreadable_lines
                );
            }
        }
        out.push('\n');
        out
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
