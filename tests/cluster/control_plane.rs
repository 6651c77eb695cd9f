//! Smoke tests of the test harness: the real control plane behaves as a cluster does.

use std::time::Duration;

use agentrun_testkit::cluster::{ControlPlane, Identity, assert_success};
use agentrun_testkit::wait::eventually;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

fn pinned_kubernetes_version() -> String {
    let go_mod = std::fs::read_to_string(
        agentrun_testkit::cluster::repo_root().join("tests/control-plane/go.mod"),
    )
    .expect("read go.mod");
    go_mod
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("k8s.io/kubernetes "))
        .expect("k8s.io/kubernetes in go.mod")
        .trim()
        .to_string()
}

fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn server_reports_the_pinned_version() {
    let cp = ControlPlane::shared().await;
    let client = cp.client(Identity::Admin).await;
    let info = client.apiserver_version().await.expect("version");
    assert_eq!(info.git_version, pinned_kubernetes_version());
}

#[tokio::test]
async fn deleting_an_owner_deletes_its_dependents() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("gc").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let owner = api
        .create(&PostParams::default(), &configmap("owner", &[]))
        .await
        .expect("owner");
    let mut dependent = configmap("dependent", &[]);
    dependent.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().unwrap(),
        ..Default::default()
    }]);
    api.create(&PostParams::default(), &dependent)
        .await
        .expect("dependent");
    api.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    eventually(Duration::from_secs(60), "the garbage collector", || async {
        api.get_opt("dependent")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn namespaces_and_configmaps_can_be_created_watched_and_deleted() {
    let cp = ControlPlane::shared().await;
    let client = cp.client(Identity::Admin).await;
    let ns = cp.namespace("watch").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
    let mut stream = Box::pin(stream);
    api.create(&PostParams::default(), &configmap("watched", &[("k", "v")]))
        .await
        .expect("create");
    let seen = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(cm) = stream.try_next().await.expect("watch") {
            if cm.metadata.name.as_deref() == Some("watched") {
                return cm;
            }
        }
        panic!("watch ended")
    })
    .await
    .expect("the watch saw the ConfigMap");
    assert_eq!(seen.data.unwrap()["k"], "v");

    // The namespace controller finishes a namespace deletion.
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces
        .delete(&ns.name, &DeleteParams::default())
        .await
        .expect("delete namespace");
    eventually(Duration::from_secs(60), "namespace deletion", || async {
        namespaces
            .get_opt(&ns.name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn deployments_get_replicasets_from_the_controller_manager() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("deploy").await;
    let client = cp.client(Identity::Admin).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]}
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create deployment");
    let replicasets: Api<ReplicaSet> = Api::namespaced(client, &ns.name);
    eventually(Duration::from_secs(60), "a ReplicaSet", || async {
        let list = replicasets.list(&ListParams::default()).await.unwrap();
        (!list.items.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn rbac_forbids_carol_what_no_role_grants() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("rbac").await;
    let carol: Api<Secret> = Api::namespaced(cp.client(Identity::Carol).await, &ns.name);
    let err = carol.list(&ListParams::default()).await.unwrap_err();
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("expected 403, got {other:?}"),
    }

    // Grant carol read access to ConfigMaps only: she can list them, and still not Secrets.
    let yaml = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: cm-reader, namespace: {ns}}}
rules: [{{apiGroups: [""], resources: [configmaps], verbs: [get, list]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: carol-cm-reader, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-reader}}
subjects: [{{kind: User, name: carol@example.com}}]
"#,
        ns = ns.name
    );
    assert_success(
        &cp.kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&yaml)),
        "apply role",
    );
    let carol_cm: Api<ConfigMap> = Api::namespaced(cp.client(Identity::Carol).await, &ns.name);
    carol_cm
        .list(&ListParams::default())
        .await
        .expect("carol lists configmaps");
    assert!(carol.list(&ListParams::default()).await.is_err());
    let out = cp.kubectl(
        Identity::Carol,
        &["auth", "can-i", "delete", "configmaps", "-n", &ns.name],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
}

