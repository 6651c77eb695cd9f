//! The admission policies and roles of `crds/` against a real API server, each rule exercised by
//! the real identity it is about (their own tokens, through kubectl): who may decide an
//! ApprovalRequest and in whose name, separation of duties, no decisions on Expired or Superseded
//! requests, the stamped identities (`agentrun.dev/decided-by`, `agentrun.dev/created-by`) and
//! their immutability, and the aggregated roles. For each rule, the refused case and the allowed
//! case.
//!
//! The attacks of issue 12 on the API server's side, by namespace editors (the built-in `edit`
//! role, which lets them act as any ServiceAccount of the namespace), approvers and the GitOps
//! identity, are in the modules below: workers cannot move a run ([`run_status`]), identities are
//! compared normalised ([`identities`]), GitOps decisions need an enabled namespace and the
//! admin's allow-list ([`gitops`]), and the decision record cannot be detached or released by
//! anyone but the controller ([`retention`]).

mod gitops;
mod identities;
mod retention;
mod run_status;

use std::process::Output;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use agentrun::crd::policy::{
    APPROVER_ROLE, CREATED_BY_ANNOTATION, CREATED_BY_IMMUTABLE_MESSAGE, DECIDED_BY_ANNOTATION,
    DECIDED_BY_MESSAGE, DecidedBy, EDITOR_ROLE, FROZEN_ANNOTATIONS_MESSAGE,
    GITOPS_ALLOW_LIST_VARIABLE, GITOPS_APPROVERS_POLICY, GITOPS_COMMIT_ANNOTATION, GITOPS_GROUP,
    GITOPS_NOT_ALLOWED_MESSAGE, REQUEST_RUN_LABEL_MESSAGE, RUN_STATUS_MESSAGE, VIEWER_ROLE,
    gitops_allow_list,
};
use agentrun::crd::{
    AgentRunRef, ApprovalRequest, ApprovalRequestSpec, Decision, arguments_digest,
};
use agentrun_testkit::cluster::{
    ControlPlane, Identity, TestNamespace, assert_refused, assert_success, stderr, stdout,
};
use agentrun_testkit::wait::eventually;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// The arguments of every request in these tests.
const ARGUMENTS: &str = r#"{"host": "web-1", "replicas": 3}"#;

/// What alice is told when she records someone else as the approver.
const ALICE_NOT_BOB: &str = "approverId must be your own username (alice@example.com); only members of agentrun:gitops may record another approver, with the agentrun.dev/gitops-commit annotation naming the commit";

static POLICIES_READY: OnceLock<()> = OnceLock::new();

/// The policies of `crds/`, each checked by a probe that passes only once it is enforced.
const PROBES: [&str; 7] = [
    "stamp-creator",
    "run-creator",
    "stamp-decider",
    "approval-identity",
    "run-status",
    "record-retention",
    "gitops-approvers",
];

/// The GitOps approver allow-list of these tests, as an admin configures it: alice, bob (written
/// with another case and spaces: the list is compared normalised) and carol.
const ALLOW_LIST: [&str; 3] = [
    "alice@example.com",
    " Bob@Example.com ",
    "carol@example.com",
];

/// The group the probes' non-controller identity is in, with the rights the probes need.
const PROBE_GROUP: &str = "agentrun:policy-probe";

/// Puts [`ALLOW_LIST`] into the installed `agentrun-gitops-approvers` policy (empty as generated),
/// the way the docs tell an admin without Helm to: a JSON patch of its first variable.
fn configure_allow_list(cp: &ControlPlane) {
    let patch = json!([{
        "op": "replace",
        "path": "/spec/variables/0",
        "value": {"name": GITOPS_ALLOW_LIST_VARIABLE, "expression": gitops_allow_list(&ALLOW_LIST)},
    }]);
    assert_success(
        &cp.kubectl(
            Identity::Admin,
            &[
                "patch",
                "validatingadmissionpolicy",
                GITOPS_APPROVERS_POLICY,
                "--type=json",
                "-p",
                &patch.to_string(),
            ],
        ),
        "configure the GitOps allow-list",
    );
}

/// The probe namespace: the GitOps group an approver there, and [`PROBE_GROUP`] allowed to write
/// run status and requests (as a worker or an approver might).
fn probe_namespace(ns: &str) -> String {
    format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: probe, namespace: {ns}}}
rules:
- {{apiGroups: [agentrun.dev], resources: [agentruns/status, approvalrequests], verbs: [get, patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: probe, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: probe}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "{PROBE_GROUP}"}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: gitops, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {APPROVER_ROLE}}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "{GITOPS_GROUP}"}}]
"#
    )
}

/// Waits until the API server enforces every policy of `crds/` (installed by
/// `install_crds`): admission policies take effect a moment after they are created, and right
/// after a CRD is established the mutating ones may still answer 503 for its kind.
fn wait_for_policies(cp: &ControlPlane) {
    POLICIES_READY.get_or_init(|| {
        let probe = format!("policy-probe-{:08x}", rand::random::<u32>());
        configure_allow_list(cp);
        assert_success(
            &cp.kubectl_with_stdin(
                Identity::Admin,
                &["apply", "-f", "-"],
                Some(&probe_namespace(&probe)),
            ),
            "create the probe namespace",
        );
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut waiting: Vec<(&str, String)> = PROBES
            .iter()
            .map(|p| (*p, "not tried".to_owned()))
            .collect();
        let mut attempt = 0;
        while !waiting.is_empty() {
            assert!(
                Instant::now() < deadline,
                "the admission policies did not take effect: {waiting:#?}"
            );
            attempt += 1;
            waiting = waiting
                .into_iter()
                .filter_map(|(policy, _)| {
                    probe_policy(cp, &probe, policy, attempt)
                        .err()
                        .map(|why| (policy, why))
                })
                .collect();
            if !waiting.is_empty() {
                std::thread::sleep(Duration::from_millis(250));
            }
        }
        let _ = cp.kubectl(
            Identity::Admin,
            &["delete", "namespace", &probe, "--wait=false"],
        );
    });
}

