//! `agentrun bench`: the operator benchmark against a local control plane.
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
//! Then it creates `idle_runs` runs already in `AwaitingApproval` holding states of
//! `idle_state_kib` KiB each (no workers), starts a fresh controller and reports its RSS once its
//! caches are synced, after an observation period, and once it settled.
//!
//! The pure parts (percentiles, `/proc` and audit-log parsing, the report table) are unit-tested
//! here; the rest needs a control plane and runs from `agentrun bench` / `scripts/bench`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, Seek};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use k8s_openapi::api::rbac::v1::RoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::crd::stored_state::StoredState;
use crate::crd::{Agent, AgentRun, AgentRunPhase, ApprovalRequest};
use crate::dev_kubelet::ClusterAccess;
use crate::state::RunState;
use crate::state::pyjson::Value;

/// The p99 latency ratio (ours / baseline) the operator aims to stay under at 1000 pending runs.
pub const GOAL_P99_RATIO: f64 = 2.0;
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
const EVENT_REPORTER: &str = crate::crd::keys::field_managers::CONTROLLER;
/// Prefix of the benchmark's run names (`run-00042`).
const RUN_PREFIX: &str = "run-";
/// ConfigMaps the baseline patches (round robin).
const BASELINE_CONFIGMAPS: usize = 16;

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// `cluster.env` of the cluster folder is missing or incomplete.
    #[error("{path}: {message}")]
    ClusterEnv {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {message}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A Kubernetes API request failed.
    #[error("kubernetes API, {what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A local file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An external command (kubectl) failed.
    #[error("{what} failed: {message}")]
    Command {
        /// The command.
        what: String,
        /// Its error output.
        message: String,
    },
    /// Something did not happen in time.
    #[error("timed out after {seconds} s waiting for {what} ({progress})")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The timeout.
        seconds: u64,
        /// How far it got.
        progress: String,
    },
    /// A child process (controller, dev kubelet) exited while the benchmark needed it.
    #[error("the {what} exited early ({status}); last lines of {log}:\n{tail}")]
    ChildExited {
        /// Which child.
        what: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: String,
        /// The end of its log.
        tail: String,
    },
    /// The halted RunState for the idle runs could not be built.
    #[error("building the idle runs' RunState: {0}")]
    State(String),
    /// The runs did not get far enough to measure anything.
    #[error("{0}")]
    NothingToMeasure(String),
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Kube { what, source }
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Io { what, source }
}

/// How the benchmark runs.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The local control plane's folder (`scripts/local-cluster start --dir DIR`).
    pub cluster_dir: PathBuf,
    /// The run counts measured, one approval cycle each (zeros are skipped).
    pub runs: Vec<usize>,
    /// Idle AwaitingApproval runs for the memory measurement (0 skips it).
    pub idle_runs: usize,
    /// The size of each idle run's RunState, in KiB.
    pub idle_state_kib: usize,
    /// Apply the CRDs, policies and roles from this folder first (`None`: already installed).
    pub crds_dir: Option<PathBuf>,
    /// The `agentrun` binary started as controller, dev kubelet and workers.
    pub agentrun_binary: PathBuf,
    /// Requests in flight when creating runs, approving and sampling the baseline.
    pub concurrency: usize,
    /// Samples of the quiet baseline (before the approval burst).
    pub baseline_samples: usize,
    /// The interval between samples of the baseline taken during the approval burst.
    pub baseline_interval: Duration,
    /// The most samples of the baseline taken during the approval burst.
    pub baseline_max_live: usize,
    /// The limit of each wait (all halted, all Pods, all finished, caches synced).
    pub timeout: Duration,
    /// How long the idle controller is observed after its caches synced.
    pub idle_observe: Duration,
    /// How long to wait for the idle controller to settle (every run's request pending).
    pub idle_settle: Duration,
    /// Where namespaces' logs, kubeconfigs and Pod folders go (removed after a phase succeeds).
    pub work_dir: PathBuf,
    /// Worker Pods the dev kubelet runs at once (its `--max-pods`; 0: no limit).
    pub kubelet_max_pods: usize,
}

impl BenchConfig {
    fn validate(&self) -> Result<(), BenchError> {
        if self.runs.iter().all(|&n| n == 0) && self.idle_runs == 0 {
            return Err(BenchError::Config(
                "nothing to measure: --runs has no count above 0 and --idle-runs is 0".into(),
            ));
        }
        if self.concurrency == 0 {
            return Err(BenchError::Config(
                "--concurrency must be at least 1".into(),
            ));
        }
        if self.idle_runs > 0 && self.idle_state_kib == 0 {
            return Err(BenchError::Config(
                "--idle-state-kib must be at least 1".into(),
            ));
        }
        if self.work_dir.to_str().is_none() {
            return Err(BenchError::Config(format!(
                "the work folder {} is not UTF-8",
                self.work_dir.display()
            )));
        }
        if self.timeout.is_zero() {
            return Err(BenchError::Config(
                "--timeout-seconds must be above 0".into(),
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Pure parts.

/// The `p`-th percentile (0–100) of sorted values, by the nearest-rank method; `None` when there
/// are no values or `p` is out of range.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() || !(0.0..=100.0).contains(&p) {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// p50, p95 and p99 of a sample (milliseconds in this benchmark).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentiles {
    /// How many values.
    pub count: usize,
    /// The median.
    pub p50: f64,
    /// The 95th percentile.
    pub p95: f64,
    /// The 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    /// The percentiles of `values` (NaNs ignored); `None` for an empty sample.
    pub fn of(values: &[f64]) -> Option<Percentiles> {
        let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        sorted.sort_by(f64::total_cmp);
        Some(Percentiles {
            count: sorted.len(),
            p50: percentile(&sorted, 50.0)?,
            p95: percentile(&sorted, 95.0)?,
            p99: percentile(&sorted, 99.0)?,
        })
    }
}

/// `ours / baseline`, when the baseline is above zero.
pub fn ratio(ours: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0).then(|| ours / baseline)
}

/// A process's memory from `/proc/PID/status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size now (`VmRSS`), KiB.
    pub rss_kib: u64,
    /// Peak resident set size (`VmHWM`), KiB.
    pub peak_kib: u64,
}

impl Memory {
    /// The current RSS in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    /// The peak RSS in MiB.
    pub fn peak_mib(&self) -> f64 {
        self.peak_kib as f64 / 1024.0
    }
}

/// Reads `VmRSS` and `VmHWM` from the text of `/proc/PID/status`.
pub fn parse_proc_status(text: &str) -> Option<Memory> {
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let rest = line[name.len()..].trim_start_matches(':').trim();
        rest.strip_suffix("kB")?.trim().parse().ok()
    };
    Some(Memory {
        rss_kib: field("VmRSS")?,
        peak_kib: field("VmHWM")?,
    })
}

/// The memory of a running process.
pub fn process_memory(pid: u32) -> Result<Memory, BenchError> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(io_error(format!("reading {path}")))?;
    parse_proc_status(&text).ok_or_else(|| BenchError::Io {
        what: format!("reading {path}"),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "no VmRSS/VmHWM"),
    })
}

