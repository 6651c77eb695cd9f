//! The baseline: a minimal client's merge patch of a ConfigMap, then a Pod create, timed like an
//! approval and its worker Pod.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::BASELINE_CONFIGMAPS;

fn baseline_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "agentrun-bench-baseline"}},
        "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}
    }))
    .unwrap_or_default()
}

/// One baseline sample: a merge patch of a ConfigMap, then a Pod create. Returns when the patch
/// returned (the latency runs from there to the Pod seen by the watch, as for approvals).
pub(crate) async fn baseline_sample(
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
pub(crate) async fn baseline_during(
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
