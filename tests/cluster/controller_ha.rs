//! Two controllers with leader election against the real control plane: only the leader
//! reconciles; when it dies the other takes over and nothing is duplicated. Also the controller's
//! /metrics, /healthz and /readyz endpoints.

use std::time::Duration;

use agentrun::controller::{self, ControllerConfig, LeaderElection, decide::Policy};
use agentrun::crd::{AgentRunPhase, ApprovalRequest};
use agentrun_testkit::cluster::{ControlPlane, Identity, assert_success};
use agentrun_testkit::operator::start_dev_kubelet;
use agentrun_testkit::runs::{pods_of, wait_for_phase_within};
use agentrun_testkit::wait::free_port;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use serde_json::json;

async fn start(
    cp: &ControlPlane,
    ns: &str,
    identity: &str,
    port: u16,
) -> tokio::task::JoinHandle<()> {
    let client = cp.client(Identity::Admin).await;
    let config = ControllerConfig {
        namespace: Some(ns.to_owned()),
        policy: Policy {
            retry_backoff: Duration::from_millis(200),
            ..Policy::default()
        },
        // Kept: the test checks that the new leader made no Pod twice.
        worker: agentrun_testkit::operator::keep_worker_pods(),
        metrics_addr: Some(([127, 0, 0, 1], port).into()),
        leader_election: Some(LeaderElection {
            namespace: ns.to_owned(),
            lease_name: "agentrun-controller".into(),
            identity: identity.to_owned(),
            lease_duration: Duration::from_secs(4),
            grace: Duration::from_secs(1),
        }),
        ..Default::default()
    };
    tokio::spawn(async move {
        let _ = controller::run(client, config).await;
    })
}

async fn get(port: u16, path: &str) -> (u16, String) {
    let response = reqwest::get(format!("http://127.0.0.1:{port}{path}"))
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn holder(cp: &ControlPlane, ns: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    leases
        .get_opt("agentrun-controller")
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_when_the_leader_dies_and_nothing_is_duplicated() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter("agentrun=info,kube_lease_manager=info")
        .with_test_writer()
        .try_init();
    let cp = ControlPlane::shared().await;
    cp.install_crds().await;
    let ns = cp.namespace("ha").await;
    let (port_a, port_b) = (free_port().unwrap().port(), free_port().unwrap().port());
    let a = start(cp, &ns.name, "controller-a", port_a).await;
    // Let a take the lease first, so the test knows which one to kill.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while holder(cp, &ns.name).await.as_deref() != Some("controller-a") {
        assert!(
            tokio::time::Instant::now() < deadline,
            "controller-a never led"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = start(cp, &ns.name, "controller-b", port_b).await;

    let kubelet = start_dev_kubelet(cp, &ns.name).await;

    // Both replicas are healthy and ready (the standby waits for the lease).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for port in [port_a, port_b] {
        loop {
            if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await
                && r.status() == 200
            {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                let body = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
                    .await
                    .map(|r| r.status().as_u16());
                panic!("port {port} never ready: {body:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(get(port, "/healthz").await, (200, "ok".to_string()));
    }

    let agent = json!({
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "Agent",
        "metadata": {"name": "ops", "namespace": ns.name},
        "spec": {"model": {"scripted": {"turns": [
            {"toolCalls": [{"id": "call_1", "name": "restart", "arguments": {"service": "db"}}]},
            {"content": "Restarted."}
        ]}}, "tools": [{"name": "restart", "requiresApproval": true, "http": {"url": "http://127.0.0.1:9/restart"}}]}
    });
    let run = json!({
        "apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
        "metadata": {"name": "r1", "namespace": ns.name},
        "spec": {"agentRef": {"name": "ops"}, "input": "Restart the database"}
    });
    let grant = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "approvers", "namespace": ns.name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "agentrun-approver"},
        "subjects": [{"kind": "Group", "name": "agentrun:approvers"}]
    });
    for doc in [grant, agent, run] {
        assert_success(
            &cp.kubectl_with_stdin(
                Identity::Admin,
                &["apply", "-f", "-"],
                Some(&doc.to_string()),
            ),
            "apply",
        );
    }
    wait_for_phase_within(
        cp,
        &ns.name,
        "r1",
        AgentRunPhase::AwaitingApproval,
        Duration::from_secs(60),
    )
    .await;
    let (_, text) = get(port_a, "/metrics").await;
    assert!(
        text.contains("agentrun_reconciles_total{result=\"ok\"}"),
        "{text}"
    );
    assert!(text.contains("agentrun_pending_approvals 1"), "{text}");

    // The leader dies; the standby takes the lease and finishes the run.
    a.abort();
    let requests: Api<ApprovalRequest> =
        Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let name = requests.list(&ListParams::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    assert_success(
        &cp.kubectl(
            Identity::Alice,
            &[
                "patch",
                "apr",
                &name,
                "-n",
                &ns.name,
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"decision":"Approved","approverId":"alice@example.com","reason":"ok"}}"#,
            ],
        ),
        "approve",
    );
    wait_for_phase_within(
        cp,
        &ns.name,
        "r1",
        AgentRunPhase::Succeeded,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(holder(cp, &ns.name).await.as_deref(), Some("controller-b"));
    let names = pods_of(cp, &ns.name).await;
    assert_eq!(names, ["r1-step-0", "r1-step-1"]);
    assert_eq!(
        requests
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let (_, text) = get(port_b, "/metrics").await;
    assert!(
        text.contains("agentrun_approval_wait_seconds_count 1"),
        "{text}"
    );
    assert!(
        text.contains("agentrun_resume_latency_seconds_count 1"),
        "{text}"
    );
    assert!(
        text.contains("agentrun_runs{phase=\"Succeeded\"} 1"),
        "{text}"
    );
    b.abort();
    kubelet.abort();
}
