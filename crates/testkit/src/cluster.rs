//! A real control plane for integration tests: etcd, kube-apiserver and kube-controller-manager on
//! loopback, started once per test binary by `scripts/local-cluster run --lifeline`.
//!
//! The cluster lives as long as the test binary: its supervisor reads our end of a pipe and tears
//! everything down (processes and data) when the pipe closes, which the kernel does when this
//! process exits for any reason, a panic or a kill included.
//!
//! Set `AGENTRUN_TEST_CLUSTER_DIR` to the folder of a cluster started with
//! `scripts/local-cluster start` to reuse it instead (faster when iterating).
//!
//! The tests of one binary run in parallel on its control plane: each works in namespaces of its
//! own ([`ControlPlane::namespace`]) and names any cluster-scoped object it creates uniquely.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use agentrun_dev_kubelet::ClusterAccess;
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::cluster_env::{ClusterEnv, parse_cluster_env};
use crate::namespaces;

/// The identities of the local cluster's static token file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// `admin`, in `system:masters`.
    Admin,
    /// `alice@example.com`, in `agentrun:approvers`.
    Alice,
    /// `bob@example.com`, in `agentrun:approvers`.
    Bob,
    /// `carol@example.com`, in `agentrun:requesters` (no approval rights).
    Carol,
    /// `gitops`, in `agentrun:gitops`.
    Gitops,
}

impl Identity {
    /// Every identity.
    pub const ALL: [Identity; 5] = [
        Identity::Admin,
        Identity::Alice,
        Identity::Bob,
        Identity::Carol,
        Identity::Gitops,
    ];

    /// The kubeconfig file stem.
    pub fn key(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Alice => "alice",
            Identity::Bob => "bob",
            Identity::Carol => "carol",
            Identity::Gitops => "gitops",
        }
    }

    /// The username the API server authenticates.
    pub fn username(self) -> &'static str {
        match self {
            Identity::Admin => "admin",
            Identity::Alice => "alice@example.com",
            Identity::Bob => "bob@example.com",
            Identity::Carol => "carol@example.com",
            Identity::Gitops => "gitops",
        }
    }
}

/// A running control plane shared by all tests of one binary.
pub struct ControlPlane {
    dir: PathBuf,
    env: ClusterEnv,
    /// Kept open for the life of the process: closing it stops the cluster.
    _lifeline: Option<Mutex<(Child, ChildStdin)>>,
    crds: OnceLock<()>,
}

static SHARED: OnceLock<ControlPlane> = OnceLock::new();

/// The repository root (this crate is `crates/testkit` in it).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/testkit has a grandparent")
        .to_path_buf()
}

