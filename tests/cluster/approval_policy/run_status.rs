//! Workers cannot move a run (issue 12, item 2): through a run's worker ServiceAccount, which
//! every namespace editor can act as, only what a step produces can be written, and only while
//! the run is Running. The attack of the issue (phase Running, step 1 and a state with a forged
//! approval, patched as the worker) is refused; what a worker really writes is accepted.

use agentrun::crd::policy::{
    CONTROLLER_VERB, RUN_NOT_RUNNING_MESSAGE, RUN_STATUS_MESSAGE, WORKER_STATUS_FIELDS,
};
use agentrun::crd::{AgentRun, arguments_digest};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::{Fixture, assert_refused, assert_success, eventually, setup};
use agentrun_testkit::cluster::Identity;
use std::time::Duration;

/// A RunState as a worker writes it: the halted conversation, the approval it needs.
const STATE: &str = r#"{"messages":[{"role":"user","content":"Delete user u-1"}],"deferred_tool_requests":[{"tool_call_id":"call_1","tool_name":"delete_user","arguments":"{\"user_id\": \"u-1\"}"}],"approved_tools":[],"approval_metadata":{}}"#;

/// The same state with an approval nobody gave, as carol wrote it in the issue.
const FORGED: &str = r#"{"messages":[{"role":"user","content":"Delete user u-1"}],"deferred_tool_requests":[],"approved_tools":["call_1"],"approval_metadata":{"call_1":{"approver_id":"alice@example.com"}}}"#;

/// The status fields of a worker's write: the state, its encoding, size and digest, a tool-call
/// record and a final output.
fn step_output(state: &str) -> Value {
    json!({"status": {
        "runState": state,
        "runStateEncoding": "json",
        "runStateBytes": state.len(),
        "runStateDigest": arguments_digest(state),
        "toolCalls": [{"toolCallId": "call_1", "toolName": "delete_user", "step": 0, "startedAt": "2026-01-01T00:00:00Z"}],
        "finalOutput": "done",
    }})
}

impl Fixture {
    /// A run `name` as the controller leaves it while its first worker runs (status written by
    /// admin, a controller identity), with the worker's ServiceAccount `<name>-worker` and the Role
    /// the controller gives it. Returns the ServiceAccount's username.
    async fn running_run(&self, name: &str) -> String {
        let account = format!("{name}-worker");
        self.admin_apply(
            &format!(
                r#"
apiVersion: agentrun.dev/v1alpha1
kind: AgentRun
metadata: {{name: {name}, namespace: {ns}}}
spec: {{agentRef: {{name: ops}}, input: delete user u-1}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {account}, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {account}, namespace: {ns}}}
rules:
- {{apiGroups: [agentrun.dev], resources: [agentruns], resourceNames: [{name}], verbs: [get]}}
- {{apiGroups: [agentrun.dev], resources: [agentruns/status], resourceNames: [{name}], verbs: [get, patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {account}, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {account}}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {ns}}}]
"#,
                ns = self.ns()
            ),
            "the run and its worker identity",
        );
        let status = json!({"status": {
            "phase": "Running",
            "step": 0,
            "retries": 0,
            "pendingApprovals": 0,
            "workerPod": format!("{name}-step-0"),
            "createdBy": "carol@example.com",
            "startedAt": "2026-01-01T00:00:00Z",
            "observedGeneration": 1,
            "conditions": [{"type": "Ready", "status": "False", "reason": "Running",
                            "message": "worker Pod runs step 0", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        }});
        self.patch_status_as_admin(name, &status);
        let user = format!("system:serviceaccount:{}:{account}", self.ns());
        eventually(Duration::from_secs(30), "the worker's Role", || async {
            let out = self.kubectl_as(
                Identity::Admin,
                &user,
                &[
                    "auth",
                    "can-i",
                    "patch",
                    &format!("agentruns.agentrun.dev/{name}"),
                    "--subresource=status",
                ],
            );
            (String::from_utf8_lossy(&out.stdout).trim() == "yes").then_some(())
        })
        .await;
        user
    }

    fn patch_status_as_admin(&self, name: &str, patch: &Value) {
        self.admin(&[
            "patch",
            "agentrun",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ]);
    }

    /// `kubectl patch agentrun NAME --subresource=status` by `identity` acting as `user`.
    fn patch_status_as(
        &self,
        identity: Identity,
        user: &str,
        name: &str,
        patch: &Value,
    ) -> std::process::Output {
        self.kubectl_as(
            identity,
            user,
            &[
                "patch",
                "agentrun",
                name,
                "--subresource=status",
                "--type=merge",
                "-p",
                &patch.to_string(),
            ],
        )
    }
}

