//! The Helm chart (`charts/agentrun`) against the real control plane: `helm lint`, CRD drift, the
//! values schema and documentation, `helm template` applied with a server-side dry run, `helm
//! install` into a namespace enforcing Pod Security "restricted", the controller running in-process
//! with a token of the chart's service account through a whole approval flow (which proves the
//! chart's RBAC is enough), the controller's rights being no more than that, and `helm upgrade` and
//! `helm uninstall` leaving nothing behind.
//!
//! A test binary of its own, so a control plane of its own: every admission policy and user role
//! in this cluster must come from the chart (several releases install their own, cluster-wide, and
//! the roles aggregate into `view`, `edit` and `admin`), so it cannot share the control plane of
//! `tests/cluster`, which holds those of `crds/`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use agentrun::controller::{self, ControllerConfig, LeaderElection, StartError, decide::Policy};
use agentrun::crd::{AgentRun, AgentRunPhase, ApprovalRequest, NotificationSink};
use agentrun::notify::NotifyConfig;
use agentrun_testkit::cluster::{ControlPlane, Identity, TestNamespace, assert_success, repo_root};
use agentrun_testkit::model_server::{ModelServer, Reply};
use agentrun_testkit::notification_receiver::NotificationReceiver;
use agentrun_testkit::operator::start_dev_kubelet;
use agentrun_testkit::tool_server::ToolServer;
use base64::Engine;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use kube::api::{Api, ListParams};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::task::AbortOnDropHandle;

/// The chart's folder.
fn chart() -> PathBuf {
    repo_root().join("charts/agentrun")
}

fn chart_arg() -> String {
    chart()
        .to_str()
        .expect("the repository path is UTF-8")
        .to_owned()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A release name unique in the cluster. It contains "agentrun", so it is also the prefix of every
/// object the chart creates (cluster-scoped ones included).
fn release_name(purpose: &str) -> String {
    format!(
        "agentrun-{purpose}-{:06x}",
        rand::random::<u32>() & 0x00ff_ffff
    )
}

/// `--set` arguments for helm.
fn set_args(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| ["--set".to_owned(), v.clone()])
        .collect()
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| (*v).to_owned()).collect()
}

fn helm(cp: &ControlPlane, args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    cp.helm(&args)
}

/// `helm template` of the chart (no CRDs), as text.
fn template(cp: &ControlPlane, release: &str, namespace: &str, values: &[String]) -> String {
    let mut args = strings(&["template", release, &chart_arg(), "--namespace", namespace]);
    args.extend(set_args(values));
    let out = helm(cp, &args);
    assert_success(&out, &format!("helm template {values:?}"));
    text(&out.stdout)
}

/// The YAML documents of a rendered chart.
fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(yaml)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn one_of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(docs, kind);
    assert_eq!(found.len(), 1, "expected one {kind}, found {}", found.len());
    found[0]
}

static CRDS: OnceLock<()> = OnceLock::new();

/// Installs the chart's CRDs once per test binary and waits until they are served. Not
/// `ControlPlane::install_crds`: that also applies the admission policies and roles of the top-level
/// `crds/`, and here every policy in the cluster must come from the chart.
fn install_crds(cp: &ControlPlane) {
    CRDS.get_or_init(|| cp.apply_crds(&[chart().join("crds")]));
}
/// A helm release of the chart, uninstalled when dropped (unless the test failed, to leave it for
/// inspection, or AGENTRUN_KEEP_NAMESPACES is set).
struct Release {
    cp: &'static ControlPlane,
    name: String,
    namespace: String,
    /// `helm install`'s standard output (it holds the NOTES).
    install_output: String,
}

impl Release {
    fn install(
        cp: &'static ControlPlane,
        name: &str,
        namespace: &str,
        values: &[String],
    ) -> Release {
        let mut args = strings(&["install", name, &chart_arg(), "--namespace", namespace]);
        args.extend(set_args(values));
        let out = helm(cp, &args);
        assert_success(&out, &format!("helm install {name} {values:?}"));
        Release {
            cp,
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            install_output: text(&out.stdout),
        }
    }

    fn upgrade(&self, values: &[String]) {
        let mut args = strings(&[
            "upgrade",
            &self.name,
            &chart_arg(),
            "--namespace",
            &self.namespace,
        ]);
        args.extend(set_args(values));
        assert_success(&helm(self.cp, &args), &format!("helm upgrade {values:?}"));
    }

    /// The name of the chart's controller objects (Deployment, ServiceAccount, ClusterRole...).
    fn controller(&self) -> String {
        format!("{}-controller", self.name)
    }

    /// The API server's username of the controller's service account.
    fn controller_user(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace,
            self.controller()
        )
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("AGENTRUN_KEEP_NAMESPACES").is_some() {
            return;
        }
        let _ = self.cp.helm(&[
            "uninstall",
            &self.name,
            "--namespace",
            &self.namespace,
            "--ignore-not-found",
        ]);
    }
}

/// Every object carrying the release's instance label, as `kind/name` (namespaced ones as
/// `namespace/kind/name`), over the kinds the chart creates and the ones created for it.
fn objects_of(cp: &ControlPlane, release: &str) -> BTreeSet<String> {
    let kinds = "deployments,replicasets,pods,services,serviceaccounts,configmaps,roles,rolebindings,\
                 networkpolicies,poddisruptionbudgets,clusterroles,clusterrolebindings,\
                 mutatingadmissionpolicies,mutatingadmissionpolicybindings,\
                 validatingadmissionpolicies,validatingadmissionpolicybindings";
    let out = cp.kubectl(
        Identity::Admin,
        &[
            "get",
            kinds,
            "--all-namespaces",
            "-l",
            &format!("app.kubernetes.io/instance={release}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.namespace}/{.kind}/{.metadata.name}{\"\\n\"}{end}",
        ],
    );
    assert_success(&out, "list the release's objects");
    text(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.trim_start_matches('/').to_owned())
        .collect()
}

fn label_restricted(cp: &ControlPlane, namespace: &str) {
    let out = cp.kubectl(
        Identity::Admin,
        &[
            "label",
            "namespace",
            namespace,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/enforce-version=latest",
        ],
    );
    assert_success(&out, "label the namespace restricted");
}

/// Runs kubectl with a kubeconfig file (e.g. one holding a service account's token).
fn kubectl_as(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new(cp.bin_dir().join("kubectl"))
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", std::env::temp_dir())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kubectl")
}

/// `kubectl auth can-i` with a kubeconfig: the API server's own answer for that identity.
fn can_i(cp: &ControlPlane, kubeconfig: &Path, args: &[&str]) -> bool {
    let mut all = vec!["auth", "can-i"];
    all.extend_from_slice(args);
    let out = kubectl_as(cp, kubeconfig, &all);
    match text(&out.stdout).trim() {
        "yes" => true,
        "no" => false,
        other => panic!(
            "kubectl auth can-i {args:?}: unexpected answer {other:?}; stderr: {}",
            text(&out.stderr)
        ),
    }
}

/// A kubeconfig holding a fresh token of the chart's controller service account.
async fn controller_kubeconfig(cp: &ControlPlane, release: &Release) -> PathBuf {
    let token = cp
        .service_account_token(&release.namespace, &release.controller())
        .await;
    cp.write_token_kubeconfig(&release.name, &token)
}

fn is_admission_policy_kind(kind: &Value) -> bool {
    kind.as_str()
        .is_some_and(|k| k.ends_with("AdmissionPolicy") || k.ends_with("AdmissionPolicyBinding"))
}

fn file_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

/// The chart's `crds/` holds the generated CRD files and `files/` the generated admission-policy
/// files, byte for byte; nothing else is there.
#[test]
fn the_chart_crds_and_policies_are_the_generated_ones() {
    let top = repo_root().join("crds");
    let mut crd_files = BTreeSet::new();
    let mut policy_files = BTreeSet::new();
    for name in file_names(&top) {
        if !name.ends_with(".yaml") {
            continue;
        }
        let bytes = std::fs::read(top.join(&name)).expect("read a crds/ file");
        let docs = documents(&text(&bytes));
        let (copy, what) = if !docs.is_empty()
            && docs.iter().all(|d| d["kind"] == "CustomResourceDefinition")
        {
            crd_files.insert(name.clone());
            (chart().join("crds").join(&name), "crds")
        } else if !docs.is_empty() && docs.iter().all(|d| is_admission_policy_kind(&d["kind"])) {
            policy_files.insert(name.clone());
            (chart().join("files").join(&name), "files")
        } else {
            // Anything else (the user roles) the chart templates itself; see
            // the_chart_renders_every_other_object_of_crds.
            assert!(
                !chart().join("crds").join(&name).exists(),
                "charts/agentrun/crds/{name} is not a CRD file: the chart templates those objects"
            );
            continue;
        };
        let chart_bytes = std::fs::read(&copy).unwrap_or_else(|e| {
            panic!("charts/agentrun/{what}/{name} is missing ({e}): cp crds/{name} charts/agentrun/{what}/")
        });
        assert!(
            chart_bytes == bytes,
            "charts/agentrun/{what}/{name} differs from crds/{name}: after `agentrun crdgen`, cp crds/{name} charts/agentrun/{what}/"
        );
    }
    assert!(
        crd_files.len() >= 3,
        "expected the three CRDs, found {crd_files:?}"
    );
    assert_eq!(
        file_names(&chart().join("crds")),
        crd_files,
        "charts/agentrun/crds must hold exactly the generated CRD files"
    );
    let chart_policy_files = if chart().join("files").exists() {
        file_names(&chart().join("files"))
    } else {
        BTreeSet::new()
    };
    assert_eq!(
        chart_policy_files, policy_files,
        "charts/agentrun/files must hold exactly the generated admission-policy files"
    );
}