/// The value of an unlabelled sample in a Prometheus text exposition.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (metric, value) = l.split_once(' ')?;
        (metric == name).then(|| value.trim().parse().ok())?
    })
}

/// API requests by `"<verb> <resource>[/<subresource>]"`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// The counts.
    pub by_kind: BTreeMap<String, u64>,
    /// Audit lines that could not be parsed (e.g. a line being written).
    pub unreadable_lines: u64,
}

/// Whether a verb changes state.
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "create" | "update" | "patch" | "delete" | "deletecollection"
    )
}

impl RequestCounts {
    /// Adds `n` requests of a verb on a resource.
    pub fn add(&mut self, verb: &str, resource: &str, n: u64) {
        *self
            .by_kind
            .entry(format!("{verb} {resource}"))
            .or_default() += n;
    }

    /// All requests.
    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }

    /// Requests that change state.
    pub fn writes(&self) -> u64 {
        self.by_kind
            .iter()
            .filter(|(k, _)| is_write(k.split(' ').next().unwrap_or_default()))
            .map(|(_, n)| n)
            .sum()
    }

    /// Writes that finish a run (see [`COMPLETION`]).
    pub fn completion_writes(&self) -> u64 {
        self.by_kind
            .iter()
            .filter(|(k, _)| k.ends_with(COMPLETION))
            .map(|(_, n)| n)
            .sum()
    }
}

#[derive(serde::Deserialize)]
struct AuditEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    verb: String,
    user: AuditUser,
    #[serde(rename = "objectRef", default)]
    object_ref: Option<AuditObject>,
    #[serde(rename = "requestObject", default)]
    request_object: Option<AuditRequestObject>,
}

/// The part of a status patch that says whether it finishes a run.
#[derive(serde::Deserialize)]
struct AuditRequestObject {
    #[serde(default)]
    status: Option<AuditRequestStatus>,
}

#[derive(serde::Deserialize)]
struct AuditRequestStatus {
    #[serde(default)]
    phase: Option<String>,
}

/// The suffix of the request kind of a run status write that finishes the run (its phase becomes
/// Succeeded or Failed): the run's completion, not part of its approval cycle.
pub const COMPLETION: &str = " (completion)";

/// Whether an Event reason marks a run's completion.
pub fn is_completion_reason(reason: &str) -> bool {
    matches!(reason, "Succeeded" | "Failed")
}

#[derive(serde::Deserialize)]
struct AuditUser {
    #[serde(default)]
    username: String,
}

#[derive(serde::Deserialize)]
struct AuditObject {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
}

/// Counts the requests of `username` in an API server audit log (JSON lines). A request logged at
/// several stages (a watch: started, then complete) counts once, by its `auditID`.
pub fn count_audit_requests<R: BufRead>(
    mut reader: R,
    username: &str,
) -> std::io::Result<RequestCounts> {
    let mut counts = RequestCounts::default();
    let mut seen = HashSet::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        // Most lines are other users': skip them before parsing.
        if !line.contains(username) {
            continue;
        }
        let Ok(event) = serde_json::from_str::<AuditEvent>(&line) else {
            counts.unreadable_lines += 1;
            continue;
        };
        if event.user.username != username || !seen.insert(event.audit_id) {
            continue;
        }
        let mut resource = match &event.object_ref {
            Some(o) => match &o.subresource {
                Some(sub) if !sub.is_empty() => format!("{}/{sub}", o.resource),
                _ => o.resource.clone(),
            },
            None => "(none)".to_owned(),
        };
        let finishes = event
            .request_object
            .as_ref()
            .and_then(|o| o.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(is_completion_reason);
        if resource == "agentruns/status" && is_write(&event.verb) && finishes {
            resource.push_str(COMPLETION);
        }
        counts.add(&event.verb, &resource, 1);
    }
    Ok(counts)
}

/// The API writes behind each Event a controller published: 1 for the create, plus one patch
/// per repeat (`series.count` counts every occurrence), by Event name.
pub fn event_writes(events: &[KubeEvent], reporter: &str) -> BTreeMap<String, u64> {
    event_writes_where(events, reporter, |_| true)
}

/// [`event_writes`] of the Events whose reason passes `keep`.
pub fn event_writes_where(
    events: &[KubeEvent],
    reporter: &str,
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<String, u64> {
    events
        .iter()
        .filter(|e| e.reporting_controller.as_deref() == Some(reporter))
        .filter(|e| keep(e.reason.as_deref().unwrap_or_default()))
        .map(|e| {
            let writes = e
                .series
                .as_ref()
                .map_or(1, |s| u64::try_from(s.count).unwrap_or(0).max(1));
            (e.name_any(), writes)
        })
        .collect()
}

/// The writes between two snapshots of [`event_writes`].
pub fn event_writes_between(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> u64 {
    after
        .iter()
        .map(|(name, n)| n.saturating_sub(before.get(name).copied().unwrap_or(0)))
        .sum()
}

/// The settings `scripts/local-cluster` writes to `DIR/cluster.env`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterEnv {
    /// `KUBE_APISERVER_URL`.
    pub api_url: String,
    /// `KUBECONFIG_DIR`: `admin.kubeconfig`, `alice.kubeconfig`, ...
    pub kubeconfig_dir: PathBuf,
    /// `AUDIT_LOG`: the API server's JSON audit log.
    pub audit_log: PathBuf,
    /// `BIN_DIR`: kubectl and the control-plane binaries.
    pub bin_dir: PathBuf,
}

/// Parses `cluster.env` (`KEY=value` lines); the error names the missing key.
pub fn parse_cluster_env(text: &str) -> Result<ClusterEnv, String> {
    let values: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.trim().split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let get = |key: &str| {
        values
            .get(key)
            .filter(|v| !v.is_empty())
            .map(|v| v.to_string())
            .ok_or_else(|| format!("{key} is not set"))
    };
    Ok(ClusterEnv {
        api_url: get("KUBE_APISERVER_URL")?,
        kubeconfig_dir: get("KUBECONFIG_DIR")?.into(),
        audit_log: get("AUDIT_LOG")?.into(),
        bin_dir: get("BIN_DIR")?.into(),
    })
}

/// A text table with aligned columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Table {
        Table {
            header: header.into_iter().map(Into::into).collect(),
            rows: vec![],
        }
    }

    /// Appends a row; missing cells are blank, extra cells are dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut row: Vec<String> = cells.into_iter().map(Into::into).collect();
        row.resize(self.header.len(), String::new());
        self.rows.push(row);
    }

    /// The table as text: a header, a rule, then the rows; columns padded to their widest cell.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: &[String]| -> String {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, &w)| format!("{c}{}", " ".repeat(w - c.chars().count())))
                .collect();
            padded.join(" | ").trim_end().to_owned()
        };
        let mut out = line(&self.header);
        out.push('\n');
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        out.push_str(&rule.join("-+-"));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }
}

