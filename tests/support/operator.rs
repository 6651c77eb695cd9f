//! The operator of one test: the controller and the dev kubelet running in the test process,
//! scoped to the test's namespace, stopped when dropped.

use std::time::Duration;

use agentrun::controller::{self, ControllerConfig, decide::Policy};
use agentrun::dev_kubelet::{self, ClusterAccess, DevKubeletConfig};
use kube::config::Kubeconfig;

use super::cluster::{ControlPlane, Identity, TestNamespace};

/// The controller and dev kubelet of one test; both stop when this drops.
pub struct Operator {
    /// The controller task (tests restart it to simulate a crash).
    pub controller: tokio::task::JoinHandle<()>,
    /// The dev kubelet task.
    pub kubelet: tokio::task::JoinHandle<()>,
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.controller.abort();
        self.kubelet.abort();
    }
}

/// Fast retries and rechecks for tests.
pub fn test_policy() -> Policy {
    Policy {
        max_retries: 2,
        retry_backoff: Duration::from_millis(200),
        recheck: Duration::from_secs(2),
    }
}

/// Starts a controller (as admin) watching `ns`.
pub async fn start_controller(cp: &ControlPlane, ns: &str) -> tokio::task::JoinHandle<()> {
    start_controller_with(cp, test_config(ns)).await
}

/// The controller settings of a test watching `ns`.
pub fn test_config(ns: &str) -> ControllerConfig {
    ControllerConfig {
        namespace: Some(ns.to_owned()),
        policy: test_policy(),
        ..Default::default()
    }
}

/// Starts a controller (as admin) with `config`.
pub async fn start_controller_with(
    cp: &ControlPlane,
    config: ControllerConfig,
) -> tokio::task::JoinHandle<()> {
    let client = cp.client(Identity::Admin).await;
    tokio::spawn(async move {
        controller::run(client, config).await.expect("controller");
    })
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
    let controller = start_controller_with(cp, config).await;
    let kubeconfig = Kubeconfig::read_from(cp.kubeconfig(Identity::Admin)).expect("kubeconfig");
    let config = DevKubeletConfig {
        agentrun_binary: env!("CARGO_BIN_EXE_agentrun").into(),
        namespace: Some(ns.name.clone()),
        work_dir: std::env::temp_dir().join(format!("agentrun-test-{}", ns.name)),
        cluster: ClusterAccess::from_kubeconfig(&kubeconfig).expect("cluster access"),
        max_pods: 0,
    };
    let client = cp.client(Identity::Admin).await;
    let kubelet = tokio::spawn(async move {
        dev_kubelet::run(client, config).await.expect("dev kubelet");
    });
    Operator {
        controller,
        kubelet,
    }
}