/// `Ok` when `policy` is enforced, else why not (yet); tried with objects named for `attempt`.
fn probe_policy(cp: &ControlPlane, ns: &str, policy: &str, attempt: u32) -> Result<(), String> {
    let name = format!("{policy}-{attempt}");
    let run = |annotations: &str| {
        format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {{name: {name}, namespace: {ns}, annotations: {{{annotations}}}}}\nspec: {{agentRef: {{name: probe}}, input: probe}}\n"
        )
    };
    let request = |annotations: &str, decision: &str| {
        format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: ApprovalRequest\nmetadata: {{name: {name}, namespace: {ns}, annotations: {{{annotations}}}, labels: {{agentrun.dev/run: probe}}}}\nspec: {{agentRunRef: {{name: probe, uid: probe}}, step: 0, toolCallId: call, toolName: probe, arguments: '{ARGUMENTS}', argumentsDigest: {}{decision}}}\n",
            arguments_digest(ARGUMENTS)
        )
    };
    // kubectl as a non-controller identity with the probe's rights.
    let as_probe = |args: &[&str]| {
        let mut all = vec!["-n", ns, "--as", "policy-probe", "--as-group", PROBE_GROUP];
        all.extend_from_slice(args);
        cp.kubectl(Identity::Admin, &all)
    };
    // The created object, or why the create failed.
    let create = |yaml: &str| -> Result<Value, String> {
        let out = cp.kubectl_with_stdin(
            Identity::Admin,
            &["create", "-o", "json", "-f", "-"],
            Some(yaml),
        );
        if !out.status.success() {
            return Err(stderr(&out));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("kubectl printed no object: {e}"))
    };
    let annotation = |object: &Value, key: &str| -> Option<String> {
        object["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_owned)
    };
    // A change the policy must refuse, with `message`.
    let refused = |out: Output, message: &str| {
        let err = stderr(&out);
        if out.status.success() {
            Err("accepted".to_owned())
        } else if err.contains(message) {
            Ok(())
        } else {
            Err(err)
        }
    };
    match policy {
        "stamp-creator" => {
            let object = create(&run(&format!("'{CREATED_BY_ANNOTATION}': forged")))?;
            match annotation(&object, CREATED_BY_ANNOTATION).as_deref() {
                Some("admin") => Ok(()),
                other => Err(format!("{CREATED_BY_ANNOTATION} is {other:?}")),
            }
        }
        "run-creator" => {
            create(&run(""))?;
            let out = cp.kubectl(
                Identity::Admin,
                &[
                    "-n",
                    ns,
                    "annotate",
                    "--overwrite",
                    "agentrun",
                    &name,
                    &format!("{CREATED_BY_ANNOTATION}=changed"),
                ],
            );
            refused(out, CREATED_BY_IMMUTABLE_MESSAGE)
        }
        "stamp-decider" => {
            let object = create(&request(
                "",
                ", decision: Approved, approverId: admin, reason: probe",
            ))?;
            let stamp = annotation(&object, DECIDED_BY_ANNOTATION)
                .ok_or_else(|| format!("no {DECIDED_BY_ANNOTATION}"))?;
            match DecidedBy::parse(&stamp) {
                Ok(d) if d.username == "admin" => Ok(()),
                other => Err(format!("{DECIDED_BY_ANNOTATION}: {other:?}")),
            }
        }
        "approval-identity" => {
            let out = cp.kubectl_with_stdin(
                Identity::Admin,
                &["create", "-f", "-"],
                Some(&request(&format!("'{DECIDED_BY_ANNOTATION}': forged"), "")),
            );
            refused(out, DECIDED_BY_MESSAGE)
        }
        "run-status" => {
            create(&run(""))?;
            let out = cp.kubectl(
                Identity::Admin,
                &[
                    "-n",
                    ns,
                    "patch",
                    "agentrun",
                    &name,
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    r#"{"status":{"phase":"Running","step":0}}"#,
                ],
            );
            if !out.status.success() {
                return Err(stderr(&out));
            }
            let out = as_probe(&[
                "patch",
                "agentrun",
                &name,
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"step":5}}"#,
            ]);
            refused(out, RUN_STATUS_MESSAGE)
        }
        "record-retention" => {
            create(&request("", ""))?;
            let out = as_probe(&[
                "label",
                "--overwrite",
                "apr",
                &name,
                "agentrun.dev/run=other",
            ]);
            refused(out, REQUEST_RUN_LABEL_MESSAGE)
        }
        "gitops-approvers" => {
            create(&request("", ""))?;
            let decision = json!({
                "metadata": {"annotations": {GITOPS_COMMIT_ANNOTATION: "9fceb02d0ae598e95dc970b74767f19372d61af8"}},
                "spec": {"decision": "Approved", "approverId": "not-listed@example.com", "reason": "probe"}
            });
            let out = cp.kubectl(
                Identity::Gitops,
                &[
                    "-n",
                    ns,
                    "patch",
                    "apr",
                    &name,
                    "--type=merge",
                    "-p",
                    &decision.to_string(),
                ],
            );
            // Refused as not listed (not as "the list is empty"): the list is configured.
            refused(out, GITOPS_NOT_ALLOWED_MESSAGE)
        }
        other => unreachable!("no probe for {other}"),
    }
}

