//! The control plane the benchmark runs against, and its namespaces: set up with the approvers'
//! binding and the identities of the controller and the baseline client, removed afterwards.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentrun::crd::{AgentRun, ApprovalRequest};
use agentrun_dev_kubelet::ClusterAccess;
use agentrun_testkit::cluster::apply_crds;
use agentrun_testkit::cluster_env::{ClusterEnv, parse_cluster_env};
use agentrun_testkit::namespaces;
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::error::{io_error, kube_error};
use crate::run::Progress;
use crate::{BASELINE_ACCOUNT, BenchConfig, BenchError, CONTROLLER_ACCOUNT};

/// The local control plane the benchmark runs against, with admin and alice (an approver).
pub(crate) struct Cluster {
    pub(crate) env: ClusterEnv,
    pub(crate) admin_kubeconfig: PathBuf,
    access: ClusterAccess,
    pub(crate) admin: Client,
    pub(crate) alice: Client,
}

/// A client from a kubeconfig file.
pub(crate) async fn client_from(path: &Path) -> Result<Client, BenchError> {
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
    /// Connects to the control plane of folder `dir` (`scripts/local-cluster start --dir DIR`).
    pub(crate) async fn connect(dir: &Path) -> Result<Cluster, BenchError> {
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
    pub(crate) async fn admin_client(&self) -> Result<Client, BenchError> {
        client_from(&self.admin_kubeconfig).await
    }

    /// Applies the CRDs, policies and roles of folder `dir` and waits for the CRDs.
    pub(crate) async fn install_crds(&self, dir: &Path) -> Result<(), BenchError> {
        let (kubectl, kubeconfig) = (
            self.env.bin_dir.join("kubectl"),
            self.admin_kubeconfig.clone(),
        );
        let paths = [dir.to_owned()];
        tokio::task::spawn_blocking(move || apply_crds(&kubectl, &kubeconfig, &paths))
            .await
            .map_err(|e| BenchError::Config(format!("installing the CRDs: {e}")))?
            .map_err(|message| BenchError::Command {
                what: "installing the CRDs".into(),
                message,
            })
    }

    /// Writes a kubeconfig file for a bearer token on this cluster.
    fn write_kubeconfig(&self, path: &Path, user: &str, token: &str) -> Result<(), BenchError> {
        self.access
            .write_token_kubeconfig(path, user, token)
            .map_err(io_error(format!("writing {}", path.display())))
    }
}

/// A namespace of the benchmark, with the approvers' RoleBinding and the identities of the
/// controller and of the baseline client.
#[derive(Clone)]
pub(crate) struct BenchNamespace {
    /// The namespace.
    pub(crate) name: String,
    /// The controller's kubeconfig (its ServiceAccount token).
    pub(crate) controller_kubeconfig: PathBuf,
    /// The baseline client's kubeconfig: a ServiceAccount too, so that API Priority and Fairness
    /// classifies it like the controller (the admin identity is exempt from it).
    pub(crate) baseline_kubeconfig: PathBuf,
    /// Logs and Pod folders.
    pub(crate) dir: PathBuf,
}

impl BenchNamespace {
    /// The ClusterRoleBinding giving the controller its cluster-scoped rights.
    pub(crate) fn controller_binding(&self) -> String {
        format!("{}-{CONTROLLER_ACCOUNT}", self.name)
    }

    /// The API server's username of the controller.
    pub(crate) fn controller_username(&self) -> String {
        format!("system:serviceaccount:{}:{CONTROLLER_ACCOUNT}", self.name)
    }
}

/// A namespace `<prefix>-<random>` labelled `agentrun.dev/bench=true`, with the approvers'
/// RoleBinding and the controller's and baseline client's identities, and its work folder.
pub(crate) async fn create_namespace(
    cluster: &Cluster,
    config: &BenchConfig,
    prefix: &str,
) -> Result<BenchNamespace, BenchError> {
    let name = format!("{prefix}-{:06x}", rand::random::<u32>() & 0xff_ffff);
    namespaces::create_namespace(
        &cluster.admin,
        &name,
        &[("agentrun.dev/bench", "true")],
        Duration::from_secs(60),
    )
    .await?;
    let dir = config.work_dir.join(&name);
    std::fs::create_dir_all(&dir).map_err(io_error(format!("creating {}", dir.display())))?;
    let ns = BenchNamespace {
        controller_kubeconfig: dir.join("controller.kubeconfig"),
        baseline_kubeconfig: dir.join("baseline.kubeconfig"),
        name,
        dir,
    };
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
    // The controller also reads cluster-scoped objects (ApprovalPolicies, NotificationSinks,
    // its namespace's labels) and writes ApprovalRecords; removed with the namespace.
    let cluster_binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": ns.controller_binding(), "labels": {"agentrun.dev/bench": "true"}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_ACCOUNT, "namespace": ns.name}],
    }))
    .map_err(|e| BenchError::Config(format!("the controller's ClusterRoleBinding: {e}")))?;
    Api::<ClusterRoleBinding>::all(cluster.admin.clone())
        .create(&PostParams::default(), &cluster_binding)
        .await
        .map_err(kube_error("creating the controller's ClusterRoleBinding"))?;
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
    Ok(namespaces::service_account_token(&cluster.admin, ns, account, 4 * 3600).await?)
}

