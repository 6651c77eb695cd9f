//! The chaos test: many runs against the real control plane while the controller is killed at
//! random moments, worker processes are killed mid-step and kube-apiserver is restarted once.
//! Afterwards every run has finished, every approved tool call ran exactly once per
//! Idempotency-Key (re-sent only as recorded), no decision was lost and no Pod was duplicated.
//! Bounded in time; it stops by itself. `AGENTRUN_CHAOS_RUNS` changes the number of runs.
//!
//! A test binary of its own, so a control plane of its own: it restarts kube-apiserver, which
//! would fail the requests of any test sharing the control plane.

use std::collections::HashSet;
use std::time::Duration;

use agentrun::controller::{self, ControllerConfig, decide::Policy};
use agentrun::crd::{AgentRun, AgentRunPhase, ApprovalRequest};
use agentrun_testkit::cluster::{ControlPlane, Identity, assert_success};
use agentrun_testkit::operator::start_dev_kubelet;
use agentrun_testkit::tool_server::ToolServer;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use rand::Rng;
use serde_json::json;

fn runs_wanted() -> usize {
    std::env::var("AGENTRUN_CHAOS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

async fn controller(cp: &ControlPlane, ns: &str) -> tokio::task::JoinHandle<()> {
    let client = cp.client(Identity::Admin).await;
    let config = ControllerConfig {
        namespace: Some(ns.to_owned()),
        policy: Policy {
            max_retries: 10,
            retry_backoff: Duration::from_millis(200),
            recheck: Duration::from_secs(2),
            ..Default::default()
        },
        // Kept: the test checks that no run made a Pod twice.
        worker: agentrun_testkit::operator::keep_worker_pods(),
        ..Default::default()
    };
    tokio::spawn(async move {
        // A controller that exits (e.g. it started while the API server was down) is started
        // again after a second, as the kubelet restarts a crashed container.
        loop {
            let _ = controller::run(client.clone(), config.clone()).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_survive_controller_kills_worker_kills_and_an_apiserver_restart() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cp = ControlPlane::shared().await;
    cp.install_crds().await;
    let ns = cp.namespace("chaos").await;
    let n = runs_wanted();
    let started = tokio::time::Instant::now();
    let deadline = started + Duration::from_secs(720);

    let grant = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: approvers, namespace: {}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agentrun-approver}}\nsubjects: [{{kind: Group, name: \"agentrun:approvers\"}}]\n",
        ns.name
    );
    assert_success(
        &cp.kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&grant)),
        "grant",
    );

    let tools = ToolServer::start().await;
    // Approved calls take a moment, so that some workers are killed while a call is in flight.
    tools.set_reply(
        "/delete_user",
        agentrun_testkit::tool_server::ToolReply::Delay(
            Duration::from_millis(300),
            Box::new(agentrun_testkit::tool_server::ToolReply::Echo),
        ),
    );

    let admin = cp.client(Identity::Admin).await;
    let agents: Api<agentrun::crd::Agent> = Api::namespaced(admin.clone(), &ns.name);
    let runs: Api<AgentRun> = Api::namespaced(admin.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns.name);
    let kubelet = start_dev_kubelet(cp, &ns.name).await;
    let mut current = controller(cp, &ns.name).await;

    // One Agent per run, so each run's approved call has its own id (and Idempotency-Key).
    for i in 0..n {
        let agent: agentrun::crd::Agent = serde_json::from_value(json!({
            "apiVersion": "agentrun.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": format!("ops-{i}")},
            "spec": {
                "model": {"scripted": {"turns": [
                    {"toolCalls": [
                        {"id": format!("del_{i}"), "name": "delete_user", "arguments": {"user_id": format!("u-{i}")}},
                        {"id": format!("get_{i}"), "name": "lookup_user", "arguments": {"user_id": format!("u-{i}")}}
                    ]},
                    {"content": format!("deleted u-{i}")}
                ]}},
                "tools": [
                    {"name": "delete_user", "requiresApproval": true, "idempotent": true, "http": {"url": tools.url("/delete_user")}},
                    {"name": "lookup_user", "http": {"url": tools.url("/lookup_user")}}
                ]
            }
        }))
        .unwrap();
        agents.create(&PostParams::default(), &agent).await.unwrap();
        let run: AgentRun = serde_json::from_value(json!({
            "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
            "metadata": {"name": format!("r{i}")},
            "spec": {"agentRef": {"name": format!("ops-{i}")}, "input": format!("Delete u-{i}")}
        }))
        .unwrap();
        runs.create(&PostParams::default(), &run).await.unwrap();
    }

    let alice: Api<ApprovalRequest> = Api::namespaced(cp.client(Identity::Alice).await, &ns.name);
    let mut approved: HashSet<String> = HashSet::new();
    let mut restarted = false;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));

    // Kill the controller at random moments, 20 times; a new one starts as a Deployment would.
    let killer = {
        let stop = stop.clone();
        let ns = ns.name.clone();
        tokio::spawn(async move {
            let cp = ControlPlane::shared().await;
            let mut kills = 0;
            while kills < 20 && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let wait = rand::rng().random_range(200..2500);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                current.abort();
                kills += 1;
                let pause = rand::rng().random_range(0..400);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                current = controller(cp, &ns).await;
            }
            (kills, current)
        })
    };
    // Kill running worker processes mid-step (the dev kubelet kills a deleted Pod's process).
    let pod_killer = {
        let stop = stop.clone();
        let pods = pods.clone();
        tokio::spawn(async move {
            let mut kills = 0;
            while kills < 20 && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let wait = rand::rng().random_range(100..1500);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let Ok(list) = pods.list(&ListParams::default()).await else {
                    continue;
                };
                let running: Vec<String> = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .filter_map(|p| p.metadata.name.clone())
                    .collect();
                if running.is_empty() {
                    continue;
                }
                let victim = running[rand::rng().random_range(0..running.len())].clone();
                if pods.delete(&victim, &Default::default()).await.is_ok() {
                    kills += 1;
                }
            }
            kills
        })
    };
    loop {
        if tokio::time::Instant::now() > deadline {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let phases: Vec<_> = runs
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .map(|r| r.status.as_ref().and_then(|s| s.phase))
                        .collect()
                })
                .unwrap_or_default();
            let done = phases
                .iter()
                .filter(|p| p.is_some_and(AgentRunPhase::is_terminal))
                .count();
            panic!(
                "the chaos run did not finish in time: {done}/{n} done, {} approved, restarted: {restarted}, phases: {phases:?}",
                approved.len()
            );
        }
        // Approve every request that waits, as alice.
        if let Ok(list) = alice.list(&ListParams::default()).await {
            for request in list.items.iter().filter(|r| r.spec.decision.is_none()) {
                let name = request.metadata.name.clone().unwrap();
                let patch = json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": format!("chaos approval of {}", request.spec.tool_call_id)}});
                if alice
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    approved.insert(request.spec.tool_call_id.clone());
                }
            }
        }
        // Restart kube-apiserver once, when about a third of the approvals are in.
        if !restarted && approved.len() >= n / 3 {
            tokio::task::spawn_blocking(|| ControlPlane::shared_blocking().restart_apiserver())
                .await
                .unwrap();
            restarted = true;
        }
        let done = match runs.list(&ListParams::default()).await {
            Ok(list) => list
                .items
                .iter()
                .filter(|r| {
                    r.status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .is_some_and(AgentRunPhase::is_terminal)
                })
                .count(),
            Err(_) => 0,
        };
        if done == n && restarted && killer.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (controller_kills, current) = killer.await.unwrap();
    let pod_kills = pod_killer.await.unwrap();
    current.abort();
    kubelet.abort();
    eprintln!(
        "chaos: {n} runs in {:?}; controller killed {controller_kills} times, {pod_kills} worker Pods killed, kube-apiserver restarted",
        started.elapsed()
    );
    assert!(
        controller_kills >= 5,
        "the controller was killed only {controller_kills} times"
    );

    let requests: Api<ApprovalRequest> = Api::namespaced(admin.clone(), &ns.name);
    let all_requests = requests.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        all_requests.len(),
        n,
        "one ApprovalRequest per deferred call, none duplicated"
    );
    let all_pods = pods.list(&ListParams::default()).await.unwrap().items;
    for i in 0..n {
        let run = runs.get(&format!("r{i}")).await.unwrap();
        let status = run.status.clone().unwrap();
        assert_eq!(
            status.phase,
            Some(AgentRunPhase::Succeeded),
            "r{i}: {:?}",
            status.conditions
        );
        assert_eq!(
            status.final_output.as_deref(),
            Some(format!("deleted u-{i}").as_str())
        );
        // Exactly once per Idempotency-Key: any repeat is a recorded re-send with the same key.
        let key = format!("del_{i}");
        let resent = status
            .tool_calls
            .iter()
            .find(|r| r.tool_call_id == key)
            .and_then(|r| r.resent)
            .unwrap_or(0) as usize;
        assert!(tools.calls_of(&key) >= 1, "{key} never ran");
        assert!(
            tools.calls_of(&key) <= 1 + resent,
            "{key} was sent {} times but re-sent only {resent} times",
            tools.calls_of(&key)
        );
        // No decision lost: the audit entry is alice's.
        let state = agentrun::chunk_store::load(&admin, &run)
            .await
            .unwrap()
            .unwrap();
        let audit = &state.approval_metadata[&key];
        assert_eq!(audit.approver_id.as_deref(), Some("alice@example.com"));
        assert_eq!(
            audit.reason.as_deref(),
            Some(format!("chaos approval of {key}").as_str())
        );
        // No Pod duplicated: each (step, attempt) has one Pod, and only steps 0 and 1 exist.
        let mine: Vec<&str> = all_pods
            .iter()
            .filter_map(|p| p.metadata.name.as_deref())
            .filter(|name| name.starts_with(&format!("r{i}-step-")))
            .collect();
        let unique: HashSet<&&str> = mine.iter().collect();
        assert_eq!(unique.len(), mine.len());
        assert!(
            mine.iter().all(|p| p.starts_with(&format!("r{i}-step-0"))
                || p.starts_with(&format!("r{i}-step-1"))),
            "{mine:?}"
        );
    }
}
