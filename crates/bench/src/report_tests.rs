//! Tests of the report table.
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
        single: None,
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

fn rows_of(text: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no row {prefix} in\n{text}"))
        .split(" | ")
        .map(|c| c.trim().to_owned())
        .collect()
}

#[test]
fn ours_is_compared_with_the_ideal_controller_at_n_1000() {
    let with_ideal = |mut ours: CycleReport, ideal_p99: f64, ideal_seconds: f64| {
        let mut ideal = cycle_report(ours.runs, ideal_p99, 10.0, 2 * ours.runs as u64);
        ideal.complete_seconds = ideal_seconds;
        ideal.event_writes = 0;
        ideal.cpu = Some(CpuUse {
            processes: vec![("kube-apiserver".into(), 27.7), ("bench".into(), 1.74)],
            seconds: 18.1,
            machine_busy: 0.999,
        });
        ours.ideal = Some(Box::new(ideal));
        ours.ready_again = Some(ReadyAgain {
            seconds: 4.5,
            memory: Memory {
                rss_kib: 50 * 1024,
                peak_kib: 50 * 1024,
            },
            caches: vec![("agentruns".into(), 1200), ("pods".into(), 4400)],
            cpu: Some(CpuUse {
                processes: vec![("kube-apiserver".into(), 3.04), ("controller".into(), 1.5)],
                seconds: 4.5,
                machine_busy: 0.7,
            }),
        });
        ours
    };
    let report = BenchReport {
        // N=100: 3x the ideal p99 (no goal at N=100); N=1000: 1.2x and 0.8x its runs/s.
        cycles: vec![
            with_ideal(cycle_report(100, 30.0, 20.0, 200), 10.0, 10.0),
            CycleReport {
                ideal_measured: IdealMeasured::Before,
                ..with_ideal(cycle_report(1000, 120.0, 30.0, 2000), 100.0, 8.0)
            },
        ],
        ..Default::default()
    };
    let text = report.render();
    assert_eq!(
        rows_of(&text, "ideal controller: measured")[1..3],
        ["after ours", "before ours"]
    );
    let p99 = rows_of(&text, "ratio ours/ideal p99");
    assert_eq!(p99[1..], ["3.00x", "1.20x", "<= 1.25x at N=1000", "yes"]);
    // Ours 30/20 and 120/30 ms over its baseline p99, the ideal 10/10 and 100/10 ms over its own.
    assert_eq!(
        rows_of(&text, "ratio (ours/baseline) / (ideal/its baseline) p99")[1..3],
        ["1.50x", "0.40x"]
    );
    assert_eq!(
        rows_of(
            &text,
            "  ideal: baseline patch+create p50 / p99 (same moment)"
        )[1..3],
        ["5.0 ms / 10.0 ms", "5.0 ms / 10.0 ms"]
    );
    let runs = rows_of(&text, "ratio ours/ideal runs/s");
    assert_eq!(
        runs[1..],
        ["1.00x", "0.80x", ">= 0.9x at N=1000", "no (N=1000)"]
    );
    assert_eq!(
        rows_of(&text, "ideal controller: approval -> worker Pod p99")[1..3],
        ["10.0 ms", "100 ms"]
    );
    assert_eq!(
        rows_of(&text, "ideal controller: writes per approval cycle")[2],
        "3.00 / 0.00"
    );
    assert_eq!(
        rows_of(&text, "fresh controller ready with the N runs present")[1..],
        ["4.5 s, 50.0 MiB", "4.5 s, 50.0 MiB", "< 10 s", "yes"]
    );
    assert_eq!(
        rows_of(&text, "fresh controller: each cache synced after (s)")[1..3],
        ["agentruns 1.2, pods 4.4", "agentruns 1.2, pods 4.4"]
    );
    assert_eq!(
        rows_of(&text, "fresh controller: CPU seconds until ready")[1],
        "kube-apiserver 3.0, controller 1.5; 4.5 s, machine 70% busy"
    );
    assert!(text.contains("N=1000: ideal controller requests (1000 approvals)"));
    assert!(text.contains(
        "N=1000 ideal: CPU seconds from the burst until every next Pod was seen: \
         kube-apiserver 27.7, bench 1.7; 18.1 s, machine 100% busy"
    ));
    assert!(!text.contains("N=1000: CPU seconds"), "ours measured none");
}

#[test]
fn single_approvals_have_their_own_table() {
    let single = SingleReport {
        approvals: 50,
        finished: 50,
        latency: Percentiles::of(&[100.0, 400.0]),
        baseline: Percentiles::of(&[50.0, 100.0]),
        cpu: Some(CpuUse {
            processes: vec![("kube-apiserver".into(), 4.2), ("etcd".into(), 0.6)],
            seconds: 41.0,
            machine_busy: 0.31,
        }),
        ..Default::default()
    };
    let report = BenchReport {
        single: Some(single.clone()),
        ..Default::default()
    };
    let text = report.render();
    assert_eq!(
        rows_of(&text, "ratio single approval / patch+create p99")[1..],
        ["4.00x", "<= 3x", "no (single)"]
    );
    assert_eq!(
        rows_of(&text, "approval -> worker Pod p50 / p99")[1],
        "100 ms / 400 ms"
    );
    assert_eq!(
        rows_of(
            &text,
            "control plane CPU seconds over the approvals and samples"
        )[1],
        "kube-apiserver 4.2, etcd 0.6; 41.0 s, machine 31% busy"
    );
    assert_eq!(single.p99_ratio(), Some(4.0));
}