#[tokio::test]
async fn a_worker_identity_writes_only_what_a_step_produces() {
    let f = setup("pol-worker").await;
    f.bind_edit().await;
    let worker = f.running_run("r2").await;
    let before = f.get_json("agentrun", "r2")["status"].clone();

    // carol (edit) acts as the run's worker: she cannot move the run or rewrite what the
    // controller owns, alone or together with a state.
    let mut attack = step_output(FORGED);
    attack["status"]["phase"] = json!("Running");
    attack["status"]["step"] = json!(1);
    for (what, patch, field) in [
        (
            "the phase",
            json!({"status": {"phase": "Succeeded"}}),
            "phase",
        ),
        ("the step", json!({"status": {"step": 1}}), "step"),
        ("the retries", json!({"status": {"retries": 3}}), "retries"),
        (
            "the worker Pod",
            json!({"status": {"workerPod": "r2-step-9"}}),
            "workerPod",
        ),
        (
            "the pending approvals",
            json!({"status": {"pendingApprovals": 2}}),
            "pendingApprovals",
        ),
        (
            "the creator, cleared",
            json!({"status": {"createdBy": null}}),
            "createdBy",
        ),
        (
            "the creator, forged",
            json!({"status": {"createdBy": "mallory@example.com"}}),
            "createdBy",
        ),
        (
            "the conditions",
            json!({"status": {"conditions": []}}),
            "conditions",
        ),
        (
            "the start time",
            json!({"status": {"startedAt": "2020-01-01T00:00:00Z"}}),
            "startedAt",
        ),
        (
            "the completion time",
            json!({"status": {"completedAt": "2020-01-01T00:00:00Z"}}),
            "completedAt",
        ),
        (
            "the observed generation",
            json!({"status": {"observedGeneration": 7}}),
            "observedGeneration",
        ),
        (
            "the issue's attack: step 1 with a forged approval",
            attack,
            "step",
        ),
    ] {
        let out = f.patch_status_as(Identity::Carol, &worker, "r2", &patch);
        assert_refused(
            &out,
            &format!("carol as the worker changing {what}"),
            &[RUN_STATUS_MESSAGE, field],
        );
    }
    assert_eq!(f.get_json("agentrun", "r2")["status"], before);

    // What a worker writes at the end of its step is accepted, from carol acting as it...
    let out = f.patch_status_as(Identity::Carol, &worker, "r2", &step_output(STATE));
    assert_success(&out, "the worker's step output");
    let after = f.get_json("agentrun", "r2")["status"].clone();
    assert_eq!(after["runState"], STATE);
    assert_eq!(after["runStateDigest"], arguments_digest(STATE));
    assert_eq!(after["phase"], "Running");
    for field in WORKER_STATUS_FIELDS {
        if field != "runStateChunks" {
            assert!(!after[field].is_null(), "{field} written");
        }
    }
    // ... and from the worker's own token, as its Pod holds it; which cannot move the run either.
    let token = f.cp.service_account_token(f.ns(), "r2-worker").await;
    let runs: Api<AgentRun> = Api::namespaced(f.cp.client_with_token(&token).await, f.ns());
    let params = PatchParams::default();
    runs.patch_status(
        "r2",
        &params,
        &Patch::Merge(json!({"status": {"finalOutput": "again"}})),
    )
    .await
    .expect("the worker's token writes its output");
    let err = runs
        .patch_status(
            "r2",
            &params,
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .expect_err("the worker's token moves the run")
        .to_string();
    assert!(
        err.contains(RUN_STATUS_MESSAGE) && err.contains("phase"),
        "{err}"
    );

    // Once the run halts, the state is the controller's: nothing acting as the worker rewrites
    // it (the issue's arguments swapped after the halt).
    f.patch_status_as_admin(
        "r2",
        &json!({"status": {"phase": "AwaitingApproval", "pendingApprovals": 1}}),
    );
    let swapped = STATE.replace("u-1", "u-666");
    let out = f.patch_status_as(Identity::Carol, &worker, "r2", &step_output(&swapped));
    assert_refused(
        &out,
        "carol as the worker rewriting a halted run's state",
        &[RUN_NOT_RUNNING_MESSAGE, "AwaitingApproval"],
    );
    assert_eq!(f.get_json("agentrun", "r2")["status"]["runState"], STATE);

    // The controller identities change anything: admin (system:masters) ...
    f.patch_status_as_admin(
        "r2",
        &json!({"status": {"phase": "Running", "step": 1, "pendingApprovals": 0, "createdBy": "carol@example.com"}}),
    );
    // ... and an identity RBAC grants the controller verb in the namespace, as the chart grants
    // its controller ServiceAccount (which lives in its own namespace: editors of a namespace can
    // act as its ServiceAccounts, so the verb is never for those). Status rights alone do not make
    // a controller.
    let system = format!("{}-system", f.ns());
    let controller = format!("system:serviceaccount:{system}:agentrun-controller");
    f.admin_apply(
        &format!(
            r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {system}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: agentrun-controller, namespace: {system}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: controller-status, namespace: {ns}}}
rules: [{{apiGroups: [agentrun.dev], resources: [agentruns/status], verbs: [get, patch]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: controller-status, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: controller-status}}
subjects: [{{kind: ServiceAccount, name: agentrun-controller, namespace: {system}}}]
"#,
            ns = f.ns()
        ),
        "the controller's status rights",
    );
    let succeed = json!({"status": {"phase": "Succeeded", "completedAt": "2026-01-01T00:05:00Z"}});
    let refusal = eventually(Duration::from_secs(30), "the status rights", || async {
        let out = f.patch_status_as(Identity::Admin, &controller, "r2", &succeed);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (!out.status.success() && err.contains(RUN_STATUS_MESSAGE)).then_some(err)
    })
    .await;
    assert!(refusal.contains("phase"), "{refusal}");
    f.admin_apply(
        &format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: controller, namespace: {ns}}}
