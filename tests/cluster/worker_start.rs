//! A worker started before its run reaches its step: the controller creates a resumed run's next
//! worker Pod at the same time as it writes the status that moves the run to that step, so the
//! worker waits for that write instead of failing the step. A worker of a finished run runs nothing.

use std::time::Duration;

use agentrun::crd::{AgentRun, AgentRunPhase};
use agentrun::worker::{WorkerError, run_step};
use agentrun_testkit::cluster::{ControlPlane, Identity};
use agentrun_testkit::runs::run_yaml;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_waits_for_its_run_to_reach_its_step_and_refuses_a_later_one_or_a_finished_run() {
    let cp = ControlPlane::shared().await;
    cp.install_crds().await;
    let ns = cp.namespace("worker-start").await;
    cp.apply(Identity::Admin, &run_yaml(&ns.name, "r1", "ops", "go"));
    let client = cp.client(Identity::Admin).await;
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), &ns.name);
    let set_status = |status: serde_json::Value| {
        let runs = runs.clone();
        async move {
            runs.patch_status(
                "r1",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .expect("the run's status");
        }
    };
    set_status(json!({"phase": "AwaitingApproval", "step": 0})).await;

    // Started for step 1 while the run is at step 0: it waits.
    let (early, namespace) = (client.clone(), ns.name.clone());
    let worker = tokio::spawn(async move { run_step(early, &namespace, "r1", 1).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!worker.is_finished(), "the worker gave up before its step");
    // The run reaches step 1: the worker goes on with it (and stops here, as this run has no
    // Agent snapshot: the step itself is not what this test is about).
    set_status(json!({"phase": "Running", "step": 1})).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), worker)
        .await
        .expect("the worker went on once the run reached its step")
        .expect("the worker task");
    assert!(
        matches!(ended, Err(WorkerError::NoAgentSnapshot(_))),
        "{ended:?}"
    );

    // A worker of an earlier step is stale at once.
    let stale = tokio::time::timeout(
        Duration::from_secs(5),
        run_step(client.clone(), &ns.name, "r1", 0),
    )
    .await
    .expect("a stale worker does not wait");
    assert!(
        matches!(
            stale,
            Err(WorkerError::StaleStep {
                expected: 0,
                current: 1
            })
        ),
        "{stale:?}"
    );

    // A worker started for a finished run (by a controller that saw an earlier version of it)
    // runs nothing, not even at the run's step.
    set_status(json!({"phase": "Succeeded", "step": 1})).await;
    let late = tokio::time::timeout(
        Duration::from_secs(5),
        run_step(client.clone(), &ns.name, "r1", 1),
    )
    .await
    .expect("a worker of a finished run does not wait");
    assert!(
        matches!(
            late,
            Err(WorkerError::RunFinished {
                phase: AgentRunPhase::Succeeded
            })
        ),
        "{late:?}"
    );
}