#[tokio::test]
async fn a_token_request_token_authenticates_as_its_service_account() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("sa").await;
    let token = cp.service_account_token(&ns.name, "default").await;
    let client = cp.client_with_token(&token).await;
    let reviews: Api<SelfSubjectReview> = Api::all(client);
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("self subject review");
    let user = review.status.unwrap().user_info.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{}:default", ns.name).as_str())
    );
    assert!(
        user.groups
            .unwrap()
            .contains(&"system:serviceaccounts".to_string())
    );
}

const SMOKE_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: smokewidgets.agentrun.dev}
spec:
  group: agentrun.dev
  scope: Namespaced
  names: {plural: smokewidgets, singular: smokewidget, kind: SmokeWidget}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              replicas: {type: integer}
              owner: {type: string, maxLength: 64}
            x-kubernetes-validations:
            - rule: "self.replicas <= 5"
              message: "replicas must be at most 5"
"#;

async fn install_smoke_crd(cp: &ControlPlane) {
    assert_success(
        &cp.kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(SMOKE_CRD)),
        "apply smoke CRD",
    );
    assert_success(
        &cp.kubectl(
            Identity::Admin,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/smokewidgets.agentrun.dev",
            ],
        ),
        "wait for smoke CRD",
    );
}

#[tokio::test]
async fn a_cel_rule_on_a_crd_rejects_a_bad_object() {
    let cp = ControlPlane::shared().await;
    install_smoke_crd(cp).await;
    let ns = cp.namespace("cel").await;
    let bad = format!(
        "apiVersion: agentrun.dev/v1alpha1\nkind: SmokeWidget\nmetadata: {{name: bad, namespace: {}}}\nspec: {{replicas: 9}}\n",
        ns.name
    );
    let out = cp.kubectl_with_stdin(Identity::Admin, &["create", "-f", "-"], Some(&bad));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("replicas must be at most 5"), "{stderr}");
    let good = bad
        .replace("replicas: 9", "replicas: 3")
        .replace("name: bad", "name: good");
    assert_success(
        &cp.kubectl_with_stdin(Identity::Admin, &["create", "-f", "-"], Some(&good)),
        "create a valid object",
    );
}

#[tokio::test]
async fn a_validating_admission_policy_compares_a_field_with_the_username() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("vap").await;
    let policy = format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: owner-is-requester-{ns}}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [configmaps]
  validations:
  - expression: "!has(object.data) || !('owner' in object.data) || object.data.owner == request.userInfo.username"
    messageExpression: "'data.owner must be ' + request.userInfo.username"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: owner-is-requester-{ns}}}
spec:
  policyName: owner-is-requester-{ns}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {{kubernetes.io/metadata.name: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-edit, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects: [{{kind: User, name: alice@example.com}}]
"#,
        ns = ns.name
    );
    assert_success(
        &cp.kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&policy)),
        "apply policy",
    );
    let alice: Api<ConfigMap> = Api::namespaced(cp.client(Identity::Alice).await, &ns.name);
    // The policy takes effect once the API server has loaded it; until then creates pass, so use a
    // fresh name per try.
    let mut attempt = 0;
    let message = eventually(Duration::from_secs(30), "the policy to deny", || {
        attempt += 1;
        let alice = alice.clone();
        async move {
            let cm = configmap(&format!("claim-{attempt}"), &[("owner", "bob@example.com")]);
            match alice.create(&PostParams::default(), &cm).await {
                Err(kube::Error::Api(status)) => Some(status.message),
                Err(other) => panic!("unexpected error {other:?}"),
                Ok(_) => None,
            }
        }
    })
    .await;
    assert!(
        message.contains("data.owner must be alice@example.com"),
        "{message}"
    );
    alice
        .create(
            &PostParams::default(),
            &configmap("mine", &[("owner", "alice@example.com")]),
        )
        .await
        .expect("alice may claim her own name");
    let _ = cp.kubectl(
        Identity::Admin,
        &[
            "delete",
            "validatingadmissionpolicybinding,validatingadmissionpolicy",
            &format!("owner-is-requester-{}", ns.name),
        ],
    );
}

#[tokio::test]
async fn the_audit_log_records_alices_patch_with_her_username() {
    let cp = ControlPlane::shared().await;
    install_smoke_crd(cp).await;
    let ns = cp.namespace("audit").await;
    let grant = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: widgets, namespace: {ns}}}