rules: [{{apiGroups: [agentrun.dev], resources: [agentruns], verbs: [{CONTROLLER_VERB}]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: controller, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: controller}}
subjects: [{{kind: ServiceAccount, name: agentrun-controller, namespace: {system}}}]
"#,
            ns = f.ns()
        ),
        "the controller verb",
    );
    // carol cannot act as the controller: its ServiceAccount is not in her namespace.
    let out = f.patch_status_as(Identity::Carol, &controller, "r2", &succeed);
    assert_refused(
        &out,
        "carol acting as the controller",
        &["cannot impersonate resource \"serviceaccounts\""],
    );
    eventually(
        Duration::from_secs(30),
        "the controller's write",
        || async {
            f.patch_status_as(Identity::Admin, &controller, "r2", &succeed)
                .status
                .success()
                .then_some(())
        },
    )
    .await;
    assert_eq!(f.get_json("agentrun", "r2")["status"]["phase"], "Succeeded");
    // A finished run takes no more worker writes.
    let out = f.patch_status_as(Identity::Carol, &worker, "r2", &step_output(STATE));
    assert_refused(
        &out,
        "a worker write after the end",
        &[RUN_NOT_RUNNING_MESSAGE, "Succeeded"],
    );
    let _ = f.cp.kubectl(
        Identity::Admin,
        &["delete", "namespace", &system, "--wait=false"],
    );
}

/// A run keeps the worker settings it started with (issue 12, item 3: `spec.worker` image and
/// service account were mutable).
#[tokio::test]
async fn a_run_keeps_its_worker_settings() {
    let f = setup("pol-worker-spec").await;
    f.bind_edit().await;
    let run = |name: &str, worker: &str| {
        format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {{name: {name}, namespace: {}}}\nspec: {{agentRef: {{name: ops}}, input: restart the web tier{worker}}}\n",
            f.ns()
        )
    };
    for (name, worker) in [
        (
            "with",
            ", worker: {image: registry.example.com/agentrun:1.0, serviceAccountName: runner}",
        ),
        ("without", ""),
    ] {
        assert_success(
            &f.cp.kubectl_with_stdin(
                Identity::Carol,
                &["create", "-f", "-"],
                Some(&run(name, worker)),
            ),
            "carol creates a run",
        );
    }
    for (identity, name, patch) in [
        (
            Identity::Carol,
            "with",
            json!({"spec": {"worker": {"image": "evil.example.com/agentrun:1.0"}}}),
        ),
        (
            Identity::Carol,
            "with",
            json!({"spec": {"worker": {"serviceAccountName": "default"}}}),
        ),
        (Identity::Carol, "with", json!({"spec": {"worker": null}})),
        (
            Identity::Carol,
            "without",
            json!({"spec": {"worker": {"image": "evil.example.com/agentrun:1.0"}}}),
        ),
        (
            Identity::Admin,
            "with",
            json!({"spec": {"worker": {"image": "evil.example.com/agentrun:1.0"}}}),
        ),
    ] {
        let out = f.cp.kubectl(
            identity,
            &[
                "-n",
                f.ns(),
                "patch",
                "agentrun",
                name,
                "--type=merge",
                "-p",
                &patch.to_string(),
            ],
        );
        assert_refused(
            &out,
            &format!("{identity:?} patching {name}: {patch}"),
            &["worker is immutable"],
        );
    }
    let with = f.get_json("agentrun", "with");
    assert_eq!(
        with["spec"]["worker"]["image"],
        "registry.example.com/agentrun:1.0"
    );
    assert_eq!(with["spec"]["worker"]["serviceAccountName"], "runner");
    assert!(f.get_json("agentrun", "without")["spec"]["worker"].is_null());
    // The rest of the run stays editable as before (labels, annotations).
    assert_success(
        &f.cp.kubectl(
            Identity::Carol,
            &["-n", f.ns(), "label", "agentrun", "with", "team=ops"],
        ),
        "carol labels her run",
    );
}