/// The bindings every test namespace gets: approvers and GitOps may decide, carol may edit.
fn bindings(ns: &str) -> String {
    format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: approvers, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {APPROVER_ROLE}}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "agentrun:approvers"}}
- {{apiGroup: rbac.authorization.k8s.io, kind: Group, name: "{GITOPS_GROUP}"}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: editors, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {EDITOR_ROLE}}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol@example.com}}
"#
    )
}

/// True when `identity` may `verb` `resource` in `ns`, asked with its own token.
fn can_i(cp: &ControlPlane, identity: Identity, ns: &str, verb: &str, resource: &str) -> bool {
    let out = cp.kubectl(identity, &["auth", "can-i", verb, resource, "-n", ns]);
    stdout(&out).trim() == "yes"
}

struct Fixture {
    cp: &'static ControlPlane,
    ns: TestNamespace,
    requests: Api<ApprovalRequest>,
}

async fn setup(prefix: &str) -> Fixture {
    let cp = ControlPlane::shared().await;
    cp.install_crds().await;
    wait_for_policies(cp);
    let ns = cp.namespace(prefix).await;
    assert_success(
        &cp.kubectl_with_stdin(
            Identity::Admin,
            &["apply", "-f", "-"],
            Some(&bindings(&ns.name)),
        ),
        "bind the roles",
    );
    // The authorizer learns about new bindings a moment later.
    for (identity, verb, resource) in [
        (Identity::Alice, "patch", "approvalrequests.agentrun.dev"),
        (Identity::Bob, "patch", "approvalrequests.agentrun.dev"),
        (Identity::Gitops, "patch", "approvalrequests.agentrun.dev"),
        (Identity::Carol, "create", "agentruns.agentrun.dev"),
    ] {
        eventually(Duration::from_secs(30), "the role bindings", || async {
            can_i(cp, identity, &ns.name, verb, resource).then_some(())
        })
        .await;
    }
    let requests = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    Fixture { cp, ns, requests }
}

impl Fixture {
    fn ns(&self) -> &str {
        &self.ns.name
    }

    /// Binds the built-in `edit` ClusterRole to carol and bob here, and waits until carol may act
    /// as the namespace's ServiceAccounts (which `edit` allows).
    async fn bind_edit(&self) {
        let binding = format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: built-in-edit, namespace: {}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol@example.com}}
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob@example.com}}
"#,
            self.ns()
        );
        assert_success(
            &self
                .cp
                .kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&binding)),
            "bind edit to carol and bob",
        );
        for identity in [Identity::Carol, Identity::Bob] {
            eventually(Duration::from_secs(60), "the edit binding", || async {
                (can_i(
                    self.cp,
                    identity,
                    self.ns(),
                    "impersonate",
                    "serviceaccounts",
                ) && can_i(
                    self.cp,
                    identity,
                    self.ns(),
                    "patch",
                    "agentruns.agentrun.dev",
                ))
                .then_some(())
            })
            .await;
        }
    }

    /// kubectl in this namespace as `identity` acting as `user` (`--as`), e.g. carol as a
    /// ServiceAccount of the namespace.
    fn kubectl_as(&self, identity: Identity, user: &str, args: &[&str]) -> Output {
        let mut all = vec!["-n", self.ns(), "--as", user];
        all.extend_from_slice(args);
        self.cp.kubectl(identity, &all)
    }

    /// Applies `manifest` as admin.
    fn admin_apply(&self, manifest: &str, what: &str) {
        assert_success(
            &self
                .cp
                .kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(manifest)),
            what,
        );
    }

    /// Runs kubectl in this namespace as admin, asserting success; its standard output.
    fn admin(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.ns()];
        all.extend_from_slice(args);
        let out = self.cp.kubectl(Identity::Admin, &all);
        assert_success(&out, &all.join(" "));
        stdout(&out)
    }

    /// An object of this namespace as JSON, read by admin.
    fn get_json(&self, kind: &str, name: &str) -> Value {
        let text = self.admin(&["get", kind, name, "-o", "json"]);
        serde_json::from_str(&text).expect("kubectl -o json")
    }

    /// Creates a pending ApprovalRequest as admin (the way the controller does: no decision).
    async fn pending(&self, name: &str, run_creator: Option<&str>) -> ApprovalRequest {
        let spec = ApprovalRequestSpec {
            agent_run_ref: AgentRunRef {
                name: "restart-web".to_owned(),
                uid: "0b6d0a6e-6f0e-4d1b-9a43-3f1f2b0c9d11".to_owned(),
            },
            step: 0,
            tool_call_id: format!("call-{name}"),
            tool_name: "restart".to_owned(),
            arguments: ARGUMENTS.to_owned(),
            arguments_digest: arguments_digest(ARGUMENTS),
            run_creator: run_creator.map(str::to_owned),
            ..Default::default()
        };
        self.requests
            .create(&PostParams::default(), &ApprovalRequest::new(name, spec))
            .await
            .unwrap_or_else(|e| panic!("create ApprovalRequest {name}: {e}"))
    }

    async fn get(&self, name: &str) -> ApprovalRequest {
        self.requests.get(name).await.expect("get ApprovalRequest")
    }

    async fn set_phase(&self, name: &str, phase: &str) {
        self.requests
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase}})),
            )
            .await
            .unwrap_or_else(|e| panic!("set the phase of {name}: {e}"));
    }

    /// `kubectl patch apr NAME --type merge -p PATCH` as `identity`.
    fn patch(&self, identity: Identity, name: &str, patch: &Value) -> Output {
        self.cp.kubectl(
            identity,
            &[
                "-n",
                self.ns(),
                "patch",
                "apr",
                name,
                "--type",
                "merge",
                "-p",
                &patch.to_string(),
            ],
        )
    }

    /// Sets a decision as `identity` with a merge patch, the documented way.
    fn decide(&self, identity: Identity, name: &str, approver: &str) -> Output {
        self.patch(
            identity,
            name,
            &json!({"spec": {"decision": "Approved", "approverId": approver, "reason": "authorized per change CR-1234"}}),
        )
    }

    /// `kubectl annotate apr NAME ARGS… --overwrite` as `identity`.
    fn annotate(&self, identity: Identity, name: &str, change: &str) -> Output {
        self.cp.kubectl(
            identity,
            &[
                "-n",
                self.ns(),
                "annotate",
                "--overwrite",
                "apr",
                name,
                change,
            ],
        )
    }

    /// The GitOps manifest of a decision, as committed to a repository.
    fn gitops_manifest(&self, name: &str, approver: &str, commit: Option<&str>) -> String {
        let annotations = commit
            .map(|c| format!("  annotations:\n    {GITOPS_COMMIT_ANNOTATION}: \"{c}\"\n"))
            .unwrap_or_default();
        format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: ApprovalRequest\nmetadata:\n  name: {name}\n  namespace: {}\n{annotations}spec:\n  decision: Approved\n  approverId: {approver}\n  reason: approved in pull request 42\n",
            self.ns()
        )
    }

    /// `kubectl apply --server-side` of `manifest` as `identity`.
    fn apply(&self, identity: Identity, manifest: &str) -> Output {
        self.cp.kubectl_with_stdin(
            identity,
            &[
                "apply",
                "--server-side",
                "--field-manager",
                "gitops-sync",
                "-f",
                "-",
            ],
            Some(manifest),
        )
    }
}