/// Builds the state of an idle run: `template` (a state halted for approval) for run `run_id`,
/// with earlier user messages of random text prepended until its JSON is at least
/// `target_bytes` long. Only user messages are added, so the scripted model's turn (the number of
/// assistant messages) is unchanged and the state stays resumable.
pub fn padded_state(template: &RunState, run_id: &str, target_bytes: usize) -> RunState {
    use rand::Rng;
    use rand::distr::Alphanumeric;
    // `{"role": "user", "content": ""}` and the `, ` separating it from the next message.
    const OVERHEAD: usize = 33;
    const CHUNK: usize = 4096;
    let mut state = template.clone();
    state.run_id = run_id.to_owned();
    let text = |n: usize| -> String {
        rand::rng()
            .sample_iter(&Alphanumeric)
            .take(n)
            .map(char::from)
            .collect()
    };
    let message = |content: String| {
        Value::from_iter([
            ("role", Value::from("user")),
            ("content", Value::from(content)),
        ])
    };
    let mut size = state.to_json().len();
    let mut padding = Vec::new();
    while size < target_bytes {
        let missing = target_bytes - size;
        let len = missing.saturating_sub(OVERHEAD).clamp(1, CHUNK);
        padding.push(message(text(len)));
        size += len + OVERHEAD;
    }
    state.messages.splice(0..0, padding);
    // The estimate can be a few bytes short: top it up.
    let actual = state.to_json().len();
    if actual < target_bytes {
        state
            .messages
            .insert(0, message(text((target_bytes - actual).max(1))));
    }
    state
}

// ---------------------------------------------------------------------------------------------
// Reports.

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

/// Everything one `agentrun bench` measured.
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

fn ms(value: f64) -> String {
    if value >= 100.0 {
        format!("{value:.0} ms")
    } else {
        format!("{value:.1} ms")
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn times(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.2}x"))
}

fn opt(value: Option<f64>, unit: &str) -> String {
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

// ---------------------------------------------------------------------------------------------
// The run against a control plane.

/// Progress lines on stderr, stamped with the time since the start.
struct Progress {
    start: Instant,
}

impl Progress {
    fn say(&self, message: impl std::fmt::Display) {
        eprintln!(
            "[bench +{:>6.1}s] {message}",
            self.start.elapsed().as_secs_f64()
        );
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Cluster {
    env: ClusterEnv,
    admin_kubeconfig: PathBuf,
    access: ClusterAccess,
    admin: Client,
    alice: Client,
}

async fn client_from(path: &Path) -> Result<Client, BenchError> {
    let bad = |message: String| BenchError::Kubeconfig {
        path: path.to_owned(),
        message,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    Client::try_from(config).map_err(|e| bad(e.to_string()))
}

impl Cluster {
    async fn connect(dir: &Path) -> Result<Cluster, BenchError> {
        let path = dir.join("cluster.env");
        let text = std::fs::read_to_string(&path).map_err(|e| BenchError::ClusterEnv {
            path: path.clone(),
            message: format!("{e} (start one with scripts/local-cluster start --dir DIR)"),
        })?;
        let env = parse_cluster_env(&text).map_err(|message| BenchError::ClusterEnv {
            path: path.clone(),
            message,
        })?;
        let admin_kubeconfig = env.kubeconfig_dir.join("admin.kubeconfig");
        let kubeconfig =
            Kubeconfig::read_from(&admin_kubeconfig).map_err(|e| BenchError::Kubeconfig {
                path: admin_kubeconfig.clone(),
                message: e.to_string(),
            })?;
        let access =
            ClusterAccess::from_kubeconfig(&kubeconfig).map_err(|e| BenchError::Kubeconfig {
                path: admin_kubeconfig.clone(),
                message: e.to_string(),
            })?;
        let admin = client_from(&admin_kubeconfig).await?;
        let alice = client_from(&env.kubeconfig_dir.join("alice.kubeconfig")).await?;
        admin
            .apiserver_version()
            .await
            .map_err(kube_error(format!("reaching {}", env.api_url)))?;
        Ok(Cluster {
            env,
            admin_kubeconfig,
            access,
            admin,
            alice,
        })
    }

    /// A fresh admin client (its own connections, e.g. for a watch).
    async fn admin_client(&self) -> Result<Client, BenchError> {
        client_from(&self.admin_kubeconfig).await
    }

    async fn kubectl(&self, args: &[&str]) -> Result<(), BenchError> {
        let kubectl = self.env.bin_dir.join("kubectl");
        let out = tokio::process::Command::new(&kubectl)
            .args(args)
            .env("KUBECONFIG", &self.admin_kubeconfig)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(io_error(format!("running {}", kubectl.display())))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(BenchError::Command {
                what: format!("kubectl {}", args.join(" ")),
                message: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            })
        }
    }

    async fn install_crds(&self, dir: &Path) -> Result<(), BenchError> {
        let dir = dir
            .to_str()
            .ok_or_else(|| BenchError::Config(format!("--crds {} is not UTF-8", dir.display())))?;
        self.kubectl(&["apply", "--server-side", "--force-conflicts", "-f", dir])
            .await?;
        self.kubectl(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "-l",
            "app.kubernetes.io/part-of=agentrun",
        ])
        .await
    }

    /// A kubeconfig file for a bearer token, on this cluster.
    fn write_kubeconfig(&self, path: &Path, user: &str, token: &str) -> Result<(), BenchError> {
        let mut cluster = json!({"server": self.access.server});
        if let Some(ca) = &self.access.certificate_authority_data {
            cluster["certificate-authority-data"] = json!(ca);
        }
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "bench", "cluster": cluster}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": user}}],
            "current-context": "bench",
        });
        let text = serde_json::to_string_pretty(&doc).unwrap_or_default();
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(io_error(format!("writing {}", path.display())))
    }
}

/// A namespace of the benchmark, with the approvers' RoleBinding and the identities of the
/// controller and of the baseline client.
struct BenchNamespace {
    name: String,
    /// The controller's kubeconfig (its ServiceAccount token).
    controller_kubeconfig: PathBuf,
    /// The baseline client's kubeconfig: a ServiceAccount too, so that API Priority and Fairness
    /// classifies it like the controller (the admin identity is exempt from it).
    baseline_kubeconfig: PathBuf,
    /// Logs and Pod folders.
    dir: PathBuf,
}

impl BenchNamespace {
    fn controller_username(&self) -> String {
        format!("system:serviceaccount:{}:{CONTROLLER_ACCOUNT}", self.name)
    }
}

