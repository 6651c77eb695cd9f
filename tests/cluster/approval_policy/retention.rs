//! The record cannot be detached or released by approvers or editors (issue 12, item 8, API
//! side): an ApprovalRequest's finalizers, ownerReferences and run label, and an AgentRun's
//! `agentrun.dev/cleanup` finalizer, change only by a controller identity (Kubernetes' garbage
//! collector may still orphan a request).

use std::process::Output;
use std::time::Duration;

use agentrun::crd::policy::{
    APPROVER_ROLE, REQUEST_FINALIZERS_MESSAGE, REQUEST_OWNERS_MESSAGE, REQUEST_RUN_LABEL_MESSAGE,
    RUN_CLEANUP_MESSAGE,
};
use serde_json::{Value, json};

use super::{Fixture, assert_refused, assert_success, can_i, eventually, setup};
use agentrun_testkit::cluster::Identity;

const KEEP: &str = "agentrun.dev/keep-with-run";
const CLEANUP: &str = "agentrun.dev/cleanup";
const GARBAGE_COLLECTOR: &str = "system:serviceaccount:kube-system:generic-garbage-collector";

impl Fixture {
    /// `kubectl patch KIND NAME --type TYPE -p PATCH` by `identity`, acting as `user` if given.
    fn patch_as(
        &self,
        identity: Identity,
        user: Option<&str>,
        target: (&str, &str),
        kind: &str,
        patch: &Value,
    ) -> Output {
        let patch = patch.to_string();
        let args = [
            "patch",
            target.0,
            target.1,
            "--type",
            kind,
            "-p",
            patch.as_str(),
        ];
        match user {
            Some(user) => self.kubectl_as(identity, user, &args),
            None => {
                let mut all = vec!["-n", self.ns()];
                all.extend_from_slice(&args);
                self.cp.kubectl(identity, &all)
            }
        }
    }
}