fn annotation(request: &ApprovalRequest, key: &str) -> Option<String> {
    request.annotations().get(key).cloned()
}

fn decided_by(request: &ApprovalRequest) -> DecidedBy {
    let value = annotation(request, DECIDED_BY_ANNOTATION)
        .unwrap_or_else(|| panic!("no {DECIDED_BY_ANNOTATION} on {}", request.name_any()));
    DecidedBy::parse(&value).expect("the stamp is JSON")
}

#[tokio::test]
async fn alice_approves_in_her_own_name_and_her_identity_is_stamped() {
    let f = setup("pol-alice").await;
    f.pending("plain", Some("carol@example.com")).await;
    assert_success(
        &f.decide(Identity::Alice, "plain", "alice@example.com"),
        "alice approves as herself",
    );
    let decided = f.get("plain").await;
    assert_eq!(decided.spec.decision, Some(Decision::Approved));
    assert_eq!(
        decided.spec.approver_id.as_deref(),
        Some("alice@example.com")
    );
    let stamp = decided_by(&decided);
    assert_eq!(stamp.username, "alice@example.com");
    assert_eq!(stamp.uid, "uid-alice");
    assert!(
        stamp.groups.contains(&"agentrun:approvers".to_owned()),
        "{stamp:?}"
    );
    assert!(
        stamp.groups.contains(&"system:authenticated".to_owned()),
        "{stamp:?}"
    );
    let identity = stamp.to_verified_identity();
    assert_eq!(identity.uid.as_deref(), Some("uid-alice"));

    // A stamp written by hand in the deciding patch is replaced by the verified one.
    f.pending("forged", None).await;
    let forged = json!({"username": "bob@example.com", "uid": "uid-bob", "groups": []}).to_string();
    let out = f.patch(
        Identity::Alice,
        "forged",
        &json!({
            "metadata": {"annotations": {DECIDED_BY_ANNOTATION: forged}},
            "spec": {"decision": "Rejected", "approverId": "alice@example.com", "reason": "not now", "message": "Do not restart web-1."}
        }),
    );
    assert_success(&out, "alice rejects with a forged stamp in her patch");
    let decided = f.get("forged").await;
    assert_eq!(decided.spec.decision, Some(Decision::Rejected));
    assert_eq!(decided_by(&decided).username, "alice@example.com");
}

