//! The operator of one test: the controller and the dev kubelet running in the test process,
//! scoped to the test's namespace, stopped when dropped.

use std::path::PathBuf;
use std::time::Duration;

use agentrun::controller::{
    self, ControllerConfig, WorkerPodDeletion, WorkerSettings, decide::Policy,
};
use agentrun_dev_kubelet::{ClusterAccess, DevKubeletConfig};
use kube::config::Kubeconfig;
use tokio_util::task::AbortOnDropHandle;

use crate::cluster::{ControlPlane, Identity, TestNamespace};

/// The controller and dev kubelet of one test; both stop when this drops.
pub struct Operator {
    /// The controller task (tests abort and replace it to simulate a crash).
    pub controller: AbortOnDropHandle<()>,
    /// The dev kubelet task.
    pub kubelet: AbortOnDropHandle<()>,
}

/// Fast retries and rechecks for tests.
pub fn test_policy() -> Policy {
    Policy {
        max_retries: 2,
        retry_backoff: Duration::from_millis(200),
        recheck: Duration::from_secs(2),
        ..Default::default()
    }
}

/// The `agentrun` binary of the build running this test: the one cargo built beside the test
/// binary (`target/<profile>/agentrun`; test binaries are in `target/<profile>/deps`). Worker
/// Pods run it.
pub fn agentrun_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("CARGO_BIN_EXE_agentrun") {
        return path.into();
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let path = exe
        .ancestors()
        .nth(2)
        .expect("the test binary is in target/<profile>/deps")
        .join("agentrun");
    assert!(
        path.is_file(),
        "{} is missing: build it first (cargo build --bin agentrun)",
        path.display()
    );
    path
}

/// Worker Pods that stay until their run is deleted, for the tests that check every Pod a run
/// made (the default deletes a succeeded run's Pods once its status says so).
pub fn keep_worker_pods() -> WorkerSettings {
    WorkerSettings {
        pod_deletion: WorkerPodDeletion::Never,
        ..Default::default()
    }
}

/// The controller settings of a test watching `ns` (keeping the worker Pods: see
/// [`keep_worker_pods`]).
pub fn test_config(ns: &str) -> ControllerConfig {
    ControllerConfig {
        namespace: Some(ns.to_owned()),
        policy: test_policy(),
        worker: keep_worker_pods(),
        // As the chart runs it on Kubernetes >= 1.34 (the tests' control plane is 1.36); the
        // tests that build their own config (chaos, leader election, the chart's) use paged lists.
        streaming_lists: true,
        ..Default::default()
    }
}

/// Starts a controller (as admin) watching `ns`.
pub async fn start_controller(cp: &ControlPlane, ns: &str) -> AbortOnDropHandle<()> {
    start_controller_with(cp, test_config(ns)).await
}

/// Starts a controller (as admin) with `config`.
pub async fn start_controller_with(
    cp: &ControlPlane,
    config: ControllerConfig,
) -> AbortOnDropHandle<()> {
    let client = cp.client(Identity::Admin).await;
    AbortOnDropHandle::new(tokio::spawn(async move {
        controller::run(client, config).await.expect("controller");
    }))
}

/// Starts the dev kubelet (as admin) for the worker Pods of `ns`; they run [`agentrun_binary`] in
/// folders under the system temp dir.
pub async fn start_dev_kubelet(cp: &ControlPlane, ns: &str) -> AbortOnDropHandle<()> {
    let kubeconfig = Kubeconfig::read_from(cp.kubeconfig(Identity::Admin)).expect("kubeconfig");
    let config = DevKubeletConfig {
        agentrun_binary: agentrun_binary(),
        namespace: Some(ns.to_owned()),
        work_dir: crate::cluster::worker_dir(ns),
        cluster: ClusterAccess::from_kubeconfig(&kubeconfig).expect("cluster access"),
        max_pods: 0,
    };
    let client = cp.client(Identity::Admin).await;
    AbortOnDropHandle::new(tokio::spawn(async move {
        if let Err(error) = agentrun_dev_kubelet::run(client, config).await {
            eprintln!("dev kubelet: {error}");
        }
    }))
}

/// Installs the CRDs and policies, then starts the controller and the dev kubelet for `ns`.
pub async fn start_operator(cp: &ControlPlane, ns: &TestNamespace) -> Operator {
    start_operator_with(cp, ns, test_config(&ns.name)).await
}

/// Like [`start_operator`], with the controller's settings.
pub async fn start_operator_with(
    cp: &ControlPlane,
    ns: &TestNamespace,
    config: ControllerConfig,
) -> Operator {
    let _ = rustls::crypto::ring::default_provider().install_default();
    cp.install_crds().await;
    Operator {
        controller: start_controller_with(cp, config).await,
        kubelet: start_dev_kubelet(cp, &ns.name).await,
    }
}
