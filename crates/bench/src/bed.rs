//! [`Bed`]: what every measured phase starts from in its namespace: the Agent, the baseline's
//! ConfigMaps, the benchmark's watches, the dev kubelet and our controller, and N runs halted for
//! approval.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use agentrun::crd::AgentRun;
use agentrun_testkit::tool_server::ToolServer;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio_util::task::AbortOnDropHandle;

use crate::cluster::{BenchNamespace, Cluster};
use crate::error::kube_error;
use crate::objects::{create_agent, run_name, run_object};
use crate::observe::{Observations, watch_pods, watch_runs};
use crate::process::{ChildProcess, Controller, CpuPriority};
use crate::run::wait_for;
use crate::{BASELINE_CONFIGMAPS, BenchConfig, BenchError};

/// One phase's test bed in its namespace.
pub(crate) struct Bed {
    /// What the benchmark's watches saw.
    pub(crate) seen: Arc<Observations>,
    _pod_watch: AbortOnDropHandle<()>,
    _run_watch: AbortOnDropHandle<()>,
    /// The dev kubelet running the worker Pods.
    pub(crate) kubelet: ChildProcess,
    /// Our controller (`None` once stopped).
    pub(crate) controller: Option<Controller>,
}

/// The runs of a bed after they were created and halted.
pub(crate) struct Halted {
    /// The runs awaiting approval.
    pub(crate) runs: Vec<String>,
    /// Seconds from the first create to every run halted (or failed).
    pub(crate) seconds: f64,
}

impl Bed {
    /// Creates the Agent and the baseline's ConfigMaps, starts the watches, the dev kubelet (and
    /// so its workers) at `kubelet_priority` and our controller, and waits until the controller is
    /// ready.
    pub(crate) async fn start(
        config: &BenchConfig,
        cluster: &Cluster,
        tools: &ToolServer,
        ns: &BenchNamespace,
        kubelet_priority: CpuPriority,
    ) -> Result<Bed, BenchError> {
        create_agent(cluster, &ns.name, tools).await?;
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
        let pod_watch = watch_pods(cluster.admin_client().await?, &ns.name, seen.clone());
        let run_watch = watch_runs(cluster.admin_client().await?, &ns.name, seen.clone());
        wait_for("the benchmark's watches", Duration::from_secs(60), || {
            let ready = seen.pods_synced.load(Ordering::Relaxed)
                && seen.runs_synced.load(Ordering::Relaxed);
            Ok((!ready).then(|| "not synced".to_owned()))
        })
        .await?;
        let rust_log = std::env::var_os("RUST_LOG").unwrap_or_else(|| "warn".into());
        let pod_dir = ns.dir.join("pods");
        let kubelet = ChildProcess::spawn(
            "dev kubelet",
            &config.dev_kubelet_binary,
            &[
                "--agentrun-binary",
                &config.agentrun_binary.to_string_lossy(),
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
            kubelet_priority,
        )?;
        let (mut controller, _) = Controller::start(config, ns, "controller.log").await?;
        controller.wait_ready(config.timeout).await?;
        Ok(Bed {
            seen,
            _pod_watch: pod_watch,
            _run_watch: run_watch,
            kubelet,
            controller: Some(controller),
        })
    }

    /// Fails when the dev kubelet or our controller (while running) exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), BenchError> {
        self.kubelet.check_alive()?;
        match &mut self.controller {
            Some(controller) => controller.process.check_alive(),
            None => Ok(()),
        }
    }

    /// Stops our controller.
    pub(crate) async fn stop_controller(&mut self) {
        if let Some(controller) = self.controller.take() {
            controller.process.stop().await;
        }
    }

    /// How many of `names` are awaiting approval or finished.
    fn halted_or_finished(&self, names: &[String]) -> usize {
        let runs = self.seen.runs();
        names
            .iter()
            .filter(|r| {
                runs.get(*r)
                    .is_some_and(|s| s.awaiting.is_some() || s.terminal.is_some())
            })
            .count()
    }

    /// Creates `n` runs as admin, in waves (at most two waves in flight before they halt: this
    /// bounds the step-0 worker processes running at once), and waits until every run halted.
    pub(crate) async fn create_and_halt(
        &mut self,
        config: &BenchConfig,
        cluster: &Cluster,
        ns: &BenchNamespace,
        n: usize,
    ) -> Result<Halted, BenchError> {
        let names: Vec<String> = (0..n).map(run_name).collect();
        let runs: Api<AgentRun> = Api::namespaced(cluster.admin.clone(), &ns.name);
        let created = Instant::now();
        let wave = (config.concurrency * 4).max(1);
        for (index, chunk) in names.chunks(wave).enumerate() {
            let started = index * wave;
            wait_for("runs to halt before the next wave", config.timeout, || {
                self.check_alive()?;
                let done = self.halted_or_finished(&names[..started]);
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
        wait_for("every run to halt for approval", config.timeout, || {
            self.check_alive()?;
            let done = self.halted_or_finished(&names);
            Ok((done < n).then(|| format!("{done}/{n} halted or finished")))
        })
        .await?;
        let seconds = created.elapsed().as_secs_f64();
        let seen = self.seen.runs();
        let halted: Vec<String> = names
            .into_iter()
            .filter(|r| {
                seen.get(r)
                    .is_some_and(|s| s.awaiting.is_some() && s.terminal.is_none())
            })
            .collect();
        if halted.is_empty() {
            return Err(BenchError::NothingToMeasure(format!(
                "no run halted for approval; see {}",
                ns.dir.display()
            )));
        }
        Ok(Halted {
            runs: halted,
            seconds,
        })
    }

    /// How many of `runs` finished, and the moment the last of them succeeded.
    pub(crate) fn finished(&self, runs: &[String]) -> (usize, Option<Instant>) {
        let seen = self.seen.runs();
        let done = runs
            .iter()
            .filter(|r| seen.get(*r).is_some_and(|s| s.terminal.is_some()))
            .count();
        let last = runs
            .iter()
            .filter_map(|r| seen.get(r)?.terminal)
            .filter(|(_, ok)| *ok)
            .map(|(at, _)| at)
            .max();
        (done, last)
    }
}
