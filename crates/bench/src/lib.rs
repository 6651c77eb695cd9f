//! `agentrun-bench`: the operator benchmark against a local control plane.
//!
//! For each run count N it creates N AgentRuns of a scripted agent that halts once for approval,
//! approves them all at once as alice, and measures, side by side:
//!
//! - the latency from an approval (the moment its merge patch returned) to the run's next worker
//!   Pod (the moment a Pod watch first delivered `<run>-step-1`), p50/p95/p99;
//! - a baseline at the same moment from a minimal client: one merge patch of a ConfigMap, then
//!   one Pod create, timed the same way (patch returned → Pod seen by the watch), and the ratio;
//! - runs completed per second, from the start of the approval burst to the last `Succeeded`;
//! - the API requests the controller made per approval cycle: the controller runs as a child
//!   process with its own ServiceAccount token, so the API server's audit log names it; the audit
//!   policy of the local control plane logs only `agentrun.dev` resources, so Pod creates are
//!   counted from the Pod watch and Event writes from the Events it published;
//! - the controller's peak RSS (`VmHWM` of the child process).
//!
//! Each cycle is then replayed, in a namespace of its own, through an ideal controller
//! (`ideal.rs`: a watch on requests and, per decision, only the writes the design cannot avoid),
//! with the same N, burst and dev-kubelet limits, and the table compares the two (`ratio
//! ours/ideal p99`, `ratio ours/ideal runs/s`). After each of our cycles a fresh controller starts
//! with the cycle's runs present and the time until it is ready is reported. Single approvals on
//! an idle system (one at a time) are compared with one patch + create timed the same way.
//!
//! Then it creates `idle_runs` runs already in `AwaitingApproval` holding states of
//! `idle_state_kib` KiB each (no workers), starts a fresh controller and reports its RSS once its
//! caches are synced, after an observation period, and once it settled.
//!
//! The pure parts (percentiles, `/proc` and audit-log parsing, the report table) are unit-tested
//! in their modules; the rest needs a control plane and runs from `agentrun-bench` /
//! `scripts/bench`. Test helpers it shares with the integration tests (tool server, namespaces,
//! tokens, waits, free ports) come from `agentrun-testkit`.

mod audit;
mod baseline;
mod bed;
pub mod cli;
mod cluster;
mod config;
mod cpu;
mod cycle;
mod error;
mod ideal;
mod idle;
mod lane;
mod objects;
mod observe;
mod process;
mod report;
mod run;
mod single;
mod state;
mod stats;
mod table;

pub use audit::{
    COMPLETION, RequestCounts, count_audit_requests, event_writes, event_writes_between,
    event_writes_where, is_completion_reason, is_write,
};
pub use config::BenchConfig;
pub use cpu::CpuUse;
pub use error::BenchError;
pub use process::{Memory, metric_value, parse_proc_status, process_memory};
pub use report::{BenchReport, CycleReport, IdleEnd, IdleReport, SingleReport};
pub use run::run;
pub use state::padded_state;
pub use stats::{Percentiles, percentile, ratio};
pub use table::Table;

/// The p99 latency ratio (ours / baseline) the operator aims to stay under at 1000 pending runs.
pub const GOAL_P99_RATIO: f64 = 2.0;
/// The p99 latency ratio (ours / ideal controller) aimed for at N=1000.
pub const GOAL_IDEAL_P99_RATIO: f64 = 1.25;
/// The share of the ideal controller's runs per second aimed for at N=1000.
pub const GOAL_IDEAL_RUNS_PER_SECOND: f64 = 0.9;
/// The p99 ratio (single approval on an idle system / one patch + create) aimed for.
pub const GOAL_SINGLE_P99_RATIO: f64 = 3.0;
/// The seconds a fresh controller may take to be ready with every run present.
pub const GOAL_READY_SECONDS: f64 = 10.0;
/// The API writes per approval cycle the controller aims to stay under.
pub const GOAL_WRITES_PER_CYCLE: f64 = 4.0;
/// The controller RSS (MiB) aimed for with 10,000 idle runs.
pub const GOAL_IDLE_RSS_MIB: f64 = 150.0;
/// The approver identity of the local control plane (`scripts/local-cluster`), and the
/// `approverId` the admission policy requires it to write.
pub const APPROVER: &str = "alice@example.com";
/// The ServiceAccount the controller child authenticates as, so the audit log names it.
pub const CONTROLLER_ACCOUNT: &str = "agentrun-controller";
/// The ServiceAccount the baseline client authenticates as (like the controller, not exempt
/// from API Priority and Fairness).
pub const BASELINE_ACCOUNT: &str = "bench-baseline";
/// The tool call id of the scripted agent's one call needing approval.
pub const TOOL_CALL_ID: &str = "call_1";
/// The name of the benchmark's Agent in each namespace.
pub const AGENT_NAME: &str = "bench";
/// The `reportingController` of the Events the controller publishes.
pub(crate) const EVENT_REPORTER: &str = agentrun::crd::keys::field_managers::CONTROLLER;
/// Prefix of the benchmark's run names (`run-00042`).
pub(crate) const RUN_PREFIX: &str = "run-";
/// ConfigMaps the baseline patches (round robin).
pub(crate) const BASELINE_CONFIGMAPS: usize = 16;