#[tokio::test]
async fn alice_cannot_record_bob_as_the_approver() {
    let f = setup("pol-impersonate").await;
    f.pending("r1", None).await;
    let out = f.decide(Identity::Alice, "r1", "bob@example.com");
    assert_refused(&out, "alice approving as bob", &[ALICE_NOT_BOB]);
    // The GitOps exception is for the GitOps group only: the annotation does not help alice.
    let out = f.patch(
        Identity::Alice,
        "r1",
        &json!({
            "metadata": {"annotations": {GITOPS_COMMIT_ANNOTATION: "4b825dc642cb6eb9a060e54bf8d69288fbee4904"}},
            "spec": {"decision": "Approved", "approverId": "bob@example.com", "reason": "ok"}
        }),
    );
    assert_refused(
        &out,
        "alice approving as bob with a commit",
        &[ALICE_NOT_BOB],
    );
    let untouched = f.get("r1").await;
    assert_eq!(untouched.spec.decision, None);
    assert_eq!(annotation(&untouched, DECIDED_BY_ANNOTATION), None);
    // The allowed case on the same request.
    assert_success(
        &f.decide(Identity::Alice, "r1", "alice@example.com"),
        "alice approving as herself",
    );
    assert_eq!(decided_by(&f.get("r1").await).username, "alice@example.com");
}

#[tokio::test]
async fn carol_cannot_decide_but_alice_can() {
    let f = setup("pol-rbac").await;
    f.pending("r1", None).await;
    assert!(!can_i(
        f.cp,
        Identity::Carol,
        f.ns(),
        "patch",
        "approvalrequests.agentrun.dev"
    ));
    assert!(can_i(
        f.cp,
        Identity::Carol,
        f.ns(),
        "get",
        "approvalrequests.agentrun.dev"
    ));
    assert!(can_i(
        f.cp,
        Identity::Alice,
        f.ns(),
        "patch",
        "approvalrequests.agentrun.dev"
    ));
    assert!(!can_i(
        f.cp,
        Identity::Alice,
        f.ns(),
        "create",
        "approvalrequests.agentrun.dev"
    ));
    let out = f.decide(Identity::Carol, "r1", "carol@example.com");
    assert_refused(
        &out,
        "carol approving",
        &[
            "forbidden",
            "carol@example.com",
            "cannot patch resource \"approvalrequests\"",
        ],
    );
    // Carol (an editor) can still read the request she cannot decide.
    let out = f.cp.kubectl(
        Identity::Carol,
        &["-n", f.ns(), "get", "apr", "r1", "-o", "name"],
    );
    assert_success(&out, "carol reads the request");
    assert_eq!(f.get("r1").await.spec.decision, None);
    assert_success(
        &f.decide(Identity::Alice, "r1", "alice@example.com"),
        "alice approving",
    );
}

#[tokio::test]
async fn gitops_records_another_approver_only_with_a_commit() {
    let f = setup("pol-gitops").await;
    // The admin's allow-list names alice (configured once for all tests, before any runs).
    assert!(ALLOW_LIST.contains(&"alice@example.com"));
    f.pending("r1", Some("carol@example.com")).await;
    let without = f.gitops_manifest("r1", "alice@example.com", None);
    let out = f.apply(Identity::Gitops, &without);
    assert_refused(
        &out,
        "a GitOps decision without its commit",
        &[
            "approverId must be your own username (gitops)",
            GITOPS_COMMIT_ANNOTATION,
        ],
    );
    let blank = f.gitops_manifest("r1", "alice@example.com", Some("  "));
    assert_refused(
        &f.apply(Identity::Gitops, &blank),
        "a GitOps decision with a blank commit",
        &["approverId must be your own username (gitops)"],
    );
    // A commit does not let someone outside the GitOps group decide for another.
    let commit = "9fceb02d0ae598e95dc970b74767f19372d61af8";
    let manifest = f.gitops_manifest("r1", "alice@example.com", Some(commit));
    assert_refused(
        &f.apply(Identity::Bob, &manifest),
        "bob applying a decision in alice's name",
        &["approverId must be your own username (bob@example.com)"],
    );
    assert_eq!(f.get("r1").await.spec.decision, None);

    let out = f.apply(Identity::Gitops, &manifest);
    assert_success(&out, "the GitOps decision with its commit");
    let decided = f.get("r1").await;
    assert_eq!(decided.spec.decision, Some(Decision::Approved));
    assert_eq!(
        decided.spec.approver_id.as_deref(),
        Some("alice@example.com")
    );
    assert_eq!(
        annotation(&decided, GITOPS_COMMIT_ANNOTATION).as_deref(),
        Some(commit)
    );
    // The actor and the claimed approver are recorded separately.
    let stamp = decided_by(&decided);
    assert_eq!(stamp.username, "gitops");
    assert_eq!(stamp.uid, "uid-gitops");
    assert!(stamp.groups.contains(&GITOPS_GROUP.to_owned()), "{stamp:?}");

    // A sync loop re-applies the same manifest: accepted, nothing changes.
    assert_success(
        &f.apply(Identity::Gitops, &manifest),
        "re-applying the decision",
    );
    let again = f.get("r1").await;
    assert_eq!(again.annotations(), decided.annotations());
    assert_eq!(again.spec, decided.spec);
    // Pointing the decision at another commit afterwards is refused.
    let moved = f.gitops_manifest(
        "r1",
        "alice@example.com",
        Some("0000000000000000000000000000000000000000"),
    );
    assert_refused(
        &f.apply(Identity::Gitops, &moved),
        "changing the commit of a decision",
        &[FROZEN_ANNOTATIONS_MESSAGE],
    );
}