/// The names of the objects of `api` that hold finalizers. A failed listing is reported and ends
/// the list there.
async fn finalized<K>(api: &Api<K>, progress: &Progress) -> Vec<String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let mut names = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        match api.list_metadata(&params).await {
            Ok(page) => {
                names.extend(
                    page.items
                        .iter()
                        .filter(|o| !o.finalizers().is_empty())
                        .map(|o| o.name_any()),
                );
                match page.metadata.continue_.filter(|t| !t.is_empty()) {
                    Some(token) => params = params.continue_token(&token),
                    None => return names,
                }
            }
            Err(error) => {
                progress.say(format!("warning: listing objects to remove: {error}"));
                return names;
            }
        }
    }
}

/// Removes the finalizers of the objects `names` of `api`, `concurrency` at a time; returns how
/// many could not be removed (an object already gone counts as done).
async fn strip_finalizers<K>(api: &Api<K>, names: Vec<String>, concurrency: usize) -> usize
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let strip = json!({"metadata": {"finalizers": null}});
    stream::iter(names)
        .map(|name| {
            let strip = &strip;
            async move {
                match api
                    .patch_metadata(&name, &PatchParams::default(), &Patch::Merge(strip))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(concurrency)
        .filter(|r| futures::future::ready(r.is_err()))
        .count()
        .await
}

/// Removes the namespace: finalizers first (the controller is stopped by then), then the
/// namespace; waits a bounded time for it to go. Problems are reported, not returned.
pub(crate) async fn remove_namespace(
    cluster: &Cluster,
    config: &BenchConfig,
    ns: &str,
    progress: &Progress,
) {
    progress.say(format!("removing namespace {ns}"));
    let runs: Api<AgentRun> = Api::namespaced(cluster.admin.clone(), ns);
    let requests: Api<ApprovalRequest> = Api::namespaced(cluster.admin.clone(), ns);
    let (request_names, run_names) = (
        finalized(&requests, progress).await,
        finalized(&runs, progress).await,
    );
    let failures = strip_finalizers(&requests, request_names, config.concurrency).await
        + strip_finalizers(&runs, run_names, config.concurrency).await;
    if failures > 0 {
        progress.say(format!(
            "warning: {failures} finalizers of {ns} could not be removed"
        ));
    }
    let binding = format!("{ns}-{CONTROLLER_ACCOUNT}");
    match Api::<ClusterRoleBinding>::all(cluster.admin.clone())
        .delete(&binding, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(error) => progress.say(format!(
            "warning: deleting ClusterRoleBinding {binding}: {error}"
        )),
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