rules: [{{apiGroups: [agentrun.dev], resources: [smokewidgets], verbs: [get, patch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: alice-widgets, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: widgets}}
subjects: [{{kind: User, name: alice@example.com}}]
---
apiVersion: agentrun.dev/v1alpha1
kind: SmokeWidget
metadata: {{name: w, namespace: {ns}}}
spec: {{replicas: 1}}
"#,
        ns = ns.name
    );
    assert_success(
        &cp.kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&grant)),
        "apply",
    );
    let out = cp.kubectl(
        Identity::Alice,
        &[
            "patch",
            "smokewidget",
            "w",
            "-n",
            &ns.name,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"owner":"alice-was-here"}}"#,
        ],
    );
    assert_success(&out, "alice patches");
    let event = eventually(Duration::from_secs(10), "the audit event", || async {
        cp.audit_events().into_iter().find(|e| {
            e["verb"] == "patch"
                && e["objectRef"]["namespace"] == ns.name.as_str()
                && e["objectRef"]["resource"] == "smokewidgets"
                && e["stage"] == "ResponseComplete"
        })
    })
    .await;
    assert_eq!(event["user"]["username"], "alice@example.com");
    assert!(
        event["user"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("agentrun:approvers"))
    );
    assert_eq!(event["responseStatus"]["code"], 200);
    assert_eq!(event["requestObject"]["spec"]["owner"], "alice-was-here");
}

#[tokio::test]
async fn server_side_apply_and_resource_version_conflicts_behave() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("ssa").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let params = PatchParams::apply("agentrun-test").force();
    let applied = api
        .patch("applied", &params, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "1"}})))
        .await
        .expect("apply");
    let managers: Vec<_> = applied
        .metadata
        .managed_fields
        .clone()
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"agentrun-test".to_string()));
    // A replace carrying a stale resourceVersion is refused with 409.
    let mut stale = applied.clone();
    api.patch("applied", &params, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"a": "2"}})))
        .await
        .expect("second apply");
    stale.data = Some([("a".to_string(), "3".to_string())].into());
    match api.replace("applied", &PostParams::default(), &stale).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn mutating_admission_policies_are_served() {
    let cp = ControlPlane::shared().await;
    let out = cp.kubectl(
        Identity::Admin,
        &[
            "api-resources",
            "--api-group=admissionregistration.k8s.io",
            "-o",
            "name",
        ],
    );
    assert_success(&out, "api-resources");
    let names = String::from_utf8_lossy(&out.stdout);
    assert!(names.contains("validatingadmissionpolicies"), "{names}");
    assert!(names.contains("mutatingadmissionpolicies"), "{names}");
}

#[tokio::test]
async fn kubectl_and_helm_run() {
    let cp = ControlPlane::shared().await;
    let out = cp.kubectl(Identity::Admin, &["version", "-o", "json"]);
    assert_success(&out, "kubectl version");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["serverVersion"]["gitVersion"],
        pinned_kubernetes_version().as_str()
    );
    assert!(
        v["clientVersion"]["gitVersion"]
            .as_str()
            .unwrap()
            .starts_with("v1.35")
    );
    let out = cp.helm(&["version", "--short"]);
    assert_success(&out, "helm version");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("v3")
            || String::from_utf8_lossy(&out.stdout).starts_with("v4")
    );
    assert_success(&cp.helm(&["list", "--all-namespaces"]), "helm list");
}

#[tokio::test]
async fn a_watch_stream_sees_deletions() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("watchdel").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    api.create(&PostParams::default(), &configmap("gone", &[]))
        .await
        .unwrap();
    let mut events = Box::pin(watcher(api.clone(), watcher::Config::default()));
    // Wait for the initial listing to finish before deleting.
    loop {
        match events.next().await.unwrap().unwrap() {
            watcher::Event::InitDone => break,
            _ => continue,
        }
    }
    api.delete("gone", &DeleteParams::default()).await.unwrap();
    let deleted = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            if let watcher::Event::Delete(cm) = events.next().await.unwrap().unwrap() {
                return cm;
            }
        }
    })
    .await
    .expect("a delete event");
    assert_eq!(deleted.metadata.name.as_deref(), Some("gone"));
}