async fn wait_for<F>(what: &str, timeout: Duration, mut check: F) -> Result<(), BenchError>
where
    F: FnMut() -> Result<Option<String>, BenchError>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let progress = match check()? {
            None => return Ok(()),
            Some(progress) => progress,
        };
        if Instant::now() >= deadline {
            return Err(BenchError::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs(),
                progress,
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_namespace(
    cluster: &Cluster,
    config: &BenchConfig,
    prefix: &str,
) -> Result<BenchNamespace, BenchError> {
    let name = format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let namespaces: Api<Namespace> = Api::all(cluster.admin.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([("agentrun.dev/bench".to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(kube_error(format!("creating namespace {name}")))?;
    let dir = config.work_dir.join(&name);
    std::fs::create_dir_all(&dir).map_err(io_error(format!("creating {}", dir.display())))?;
    let ns = BenchNamespace {
        controller_kubeconfig: dir.join("controller.kubeconfig"),
        baseline_kubeconfig: dir.join("baseline.kubeconfig"),
        name,
        dir,
    };

    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.admin.clone(), &ns.name);
    let deadline = Instant::now() + Duration::from_secs(60);
    while accounts
        .get_opt("default")
        .await
        .map_err(kube_error("reading the default ServiceAccount"))?
        .is_none()
    {
        if Instant::now() > deadline {
            return Err(BenchError::Timeout {
                what: format!("the default ServiceAccount of {}", ns.name),
                seconds: 60,
                progress: "kube-controller-manager did not create it".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bindings: Api<RoleBinding> = Api::namespaced(cluster.admin.clone(), &ns.name);
    let approvers: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "agentrun-approvers", "namespace": ns.name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "agentrun-approver"},
        "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "agentrun:approvers"}],
    }))
    .map_err(|e| BenchError::Config(format!("the approvers' RoleBinding: {e}")))?;
    bindings
        .create(&PostParams::default(), &approvers)
        .await
        .map_err(kube_error("creating the approvers' RoleBinding"))?;
    for (account, path) in [
        (CONTROLLER_ACCOUNT, &ns.controller_kubeconfig),
        (BASELINE_ACCOUNT, &ns.baseline_kubeconfig),
    ] {
        let token = namespace_admin_token(cluster, &ns.name, account).await?;
        cluster.write_kubeconfig(path, account, &token)?;
    }
    Ok(ns)
}

/// Creates a ServiceAccount with every right in `ns` (ClusterRole `cluster-admin` bound in the
/// namespace) and mints a token for it.
async fn namespace_admin_token(
    cluster: &Cluster,
    ns: &str,
    account: &str,
) -> Result<String, BenchError> {
    let bindings: Api<RoleBinding> = Api::namespaced(cluster.admin.clone(), ns);
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": account, "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }))
    .map_err(|e| BenchError::Config(format!("the RoleBinding of {account}: {e}")))?;
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .map_err(kube_error(format!("creating RoleBinding {account}")))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(cluster.admin.clone(), ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(account.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create(&PostParams::default(), &sa)
        .await
        .map_err(kube_error(format!("creating ServiceAccount {account}")))?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![]),
            expiration_seconds: Some(4 * 3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .map_err(kube_error(format!("minting a token for {account}")))?
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| BenchError::Command {
            what: format!("TokenRequest for {account}"),
            message: "the API server returned no token".into(),
        })
}

/// Removes the namespace: finalizers first (the controller is stopped by then), then the
/// namespace; waits a bounded time for it to go. Problems are reported, not returned.
async fn remove_namespace(cluster: &Cluster, config: &BenchConfig, ns: &str, progress: &Progress) {
    progress.say(format!("removing namespace {ns}"));
    let strip = json!({"metadata": {"finalizers": null}});
    let runs: Api<AgentRun> = Api::namespaced(cluster.admin.clone(), ns);
    let requests: Api<ApprovalRequest> = Api::namespaced(cluster.admin.clone(), ns);
    let mut names: Vec<(bool, String)> = Vec::new();
    for is_run in [false, true] {
        let mut token: Option<String> = None;
        loop {
            let mut params = ListParams::default().limit(500);
            if let Some(t) = &token {
                params = params.continue_token(t);
            }
            let page = if is_run {
                runs.list_metadata(&params).await.map(|l| {
                    let names = l
                        .items
                        .into_iter()
                        .filter(|o| !o.finalizers().is_empty())
                        .map(|o| o.name_any())
                        .collect::<Vec<_>>();
                    (names, l.metadata.continue_)
                })
            } else {
                requests.list_metadata(&params).await.map(|l| {
                    let names = l
                        .items
                        .into_iter()
                        .filter(|o| !o.finalizers().is_empty())
                        .map(|o| o.name_any())
                        .collect::<Vec<_>>();
                    (names, l.metadata.continue_)
                })
            };
            match page {
                Ok((page_names, next)) => {
                    names.extend(page_names.into_iter().map(|n| (is_run, n)));
                    match next.filter(|t| !t.is_empty()) {
                        Some(t) => token = Some(t),
                        None => break,
                    }
                }
                Err(error) => {
                    progress.say(format!("warning: listing objects of {ns}: {error}"));
                    break;
                }
            }
        }
    }
    let failures = stream::iter(names)
        .map(|(is_run, name)| {
            let (runs, requests, strip) = (&runs, &requests, &strip);
            async move {
                let params = PatchParams::default();
                let result = if is_run {
                    runs.patch_metadata(&name, &params, &Patch::Merge(strip))
                        .await
                        .map(|_| ())
                } else {
                    requests
                        .patch_metadata(&name, &params, &Patch::Merge(strip))
                        .await
                        .map(|_| ())
                };
                match result {
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    other => other,
                }
            }
        })
        .buffer_unordered(config.concurrency)
        .filter(|r| futures::future::ready(r.is_err()))
        .count()
        .await;
    if failures > 0 {
        progress.say(format!(
            "warning: {failures} finalizers of {ns} could not be removed"
        ));
    }
    let namespaces: Api<Namespace> = Api::all(cluster.admin.clone());
    if let Err(error) = namespaces.delete(ns, &DeleteParams::default()).await {
        progress.say(format!("warning: deleting namespace {ns}: {error}"));
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match namespaces.get_opt(ns).await {
            Ok(None) => return,
            Ok(Some(_)) if Instant::now() > deadline => {
                progress.say(format!(
                    "warning: namespace {ns} is still terminating after 300 s"
                ));
                return;
            }
            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(500)).await,
            Err(error) => {
                progress.say(format!("warning: reading namespace {ns}: {error}"));
                return;
            }
        }
    }
}

/// The loopback tool server the approved calls go to; it counts calls.
struct ToolServer {
    url: String,
    calls: Arc<AtomicU64>,
    _task: AbortOnDrop,
}

impl ToolServer {
    async fn start() -> Result<ToolServer, BenchError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io_error("binding the tool server on 127.0.0.1"))?;
        let addr = listener
            .local_addr()
            .map_err(io_error("reading the tool server's address"))?;
        let calls = Arc::new(AtomicU64::new(0));
        let counter = calls.clone();
        let router = axum::Router::new().fallback(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::Relaxed);
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    r#"{"ok": true, "applied": true}"#,
                )
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(ToolServer {
            url: format!("http://{addr}/change_config"),
            calls,
            _task: AbortOnDrop(task),
        })
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

/// The benchmark's Agent: a scripted model whose first turn calls a tool needing approval and
/// whose second turn answers.
fn agent_object(ns: &str, tool_url: &str) -> Result<Agent, BenchError> {
    serde_json::from_value(json!({
        "apiVersion": crate::crd::API_VERSION,
        "kind": "Agent",
        "metadata": {"name": AGENT_NAME, "namespace": ns},
        "spec": {
            "instructions": "You apply configuration changes once a person approves them.",
            "model": {"scripted": {"turns": [
                {"toolCalls": [{"id": TOOL_CALL_ID, "name": "change_config",
                                "arguments": {"key": "replicas", "value": "3"}}]},
                {"content": "The change was applied."}
            ]}},
            "maxTurns": 5,
            "tools": [{
                "name": "change_config",
                "description": "Apply a configuration change.",
                "requiresApproval": true,
                "parameters": {"type": "object",
                               "properties": {"key": {"type": "string"}, "value": {"type": "string"}},
                               "required": ["key", "value"]},
                "http": {"url": tool_url, "timeoutSeconds": 30}
            }]
        }
    }))
    .map_err(|e| BenchError::Config(format!("the benchmark Agent: {e}")))
}

async fn create_agent(cluster: &Cluster, ns: &str, tool_url: &str) -> Result<Agent, BenchError> {
    let agent = agent_object(ns, tool_url)?;
    Api::<Agent>::namespaced(cluster.admin.clone(), ns)
        .create(&PostParams::default(), &agent)
        .await
        .map_err(kube_error("creating the Agent"))
}

fn run_object(ns: &str, name: &str) -> Result<AgentRun, BenchError> {
    serde_json::from_value(json!({
        "apiVersion": crate::crd::API_VERSION,
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"agentRef": {"name": AGENT_NAME}, "input": "Set replicas to 3."}
    }))
    .map_err(|e| BenchError::Config(format!("the benchmark AgentRun: {e}")))
}