/// A ClusterRole's rules in a comparable form (each list sorted, then the rules sorted).
fn normalized_rules(role: &Value) -> Vec<Vec<Vec<String>>> {
    let mut rules: Vec<Vec<Vec<String>>> = role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|rule| {
            ["apiGroups", "resources", "resourceNames", "verbs"]
                .iter()
                .map(|field| {
                    let mut list: Vec<String> = rule[*field]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect();
                    list.sort();
                    list
                })
                .collect()
        })
        .collect();
    rules.sort();
    rules
}

fn aggregation_labels(object: &Value) -> BTreeSet<String> {
    object["metadata"]["labels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| k.starts_with("rbac.authorization.k8s.io/aggregate-to-") && *v == "true")
        .map(|(k, _)| k.clone())
        .collect()
}

/// Whatever else `crds/` holds beside the CRDs (admission policies, user roles) is generated from
/// the Rust sources; the chart must install the same objects (by templates, not from its crds/).
#[tokio::test]
async fn the_chart_renders_every_other_object_of_crds() {
    let cp = ControlPlane::shared().await;
    let rendered = documents(&template(cp, "agentrun", "agentrun-system", &[]));
    let mut checked = 0;
    for entry in std::fs::read_dir(repo_root().join("crds")).expect("read crds/") {
        let path = entry.expect("crds/ entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let docs = documents(&std::fs::read_to_string(&path).expect("read a crds/ file"));
        for doc in docs
            .iter()
            .filter(|d| d["kind"] != "CustomResourceDefinition")
        {
            let (kind, name) = (&doc["kind"], &doc["metadata"]["name"]);
            let ours = rendered
                .iter()
                .find(|r| r["kind"] == *kind && r["metadata"]["name"] == *name)
                .unwrap_or_else(|| {
                    panic!("crds/{file} holds {kind} {name}, which the chart (release \"agentrun\") does not install: template it")
                });
            if kind == "ClusterRole" {
                assert_eq!(
                    normalized_rules(ours),
                    normalized_rules(doc),
                    "the chart's ClusterRole {name} differs from crds/{file}"
                );
                assert_eq!(
                    aggregation_labels(ours),
                    aggregation_labels(doc),
                    "the chart's ClusterRole {name} is aggregated differently from crds/{file}"
                );
            } else {
                assert_eq!(
                    ours["spec"], doc["spec"],
                    "the chart's {kind} {name} differs from crds/{file}"
                );
            }
            assert_eq!(ours["apiVersion"], doc["apiVersion"], "{kind} {name}");
            checked += 1;
        }
    }
    eprintln!("{checked} non-CRD objects of crds/ are installed alike by the chart");
}

/// The schema node of a values path, when every step is a declared property.
fn schema_node<'a>(schema: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut node = schema;
    for key in path {
        node = node.get("properties")?.get(*key)?;
    }
    Some(node)
}

/// Walks values and schema together: every value is declared and described, every declared
/// property has a default.
fn check_values_against_schema(
    values: &Value,
    schema: &Value,
    path: &str,
    problems: &mut Vec<String>,
) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let Some(values) = values.as_object() else {
        problems.push(format!(
            "{path}: the schema declares an object, values.yaml has {values}"
        ));
        return;
    };
    for (key, value) in values {
        let here = if path.is_empty() {
            key.clone()
        } else {
            format!("{path}.{key}")
        };
        match properties.get(key) {
            None => problems.push(format!("{here}: in values.yaml, not in values.schema.json")),
            Some(node) => {
                if node
                    .get("description")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    problems.push(format!("{here}: no description in values.schema.json"));
                }
                check_values_against_schema(value, node, &here, problems);
            }
        }
    }
    for key in properties.keys() {
        if key != "global" && !values.contains_key(key) {
            let here = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            problems.push(format!(
                "{here}: declared in values.schema.json, no default in values.yaml"
            ));
        }
    }
}

#[test]
fn every_value_is_documented_and_declared_in_the_schema() {
    let yaml = std::fs::read_to_string(chart().join("values.yaml")).expect("read values.yaml");
    let values: Value = serde_yaml_ng::from_str(&yaml).expect("values.yaml parses");
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("values.schema.json")).expect("read the schema"),
    )
    .expect("values.schema.json parses");
    let mut problems = Vec::new();
    check_values_against_schema(&values, &schema, "", &mut problems);

    // Every leaf value (anything but a group of declared values) has a comment right above it.
    let lines: Vec<&str> = yaml.lines().collect();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut leaves = 0;
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('-') {
            continue;
        }
        let Some((key, _)) = trimmed.split_once(':') else {
            continue;
        };
        let indent = line.len() - trimmed.len();
        while stack.last().is_some_and(|(depth, _)| *depth >= indent) {
            stack.pop();
        }
        stack.push((indent, key.to_owned()));
        let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
        let Some(node) = schema_node(&schema, &path) else {
            continue;
        };
        if node.get("properties").is_some() {
            continue;
        }
        leaves += 1;
        let above = lines[..i].iter().rev().find(|l| !l.trim().is_empty());
        if !above.is_some_and(|l| l.trim_start().starts_with('#')) {
            problems.push(format!(
                "{}: no comment above it in values.yaml (line {})",
                path.join("."),
                i + 1
            ));
        }
    }
    assert!(
        leaves > 40,
        "only {leaves} documented values found: is the walk broken?"
    );
    assert!(
        problems.is_empty(),
        "values.yaml / values.schema.json:\n{}",
        problems.join("\n")
    );
}

#[tokio::test]
async fn helm_lint_passes() {
    let cp = ControlPlane::shared().await;
    let out = cp.helm(&["lint", "--strict", &chart_arg()]);
    assert_success(&out, "helm lint --strict charts/agentrun");
    assert!(
        text(&out.stdout).contains("0 chart(s) failed"),
        "{}",
        text(&out.stdout)
    );
}