#[tokio::test]
async fn the_record_cannot_be_released_by_approvers_or_editors() {
    let f = setup("pol-retention").await;
    f.bind_edit().await;
    // The run and its request as the controller makes them.
    f.admin_apply(
        &format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {{name: r1, namespace: {}, finalizers: [{CLEANUP}]}}\nspec: {{agentRef: {{name: ops}}, input: delete user u-1}}\n",
            f.ns()
        ),
        "the run",
    );
    let uid = f.get_json("agentrun", "r1")["metadata"]["uid"].clone();
    let owner = json!({"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun", "name": "r1",
                       "uid": uid, "controller": true, "blockOwnerDeletion": true});
    f.pending("rec", Some("carol@example.com")).await;
    let out = f.patch_as(
        Identity::Admin,
        None,
        ("apr", "rec"),
        "merge",
        &json!({"metadata": {"finalizers": [KEEP], "ownerReferences": [owner], "labels": {"agentrun.dev/run": "r1"}}}),
    );
    assert_success(&out, "the controller ties the request to its run");
    let record = f.get_json("apr", "rec")["metadata"].clone();

    // A namespace ServiceAccount an admin made an approver (e.g. for CI): every editor can act
    // as it.
    f.admin_apply(
        &format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: ci, namespace: {ns}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: ci-approver, namespace: {ns}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {APPROVER_ROLE}}}\nsubjects: [{{kind: ServiceAccount, name: ci, namespace: {ns}}}]\n",
            ns = f.ns()
        ),
        "the ci ServiceAccount",
    );
    let ci = format!("system:serviceaccount:{}:ci", f.ns());
    eventually(Duration::from_secs(30), "ci's approver rights", || async {
        let out = f.kubectl_as(
            Identity::Carol,
            &ci,
            &["auth", "can-i", "patch", "approvalrequests.agentrun.dev"],
        );
        (String::from_utf8_lossy(&out.stdout).trim() == "yes").then_some(())
    })
    .await;

    let attacks = [
        (
            "removing the finalizer",
            "merge",
            json!({"metadata": {"finalizers": null}}),
            REQUEST_FINALIZERS_MESSAGE,
        ),
        (
            "adding a finalizer",
            "merge",
            json!({"metadata": {"finalizers": [KEEP, "example.com/hold"]}}),
            REQUEST_FINALIZERS_MESSAGE,
        ),
        (
            "removing the ownerReferences",
            "merge",
            json!({"metadata": {"ownerReferences": null}}),
            REQUEST_OWNERS_MESSAGE,
        ),
        (
            "pointing the owner elsewhere",
            "json",
            json!([{"op": "replace", "path": "/metadata/ownerReferences/0/uid", "value": "00000000-0000-0000-0000-000000000000"}]),
            REQUEST_OWNERS_MESSAGE,
        ),
        (
            "moving the request to another run",
            "merge",
            json!({"metadata": {"labels": {"agentrun.dev/run": "r9"}}}),
            REQUEST_RUN_LABEL_MESSAGE,
        ),
        (
            "removing the run label",
            "merge",
            json!({"metadata": {"labels": {"agentrun.dev/run": null}}}),
            REQUEST_RUN_LABEL_MESSAGE,
        ),
    ];
    for (what, kind, patch, message) in &attacks {
        for (identity, user, who) in [
            (Identity::Alice, None, "alice (approver)"),
            (Identity::Bob, None, "bob (approver and editor)"),
            (
                Identity::Carol,
                Some(ci.as_str()),
                "carol as the ci ServiceAccount",
            ),
        ] {
            let out = f.patch_as(identity, user, ("apr", "rec"), kind, patch);
            assert_refused(&out, &format!("{who} {what}"), &[message]);
        }
    }
    // carol as herself has no write access to requests at all.
    let out = f.patch_as(
        Identity::Carol,
        None,
        ("apr", "rec"),
        "merge",
        &json!({"metadata": {"finalizers": null}}),
    );
    assert_refused(
        &out,
        "carol removing the finalizer",
        &["forbidden", "cannot patch resource \"approvalrequests\""],
    );
    // The garbage collector may orphan the request, and nothing else.
    let out = f.patch_as(
        Identity::Admin,
        Some(GARBAGE_COLLECTOR),
        ("apr", "rec"),
        "merge",
        &json!({"metadata": {"finalizers": null}}),
    );
    assert_refused(
        &out,
        "the garbage collector removing the finalizer",
        &[REQUEST_FINALIZERS_MESSAGE],
    );
    assert_eq!(
        f.get_json("apr", "rec")["metadata"]["finalizers"],
        record["finalizers"]
    );
    assert_eq!(
        f.get_json("apr", "rec")["metadata"]["ownerReferences"],
        record["ownerReferences"]
    );
    assert_eq!(
        f.get_json("apr", "rec")["metadata"]["labels"],
        record["labels"]
    );
    // Other metadata stays the approvers' to annotate.
    assert_success(
        &f.annotate(Identity::Alice, "rec", "example.com/ticket=CR-1234"),
        "alice annotates",
    );

    // The run's cleanup finalizer: editors cannot remove it, before or after deleting the run.
    for (identity, user, who) in [
        (Identity::Carol, None, "carol (editor)"),
        (
            Identity::Carol,
            Some("system:serviceaccount:NS:r1-worker"),
            "carol as a ServiceAccount",
        ),
    ] {
        let user = user.map(|u| u.replace("NS", f.ns()));
        if let Some(user) = &user {
            f.admin(&["create", "serviceaccount", user.rsplit(':').next().unwrap()]);
            f.admin(&[
                "create",
                "rolebinding",
                "sa-edit",
                "--clusterrole=edit",
                &format!("--serviceaccount={}:r1-worker", f.ns()),
            ]);
            let user = user.clone();
            eventually(
                Duration::from_secs(30),
                "the ServiceAccount's rights",
                || async {
                    let out = f.kubectl_as(
                        Identity::Carol,
                        &user,
                        &["auth", "can-i", "patch", "agentruns.agentrun.dev"],
                    );
                    (String::from_utf8_lossy(&out.stdout).trim() == "yes").then_some(())
                },
            )
            .await;
        }
        let out = f.patch_as(
            identity,
            user.as_deref(),
            ("agentrun", "r1"),
            "merge",
            &json!({"metadata": {"finalizers": null}}),
        );
        assert_refused(
            &out,
            &format!("{who} removing the run's cleanup finalizer"),
            &[RUN_CLEANUP_MESSAGE],
        );
    }
    // Finalizers that are not agentrun's stay the editors' own.
    for finalizers in [json!([CLEANUP, "example.com/hold"]), json!([CLEANUP])] {
        let out = f.patch_as(
            Identity::Carol,
            None,
            ("agentrun", "r1"),
            "merge",
            &json!({"metadata": {"finalizers": finalizers}}),
        );
        assert_success(&out, "carol changing her own finalizer");
    }
    assert!(can_i(
        f.cp,
        Identity::Bob,
        f.ns(),
        "delete",
        "agentruns.agentrun.dev"
    ));
    assert_success(
        &f.cp.kubectl(
            Identity::Bob,
            &["-n", f.ns(), "delete", "agentrun", "r1", "--wait=false"],
        ),
        "bob deletes the run",
    );
    let out = f.patch_as(
        Identity::Bob,
        None,
        ("agentrun", "r1"),
        "json",
        &json!([{"op": "remove", "path": "/metadata/finalizers/0"}]),
    );
    assert_refused(
        &out,
        "bob releasing the deleted run",
        &[RUN_CLEANUP_MESSAGE],
    );
    let run = f.get_json("agentrun", "r1");
    assert!(!run["metadata"]["deletionTimestamp"].is_null());
    assert_eq!(run["metadata"]["finalizers"], json!([CLEANUP]));
    assert_eq!(
        f.get_json("apr", "rec")["metadata"]["finalizers"],
        json!([KEEP])
    );

    // The garbage collector orphaning the request (owner deleted with --cascade=orphan).
    let out = f.patch_as(
        Identity::Admin,
        Some(GARBAGE_COLLECTOR),
        ("apr", "rec"),
        "merge",
        &json!({"metadata": {"ownerReferences": null}}),
    );
    assert_success(&out, "the garbage collector orphans the request");
    // The controller identity releases the records.
    let out = f.patch_as(
        Identity::Admin,
        None,
        ("apr", "rec"),
        "merge",
        &json!({"metadata": {"finalizers": null, "ownerReferences": [owner]}}),
    );
    assert_success(&out, "admin releases the request");
    let out = f.patch_as(
        Identity::Admin,
        None,
        ("agentrun", "r1"),
        "merge",
        &json!({"metadata": {"finalizers": null}}),
    );
    assert_success(&out, "admin releases the run");
}