fn run_name(i: usize) -> String {
    format!("{RUN_PREFIX}{i:05}")
}

/// A child process (controller or dev kubelet) with its output in a log file; killed on drop.
struct ChildProcess {
    what: String,
    log: PathBuf,
    child: tokio::process::Child,
}

impl ChildProcess {
    fn spawn(
        what: &str,
        binary: &Path,
        args: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
        log: PathBuf,
    ) -> Result<ChildProcess, BenchError> {
        let file =
            std::fs::File::create(&log).map_err(io_error(format!("creating {}", log.display())))?;
        let err = file
            .try_clone()
            .map_err(io_error(format!("opening {}", log.display())))?;
        let mut command = tokio::process::Command::new(binary);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .kill_on_drop(true);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command.spawn().map_err(io_error(format!(
            "starting {} {}",
            binary.display(),
            args.join(" ")
        )))?;
        Ok(ChildProcess {
            what: what.to_owned(),
            log,
            child,
        })
    }

    fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(self.exited(status.to_string())),
            Err(e) => Err(self.exited(e.to_string())),
        }
    }

    fn exited(&self, status: String) -> BenchError {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        BenchError::ChildExited {
            what: self.what.clone(),
            status,
            log: self.log.display().to_string(),
            tail: lines[lines.len().saturating_sub(20)..].join("\n"),
        }
    }

    fn memory(&self) -> Result<Memory, BenchError> {
        let pid = self.pid().ok_or_else(|| BenchError::Io {
            what: format!("reading the memory of the {}", self.what),
            source: std::io::Error::other("the process has exited"),
        })?;
        process_memory(pid)
    }

    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

fn free_port() -> Result<SocketAddr, BenchError> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(io_error("finding a free port on 127.0.0.1"))?;
    listener
        .local_addr()
        .map_err(io_error("finding a free port on 127.0.0.1"))
}

/// The controller as a child process, authenticated as its ServiceAccount.
struct Controller {
    process: ChildProcess,
    metrics: SocketAddr,
    http: reqwest::Client,
}

impl Controller {
    async fn start(
        config: &BenchConfig,
        ns: &BenchNamespace,
        log_name: &str,
    ) -> Result<(Controller, Instant), BenchError> {
        let metrics = free_port()?;
        let addr = metrics.to_string();
        let process = ChildProcess::spawn(
            "controller",
            &config.agentrun_binary,
            &[
                "controller",
                "--namespace",
                &ns.name,
                "--metrics-addr",
                &addr,
            ],
            &[("KUBECONFIG", ns.controller_kubeconfig.as_os_str())],
            ns.dir.join(log_name),
        )?;
        let started = Instant::now();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .map_err(|e| BenchError::Config(format!("an HTTP client for /metrics: {e}")))?;
        Ok((
            Controller {
                process,
                metrics,
                http,
            },
            started,
        ))
    }

    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let response = self
            .http
            .get(format!("http://{}{path}", self.metrics))
            .send()
            .await
            .ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    /// Waits until `/readyz` answers 200 (every cache synced).
    async fn wait_ready(&mut self, timeout: Duration) -> Result<(), BenchError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.process.check_alive()?;
            if let Some((200, _)) = self.get("/readyz").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(BenchError::Timeout {
                    what: "the controller's caches to sync (/readyz)".into(),
                    seconds: timeout.as_secs(),
                    progress: format!("see {}", self.process.log.display()),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// When the benchmark's watches first saw each Pod, and each run's phases.
#[derive(Default)]
struct Observations {
    pods: Mutex<HashMap<String, Instant>>,
    runs: Mutex<HashMap<String, RunSeen>>,
    pods_synced: AtomicBool,
    runs_synced: AtomicBool,
}

#[derive(Clone, Copy, Debug, Default)]
struct RunSeen {
    awaiting: Option<Instant>,
    /// When it was first seen terminal, and whether it succeeded.
    terminal: Option<(Instant, bool)>,
}

impl Observations {
    fn pod_seen(&self, name: &str) -> Option<Instant> {
        lock(&self.pods).get(name).copied()
    }

    fn runs(&self) -> HashMap<String, RunSeen> {
        lock(&self.runs).clone()
    }
}

fn watch_pods(client: Client, ns: &str, seen: Arc<Observations>) -> AbortOnDrop {
    let api: Api<Pod> = Api::namespaced(client, ns);
    AbortOnDrop(tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default());
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(event)) => {
                    let now = Instant::now();
                    match event {
                        watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                            lock(&seen.pods).entry(pod.name_any()).or_insert(now);
                        }
                        watcher::Event::InitDone => seen.pods_synced.store(true, Ordering::Relaxed),
                        _ => {}
                    }
                }
                Ok(None) => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }))
}