/// The chart's controller is a controller identity by RBAC (the verb `control` on agentruns, which
/// the policies check), and the chart writes its GitOps allow-list into the GitOps policy.
#[tokio::test]
async fn the_policies_take_the_release_controller_and_allow_list() {
    let cp = ControlPlane::shared().await;
    let policy = |docs: &[Value], name: &str| -> Value {
        of_kind(docs, "ValidatingAdmissionPolicy")
            .into_iter()
            .find(|p| p["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    let docs = documents(&template(
        cp,
        "prod",
        "ops",
        &strings(&["admissionPolicies.gitopsApprovers={alice@example.com, Bob@Example.com }"]),
    ));
    for name in ["prod-agentrun-run-status", "prod-agentrun-record-retention"] {
        let text = policy(&docs, name)["spec"].to_string();
        assert!(
            text.contains("resource('agentruns').namespace(request.namespace).check('control')"),
            "{text}"
        );
    }
    let role = of_kind(&docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "prod-agentrun-controller")
        .expect("the controller's ClusterRole");
    assert!(
        normalized_rules(role).contains(&vec![
            vec!["agentrun.dev".to_owned()],
            vec!["agentruns".to_owned()],
            vec![],
            vec!["control".to_owned()],
        ]),
        "{role}"
    );
    let gitops = policy(&docs, "prod-agentrun-gitops-approvers");
    assert_eq!(gitops["spec"]["variables"][0]["name"], "gitopsAllowList");
    assert_eq!(
        gitops["spec"]["variables"][0]["expression"],
        r#"["alice@example.com"," Bob@Example.com "]"#
    );
    // By default the list is empty: GitOps decisions are refused.
    let docs = documents(&template(cp, "agentrun", "agentrun-system", &[]));
    let gitops = policy(&docs, "agentrun-gitops-approvers");
    assert_eq!(gitops["spec"]["variables"][0]["expression"], "[]");
}

#[tokio::test]
async fn the_values_schema_rejects_mistakes() {
    let cp = ControlPlane::shared().await;
    for (value, says) in [
        ("replicas=-1", "/replicas"),
        ("replicaCount=2", "replicaCount"),
        ("controller.logFormat=xml", "/controller/logFormat"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("metrics.port=70000", "/metrics/port"),
        ("watchNamespace=Not_A_Namespace", "/watchNamespace"),
        (
            "admissionPolicies.gitopsGroup=it's",
            "/admissionPolicies/gitopsGroup",
        ),
        (
            "notifications.horizonSeconds=10",
            "/notifications/horizonSeconds",
        ),
        (
            "notifications.signingSecrets[0]=Not_A_Secret",
            "/notifications/signingSecrets/0",
        ),
        (
            "notifications.sinks[0].name=ops,notifications.sinks[0].url=ftp://x",
            "/notifications/sinks/0",
        ),
    ] {
        let out = cp.helm(&["template", "x", &chart_arg(), "--set", value]);
        assert!(
            !out.status.success(),
            "helm template --set {value} was accepted"
        );
        let err = text(&out.stderr);
        assert!(
            err.contains(says),
            "--set {value}: the error does not name {says}: {err}"
        );
    }
    let out = cp.helm(&[
        "template",
        "x",
        &chart_arg(),
        "--set",
        "serviceMonitor.enabled=true",
        "--set",
        "metrics.service.enabled=false",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("needs metrics.service.enabled"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn the_deployment_runs_the_controller_as_specified() {
    let cp = ControlPlane::shared().await;
    let chart_yaml: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart().join("Chart.yaml")).expect("read Chart.yaml"),
    )
    .expect("Chart.yaml parses");
    let app_version = chart_yaml["appVersion"].as_str().expect("appVersion");
    assert_eq!(
        app_version,
        env!("CARGO_PKG_VERSION"),
        "appVersion follows the crate version"
    );
    let image = format!("ghcr.io/agentrun-dev/agentrun:{app_version}");

    let docs = documents(&template(cp, "agentrun", "agentrun-system", &[]));
    let deployment = one_of_kind(&docs, "Deployment");
    assert_eq!(deployment["metadata"]["name"], "agentrun-controller");
    assert_eq!(deployment["spec"]["replicas"], 1);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "agentrun-controller");
    let c = &pod["containers"][0];
    assert_eq!(c["image"], image.as_str());
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        args,
        [
            "controller",
            "--log-format",
            "json",
            "--metrics-addr",
            "0.0.0.0:8080",
            "--leader-elect",
            "--leader-election-lease",
            "agentrun-controller",
            "--worker-image",
            image.as_str(),
            "--max-retries",
            "3",
            "--retry-backoff-seconds",
            "5",
            "--concurrency",
            "256",
            "--state-cache-mib",
            "32",
            "--delete-worker-pods",
            "succeeded",
            // `helm template` renders for a recent Kubernetes, where streaming lists are on.
            "--streaming-lists",
            "--gitops-group",
            "agentrun:gitops",
            "--admission-policy-prefix",
            "agentrun",
            "--signing-key-secret",
            "agentrun-signing-keys",
            "--jwks-config-map",
            "agentrun-approval-keys",
            "--assertion-lifetime-seconds",
            "600",
            "--notification-outbox",
            "agentrun-notification-outbox",
            "--notification-horizon-seconds",
            "86400",
        ]
    );
    // The controller accepts exactly these arguments (args[0], "controller", stands as the name).
    let command = <agentrun::cli::operator::ControllerArgs as clap::Args>::augment_args(
        clap::Command::new("controller"),
    );
    if let Err(e) = command.try_get_matches_from(args.iter().copied()) {
        panic!("the controller refuses the chart's arguments: {e}");
    }
    // Streaming lists follow the cluster's version unless chosen: WatchList is on by default
    // from Kubernetes 1.34.
    let streams = |extra: &[&str]| {
        let mut args = strings(&["template", "agentrun", &chart_arg()]);
        args.extend(strings(extra));
        let out = helm(cp, &args);
        assert_success(&out, &format!("helm template {extra:?}"));
        text(&out.stdout).contains("- --streaming-lists")
    };
    assert!(streams(&["--kube-version", "1.34.0"]));
    assert!(!streams(&["--kube-version", "1.33.5"]));
    assert!(streams(&[
        "--kube-version",
        "1.30.0",
        "--set",
        "controller.streamingLists=true"
    ]));
    assert!(!streams(&["--set", "controller.streamingLists=false"]));
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let env = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .unwrap();
        assert_eq!(env["valueFrom"]["fieldRef"]["fieldPath"], field, "{name}");
    }
    // Traces are off unless an OTLP endpoint is given; then the standard variables are set (and
    // the controller passes them on to worker Pods).
    let otel_env = |c: &Value| -> Vec<(String, String)> {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("OTEL_")))
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["value"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    assert!(otel_env(c).is_empty());
    let traced = documents(&template(
        cp,
        "agentrun",
        "agentrun-system",
        &strings(&[
            "tracing.otlpEndpoint=http://collector.observability:4318",
            "tracing.sampler=parentbased_traceidratio",
            "tracing.samplerArg=0.25",
        ]),
    ));
    let traced = one_of_kind(&traced, "Deployment");
    assert_eq!(
        otel_env(&traced["spec"]["template"]["spec"]["containers"][0]),
        [
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://collector.observability:4318"
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
    );
    assert_eq!(c["ports"][0]["containerPort"], 8080);
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], c["ports"][0]["name"]);
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsUser"], 65532);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let service = one_of_kind(&docs, "Service");
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"],
        c["ports"][0]["name"]
    );
    assert!(of_kind(&docs, "ServiceMonitor").is_empty());
    assert!(of_kind(&docs, "NetworkPolicy").is_empty());
    assert!(of_kind(&docs, "PodDisruptionBudget").is_empty());
    // The admission policies, each with its binding, named after the release: two stamps, five
    // checks.
    for (kind, count) in [
        ("MutatingAdmissionPolicy", 2),
        ("MutatingAdmissionPolicyBinding", 2),
        ("ValidatingAdmissionPolicy", 5),
        ("ValidatingAdmissionPolicyBinding", 5),
    ] {
        let objects = of_kind(&docs, kind);
        assert_eq!(objects.len(), count, "{kind}");
        for object in objects {
            let name = object["metadata"]["name"].as_str().unwrap();
            assert!(name.starts_with("agentrun-"), "{kind} {name}");
            assert_eq!(
                object["metadata"]["labels"]["app.kubernetes.io/instance"],
                "agentrun"
            );
            if kind.ends_with("Binding") {
                assert_eq!(object["spec"]["policyName"], name, "{kind} {name}");
            }
        }
    }
    let policies = documents(&template(
        cp,
        "agentrun-prod",
        "agentrun-system",
        &strings(&["admissionPolicies.gitopsGroup=flux:appliers"]),
    ));
    let identity = of_kind(&policies, "ValidatingAdmissionPolicy")
        .into_iter()
        .find(|p| p["metadata"]["name"] == "agentrun-prod-approval-identity")
        .expect("the approval-identity policy, named after the release");
    let text = identity["spec"].to_string();
    assert!(
        text.contains("'flux:appliers' in request.userInfo.groups"),
        "{text}"
    );
    assert!(!text.contains("agentrun:gitops"), "{text}");
    let binding = of_kind(&policies, "ValidatingAdmissionPolicyBinding")
        .into_iter()
        .find(|b| b["metadata"]["name"] == "agentrun-prod-approval-identity")
        .expect("its binding");
    assert_eq!(
        binding["spec"]["policyName"],
        "agentrun-prod-approval-identity"
    );
    let off = documents(&template(
        cp,
        "agentrun",
        "agentrun-system",
        &strings(&["admissionPolicies.enabled=false"]),
    ));
    assert!(off.iter().all(|d| !is_admission_policy_kind(&d["kind"])));

    // Values reach the Deployment.
    let docs = documents(&template(
        cp,
        "agentrun",
        "agentrun-system",
        &strings(&[
            "image.tag=1.2.3",
            "workerImage=registry.example/agentrun-worker:9",
            "watchNamespace=team-a",
            "leaderElection.enabled=false",
            "controller.logFormat=text",
            "serviceMonitor.enabled=true",
            "serviceMonitor.labels.release=prom",
        ]),
    ));
    let c = &one_of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "ghcr.io/agentrun-dev/agentrun:1.2.3");
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(2)
            .any(|w| w == ["--worker-image", "registry.example/agentrun-worker:9"]),
        "{args:?}"
    );
    assert!(
        args.windows(2).any(|w| w == ["--namespace", "team-a"]),
        "{args:?}"
    );
    assert!(
        args.windows(2).any(|w| w == ["--log-format", "text"]),
        "{args:?}"
    );
    assert!(!args.contains(&"--leader-elect"), "{args:?}");
    assert!(
        of_kind(&docs, "Role")
            .iter()
            .all(|r| r["metadata"]["name"] != "agentrun-controller-leader-election"),
        "no leader-election Role without leader election"
    );
    // The namespaced rules are bound in that namespace only; only the rights on cluster-scoped
    // objects (the admission policies checked, SubjectAccessReviews, ApprovalRecords; the
    // NotificationSinks and the watched namespace's labels) are bound cluster-wide.
    let cluster_bindings = of_kind(&docs, "ClusterRoleBinding");
    assert_eq!(
        cluster_bindings
            .iter()
            .map(|b| b["roleRef"]["name"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        [
            "agentrun-controller-decisions",
            "agentrun-controller-notifications"
        ],
        "watchNamespace binds in one namespace"
    );
    let notifications = of_kind(&docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "agentrun-controller-notifications")
        .expect("the notifications ClusterRole");
    let namespaces = notifications["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"] == json!(["namespaces"]))
        .expect("the namespaces rule");
    assert_eq!(
        namespaces["resourceNames"],
        json!(["team-a"]),
        "only the watched namespace's labels"
    );
    let bindings = of_kind(&docs, "RoleBinding");
    let binding = bindings
        .iter()
        .find(|b| b["metadata"]["name"] == "agentrun-controller")
        .expect("the controller's RoleBinding");
    assert_eq!(binding["metadata"]["namespace"], "team-a");
    assert_eq!(binding["roleRef"]["name"], "agentrun-controller");
    let monitor = one_of_kind(&docs, "ServiceMonitor");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prom");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "http-metrics");
}

