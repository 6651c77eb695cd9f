//! The idle measurement: many runs already awaiting approval, and a fresh controller's memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentrun::crd::keys::annotations;
use agentrun::crd::status_patch::{AgentRunStatusPatch, StatusPatch};
use agentrun::crd::stored_state::StoredState;
use agentrun::crd::{AgentRun, AgentRunPhase};
use agentrun_testkit::tool_server::ToolServer;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::cluster::{BenchNamespace, Cluster};
use crate::error::kube_error;
use crate::objects::{create_agent, run_name, run_object};
use crate::process::{Controller, metric_value};
use crate::report::{IdleEnd, IdleReport, mib};
use crate::run::Progress;
use crate::state::{halted_template, padded_state};
use crate::{BenchConfig, BenchError};

/// The idle measurement in `ns`.
pub(crate) async fn idle(
    config: &BenchConfig,
    cluster: &Cluster,
    tools: &ToolServer,
    progress: &Progress,
    ns: &BenchNamespace,
) -> Result<IdleReport, BenchError> {
    let say = |m: String| progress.say(format!("idle: {m}"));
    let agent = create_agent(cluster, &ns.name, tools).await?;
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
                let status = AgentRunStatusPatch {
                    phase: Some(AgentRunPhase::AwaitingApproval),
                    step: Some(0),
                    retries: Some(0),
                    pending_approvals: Some(1),
                    started_at: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                    created_by: run.annotations().get(annotations::CREATED_BY).cloned(),
                    ..stored.status_patch()
                };
                runs.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(StatusPatch::unguarded(status)),
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