fn watch_runs(client: Client, ns: &str, seen: Arc<Observations>) -> AbortOnDrop {
    let api: Api<AgentRun> = Api::namespaced(client, ns);
    AbortOnDrop(tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default());
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(event)) => {
                    let now = Instant::now();
                    match event {
                        watcher::Event::Apply(run) | watcher::Event::InitApply(run) => {
                            let phase = run.status.as_ref().and_then(|s| s.phase);
                            let mut runs = lock(&seen.runs);
                            let entry = runs.entry(run.name_any()).or_default();
                            match phase {
                                Some(AgentRunPhase::AwaitingApproval) => {
                                    entry.awaiting.get_or_insert(now);
                                }
                                Some(p) if p.is_terminal() => {
                                    entry
                                        .terminal
                                        .get_or_insert((now, p == AgentRunPhase::Succeeded));
                                }
                                _ => {}
                            }
                        }
                        watcher::Event::InitDone => seen.runs_synced.store(true, Ordering::Relaxed),
                        _ => {}
                    }
                }
                Ok(None) => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }))
}

fn baseline_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "agentrun-bench-baseline"}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap_or_default()
}

/// One baseline sample: a merge patch of a ConfigMap, then a Pod create. Returns when the patch
/// returned (the latency runs from there to the Pod seen by the watch, as for approvals).
async fn baseline_sample(
    client: &Client,
    ns: &str,
    seq: usize,
    pod: &str,
) -> Result<Instant, kube::Error> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    maps.patch(
        &format!("baseline-{}", seq % BASELINE_CONFIGMAPS),
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"seq": seq.to_string()}})),
    )
    .await?;
    let patched = Instant::now();
    pods.create(&PostParams::default(), &baseline_pod(pod))
        .await?;
    Ok(patched)
}

/// Baseline samples taken every `interval` (at most `concurrency` in flight) until `stop` is set
/// or `max` were taken; returns (Pod, patch returned) and the failures.
async fn baseline_during(
    client: Client,
    ns: String,
    interval: Duration,
    max: usize,
    concurrency: usize,
    stop: Arc<AtomicBool>,
) -> (Vec<(String, Instant)>, usize) {
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tasks = tokio::task::JoinSet::new();
    for seq in 0..max {
        ticker.tick().await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (client, ns) = (client.clone(), ns.clone());
        tasks.spawn(async move {
            let pod = format!("baseline-live-{seq:05}");
            let result = baseline_sample(&client, &ns, seq, &pod).await;
            drop(permit);
            (pod, result)
        });
    }
    let mut samples = Vec::new();
    let mut errors = 0;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((pod, Ok(at))) => samples.push((pod, at)),
            _ => errors += 1,
        }
    }
    (samples, errors)
}

/// Latencies (ms) from each start to the first sight of its Pod, waiting a bounded time for the
/// Pods not seen yet. Returns the latencies and how many Pods were seen before their start.
async fn latencies(
    seen: &Observations,
    starts: &[(String, Instant)],
    wait: Duration,
) -> (Vec<f64>, usize) {
    let _ = wait_for("the Pods to be seen", wait, || {
        let missing = starts
            .iter()
            .filter(|(pod, _)| seen.pod_seen(pod).is_none())
            .count();
        Ok((missing > 0).then(|| format!("{missing} not seen")))
    })
    .await;
    let mut early = 0;
    let values = starts
        .iter()
        .filter_map(|(pod, start)| {
            let at = seen.pod_seen(pod)?;
            Some(match at.checked_duration_since(*start) {
                Some(d) => d.as_secs_f64() * 1000.0,
                None => {
                    early += 1;
                    0.0
                }
            })
        })
        .collect();
    (values, early)
}

async fn controller_events(cluster: &Cluster, ns: &str) -> Result<Vec<KubeEvent>, BenchError> {
    let events: Api<KubeEvent> = Api::namespaced(cluster.admin.clone(), ns);
    let list = events
        .list(&ListParams::default())
        .await
        .map_err(kube_error("listing Events"))?;
    Ok(list.items)
}

fn audit_size(path: &Path) -> Result<u64, BenchError> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(io_error(format!(
            "reading the audit log {}",
            path.display()
        )))
}

async fn count_audit_since(
    path: &Path,
    offset: u64,
    username: String,
) -> Result<RequestCounts, BenchError> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let what = format!("reading the audit log {}", path.display());
        let mut file = std::fs::File::open(&path).map_err(io_error(what.clone()))?;
        file.seek(std::io::SeekFrom::Start(offset))
            .map_err(io_error(what.clone()))?;
        count_audit_requests(std::io::BufReader::with_capacity(1 << 20, file), &username)
            .map_err(io_error(what))
    })
    .await
    .map_err(|e| BenchError::Io {
        what: "counting audit events".into(),
        source: std::io::Error::other(e.to_string()),
    })?
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
    let tools = ToolServer::start().await?;
    let mut report = BenchReport {
        kubelet_max_pods: config.kubelet_max_pods,
        ..Default::default()
    };
    for &n in config.runs.iter().filter(|&&n| n > 0) {
        let ns = create_namespace(&cluster, config, &format!("bench-{n}")).await?;
        progress.say(format!("N={n}: namespace {}", ns.name));
        let result = cycle(config, &cluster, &tools, &progress, &ns, n).await;
        remove_namespace(&cluster, config, &ns.name, &progress).await;
        match result {
            Ok(cycle) => {
                let _ = std::fs::remove_dir_all(&ns.dir);
                report.cycles.push(cycle);
            }
            Err(e) => {
                progress.say(format!("N={n}: logs kept in {}", ns.dir.display()));
                return Err(e);
            }
        }
    }
    if config.idle_runs > 0 {
        let ns = create_namespace(&cluster, config, "bench-idle").await?;
        progress.say(format!("idle: namespace {}", ns.name));
        let result = idle(config, &cluster, &tools, &progress, &ns).await;
        remove_namespace(&cluster, config, &ns.name, &progress).await;
        match result {
            Ok(idle) => {
                let _ = std::fs::remove_dir_all(&ns.dir);
                report.idle = Some(idle);
            }
            Err(e) => {
                progress.say(format!("idle: logs kept in {}", ns.dir.display()));
                return Err(e);
            }
        }
    }
    // The work folder is empty once every phase succeeded.
    let _ = std::fs::remove_dir(&config.work_dir);
    Ok(report)
}