#[tokio::test]
async fn helm_template_passes_a_server_side_dry_run() {
    let cp = ControlPlane::shared().await;
    install_crds(cp);
    let ns = cp.namespace("chart-dry").await;
    let value_sets: Vec<Vec<String>> = vec![
        vec![],
        strings(&["replicas=2", "networkPolicy.enabled=true"]),
        vec![
            "replicas=2".into(),
            "networkPolicy.enabled=true".into(),
            "networkPolicy.apiServer.cidrs[0]=10.0.0.1/32".into(),
            "podDisruptionBudget.enabled=true".into(),
            format!("watchNamespace={}", ns.name),
            "approvers.groups[0]=agentrun:approvers".into(),
            format!("approvers.namespaces[0]={}", ns.name),
            "editors.users[0]=carol@example.com".into(),
            "viewers.serviceAccounts[0].name=dashboard".into(),
            format!("viewers.serviceAccounts[0].namespace={}", ns.name),
        ],
    ];
    for values in value_sets {
        let release = release_name("dry");
        let rendered = template(cp, &release, &ns.name, &values);
        let out = cp.kubectl_with_stdin(
            Identity::Admin,
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&rendered),
        );
        assert_success(
            &out,
            &format!("kubectl apply --dry-run=server of the chart with {values:?}"),
        );
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains(&format!(
                "deployment.apps/{release}-controller created (server dry run)"
            )),
            "{stdout}"
        );
        if values.iter().any(|v| v == "networkPolicy.enabled=true") {
            assert!(
                stdout.contains("networkpolicy.networking.k8s.io/"),
                "{stdout}"
            );
        }
    }
}

