//! What a benchmark measured, and its side-by-side table against the goals.

use std::fmt::Write as _;

use crate::audit::RequestCounts;
use crate::process::Memory;
use crate::stats::{Percentiles, ratio};
use crate::table::Table;
use crate::{GOAL_IDLE_RSS_MIB, GOAL_P99_RATIO, GOAL_WRITES_PER_CYCLE};

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
    /// The controller's memory at the end of the cycle.
    pub controller_memory: Memory,
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

    /// The writes that finish a run (its final status and Event), per approved run.
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
    /// Worker Pods the dev kubelet ran at once (0: no limit).
    pub kubelet_max_pods: usize,
}

/// Whether a cycle meets a goal (`None`: not measured).
type GoalCheck = dyn Fn(&CycleReport) -> Option<bool>;

pub(crate) fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0} ms")
    } else {
        format!("{value:.1} ms")
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
            "controller API writes finishing a run (status + Event)",
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

    /// The table, then per run count the controller's requests by verb and resource.
    pub fn render(&self) -> String {
        let mut out = self.table().render();
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
mod tests {
    use super::*;

    fn cycle_report(runs: usize, p99: f64, baseline_p99: f64, writes: u64) -> CycleReport {
        let mut requests = RequestCounts::default();
        requests.add("patch", "agentruns/status", writes);
        requests.add("get", "agentruns", runs as u64);
        CycleReport {
            runs,
            halted: runs,
            approved: runs,
            succeeded: runs,
            latency: Percentiles::of(&[p99 / 2.0, p99]),
            baseline: Percentiles::of(&[baseline_p99 / 2.0, baseline_p99]),
            complete_seconds: 10.0,
            requests,
            pod_creates: runs as u64,
            event_writes: runs as u64,
            controller_memory: Memory {
                rss_kib: 30 * 1024,
                peak_kib: 40 * 1024,
            },
            ..Default::default()
        }
    }

    #[test]
    fn report_table_checks_the_goals_per_column() {
        let report = BenchReport {
            cycles: vec![
                cycle_report(100, 30.0, 20.0, 200),
                cycle_report(1000, 90.0, 30.0, 2000),
            ],
            idle: Some(IdleReport {
                runs: 10000,
                state_bytes: 65536,
                synced_seconds: 12.0,
                at_synced: Memory {
                    rss_kib: 100 * 1024,
                    peak_kib: 200 * 1024,
                },
                observe_seconds: 30.0,
                after_observe: Memory {
                    rss_kib: 90 * 1024,
                    peak_kib: 200 * 1024,
                },
                end: IdleEnd {
                    seconds: 630.0,
                    pending: 4200,
                    memory: Memory {
                        rss_kib: 120 * 1024,
                        peak_kib: 200 * 1024,
                    },
                },
                peak_kib: 200 * 1024,
            }),
            kubelet_max_pods: 16,
        };
        let text = report.render();
        let row = |prefix: &str| -> Vec<String> {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no row {prefix} in\n{text}"))
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        };
        assert_eq!(
            row("metric"),
            [
                "metric",
                "N=100",
                "N=1000",
                "idle 10000 x 64 KiB",
                "goal",
                "met"
            ]
        );
        // p99 ratios 1.5x and 3x: the goal fails at N=1000 only.
        let p99 = row("ratio ours/baseline p99");
        assert_eq!(p99[1..4], ["1.50x", "3.00x", "-"]);
        assert_eq!(p99[5], "no (N=1000)");
        // 2 status patches + 1 Pod + 1 Event per cycle = 4.
        let writes = row("controller API writes per approval cycle");
        assert_eq!(writes[1..3], ["4.00", "4.00"]);
        assert_eq!(writes[5], "yes");
        assert_eq!(row("  of which")[1], "2.00 / 1.00 / 1.00");
        assert_eq!(
            row("controller API requests per approved run, in all")[1],
            "5.00"
        );
        assert_eq!(row("runs completed per second")[2], "100.00/s");
        assert_eq!(
            row("idle RSS at caches synced")[3..6],
            ["100.0 MiB", "< 150 MiB", "yes"]
        );
        assert_eq!(
            row("idle RSS at 630 s, not settled (4200/10000 requests pending)")[3..6],
            ["120.0 MiB", "< 150 MiB", "yes"]
        );
        assert_eq!(row("idle peak RSS")[5], "no (idle)");
        assert!(text.contains("N=1000: controller requests during the approval cycle (1000 approvals): get agentruns 1000, patch agentruns/status 2000, create pods 1000, write events 1000"));
    }
}