#[tokio::test]
async fn the_run_creator_cannot_decide_its_own_requests() {
    let f = setup("pol-sod").await;
    f.pending("own", Some("alice@example.com")).await;
    let out = f.decide(Identity::Alice, "own", "alice@example.com");
    assert_refused(
        &out,
        "alice approving her own run's request",
        &[
            "separation of duties: alice@example.com created this run and cannot decide its own requests",
        ],
    );
    assert_eq!(f.get("own").await.spec.decision, None);
    // GitOps cannot record the creator as approver either.
    let manifest = f.gitops_manifest(
        "own",
        "alice@example.com",
        Some("9fceb02d0ae598e95dc970b74767f19372d61af8"),
    );
    assert_refused(
        &f.apply(Identity::Gitops, &manifest),
        "GitOps recording the creator as approver",
        &["separation of duties: alice@example.com created this run"],
    );
    // Another approver may.
    assert_success(
        &f.decide(Identity::Bob, "own", "bob@example.com"),
        "bob approving alice's run's request",
    );
    assert_eq!(decided_by(&f.get("own").await).username, "bob@example.com");

    // A GitOps identity that created the run cannot decide it, whoever it names.
    f.pending("gitops-run", Some("gitops")).await;
    let manifest = f.gitops_manifest(
        "gitops-run",
        "bob@example.com",
        Some("9fceb02d0ae598e95dc970b74767f19372d61af8"),
    );
    assert_refused(
        &f.apply(Identity::Gitops, &manifest),
        "GitOps deciding its own run",
        &["separation of duties: gitops created this run"],
    );

    // Without a recorded creator (an admin setting allows self-approval) the creator may decide.
    f.pending("self-approval", None).await;
    assert_success(
        &f.decide(Identity::Alice, "self-approval", "alice@example.com"),
        "alice approving when self-approval is allowed",
    );
}

#[tokio::test]
async fn expired_and_superseded_requests_cannot_be_decided() {
    let f = setup("pol-expired").await;
    for (name, phase) in [("expired", "Expired"), ("superseded", "Superseded")] {
        f.pending(name, None).await;
        f.set_phase(name, phase).await;
        let out = f.decide(Identity::Bob, name, "bob@example.com");
        // The CRD's own rule answers first; the policy repeats the check (defense in depth).
        assert_refused(
            &out,
            &format!("deciding a {phase} request"),
            &["can no longer be decided"],
        );
        let request = f.get(name).await;
        assert_eq!(request.spec.decision, None);
        assert_eq!(annotation(&request, DECIDED_BY_ANNOTATION), None);
    }
    f.pending("pending", None).await;
    f.set_phase("pending", "Pending").await;
    assert_success(
        &f.decide(Identity::Bob, "pending", "bob@example.com"),
        "deciding a Pending request",
    );
}

#[tokio::test]
async fn decision_annotations_cannot_be_forged_or_changed() {
    let f = setup("pol-frozen").await;
    // Before a decision, nobody can write a stamp: not an approver, not admin.
    f.pending("pending", None).await;
    let forged = format!(
        "{DECIDED_BY_ANNOTATION}={}",
        json!({"username": "bob@example.com", "uid": "uid-bob", "groups": ["agentrun:approvers"]})
    );
    for identity in [Identity::Bob, Identity::Admin] {
        assert_refused(
            &f.annotate(identity, "pending", &forged),
            &format!("{identity:?} writing a stamp on a pending request"),
            &[DECIDED_BY_MESSAGE],
        );
    }

    f.pending("decided", None).await;
    assert_success(
        &f.decide(Identity::Alice, "decided", "alice@example.com"),
        "alice approves",
    );
    let decided = f.get("decided").await;
    for (identity, change, what) in [
        (Identity::Alice, forged.as_str(), "overwriting the stamp"),
        (
            Identity::Admin,
            forged.as_str(),
            "admin overwriting the stamp",
        ),
        (
            Identity::Admin,
            "agentrun.dev/decided-by-",
            "removing the stamp",
        ),
        (
            Identity::Admin,
            "agentrun.dev/gitops-commit=9fceb02d0ae598e95dc970b74767f19372d61af8",
            "adding a commit after the decision",
        ),
    ] {
        assert_refused(
            &f.annotate(identity, "decided", change),
            what,
            &[FROZEN_ANNOTATIONS_MESSAGE],
        );
    }
    assert_eq!(f.get("decided").await.annotations(), decided.annotations());
    // Other annotations stay writable.
    assert_success(
        &f.annotate(Identity::Alice, "decided", "example.com/ticket=CR-1234"),
        "an unrelated annotation",
    );

    // A GitOps decision's commit is frozen too.
    f.pending("gitops", None).await;
    let commit = "9fceb02d0ae598e95dc970b74767f19372d61af8";
    assert_success(
        &f.apply(
            Identity::Gitops,
            &f.gitops_manifest("gitops", "bob@example.com", Some(commit)),
        ),
        "the GitOps decision",
    );
    for change in [
        "agentrun.dev/gitops-commit-".to_owned(),
        format!("{GITOPS_COMMIT_ANNOTATION}=0000000"),
    ] {
        assert_refused(
            &f.annotate(Identity::Admin, "gitops", &change),
            &format!("{change} after the decision"),
            &[FROZEN_ANNOTATIONS_MESSAGE],
        );
    }
    assert_eq!(
        annotation(&f.get("gitops").await, GITOPS_COMMIT_ANNOTATION).as_deref(),
        Some(commit)
    );
}