impl ControlPlane {
    /// The control plane of this test binary, started on first use (this blocks for the few seconds
    /// the API server takes to become ready).
    pub async fn shared() -> &'static ControlPlane {
        Self::shared_blocking()
    }

    /// [`ControlPlane::shared`] for synchronous code.
    pub fn shared_blocking() -> &'static ControlPlane {
        SHARED.get_or_init(|| match std::env::var_os("AGENTRUN_TEST_CLUSTER_DIR") {
            Some(dir) => Self::attach(PathBuf::from(dir)),
            None => Self::start(),
        })
    }

    fn start() -> ControlPlane {
        Self::start_with(&[])
    }

    /// A control plane with a real node (`scripts/local-cluster run --node`: containerd, a kubelet
    /// and kube-scheduler, the image archives of `scripts/image` imported), owned by the caller:
    /// [`ControlPlane::stop`] stops it and waits until the host is put back.
    pub fn start_with_node() -> ControlPlane {
        Self::start_with(&["--node"])
    }

    /// Stops a control plane this process started and waits until its supervisor has stopped
    /// every process and, for a node, restored the host.
    pub fn stop(self) {
        if let Some(lifeline) = self._lifeline {
            let (mut child, stdin) = lifeline.into_inner().unwrap_or_else(|e| e.into_inner());
            drop(stdin);
            let _ = child.wait();
        }
    }

    fn start_with(extra_args: &[&str]) -> ControlPlane {
        let dir = std::env::temp_dir().join(format!(
            "agentrun-cluster-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("create the cluster folder");
        let log_path = dir.with_extension("log");
        let log = std::fs::File::create(&log_path).expect("create the cluster log");
        let mut child = Command::new(repo_root().join("scripts/local-cluster"))
            .arg("run")
            .arg("--dir")
            .arg(&dir)
            .arg("--lifeline")
            .args(extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start scripts/local-cluster");
        let stdin = child.stdin.take().expect("lifeline pipe");
        let stdout = child.stdout.take().expect("ready pipe");
        let mut line = String::new();
        let mut reader = BufReader::new(stdout);
        while line.is_empty() || !line.starts_with("ready ") {
            line.clear();
            let n = reader.read_line(&mut line).unwrap_or(0);
            if n == 0 {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("the local control plane failed to start:\n{log}");
            }
        }
        let _ = std::fs::remove_file(&log_path);
        let env = read_env(&dir);
        ControlPlane {
            dir,
            env,
            _lifeline: Some(Mutex::new((child, stdin))),
            crds: OnceLock::new(),
        }
    }

    fn attach(dir: PathBuf) -> ControlPlane {
        assert!(
            dir.join("ready").exists(),
            "AGENTRUN_TEST_CLUSTER_DIR={} is not a running cluster (scripts/local-cluster start)",
            dir.display()
        );
        let env = read_env(&dir);
        ControlPlane {
            dir,
            env,
            _lifeline: None,
            crds: OnceLock::new(),
        }
    }

    /// The cluster's folder (pki, logs, kubeconfigs, audit log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's URL.
    pub fn url(&self) -> &str {
        &self.env.api_url
    }

    /// The folder holding kube-apiserver, etcd, kube-controller-manager, kubectl and helm.
    pub fn bin_dir(&self) -> PathBuf {
        self.env.bin_dir.clone()
    }

    /// The API server's audit log (JSON lines).
    pub fn audit_log(&self) -> PathBuf {
        self.env.audit_log.clone()
    }

    /// The kubeconfig file of an identity.
    pub fn kubeconfig(&self, identity: Identity) -> PathBuf {
        self.env
            .kubeconfig_dir
            .join(format!("{}.kubeconfig", identity.key()))
    }

    /// The bearer token of an identity.
    pub fn token(&self, identity: Identity) -> String {
        kubeconfig_yaml(&self.kubeconfig(identity))["users"][0]["user"]["token"]
            .as_str()
            .expect("token in kubeconfig")
            .to_string()
    }

    /// The CA certificate (PEM) the API server's serving certificate chains to.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("pki/ca.crt")).expect("read CA")
    }

    /// A new client acting as `identity`. Clients are bound to the async runtime that made them,
    /// so each test makes its own.
    pub async fn client(&self, identity: Identity) -> Client {
        let kc = Kubeconfig::read_from(self.kubeconfig(identity)).expect("read kubeconfig");
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        Client::try_from(config).expect("client")
    }

    /// A new client authenticating with a bearer token (e.g. one minted for a service account).
    pub async fn client_with_token(&self, token: &str) -> Client {
        let mut kc = Kubeconfig::read_from(self.kubeconfig(Identity::Admin)).expect("kubeconfig");
        kc.auth_infos[0].auth_info = Some(AuthInfo {
            token: Some(token.to_string().into()),
            ..Default::default()
        });
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        Client::try_from(config).expect("client")
    }

    /// A kubeconfig file (in the cluster folder) for a bearer token, e.g. for kubectl or a worker.
    pub fn write_token_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let path = self.dir.join(format!("kubeconfig/{name}.kubeconfig"));
        let admin = Kubeconfig::read_from(self.kubeconfig(Identity::Admin)).expect("kubeconfig");
        ClusterAccess::from_kubeconfig(&admin)
            .expect("the admin kubeconfig names the cluster")
            .write_token_kubeconfig(&path, name, token)
            .expect("write kubeconfig");
        path
    }

    /// A fresh namespace for one test, named `<prefix>-<random>`, with its `default` service
    /// account in place. It is deleted (without waiting) when the returned guard drops.
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        let name = format!("{}-{:08x}", prefix, rand::random::<u32>());
        let client = self.client(Identity::Admin).await;
        namespaces::create_namespace(
            &client,
            &name,
            &[("agentrun.dev/test", "true")],
            Duration::from_secs(30),
        )
        .await
        .unwrap_or_else(|e| panic!("namespace {name}: {e}"));
        TestNamespace {
            name,
            kubeconfig: self.kubeconfig(Identity::Admin),
            kubectl: self.bin_dir().join("kubectl"),
        }
    }

    /// Runs kubectl as `identity`.
    pub fn kubectl(&self, identity: Identity, args: &[&str]) -> Output {
        self.kubectl_with_stdin(identity, args, None)
    }

    /// Runs kubectl as `identity`, feeding `stdin` to it.
    pub fn kubectl_with_stdin(
        &self,
        identity: Identity,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Output {
        run_tool(
            &self.bin_dir().join("kubectl"),
            &self.kubeconfig(identity),
            args,
            stdin,
        )
    }

    /// `kubectl apply -f -` of `yaml` as `identity`; panics when it fails.
    pub fn apply(&self, identity: Identity, yaml: &str) {
        assert_success(
            &self.kubectl_with_stdin(identity, &["apply", "-f", "-"], Some(yaml)),
            "kubectl apply",
        );
    }

    /// Runs helm as admin.
    pub fn helm(&self, args: &[&str]) -> Output {
        run_tool(
            &self.bin_dir().join("helm"),
            &self.kubeconfig(Identity::Admin),
            args,
            None,
        )
    }

    /// Installs the CRDs (and admission policies) from `crds/` once per test binary and waits until
    /// the API server serves them.
    pub async fn install_crds(&self) {
        self.crds.get_or_init(|| {
            let crds = repo_root().join("crds");
            self.apply_crds(std::slice::from_ref(&crds));
            self.wait_served(crds.join("admission-policies.yaml").exists());
        });
    }

    /// Installs only the CustomResourceDefinitions (not the admission policies or roles), for tests
    /// of the schema and CEL rules on their own.
    pub async fn install_crds_only(&self) {
        self.crds.get_or_init(|| {
            let crds = repo_root().join("crds");
            let files = [
                "agent.yaml",
                "agentrun.yaml",
                "approvalrequest.yaml",
                "approvalrecord.yaml",
                "approvalpolicy.yaml",
                "runstatechunk.yaml",
            ]
            .map(|f| crds.join(f));
            self.apply_crds(&files);
            self.wait_served(false);
        });
    }

    /// [`apply_crds`] as admin; panics when it fails.
    pub fn apply_crds(&self, paths: &[PathBuf]) {
        apply_crds(
            &self.bin_dir().join("kubectl"),
            &self.kubeconfig(Identity::Admin),
            paths,
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Waits until the API server serves the custom resources to admission too (Established comes
    /// a moment earlier) and, with `policies`, until the admission policies are in effect: a
    /// server-side dry-run create shows the creator stamp overwriting a forged one.
    fn wait_served(&self, policies: bool) {
        let probe = "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: probe, namespace: default, annotations: {agentrun.dev/created-by: forged}}\nspec: {agentRef: {name: probe}, input: probe}\n";
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = self.kubectl_with_stdin(
                Identity::Admin,
                &["create", "--dry-run=server", "-o", "json", "-f", "-"],
                Some(probe),
            );
            let stamped = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .map(|v| v["metadata"]["annotations"]["agentrun.dev/created-by"] == "admin")
                .unwrap_or(false);
            if out.status.success() && (stamped || !policies) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "CRDs and policies not in effect: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Mints a token for a service account with the TokenRequest API.
    pub async fn service_account_token(&self, namespace: &str, account: &str) -> String {
        let client = self.client(Identity::Admin).await;
        namespaces::service_account_token(&client, namespace, account, 3600)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Stops kube-apiserver and starts it again with the same flags (etcd keeps the data); returns
    /// once it is ready.
    pub fn restart_apiserver(&self) {
        let out = Command::new(repo_root().join("scripts/local-cluster"))
            .arg("restart-apiserver")
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .expect("run scripts/local-cluster restart-apiserver");
        assert_success(&out, "restart kube-apiserver");
    }

    /// Reads the API server's audit log as JSON events.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.audit_log())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// A namespace owned by one test.
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("AGENTRUN_KEEP_NAMESPACES").is_some() || std::thread::panicking() {
            return;
        }
        let _ = Command::new(&self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["delete", "namespace", &self.name, "--wait=false"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(worker_dir(&self.name));
    }
}

/// Where the dev kubelet of a test runs the worker Pods of namespace `ns` (removed with the
/// namespace, kept like it when the test fails).
pub fn worker_dir(ns: &str) -> PathBuf {
    std::env::temp_dir().join(format!("agentrun-test-{ns}"))
}

/// Panics with the tool's output when it failed.
pub fn assert_success(out: &Output, what: &str) {
    if let Err(e) = succeeded(out, what) {
        panic!("{e}");
    }
}

/// A tool's standard output, as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A tool's standard error, as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that kubectl failed and that its error names every `needle`.
#[track_caller]
pub fn assert_refused(out: &Output, what: &str, needles: &[&str]) {
    let err = stderr(out);
    assert!(
        !out.status.success(),
        "{what} was accepted but must be refused:\nstdout: {}\nstderr: {err}",
        stdout(out)
    );
    for needle in needles {
        assert!(
            err.contains(needle),
            "{what}: the error does not say `{needle}`:\n{err}"
        );
    }
}

/// `Ok` when the tool succeeded, else its output.
pub fn succeeded(out: &Output, what: &str) -> Result<(), String> {
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// `kubectl apply --server-side --force-conflicts -f PATH` of each of `paths` (files or folders)
/// with `kubeconfig`, then waits up to 60 s until every agentrun CRD is Established. The error
/// holds the output of the command that failed.
pub fn apply_crds(kubectl: &Path, kubeconfig: &Path, paths: &[PathBuf]) -> Result<(), String> {
    for path in paths {
        let path = path.to_string_lossy();
        let args = ["apply", "--server-side", "--force-conflicts", "-f", &path];
        succeeded(
            &run_tool(kubectl, kubeconfig, &args, None),
            &format!("kubectl apply -f {path}"),
        )?;
    }
    let wait = [
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd",
        "-l",
        "app.kubernetes.io/part-of=agentrun",
    ];
    succeeded(
        &run_tool(kubectl, kubeconfig, &wait, None),
        "kubectl wait for the CRDs",
    )
}

fn run_tool(exe: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write;
    let mut cmd = Command::new(exe);
    cmd.env("KUBECONFIG", kubeconfig)
        .env("HOME", std::env::temp_dir())
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("agentrun-helm/cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("agentrun-helm/config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("agentrun-helm/data"),
        )
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .expect("write stdin");
    }
    child.wait_with_output().expect("wait for tool")
}

fn read_env(dir: &Path) -> ClusterEnv {
    let path = dir.join("cluster.env");
    let text = std::fs::read_to_string(&path).expect("cluster.env");
    parse_cluster_env(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn kubeconfig_yaml(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("read kubeconfig");
    serde_yaml_ng::from_str(&text).expect("parse kubeconfig")
}