/// The approval console: absent by default; with `console.enabled` a Deployment, a Service and a
/// ServiceAccount whose token is not mounted and to which no role of the chart is bound (it acts
/// only with its users' credentials), passing Pod Security "restricted" in a server-side dry run.
#[tokio::test]
async fn the_console_renders_when_enabled_with_no_rights_of_its_own() {
    let cp = ControlPlane::shared().await;
    install_crds(cp);
    let ns = cp.namespace("chart-console").await;
    label_restricted(cp, &ns.name);
    let release = release_name("console");
    let off = documents(&template(cp, &release, &ns.name, &[]));
    assert!(
        off.iter()
            .all(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] != "console"),
        "the console is off by default"
    );
    let values = strings(&[
        "console.enabled=true",
        "console.namespaces[0]=team-a",
        "console.tlsSecretName=console-tls",
        "approvers.groups[0]=agentrun:approvers",
    ]);
    let rendered = template(cp, &release, &ns.name, &values);
    let docs = documents(&rendered);
    let name = format!("{release}-console");
    let console: Vec<&Value> = docs
        .iter()
        .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "console")
        .collect();
    let kinds: BTreeSet<&str> = console.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["Deployment", "Service", "ServiceAccount"])
    );
    let account = console
        .iter()
        .find(|d| d["kind"] == "ServiceAccount")
        .unwrap();
    assert_eq!(account["metadata"]["name"], name.as_str());
    assert_eq!(account["automountServiceAccountToken"], false);
    for binding in of_kind(&docs, "RoleBinding")
        .into_iter()
        .chain(of_kind(&docs, "ClusterRoleBinding"))
    {
        let subjects = binding["subjects"].as_array().cloned().unwrap_or_default();
        assert!(
            subjects.iter().all(|s| s["name"] != name.as_str()),
            "a role is bound to the console: {binding}"
        );
    }
    let deployment = console.iter().find(|d| d["kind"] == "Deployment").unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], name.as_str());
    assert_eq!(pod["automountServiceAccountToken"], false);
    let container = &pod["containers"][0];
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args[..3],
        ["console", "--listen", "0.0.0.0:8090"],
        "{args:?}"
    );
    for expected in [
        ["--api-ca-file", "/etc/agentrun/api-ca/ca.crt"],
        ["--namespace", "team-a"],
        ["--tls-cert", "/etc/agentrun/tls/tls.crt"],
        ["--tls-key", "/etc/agentrun/tls/tls.key"],
    ] {
        assert!(
            args.windows(2).any(|w| w == expected),
            "{expected:?} in {args:?}"
        );
    }
    assert!(args.contains(&"--secure-cookies"), "{args:?}");
    assert_eq!(container["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "kube-root-ca.crt");
    let service = console.iter().find(|d| d["kind"] == "Service").unwrap();
    assert_eq!(
        service["spec"]["selector"]["app.kubernetes.io/component"],
        "console"
    );
    let controller = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] != name.as_str())
        .expect("the controller's Deployment");
    assert_eq!(
        controller["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"], "controller",
        "the controller's selector does not take the console's Pods"
    );
    let out = cp.kubectl_with_stdin(
        Identity::Admin,
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&rendered),
    );
    assert_success(
        &out,
        "kubectl apply --dry-run=server of the chart with the console",
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!("deployment.apps/{name} created (server dry run)")),
        "{stdout}"
    );
    assert!(
        !text(&out.stderr).contains("violate PodSecurity"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_into_a_restricted_namespace_creates_everything() {
    let cp = ControlPlane::shared().await;
    install_crds(cp);
    let ns = cp.namespace("chart-install").await;
    label_restricted(cp, &ns.name);
    // Pod Security admission is enforcing here: a Pod without the restricted settings is refused.
    let careless = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "careless", "namespace": ns.name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}
    });
    let out = cp.kubectl_with_stdin(
        Identity::Admin,
        &["apply", "--dry-run=server", "-f", "-"],
        Some(&careless.to_string()),
    );
    assert!(!out.status.success(), "a non-restricted Pod was admitted");
    assert!(
        text(&out.stderr).contains("violates PodSecurity"),
        "{}",
        text(&out.stderr)
    );

    let name = release_name("install");
    let release = Release::install(cp, &name, &ns.name, &strings(&["replicas=2"]));
    assert!(
        release.install_output.contains("kubectl patch apr NAME"),
        "the NOTES say how to approve:\n{}",
        release.install_output
    );

    let expected: BTreeSet<String> = [
        format!("{}/Deployment/{name}-controller", ns.name),
        format!("{}/ServiceAccount/{name}-controller", ns.name),
        format!("{}/Service/{name}-metrics", ns.name),
        format!("{}/Role/{name}-controller-leader-election", ns.name),
        format!("{}/RoleBinding/{name}-controller-leader-election", ns.name),
        format!("{}/Role/{name}-controller-signing-keys", ns.name),
        format!("{}/RoleBinding/{name}-controller-signing-keys", ns.name),
        format!("ClusterRole/{name}-controller"),
        format!("ClusterRoleBinding/{name}-controller"),
        format!("ClusterRole/{name}-approver"),
        format!("ClusterRole/{name}-editor"),
        format!("ClusterRole/{name}-viewer"),
        format!("MutatingAdmissionPolicy/{name}-stamp-creator"),
        format!("MutatingAdmissionPolicyBinding/{name}-stamp-creator"),
        format!("MutatingAdmissionPolicy/{name}-stamp-decider"),
        format!("MutatingAdmissionPolicyBinding/{name}-stamp-decider"),
        format!("ValidatingAdmissionPolicy/{name}-approval-identity"),
        format!("ValidatingAdmissionPolicyBinding/{name}-approval-identity"),
        format!("ValidatingAdmissionPolicy/{name}-run-creator"),
        format!("ValidatingAdmissionPolicyBinding/{name}-run-creator"),
    ]
    .into();
    let found = objects_of(cp, &name);
    let missing: Vec<_> = expected.difference(&found).collect();
    assert!(missing.is_empty(), "missing {missing:?}; found {found:?}");

    // The Deployment's ReplicaSet creates both Pods: they passed Pod Security "restricted".
    let client = cp.client(Identity::Admin).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns.name);
    let selector =
        format!("app.kubernetes.io/instance={name},app.kubernetes.io/component=controller");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let created = loop {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
            .items;
        for set in sets
            .list(&ListParams::default().labels(&selector))
            .await
            .unwrap()
        {
            for condition in set.status.and_then(|s| s.conditions).unwrap_or_default() {
                assert_ne!(
                    condition.type_, "ReplicaFailure",
                    "the ReplicaSet could not create Pods: {:?}",
                    condition.message
                );
            }
        }
        if list.len() == 2 {
            break list;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the controller Pods were not created; events:\n{}",
            text(
                &cp.kubectl(Identity::Admin, &["get", "events", "-n", &ns.name])
                    .stdout
            )
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    for pod in created {
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some(release.controller().as_str())
        );
        let sc = spec.containers[0].security_context.clone().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let deployment = deployments.get(&release.controller()).await.unwrap();
    assert_eq!(deployment.spec.unwrap().replicas, Some(2));

    // The user roles are aggregated: viewers into view, editors into edit (and admin); the approver
    // role is not aggregated anywhere by default.
    let roles: Api<ClusterRole> = Api::all(client);
    let grants = |role: &ClusterRole, resource: &str, verb: &str| {
        role.rules.iter().flatten().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == "agentrun.dev")
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let view = roles.get("view").await.unwrap();
        let edit = roles.get("edit").await.unwrap();
        let admin = roles.get("admin").await.unwrap();
        if grants(&view, "agentruns", "list")
            && grants(&edit, "agentruns", "create")
            && grants(&admin, "agentruns", "create")
        {
            assert!(!grants(&view, "agentruns", "create"));
            assert!(
                !grants(&edit, "approvalrequests", "patch"),
                "edit must not decide approvals"
            );
            assert!(
                !grants(&admin, "approvalrequests", "patch"),
                "admin must not decide approvals by default"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the user roles were not aggregated"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `notifications.sinks` renders NotificationSinks as the CRD has them, and the controller's Role
/// names exactly their keys' Secrets and `notifications.signingSecrets` (never an empty
/// `resourceNames`, which would grant every Secret); `notifications.enabled=false` renders
/// `--no-notifications` and none of it.
#[tokio::test]
async fn notification_sinks_and_their_keys_come_from_the_values() {
    let cp = ControlPlane::shared().await;
    let sink = "notifications.sinks[0]";
    let values = vec![
        format!("{sink}.name=ops"),
        format!("{sink}.url=https://hooks.example.com/agentrun"),
        format!("{sink}.signingSecret.name=ops-hooks"),
        format!("{sink}.signingSecret.key=secret"),
        format!("{sink}.types[0]=dev.agentrun.approval.requested"),
        format!("{sink}.namespaceSelector.matchLabels.tier=prod"),
        format!("{sink}.timeoutSeconds=5"),
        "notifications.signingSecrets={manual-hooks,ops-hooks}".to_owned(),
    ];
    let docs = documents(&template(cp, "agentrun", "agentrun-system", &values));
    let rendered = one_of_kind(&docs, "NotificationSink");
    let parsed: agentrun::crd::NotificationSink =
        serde_json::from_value(rendered.clone()).expect("a NotificationSink");
    assert_eq!(parsed.metadata.name.as_deref(), Some("ops"));
    assert_eq!(parsed.metadata.namespace, None, "cluster-scoped");
    assert_eq!(parsed.spec.url, "https://hooks.example.com/agentrun");
    assert_eq!(parsed.spec.signing_secret_ref.name, "ops-hooks");
    assert_eq!(parsed.spec.signing_secret_ref.key, "secret");
    assert_eq!(
        parsed.spec.types,
        vec![agentrun::crd::NotificationType::ApprovalRequested]
    );
    assert_eq!(
        parsed
            .spec
            .namespace_selector
            .unwrap()
            .match_labels
            .unwrap()["tier"],
        "prod"
    );
    assert_eq!(parsed.spec.timeout_seconds, Some(5));
    let secret_names = |docs: &[Value]| -> Vec<Vec<String>> {
        of_kind(docs, "Role")
            .into_iter()
            .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
            .filter(|rule| {
                rule["resources"] == json!(["secrets"]) && rule["verbs"] == json!(["get"])
            })
            .map(|rule| {
                rule["resourceNames"]
                    .as_array()
                    .expect("a Secret rule names its Secrets")
                    .iter()
                    .map(|n| n.as_str().unwrap().to_owned())
                    .collect()
            })
            .collect()
    };
    let names = secret_names(&docs);
    assert!(
        names.contains(&vec!["manual-hooks".to_owned(), "ops-hooks".to_owned()]),
        "{names:?}"
    );
    let default_docs = documents(&template(cp, "agentrun", "agentrun-system", &[]));
    assert!(of_kind(&default_docs, "NotificationSink").is_empty());
    for names in secret_names(&default_docs) {
        assert!(
            !names.is_empty(),
            "an empty resourceNames grants every Secret"
        );
        assert!(!names.contains(&"ops-hooks".to_owned()), "{names:?}");
    }

    let mut off = values.clone();
    off.push("notifications.enabled=false".into());
    let docs = documents(&template(cp, "agentrun", "agentrun-system", &off));
    assert!(of_kind(&docs, "NotificationSink").is_empty());
    let args =
        one_of_kind(&docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
            .clone();
    let args: Vec<&str> = args
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--no-notifications"), "{args:?}");
    assert!(!args.contains(&"--notification-outbox"), "{args:?}");
    let command = <agentrun::cli::operator::ControllerArgs as clap::Args>::augment_args(
        clap::Command::new("controller"),
    );
    if let Err(e) = command.try_get_matches_from(args.iter().copied()) {
        panic!("the controller refuses the chart's arguments: {e}");
    }
    assert!(
        !docs.iter().any(|d| d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.ends_with("-notifications"))),
        "no notification RBAC when off"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_service_account_holds_nothing_more_than_it_needs() {
    let cp = ControlPlane::shared().await;
    install_crds(cp);
    let system = cp.namespace("chart-rbac-sys").await;
    let team = cp.namespace("chart-rbac-team").await;
    let other = cp.namespace("chart-rbac-other").await;
    let release = Release::install(cp, &release_name("rbac"), &system.name, &[]);
    let kc = controller_kubeconfig(cp, &release).await;
    let (t, s) = (team.name.as_str(), system.name.as_str());
    let lease = "leases.coordination.k8s.io";
    let own_policy = format!(
        "validatingadmissionpolicies.admissionregistration.k8s.io/{}-approval-identity",
        release.name
    );
    let allowed: Vec<Vec<&str>> = vec![
        vec!["list", "agentruns.agentrun.dev", "--all-namespaces"],
        vec!["watch", "approvalrequests.agentrun.dev", "-n", t],
        vec![
            "patch",
            "agentruns.agentrun.dev",
            "--subresource=status",
            "-n",
            t,
        ],
        vec![
            "get",
            "agentruns.agentrun.dev",
            "--subresource=status",
            "-n",
            t,
        ],
        vec![
            "patch",
            "approvalrequests.agentrun.dev",
            "--subresource=status",
            "-n",
            t,
        ],
        vec!["create", "approvalrequests.agentrun.dev", "-n", t],
        vec!["get", "agents.agentrun.dev", "-n", t],
        vec!["create", "pods", "-n", t],
        vec!["delete", "pods", "-n", t],
        vec!["patch", "roles.rbac.authorization.k8s.io", "-n", t],
        vec!["patch", "rolebindings.rbac.authorization.k8s.io", "-n", t],
        vec!["patch", "serviceaccounts", "-n", t],
        vec!["create", "events.events.k8s.io", "-n", t],
        vec!["get", "secrets", "-n", t],
        vec!["create", lease, "-n", s],
        vec![
            "update",
            "leases.coordination.k8s.io/agentrun-controller",
            "-n",
            s,
        ],
        vec![
            "patch",
            "leases.coordination.k8s.io/agentrun-controller",
            "-n",
            s,
        ],
        vec!["control", "agentruns.agentrun.dev", "-n", t],
        vec!["create", "runstatechunks.agentrun.dev", "-n", t],
        vec!["get", "runstatechunks.agentrun.dev", "-n", t],
        vec!["list", "runstatechunks.agentrun.dev", "-n", t],
        vec!["delete", "runstatechunks.agentrun.dev", "-n", t],
        // Decisions: the admission policies checked, approvers' rights asked, records written.
        vec!["create", "subjectaccessreviews.authorization.k8s.io"],
        vec!["create", "approvalrecords.agentrun.dev"],
        vec!["get", &own_policy],
        // Approval assertions: the signing keys' Secret and the JWKS ConfigMap.
        vec!["create", "secrets", "-n", s],
        vec!["get", "secrets/agentrun-signing-keys", "-n", s],
        vec!["patch", "configmaps/agentrun-approval-keys", "-n", s],
        // Notifications: the sinks (cluster-scoped) and their status, the namespaces' labels, the
        // outbox ConfigMap.
        vec!["watch", "notificationsinks.agentrun.dev"],
        vec![
            "patch",
            "notificationsinks.agentrun.dev",
            "--subresource=status",
        ],
        vec!["list", "namespaces"],
        vec!["update", "configmaps/agentrun-notification-outbox", "-n", s],
    ];
    let refused: Vec<Vec<&str>> = vec![
        vec!["update", "configmaps", "-n", t],
        vec!["create", "configmaps", "-n", t],
        vec!["get", "configmaps", "-n", t],
        vec!["delete", "approvalrecords.agentrun.dev"],
        vec!["update", "approvalrecords.agentrun.dev"],
        vec![
            "get",
            "validatingadmissionpolicies.admissionregistration.k8s.io/someone-elses",
        ],
        vec!["list", "secrets", "-n", t],
        vec!["watch", "secrets", "-n", t],
        vec!["create", "secrets", "-n", t],
        vec!["patch", "secrets/agentrun-signing-keys", "-n", s],
        vec!["update", "secrets/agentrun-signing-keys", "-n", s],
        vec!["delete", "secrets/agentrun-signing-keys", "-n", s],
        vec!["patch", "configmaps/someone-elses", "-n", s],
        vec!["update", "configmaps/someone-elses", "-n", s],
        vec!["list", "secrets", "-n", s],
        vec!["create", "notificationsinks.agentrun.dev"],
        vec!["patch", "notificationsinks.agentrun.dev"],
        vec!["delete", "notificationsinks.agentrun.dev"],
        vec!["create", "agentruns.agentrun.dev", "-n", t],
        vec!["delete", "agentruns.agentrun.dev", "-n", t],
        vec!["patch", "agents.agentrun.dev", "-n", t],
        vec!["delete", "approvalrequests.agentrun.dev", "-n", t],
        vec!["create", "pods", "--subresource=exec", "-n", t],
        vec!["escalate", "roles.rbac.authorization.k8s.io", "-n", t],
        vec!["bind", "roles.rbac.authorization.k8s.io", "-n", t],
        vec!["delete", "roles.rbac.authorization.k8s.io", "-n", t],
        vec!["create", "clusterroles.rbac.authorization.k8s.io"],
        vec!["create", "clusterrolebindings.rbac.authorization.k8s.io"],
        vec!["create", "serviceaccounts", "--subresource=token", "-n", t],
        vec!["impersonate", "users"],
        vec!["get", "nodes"],
        vec!["create", lease, "-n", t],
        vec!["update", "leases.coordination.k8s.io/someone-else", "-n", s],
        vec![
            "delete",
            "leases.coordination.k8s.io/agentrun-controller",
            "-n",
            s,
        ],
    ];
    for args in &allowed {
        assert!(can_i(cp, &kc, args), "the controller may not {args:?}");
    }
    for args in &refused {
        assert!(!can_i(cp, &kc, args), "the controller may {args:?}");
    }

    // watchNamespace binds the same rules in one namespace only; without workerSecretAccess the
    // controller cannot read any Secret but the sinks' keys named in the values.
    let scoped = Release::install(
        cp,
        &release_name("scoped"),
        &system.name,
        &[
            format!("watchNamespace={t}"),
            "rbac.workerSecretAccess=false".into(),
            "notifications.signingSecrets={hooks}".into(),
            "notifications.outboxConfigMap=scoped-outbox".into(),
        ],
    );
    let kc = controller_kubeconfig(cp, &scoped).await;
    assert!(can_i(cp, &kc, &["get", "secrets/hooks", "-n", s]));
    assert!(!can_i(cp, &kc, &["get", "secrets/other-hooks", "-n", s]));
    assert!(!can_i(cp, &kc, &["list", "secrets", "-n", s]));
    assert!(can_i(
        cp,
        &kc,
        &["update", "configmaps/scoped-outbox", "-n", s]
    ));
    assert!(!can_i(
        cp,
        &kc,
        &["update", "configmaps/agentrun-notification-outbox", "-n", s]
    ));
    // Sinks are cluster-scoped: read everywhere whatever watchNamespace says, never written. Of
    // the namespaces, only the watched one is read (listed and watched by name, as the notifier
    // does).
    assert!(can_i(cp, &kc, &["list", "notificationsinks.agentrun.dev"]));
    assert!(!can_i(
        cp,
        &kc,
        &["create", "notificationsinks.agentrun.dev"]
    ));
    assert!(!can_i(cp, &kc, &["list", "namespaces"]));
    assert!(!can_i(
        cp,
        &kc,
        &["get", &format!("namespaces/{}", other.name)]
    ));
    let by_name = format!("metadata.name={t}");
    let out = kubectl_as(
        cp,
        &kc,
        &[
            "get",
            "namespaces",
            "--field-selector",
            &by_name,
            "-o",
            "name",
        ],
    );
    assert_success(&out, "the scoped controller lists its namespace by name");
    assert_eq!(text(&out.stdout).trim(), format!("namespace/{t}"));
    let out = kubectl_as(cp, &kc, &["get", "namespaces"]);
    assert!(
        !out.status.success(),
        "the scoped controller lists every namespace"
    );
    assert!(can_i(cp, &kc, &["list", "agentruns.agentrun.dev", "-n", t]));
    assert!(can_i(cp, &kc, &["create", "pods", "-n", t]));
    assert!(!can_i(
        cp,
        &kc,
        &["list", "agentruns.agentrun.dev", "-n", &other.name]
    ));
    assert!(!can_i(
        cp,
        &kc,
        &["list", "agentruns.agentrun.dev", "--all-namespaces"]
    ));
    assert!(!can_i(cp, &kc, &["create", "pods", "-n", &other.name]));
    assert!(!can_i(cp, &kc, &["get", "secrets", "-n", t]));
    assert!(can_i(cp, &kc, &["create", lease, "-n", s]));
}

async fn wait_for_phase(
    cp: &ControlPlane,
    ns: &str,
    run: &str,
    phase: AgentRunPhase,
    controller: &AbortOnDropHandle<Result<(), StartError>>,
) -> AgentRun {
    let api: Api<AgentRun> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            !controller.is_finished(),
            "the controller stopped early (see the error above)"
        );
        let current = api.get(run).await.expect("get the run");
        let status = current.status.clone().unwrap_or_default();
        if status.phase == Some(phase) {
            return current;
        }
        if tokio::time::Instant::now() > deadline {
            let events = cp.kubectl(Identity::Admin, &["get", "events", "-n", ns]);
            panic!(
                "run {run} did not reach {phase:?}; status: {}\nevents:\n{}",
                serde_json::to_string_pretty(&status).unwrap(),
                text(&events.stdout)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_with_the_chart_service_account_completes_an_approval_flow() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Reconcile errors (a Forbidden one names the missing right) show in the output of a failure.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("agentrun=warn"))
        .with_ansi(false)
        .with_test_writer()
        .try_init();
    let cp = ControlPlane::shared().await;
    install_crds(cp);
    let runs = cp.namespace("chart-flow-runs").await;
    let system = cp.namespace("chart-flow-sys").await;
    label_restricted(cp, &system.name);
    let can_alice = |verb: &str| {
        let out = cp.kubectl(
            Identity::Alice,
            &[
                "auth",
                "can-i",
                verb,
                "approvalrequests.agentrun.dev",
                "-n",
                &runs.name,
            ],
        );
        text(&out.stdout).trim() == "yes"
    };
    assert!(
        !can_alice("patch"),
        "alice may decide before the chart binds her"
    );
    // A NotificationSink from the chart's values, its key in a Secret of the release namespace:
    // the chart's rights must suffice to sign and deliver the events and to record the sink's
    // condition.
    let hooks_key = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
    );
    let out = cp.kubectl(
        Identity::Admin,
        &[
            "create",
            "secret",
            "generic",
            "hooks",
            "-n",
            &system.name,
            &format!("--from-literal=secret={hooks_key}"),
        ],
    );
    assert_success(&out, "create the sink's signing Secret");
    let receiver = NotificationReceiver::start(&hooks_key).await;
    let release_name = release_name("flow");
    let sink_name = format!("{release_name}-hooks");
    let sink = "notifications.sinks[0]";
    let release = Release::install(
        cp,
        &release_name,
        &system.name,
        &[
            "approvers.users[0]=alice@example.com".into(),
            format!("approvers.namespaces[0]={}", runs.name),
            format!("{sink}.name={sink_name}"),
            format!("{sink}.url={}", receiver.url()),
            format!("{sink}.signingSecret.name=hooks"),
            format!("{sink}.signingSecret.key=secret"),
            format!(
                "{sink}.namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name={}",
                runs.name
            ),
        ],
    );
    assert!(
        can_alice("patch") && can_alice("list"),
        "the chart's approver binding holds"
    );
    let bob = cp.kubectl(
        Identity::Bob,
        &[
            "auth",
            "can-i",
            "patch",
            "approvalrequests.agentrun.dev",
            "-n",
            &runs.name,
        ],
    );
    assert_eq!(text(&bob.stdout).trim(), "no", "only alice was bound");

    // The controller runs here, as the chart's service account, cluster-wide and leader-elected on
    // the chart's Lease, serving the endpoints the chart's probes and Service use.
    let token = cp
        .service_account_token(&release.namespace, &release.controller())
        .await;
    let client = cp.client_with_token(&token).await;
    let metrics_addr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().unwrap()
    };
    let config = ControllerConfig {
        namespace: None,
        policy: Policy {
            max_retries: 1,
            retry_backoff: Duration::from_millis(200),
            recheck: Duration::from_secs(2),
            ..Default::default()
        },
        metrics_addr: Some(metrics_addr),
        leader_election: Some(LeaderElection {
            namespace: release.namespace.clone(),
            lease_name: "agentrun-controller".into(),
            identity: "in-process-replica".into(),
            lease_duration: Duration::from_secs(15),
            grace: Duration::from_secs(5),
        }),
        // The chart's defaults: keys made and published in the release namespace, the admission
        // policies named after the release.
        signing: Some(controller::SigningConfig::new(&release.namespace)),
        admission_policy_prefix: Some(release.name.clone()),
        notifications: Some(NotifyConfig {
            min_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(1),
            ..NotifyConfig::new(&release.namespace)
        }),
        ..Default::default()
    };
    let controller = AbortOnDropHandle::new(tokio::spawn(async move {
        let result = controller::run(client, config).await;
        if let Err(error) = &result {
            eprintln!("controller: {error}");
        }
        result
    }));
    let _kubelet = start_dev_kubelet(cp, &runs.name).await;

    // An Agent whose model key is in a Secret: the controller must be able to grant its worker
    // `get` on that Secret, which only works if the chart gave the controller that right.
    let api_key = format!("sk-chart-{:08x}", rand::random::<u32>());
    let out = cp.kubectl(
        Identity::Admin,
        &[
            "create",
            "secret",
            "generic",
            "model-api-key",
            "-n",
            &runs.name,
            &format!("--from-literal=token={api_key}"),
        ],
    );
    assert_success(&out, "create the model Secret");
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model.push(Reply::tool_calls(&[(
        "call_1",
        "delete_user",
        json!({"user_id": "u-7"}),
    )]));
    model.push(Reply::text("User u-7 deleted."));
    let agent = json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "ops", "namespace": runs.name},
        "spec": {
            "instructions": "You are an operations agent.",
            "model": {"baseUrl": model.base_url(), "name": "test-model", "maxRetries": 0, "timeoutSeconds": 10,
                      "apiKeySecretRef": {"name": "model-api-key", "key": "token"}},
            "maxTurns": 5,
            "tools": [{"name": "delete_user", "description": "Delete a user", "requiresApproval": true,
                       "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}},
                       "http": {"url": tools.url("/delete_user"), "timeoutSeconds": 10}}]
        }
    });
    let run = json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "r1", "namespace": runs.name},
        "spec": {"agentRef": {"name": "ops"}, "input": "Delete user u-7"}
    });
    // The chart's admission policies are the only ones in this cluster: wait until the API server
    // enforces them (a dry-run create comes back with the creator stamped).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = cp.kubectl_with_stdin(
            Identity::Admin,
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            Some(&run.to_string()),
        );
        assert_success(&out, "dry-run create of the run");
        let stamped: Value = serde_json::from_slice(&out.stdout).expect("kubectl -o json");
        if stamped["metadata"]["annotations"]["agentrun.dev/created-by"] == "admin" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the chart's stamp-creator policy never took effect: {stamped}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for object in [&agent, &run] {
        let out = cp.kubectl_with_stdin(
            Identity::Admin,
            &["apply", "-f", "-"],
            Some(&object.to_string()),
        );
        assert_success(&out, "apply the Agent and the run");
    }

    wait_for_phase(
        cp,
        &runs.name,
        "r1",
        AgentRunPhase::AwaitingApproval,
        &controller,
    )
    .await;
    assert!(tools.requests().is_empty(), "nothing runs before approval");
    let requests: Api<ApprovalRequest> =
        Api::namespaced(cp.client(Identity::Admin).await, &runs.name);
    let pending = requests
        .list(&ListParams::default().labels("agentrun.dev/run=r1"))
        .await
        .unwrap()
        .items;
    assert_eq!(pending.len(), 1);
    let request = pending[0].metadata.name.clone().unwrap();
    // The chart's approval-identity policy: alice cannot record someone else as the approver.
    let forged = json!({"spec": {"decision": "Approved", "approverId": "bob@example.com", "reason": "ticket OPS-42"}});
    let out = cp.kubectl(
        Identity::Alice,
        &[
            "patch",
            "apr",
            &request,
            "-n",
            &runs.name,
            "--type",
            "merge",
            "-p",
            &forged.to_string(),
        ],
    );
    assert!(!out.status.success(), "alice recorded bob as the approver");
    assert!(
        text(&out.stderr).contains("approverId must be your own username"),
        "{}",
        text(&out.stderr)
    );
    let decision = json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ticket OPS-42"}});
    let out = cp.kubectl(
        Identity::Alice,
        &[
            "patch",
            "apr",
            &request,
            "-n",
            &runs.name,
            "--type",
            "merge",
            "-p",
            &decision.to_string(),
        ],
    );
    assert_success(&out, "alice approves with kubectl patch");

    let done = wait_for_phase(cp, &runs.name, "r1", AgentRunPhase::Succeeded, &controller).await;
    let status = done.status.clone().unwrap();
    assert_eq!(status.final_output.as_deref(), Some("User u-7 deleted."));
    assert_eq!(
        status.created_by.as_deref(),
        Some("admin"),
        "stamped by the chart's policy"
    );
    assert_eq!(tools.calls_of("call_1"), 1);
    // The chart's rights sufficed to make the signing keys and publish them: the approved call
    // carried an assertion that the JWKS served on the metrics port verifies.
    let jwks = reqwest::get(format!("http://{metrics_addr}/.well-known/jwks.json"))
        .await
        .expect("the JWKS endpoint")
        .text()
        .await
        .unwrap();
    let jwks = agentrun::assertion::Jwks::from_json(&jwks).expect("a JWKS");
    let call = &tools.requests_to("/delete_user")[0];
    let claims = agentrun::assertion::verify(
        call.header(agentrun::assertion::HEADER)
            .expect("an approval assertion"),
        &jwks,
        &agentrun::assertion::Expected::new(&tools.url("/delete_user"), call.body.as_bytes()),
    )
    .expect("a valid approval assertion");
    assert_eq!(claims.approver, "alice@example.com");
    let decided = requests.get(&request).await.unwrap();
    let stamp: Value = serde_json::from_str(
        decided
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("agentrun.dev/decided-by"))
            .expect("the decision is stamped by the chart's stamp-decider policy"),
    )
    .expect("the stamp is JSON");
    assert_eq!(stamp["username"], "alice@example.com");
    let verified = decided.status.and_then(|s| s.verified_identity);
    assert_eq!(
        verified.map(|v| v.username).as_deref(),
        Some("alice@example.com"),
        "the controller recorded the verified identity"
    );
    let bearer = format!("Bearer {api_key}");
    assert!(
        model
            .requests()
            .iter()
            .all(|r| r.header("authorization") == Some(bearer.as_str())),
        "the workers read the model key from the Secret"
    );

    // The controller held the chart's Lease, and answered on the chart's probe paths and port.
    let leases: Api<Lease> = Api::namespaced(cp.client(Identity::Admin).await, &release.namespace);
    let lease = leases
        .get("agentrun-controller")
        .await
        .expect("the leader Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("in-process-replica")
    );
    let http = reqwest::Client::new();
    for path in ["/healthz", "/readyz", "/metrics"] {
        let response = http
            .get(format!("http://{metrics_addr}{path}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert!(
            response.status().is_success(),
            "GET {path}: {}",
            response.status()
        );
    }

    // The worker Role the controller created (with the chart's rights) names exactly that Secret.
    let roles: Api<Role> = Api::namespaced(cp.client(Identity::Admin).await, &runs.name);
    let role = roles.get("r1-worker").await.expect("the worker Role");
    let secret_rule = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .find(|r| r.resources.iter().flatten().any(|x| x == "secrets"))
        .expect("a Secret rule in the worker Role");
    assert_eq!(
        secret_rule.resource_names,
        Some(vec!["model-api-key".to_string()])
    );
    assert_eq!(secret_rule.verbs, vec!["get".to_string()]);

    // The chart's sink got the request, the decision and the outcome, signed with its key (the
    // receiver verifies), and its condition was written with the chart's rights.
    let expected: BTreeSet<String> = [
        format!("{}:requested", decided.metadata.uid.as_deref().unwrap()),
        format!("{}:decided", decided.metadata.uid.as_deref().unwrap()),
        format!("{}:succeeded", done.metadata.uid.as_deref().unwrap()),
    ]
    .into();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while receiver.ids() != expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sink got {:?}, not {expected:?}",
            receiver.ids()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sinks: Api<NotificationSink> = Api::all(cp.client(Identity::Admin).await);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ready = sinks
            .get(&sink_name)
            .await
            .expect("the chart's sink")
            .status
            .and_then(|s| {
                s.conditions
                    .into_iter()
                    .find(|c| c.type_ == "Ready")
                    .map(|c| c.status)
            });
        if ready.as_deref() == Some("True") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sink's Ready condition: {ready:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let outbox = cp.kubectl(
        Identity::Admin,
        &[
            "get",
            "configmap",
            "agentrun-notification-outbox",
            "-n",
            &system.name,
            "-o",
            "name",
        ],
    );
    assert_success(&outbox, "the outbox ConfigMap the controller created");

    // The writes were made as the chart's service account (the audit log records agentrun.dev).
    let user = release.controller_user();
    let by_controller: Vec<Value> = cp
        .audit_events()
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == user.as_str()
                && e["objectRef"]["namespace"] == runs.name.as_str()
        })
        .collect();
    let wrote = |resource: &str, subresource: Option<&str>| {
        by_controller.iter().any(|e| {
            e["objectRef"]["resource"] == resource
                && e["objectRef"]["subresource"].as_str() == subresource
                && e["verb"] == "patch"
                && e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| c < 300)
        })
    };
    assert!(
        wrote("approvalrequests", None),
        "no ApprovalRequest apply by {user}"
    );
    assert!(
        wrote("approvalrequests", Some("status")),
        "no ApprovalRequest status patch by {user}"
    );
    assert!(
        wrote("agentruns", Some("status")),
        "no AgentRun status patch by {user}"
    );
    let denied: Vec<&Value> = by_controller
        .iter()
        .filter(|e| e["responseStatus"]["code"] == 403)
        .collect();
    assert!(denied.is_empty(), "the controller was refused: {denied:?}");

    // Events were published by the controller; the API key appears nowhere.
    let events = text(
        &cp.kubectl(
            Identity::Admin,
            &["get", "events", "-n", &runs.name, "-o", "json"],
        )
        .stdout,
    );
    assert!(
        events.contains("Approved by alice@example.com: ticket OPS-42"),
        "{events}"
    );
    let run_json = serde_json::to_string(&done).unwrap();
    for (place, body) in [("the run", &run_json), ("the Events", &events)] {
        assert!(!body.contains(&api_key), "the API key leaked into {place}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_and_uninstall_leave_nothing_behind() {
    let cp = ControlPlane::shared().await;
    install_crds(cp);
    let ns: TestNamespace = cp.namespace("chart-lifecycle").await;
    let runs = cp.namespace("chart-lifecycle-runs").await;
    label_restricted(cp, &ns.name);
    let name = release_name("life");
    let release = Release::install(
        cp,
        &name,
        &ns.name,
        &[
            "approvers.groups[0]=agentrun:approvers".into(),
            format!("approvers.namespaces[0]={}", runs.name),
            "viewers.groups[0]=agentrun:requesters".into(),
        ],
    );
    let client = cp.client(Identity::Admin).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);

    // Upgrade: more replicas, another log level, a NetworkPolicy and a PodDisruptionBudget.
    release.upgrade(&[
        "approvers.groups[0]=agentrun:approvers".into(),
        format!("approvers.namespaces[0]={}", runs.name),
        "viewers.groups[0]=agentrun:requesters".into(),
        "replicas=2".into(),
        "controller.logLevel=debug".into(),
        "networkPolicy.enabled=true".into(),
        "podDisruptionBudget.enabled=true".into(),
    ]);
    let deployment = deployments.get(&release.controller()).await.unwrap();
    let spec = deployment.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let env = spec.template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let rust_log = env.iter().find(|e| e.name == "RUST_LOG").unwrap();
    assert_eq!(rust_log.value.as_deref(), Some("debug"));
    let thp = env.iter().find(|e| e.name == "MIMALLOC_ALLOW_THP").unwrap();
    assert_eq!(thp.value.as_deref(), Some("0"));
    let purge = env
        .iter()
        .find(|e| e.name == "MIMALLOC_PURGE_DELAY")
        .unwrap();
    assert_eq!(purge.value.as_deref(), Some("0"));
    let status = helm(
        cp,
        &strings(&["status", &name, "--namespace", &ns.name, "-o", "json"]),
    );
    assert_success(&status, "helm status");
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["version"], 2);
    let found = objects_of(cp, &name);
    for object in [
        format!("{}/NetworkPolicy/{name}-controller", ns.name),
        format!("{}/PodDisruptionBudget/{name}-controller", ns.name),
        format!("{}/RoleBinding/{name}-approvers", runs.name),
        format!("ClusterRoleBinding/{name}-viewers"),
    ] {
        assert!(
            found.contains(&object),
            "{object} missing after the upgrade: {found:?}"
        );
    }

    // Upgrade again without them: helm removes what is no longer rendered.
    release.upgrade(&["replicas=2".into()]);
    let found = objects_of(cp, &name);
    for object in [
        format!("{}/NetworkPolicy/{name}-controller", ns.name),
        format!("{}/PodDisruptionBudget/{name}-controller", ns.name),
        format!("{}/RoleBinding/{name}-approvers", runs.name),
        format!("ClusterRoleBinding/{name}-viewers"),
    ] {
        assert!(
            !found.contains(&object),
            "{object} left after the second upgrade"
        );
    }
    assert!(
        found.contains(&format!("ClusterRole/{name}-controller")),
        "{found:?}"
    );

    // Uninstall: nothing with the release's label is left, cluster-scoped roles included (the
    // ReplicaSets and Pods go with the garbage collector, shortly after).
    let out = cp.helm(&["uninstall", &name, "--namespace", &ns.name]);
    assert_success(&out, "helm uninstall");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let left = objects_of(cp, &name);
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left after helm uninstall: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let out = cp.kubectl(
        Identity::Admin,
        &[
            "get",
            "secrets",
            "-n",
            &ns.name,
            "-l",
            &format!("owner=helm,name={name}"),
            "-o",
            "name",
        ],
    );
    assert_success(&out, "list helm's release records");
    assert_eq!(
        text(&out.stdout).trim(),
        "",
        "helm's release records are gone"
    );
    let out = cp.helm(&["list", "--namespace", &ns.name, "-q"]);
    assert_success(&out, "helm list");
    assert_eq!(text(&out.stdout).trim(), "");
    // The CRDs stay (helm never deletes crds/): runs and their audit records outlive the release.
    let out = cp.kubectl(
        Identity::Admin,
        &["get", "crd", "agentruns.agentrun.dev", "-o", "name"],
    );
    assert_success(&out, "the CRDs stay");
}