/// The controller's writes: create requests without a decision, update their status, re-apply
/// their request fields after a decision. Done here by a service account with only the rights
/// the controller needs, and by admin (system:masters).
#[tokio::test]
async fn the_controller_still_creates_requests_and_updates_status() {
    let f = setup("pol-controller").await;
    let grant = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: controller, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: controller, namespace: {ns}}}
rules:
- {{apiGroups: [agentrun.dev], resources: [approvalrequests], verbs: [get, create, patch]}}
- {{apiGroups: [agentrun.dev], resources: [approvalrequests/status], verbs: [patch]}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: controller, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: controller}}
subjects: [{{kind: ServiceAccount, name: controller, namespace: {ns}}}]
"#,
        ns = f.ns()
    );
    assert_success(
        &f.cp
            .kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&grant)),
        "the controller's service account",
    );
    let accounts: Api<ServiceAccount> = Api::namespaced(f.cp.client(Identity::Admin).await, f.ns());
    eventually(Duration::from_secs(30), "the service account", || async {
        accounts.get_opt("controller").await.ok().flatten()
    })
    .await;
    let token = f.cp.service_account_token(f.ns(), "controller").await;
    let client: Client = f.cp.client_with_token(&token).await;
    let api: Api<ApprovalRequest> = Api::namespaced(client, f.ns());
    let apply = PatchParams::apply("agentrun-controller").force();
    let body = |name: &str| {
        json!({
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "ApprovalRequest",
            "metadata": {"name": name, "finalizers": ["agentrun.dev/keep-with-run"]},
            "spec": {
                "agentRunRef": {"name": "restart-web", "uid": "0b6d0a6e-6f0e-4d1b-9a43-3f1f2b0c9d11"},
                "step": 0,
                "toolCallId": "call-1",
                "toolName": "restart",
                "arguments": ARGUMENTS,
                "argumentsDigest": arguments_digest(ARGUMENTS),
                "runCreator": "carol@example.com",
            }
        })
    };
    let status = PatchParams {
        field_manager: Some("agentrun-controller".to_owned()),
        ..Default::default()
    };
    eventually(
        Duration::from_secs(30),
        "the service account's rights",
        || {
            let api = api.clone();
            let body = body("r1");
            let apply = apply.clone();
            async move { api.patch("r1", &apply, &Patch::Apply(&body)).await.ok() }
        },
    )
    .await;
    api.patch_status(
        "r1",
        &status,
        &Patch::Merge(json!({"status": {"phase": "Pending"}})),
    )
    .await
    .expect("the controller marks the request Pending");
    assert_success(
        &f.decide(Identity::Alice, "r1", "alice@example.com"),
        "alice approves",
    );
    let stamp = decided_by(&f.get("r1").await);
    api.patch("r1", &apply, &Patch::Apply(&body("r1")))
        .await
        .expect("the controller re-applies the request fields after the decision");
    api.patch_status(
        "r1",
        &status,
        &Patch::Merge(json!({"status": {
            "phase": "Approved",
            "decidedAt": "2026-01-01T00:00:00Z",
            "verifiedIdentity": stamp.to_verified_identity(),
        }})),
    )
    .await
    .expect("the controller records the decision in the status");
    let recorded = f.get("r1").await;
    assert_eq!(decided_by(&recorded), stamp);
    let status = recorded.status.unwrap();
    assert_eq!(
        status.verified_identity.unwrap().username,
        "alice@example.com"
    );
    // Admin (system:masters) updates status and releases the finalizer after a decision.
    f.requests
        .patch_status(
            "r1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"observedGeneration": 2}})),
        )
        .await
        .expect("admin updates the status");
    f.requests
        .patch(
            "r1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("admin releases the finalizer");
}

#[tokio::test]
async fn an_agent_run_records_its_creator_and_it_cannot_change() {
    let f = setup("pol-creator").await;
    let run = |name: &str, annotations: &str| {
        format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata:\n  name: {name}\n  namespace: {}\n{annotations}spec:\n  agentRef: {{name: ops}}\n  input: restart the web tier\n",
            f.ns()
        )
    };
    let created_by = |name: &str| {
        let out = f.cp.kubectl(
            Identity::Admin,
            &["-n", f.ns(), "get", "agentrun", name, "-o", "json"],
        );
        assert_success(&out, "get the run");
        let run: Value = serde_json::from_slice(&out.stdout).unwrap();
        run["metadata"]["annotations"][CREATED_BY_ANNOTATION]
            .as_str()
            .map(str::to_owned)
    };
    // Carol writes someone else's name: the API server records hers.
    let lying = run(
        "lying",
        &format!("  annotations:\n    {CREATED_BY_ANNOTATION}: mallory@example.com\n"),
    );
    assert_success(
        &f.cp
            .kubectl_with_stdin(Identity::Carol, &["create", "-f", "-"], Some(&lying)),
        "carol creates a run",
    );
    assert_eq!(created_by("lying").as_deref(), Some("carol@example.com"));
    // A run applied server-side gets the stamp too, and a re-apply keeps it.
    let plain = run("applied", "");
    for attempt in ["first", "second"] {
        assert_success(
            &f.cp.kubectl_with_stdin(
                Identity::Carol,
                &["apply", "--server-side", "-f", "-"],
                Some(&plain),
            ),
            &format!("carol applies a run ({attempt})"),
        );
        assert_eq!(created_by("applied").as_deref(), Some("carol@example.com"));
    }
    // Nobody can change or remove it afterwards, admin included.
    for (identity, change) in [
        (
            Identity::Carol,
            format!("{CREATED_BY_ANNOTATION}=mallory@example.com"),
        ),
        (Identity::Admin, format!("{CREATED_BY_ANNOTATION}=admin")),
        (Identity::Admin, format!("{CREATED_BY_ANNOTATION}-")),
    ] {
        let out = f.cp.kubectl(
            identity,
            &[
                "-n",
                f.ns(),
                "annotate",
                "--overwrite",
                "agentrun",
                "lying",
                &change,
            ],
        );
        assert_refused(
            &out,
            &format!("{identity:?}: {change}"),
            &[CREATED_BY_IMMUTABLE_MESSAGE],
        );
    }
    assert_eq!(created_by("lying").as_deref(), Some("carol@example.com"));
    // Other annotations of the run stay writable.
    let out = f.cp.kubectl(
        Identity::Carol,
        &[
            "-n",
            f.ns(),
            "annotate",
            "agentrun",
            "lying",
            "example.com/ticket=CR-1234",
        ],
    );
    assert_success(&out, "carol annotates her run");
}