/// One approval cycle of `n` runs in `ns`.
async fn cycle(
    config: &BenchConfig,
    cluster: &Cluster,
    tools: &ToolServer,
    progress: &Progress,
    ns: &BenchNamespace,
    n: usize,
) -> Result<CycleReport, BenchError> {
    let say = |m: String| progress.say(format!("N={n}: {m}"));
    create_agent(cluster, &ns.name, &tools.url).await?;
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
        &config.agentrun_binary,
        &[
            "dev-kubelet",
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
    let calls_before = tools.calls();
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
                let name = crate::crd::approval_request_name(run, TOOL_CALL_ID);
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
            Ok(at) => approvals.push((crate::crd::worker_pod_name(&run, 1, 0), run, at)),
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
    let tool_calls = tools.calls() - calls_before;

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

/// A state halted on the benchmark Agent's call, made by the real runner with the scripted model
/// (no tool is called before approval).
async fn halted_template(agent: &Agent) -> Result<RunState, BenchError> {
    let runnable = crate::agent::Agent::from_spec_with_name(AGENT_NAME, &agent.spec)
        .map_err(|e| BenchError::State(e.to_string()))?;
    let runner = crate::agent::Runner::new().map_err(|e| BenchError::State(e.to_string()))?;
    let mut state = RunState::new("template", AGENT_NAME, "Set replicas to 3.");
    match runner.step(&runnable, &mut state).await {
        Ok(crate::agent::RunStatus::AwaitingApproval) => Ok(state),
        Ok(other) => Err(BenchError::State(format!(
            "the scripted agent did not halt for approval ({other:?})"
        ))),
        Err(e) => Err(BenchError::State(e.to_string())),
    }
}

/// The idle measurement in `ns`.
async fn idle(
    config: &BenchConfig,
    cluster: &Cluster,
    tools: &ToolServer,
    progress: &Progress,
    ns: &BenchNamespace,
) -> Result<IdleReport, BenchError> {
    let say = |m: String| progress.say(format!("idle: {m}"));
    let agent = create_agent(cluster, &ns.name, &tools.url).await?;
    let template = halted_template(&agent).await?;
    let target = config.idle_state_kib * 1024;
    let total = config.idle_runs;
    say(format!(
        "creating {total} runs in AwaitingApproval with {} KiB states",
        config.idle_state_kib
    ));
    let runs: Api<AgentRun> = Api::namespaced(cluster.admin.clone(), &ns.name);
    let done = AtomicU64::new(0);
    let state_bytes = AtomicU64::new(0);
    let created = Instant::now();
    stream::iter(0..total)
        .map(|i| {
            let (runs, template, done, state_bytes) = (&runs, &template, &done, &state_bytes);
            async move {
                let name = run_name(i);
                let run = runs
                    .create(&PostParams::default(), &run_object(&ns.name, &name)?)
                    .await
                    .map_err(kube_error(format!("creating AgentRun {name}")))?;
                let state = padded_state(template, &run.uid().unwrap_or_default(), target);
                let stored = StoredState::encode(&state);
                state_bytes.fetch_max(stored.bytes, Ordering::Relaxed);
                let status = crate::crd::status_patch::AgentRunStatusPatch {
                    phase: Some(AgentRunPhase::AwaitingApproval),
                    step: Some(0),
                    retries: Some(0),
                    pending_approvals: Some(1),
                    started_at: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                    created_by: run
                        .annotations()
                        .get(crate::crd::keys::annotations::CREATED_BY)
                        .cloned(),
                    ..stored.status_patch()
                };
                runs.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(crate::crd::status_patch::StatusPatch::unguarded(status)),
                )
                .await
                .map_err(kube_error(format!("writing the status of {name}")))?;
                let count = done.fetch_add(1, Ordering::Relaxed) + 1;
                if count.is_multiple_of(1000) {
                    progress.say(format!("idle: {count}/{total} runs created"));
                }
                Ok::<(), BenchError>(())
            }
        })
        .buffer_unordered(config.concurrency)
        .try_for_each(|_| futures::future::ready(Ok(())))
        .await?;
    say(format!(
        "{total} runs created in {:.1} s; starting a fresh controller",
        created.elapsed().as_secs_f64()
    ));

    let (mut controller, started) = Controller::start(config, ns, "controller-idle.log").await?;
    controller.wait_ready(config.timeout).await?;
    let synced_seconds = started.elapsed().as_secs_f64();
    let at_synced = controller.process.memory()?;
    say(format!(
        "caches synced in {synced_seconds:.1} s: RSS {}",
        mib(at_synced.rss_kib)
    ));
    let observed = Instant::now();
    while observed.elapsed() < config.idle_observe {
        controller.process.check_alive()?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after_observe = controller.process.memory()?;
    say(format!(
        "{:.0} s later: RSS {}",
        observed.elapsed().as_secs_f64(),
        mib(after_observe.rss_kib)
    ));
    let deadline = Instant::now() + config.idle_settle;
    let end = loop {
        controller.process.check_alive()?;
        let pending = controller
            .get("/metrics")
            .await
            .and_then(|(_, text)| metric_value(&text, "agentrun_pending_approvals"))
            .map_or(0, |v| v.max(0.0) as u64);
        let settled = pending >= total as u64;
        if settled || Instant::now() > deadline {
            let end = IdleEnd {
                seconds: started.elapsed().as_secs_f64(),
                pending,
                memory: controller.process.memory()?,
            };
            say(format!(
                "{} after {:.0} s ({pending}/{total} requests pending): RSS {}",
                if settled { "settled" } else { "not settled" },
                end.seconds,
                mib(end.memory.rss_kib)
            ));
            break end;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let peak_kib = controller.process.memory()?.peak_kib;
    controller.process.stop().await;
    Ok(IdleReport {
        runs: total,
        state_bytes: state_bytes.load(Ordering::Relaxed) as usize,
        synced_seconds,
        at_synced,
        observe_seconds: config.idle_observe.as_secs_f64(),
        after_observe,
        end,
        peak_kib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 50.0), Some(50.0));
        assert_eq!(percentile(&values, 95.0), Some(95.0));
        assert_eq!(percentile(&values, 99.0), Some(99.0));
        assert_eq!(percentile(&values, 100.0), Some(100.0));
        assert_eq!(percentile(&values, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&values, 101.0), None);
        // Unsorted input with a NaN: sorted, NaN dropped.
        let p = Percentiles::of(&[3.0, f64::NAN, 1.0, 2.0]).unwrap();
        assert_eq!((p.count, p.p50, p.p95, p.p99), (3, 2.0, 3.0, 3.0));
        assert_eq!(Percentiles::of(&[]), None);
        let one = Percentiles::of(&[7.5]).unwrap();
        assert_eq!((one.p50, one.p99), (7.5, 7.5));
        assert_eq!(ratio(3.0, 1.5), Some(2.0));
        assert_eq!(ratio(3.0, 0.0), None);
    }

    #[test]
    fn proc_status_and_metrics() {
        let status =
            "Name:\tagentrun\nVmPeak:\t  900000 kB\nVmHWM:\t   51200 kB\nVmRSS:\t   40960 kB\n";
        let memory = parse_proc_status(status).unwrap();
        assert_eq!(
            memory,
            Memory {
                rss_kib: 40960,
                peak_kib: 51200
            }
        );
        assert_eq!(memory.rss_mib(), 40.0);
        assert_eq!(memory.peak_mib(), 50.0);
        assert_eq!(parse_proc_status("Name:\tx\nVmRSS:\t1 kB\n"), None);
        let metrics = "# HELP agentrun_pending_approvals x\nagentrun_pending_approvals 9999\nagentrun_runs{phase=\"Running\"} 3\n";
        assert_eq!(
            metric_value(metrics, "agentrun_pending_approvals"),
            Some(9999.0)
        );
        assert_eq!(metric_value(metrics, "agentrun_runs"), None);
        assert_eq!(metric_value(metrics, "missing"), None);
    }

    #[test]
    fn audit_tells_the_writes_that_finish_a_run_apart() {
        let me = "system:serviceaccount:bench-1:agentrun-controller";
        let patch = |id: &str, phase: &str| {
            json!({"auditID": id, "stage": "ResponseComplete", "verb": "patch",
                   "user": {"username": me},
                   "objectRef": {"resource": "agentruns", "subresource": "status"},
                   "requestObject": {"status": {"phase": phase, "step": 1}}})
            .to_string()
        };
        let log = [
            patch("a", "Running"),
            patch("b", "Succeeded"),
            patch("c", "Failed"),
        ]
        .join("\n");
        let counts = count_audit_requests(log.as_bytes(), me).unwrap();
        assert_eq!(counts.writes(), 3);
        assert_eq!(counts.completion_writes(), 2);
        assert_eq!(counts.by_kind["patch agentruns/status"], 1);
        assert!(is_completion_reason("Succeeded") && !is_completion_reason("Approved"));
    }

    #[test]
    fn audit_counts_one_request_per_audit_id_for_one_user() {
        let me = "system:serviceaccount:bench-1:agentrun-controller";
        let line =
            |id: &str, user: &str, verb: &str, resource: &str, sub: Option<&str>, stage: &str| {
                let mut object = json!({"resource": resource, "namespace": "bench-1", "name": "r"});
                if let Some(sub) = sub {
                    object["subresource"] = json!(sub);
                }
                json!({"kind": "Event", "auditID": id, "stage": stage, "verb": verb,
                   "user": {"username": user}, "objectRef": object,
                   "responseObject": {"huge": "x".repeat(100)}})
                .to_string()
            };
        let log = [
            line(
                "a",
                me,
                "patch",
                "agentruns",
                Some("status"),
                "ResponseComplete",
            ),
            line("b", me, "get", "agentruns", None, "ResponseComplete"),
            line(
                "c",
                me,
                "watch",
                "approvalrequests",
                None,
                "ResponseStarted",
            ),
            line(
                "c",
                me,
                "watch",
                "approvalrequests",
                None,
                "ResponseComplete",
            ),
            line("d", "admin", "patch", "agentruns", None, "ResponseComplete"),
            line(
                "e",
                me,
                "patch",
                "approvalrequests",
                Some("status"),
                "ResponseComplete",
            ),
            line(
                "f",
                me,
                "create",
                "approvalrequests",
                None,
                "ResponseComplete",
            ),
            format!("{{\"auditID\": \"g\", \"user\": {{\"username\": \"{me}\""),
        ]
        .join("\n");
        let counts = count_audit_requests(log.as_bytes(), me).unwrap();
        assert_eq!(counts.total(), 5);
        assert_eq!(counts.writes(), 3);
        assert_eq!(counts.by_kind["patch agentruns/status"], 1);
        assert_eq!(counts.by_kind["watch approvalrequests"], 1);
        assert_eq!(counts.unreadable_lines, 1);
        assert!(!counts.by_kind.keys().any(|k| k.contains("admin")));
        assert!(is_write("deletecollection") && !is_write("list"));
    }

    #[test]
    fn event_writes_count_series_and_only_the_controllers() {
        let event = |name: &str, reporter: &str, series: Option<i32>| -> KubeEvent {
            let mut e: KubeEvent = serde_json::from_value(json!({
                "metadata": {"name": name},
                "eventTime": "2025-01-01T00:00:00.000000Z",
                "reportingController": reporter,
            }))
            .unwrap();
            if let Some(count) = series {
                e.series = serde_json::from_value(json!({
                    "count": count, "lastObservedTime": "2025-01-01T00:00:01.000000Z"
                }))
                .ok();
            }
            e
        };
        let before = event_writes(&[event("a", EVENT_REPORTER, None)], EVENT_REPORTER);
        let after = event_writes(
            &[
                event("a", EVENT_REPORTER, Some(3)),
                event("b", EVENT_REPORTER, None),
                event("c", "someone-else", None),
            ],
            EVENT_REPORTER,
        );
        assert_eq!(after.len(), 2);
        // "a" went from 1 write to 3 (two patches), "b" is new.
        assert_eq!(event_writes_between(&before, &after), 3);
    }

    #[test]
    fn cluster_env_names_the_missing_key() {
        let text = "KUBE_APISERVER_URL=https://127.0.0.1:6443\nKUBECONFIG_DIR=/c/kubeconfig\nAUDIT_LOG=/c/audit.log\nBIN_DIR=/bin/k8s\n";
        let env = parse_cluster_env(text).unwrap();
        assert_eq!(env.api_url, "https://127.0.0.1:6443");
        assert_eq!(env.audit_log, PathBuf::from("/c/audit.log"));
        let err = parse_cluster_env("KUBE_APISERVER_URL=x\nBIN_DIR=\n").unwrap_err();
        assert_eq!(err, "KUBECONFIG_DIR is not set");
    }

    #[test]
    fn table_aligns_columns() {
        let mut table = Table::new(["metric", "N=100", "goal"]);
        table.row(["p99", "12.0 ms", "<= 2x"]);
        table.row(["runs completed per second", "3.10/s"]);
        let text = table.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0], "metric                    | N=100   | goal");
        assert_eq!(lines[1], "--------------------------+---------+------");
        assert_eq!(lines[2], "p99                       | 12.0 ms | <= 2x");
        assert_eq!(lines[3], "runs completed per second | 3.10/s  |");
    }

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

    #[test]
    fn padded_state_reaches_the_target_and_stays_halted() {
        let mut template = RunState::new("template", "bench", "Set replicas to 3.");
        template.messages.push(Value::from_iter([
            ("role", Value::from("user")),
            ("content", Value::from("Set replicas to 3.")),
        ]));
        template.messages.push(Value::from_iter([
            ("role", Value::from("assistant")),
            ("content", Value::from("")),
        ]));
        template
            .deferred_tool_requests
            .approvals
            .push(crate::state::DeferredToolCall {
                tool_call_id: TOOL_CALL_ID.into(),
                tool_name: "change_config".into(),
                args: Value::from_iter([("key", Value::from("replicas"))]),
            });
        for target in [10, 5000, 64 * 1024] {
            let state = padded_state(&template, "uid-1", target);
            let json = state.to_json();
            assert!(json.len() >= target, "{} < {target}", json.len());
            assert!(
                json.len() <= target.max(template.to_json().len()) + 64,
                "{} for {target}",
                json.len()
            );
            let back = RunState::from_json(&json).unwrap();
            assert_eq!(back.run_id, "uid-1");
            assert_eq!(back.pending_approvals().len(), 1);
            let assistants = back
                .messages
                .iter()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                .count();
            assert_eq!(assistants, 1, "padding adds no assistant turn");
        }
    }
}
