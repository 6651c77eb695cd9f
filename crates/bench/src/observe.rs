//! What the benchmark's watches saw, and when: each Pod's first sight, each run's phases.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agentrun::crd::{AgentRun, AgentRunPhase};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio_util::task::AbortOnDropHandle;

use crate::run::wait_for;

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// When the benchmark's watches first saw each Pod, and each run's phases.
#[derive(Default)]
pub(crate) struct Observations {
    pub(crate) pods: Mutex<HashMap<String, Instant>>,
    runs: Mutex<HashMap<String, RunSeen>>,
    pub(crate) pods_synced: AtomicBool,
    pub(crate) runs_synced: AtomicBool,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RunSeen {
    pub(crate) awaiting: Option<Instant>,
    /// When it was first seen running its next step (the decision applied to its state).
    pub(crate) resumed: Option<Instant>,
    /// When it was first seen terminal, and whether it succeeded.
    pub(crate) terminal: Option<(Instant, bool)>,
}

impl Observations {
    pub(crate) fn pod_seen(&self, name: &str) -> Option<Instant> {
        lock(&self.pods).get(name).copied()
    }

    pub(crate) fn runs(&self) -> HashMap<String, RunSeen> {
        lock(&self.runs).clone()
    }
}

/// Watches `api`, calling `seen` with each object applied (or listed) and the moment it arrived,
/// and `synced` once the initial listing is done. A failed watch is retried until the task is
/// aborted (when the returned handle drops).
pub(crate) fn watch<K, F, S>(api: Api<K>, mut seen: F, synced: S) -> AbortOnDropHandle<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: FnMut(K, Instant) + Send + 'static,
    S: Fn() + Send + 'static,
{
    AbortOnDropHandle::new(tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default());
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(watcher::Event::Apply(object) | watcher::Event::InitApply(object))) => {
                    seen(object, Instant::now());
                }
                Ok(Some(watcher::Event::InitDone)) => synced(),
                Ok(Some(_)) => {}
                Ok(None) => return,
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }))
}

/// Records when each Pod of `ns` was first seen.
pub(crate) fn watch_pods(
    client: Client,
    ns: &str,
    seen: Arc<Observations>,
) -> AbortOnDropHandle<()> {
    let api: Api<Pod> = Api::namespaced(client, ns);
    let done = seen.clone();
    watch(
        api,
        move |pod, now| {
            lock(&seen.pods).entry(pod.name_any()).or_insert(now);
        },
        move || done.pods_synced.store(true, Ordering::Relaxed),
    )
}

/// Records when each run of `ns` was first seen awaiting approval, and first seen finished.
pub(crate) fn watch_runs(
    client: Client,
    ns: &str,
    seen: Arc<Observations>,
) -> AbortOnDropHandle<()> {
    let api: Api<AgentRun> = Api::namespaced(client, ns);
    let done = seen.clone();
    let synced = move || done.runs_synced.store(true, Ordering::Relaxed);
    let record = move |run: AgentRun, now: Instant| {
        let phase = run.status.as_ref().and_then(|s| s.phase);
        let step = run.status.as_ref().and_then(|s| s.step).unwrap_or(0);
        let mut runs = lock(&seen.runs);
        let entry = runs.entry(run.name_any()).or_default();
        match phase {
            Some(AgentRunPhase::AwaitingApproval) => {
                entry.awaiting.get_or_insert(now);
            }
            Some(AgentRunPhase::Running) if step > 0 => {
                entry.resumed.get_or_insert(now);
            }
            Some(p) if p.is_terminal() => {
                entry
                    .terminal
                    .get_or_insert((now, p == AgentRunPhase::Succeeded));
            }
            _ => {}
        }
    };
    watch(api, record, synced)
}

/// Per approval (run, approval returned): ms from the approval to the run first seen resumed
/// (its new state written), and from then to its next worker Pod first seen.
pub(crate) fn phases(seen: &Observations, approvals: &[(String, Instant)]) -> (Vec<f64>, Vec<f64>) {
    let runs = seen.runs();
    let ms = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64() * 1000.0;
    approvals
        .iter()
        .filter_map(|(run, approved)| {
            let resumed = runs.get(run)?.resumed?;
            let pod = seen.pod_seen(&agentrun::crd::worker_pod_name(run, 1, 0))?;
            Some((ms(*approved, resumed), ms(resumed, pod)))
        })
        .unzip()
}

/// Latencies (ms) from each start to the first sight of its Pod, waiting a bounded time for the
/// Pods not seen yet. Returns the latencies and how many Pods were seen before their start.
pub(crate) async fn latencies(
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