/// The stamp is valid JSON for any identity: quotes, backslashes and control characters are
/// escaped. (Admin impersonates such a user; impersonated identities are what admission sees.)
#[tokio::test]
async fn unusual_identities_are_stamped_as_valid_json() {
    let f = setup("pol-escape").await;
    f.pending("r1", None).await;
    let user = "o'brien \"the\" \\ tester\tx";
    let uid = "uid\\\"1";
    let patch = json!({"spec": {"decision": "Approved", "approverId": user, "reason": "ok"}});
    let out = f.cp.kubectl(
        Identity::Admin,
        &[
            "-n",
            f.ns(),
            "--as",
            user,
            "--as-uid",
            uid,
            "--as-group",
            "agentrun:approvers",
            "--as-group",
            "team \"ops\"",
            "patch",
            "apr",
            "r1",
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ],
    );
    assert_success(&out, "an unusual user approves");
    let stamp = decided_by(&f.get("r1").await);
    assert_eq!(stamp.username, user);
    assert_eq!(stamp.uid, uid);
    assert_eq!(
        stamp.groups,
        ["agentrun:approvers", "team \"ops\"", "system:authenticated"]
    );
}

/// Editors and viewers get their rights through the built-in `edit` and `view` roles; approval
/// never comes with them.
#[tokio::test]
async fn the_built_in_roles_aggregate_editing_and_viewing_but_not_approval() {
    let f = setup("pol-aggregate").await;
    let grant = format!(
        r#"
apiVersion: v1
kind: Namespace
metadata: {{name: {ns}-edit}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: carol-edit, namespace: {ns}-edit}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol@example.com}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: carol-admin, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}}
subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol@example.com}}]
"#,
        ns = f.ns()
    );
    assert_success(
        &f.cp
            .kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&grant)),
        "bind edit and admin",
    );
    let edit_ns = format!("{}-edit", f.ns());
    eventually(
        Duration::from_secs(60),
        "edit to include agentrun-editor",
        || async {
            can_i(
                f.cp,
                Identity::Carol,
                &edit_ns,
                "create",
                "agentruns.agentrun.dev",
            )
            .then_some(())
        },
    )
    .await;
    assert!(can_i(
        f.cp,
        Identity::Carol,
        &edit_ns,
        "get",
        "approvalrequests.agentrun.dev"
    ));
    assert!(!can_i(
        f.cp,
        Identity::Carol,
        &edit_ns,
        "patch",
        "approvalrequests.agentrun.dev"
    ));
    // admin includes edit, and still not approval.
    assert!(can_i(
        f.cp,
        Identity::Carol,
        f.ns(),
        "delete",
        "agents.agentrun.dev"
    ));
    assert!(!can_i(
        f.cp,
        Identity::Carol,
        f.ns(),
        "patch",
        "approvalrequests.agentrun.dev"
    ));
    f.pending("r1", None).await;
    let out = f.decide(Identity::Carol, "r1", "carol@example.com");
    assert_refused(
        &out,
        "carol (admin of the namespace) approving",
        &["forbidden"],
    );
    // view includes agentrun-viewer.
    let view = |resource: &'static str| {
        let cp = f.cp;
        async move {
            let out = cp.kubectl(
                Identity::Admin,
                &["get", "clusterrole", "view", "-o", "json"],
            );
            let role: Value = serde_json::from_slice(&out.stdout).ok()?;
            role["rules"]
                .as_array()?
                .iter()
                .any(|r| {
                    r["apiGroups"]
                        .as_array()
                        .is_some_and(|g| g.contains(&json!("agentrun.dev")))
                        && r["resources"]
                            .as_array()
                            .is_some_and(|x| x.contains(&json!(resource)))
                })
                .then_some(())
        }
    };
    for resource in ["agents", "agentruns", "approvalrequests"] {
        eventually(
            Duration::from_secs(60),
            "view to include agentrun-viewer",
            || view(resource),
        )
        .await;
    }
    let installed = f.cp.kubectl(
        Identity::Admin,
        &[
            "get",
            "clusterrole",
            APPROVER_ROLE,
            VIEWER_ROLE,
            "-o",
            "name",
        ],
    );
    assert_success(&installed, "the roles are installed");
    let _ = f.cp.kubectl(
        Identity::Admin,
        &["delete", "namespace", &edit_ns, "--wait=false"],
    );
}
