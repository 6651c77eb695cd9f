//! GitOps decisions are marked for what they are (issue 12, item 7, API side): the GitOps
//! identity may record as approver only the people on the admin's allow-list (compared
//! normalised), and the policy as generated (no one listed) refuses its decisions. Separation of
//! duties applies to it as to anyone (`the_run_creator_cannot_decide_its_own_requests`,
//! `identities_are_compared_trimmed_and_lowercased`).

use std::time::Duration;

use agentrun::crd::Decision;
use agentrun::crd::policy::{
    GITOPS_ALLOW_LIST_VARIABLE, GITOPS_APPROVERS_POLICY, GITOPS_EMPTY_ALLOW_LIST_MESSAGE,
    GITOPS_NOT_ALLOWED_MESSAGE, admission_policies,
};
use serde_json::json;

use super::{Fixture, assert_refused, assert_success, decided_by, eventually, setup, stderr};
use agentrun_testkit::cluster::{ControlPlane, Identity};

const COMMIT: &str = "9fceb02d0ae598e95dc970b74767f19372d61af8";

#[tokio::test]
async fn gitops_records_only_approvers_on_the_allow_list() {
    let f = setup("pol-gitops-list").await;
    f.pending("r1", Some("carol@example.com")).await;
    let out = f.apply(
        Identity::Gitops,
        &f.gitops_manifest("r1", "dave@example.com", Some(COMMIT)),
    );
    assert_refused(
        &out,
        "GitOps recording dave, who is not on the list",
        &[
            GITOPS_APPROVERS_POLICY,
            "approverId dave@example.com",
            GITOPS_NOT_ALLOWED_MESSAGE,
            GITOPS_ALLOW_LIST_VARIABLE,
        ],
    );
    assert_eq!(f.get("r1").await.spec.decision, None);
    // The list says " Bob@Example.com ": bob is on it.
    assert_success(
        &f.apply(
            Identity::Gitops,
            &f.gitops_manifest("r1", "bob@example.com", Some(COMMIT)),
        ),
        "GitOps recording bob",
    );
    let decided = f.get("r1").await;
    assert_eq!(decided.spec.decision, Some(Decision::Approved));
    assert_eq!(decided.spec.approver_id.as_deref(), Some("bob@example.com"));
    assert_eq!(decided_by(&decided).username, "gitops");
}

/// A copy of the generated `agentrun-gitops-approvers` policy exactly as generated (its list
/// empty), named after the test and bound in its namespace only; removed when dropped.
struct GeneratedCopy<'a> {
    cp: &'a ControlPlane,
    name: String,
}

impl<'a> GeneratedCopy<'a> {
    fn install(f: &'a Fixture) -> GeneratedCopy<'a> {
        let (mut policy, mut binding) = admission_policies()
            .validating
            .into_iter()
            .find(|(p, _)| p.metadata.name.as_deref() == Some(GITOPS_APPROVERS_POLICY))
            .expect("the generated GitOps policy");
        let name = format!("{GITOPS_APPROVERS_POLICY}-{}", f.ns());
        policy.metadata.name = Some(name.clone());
        binding.metadata.name = Some(name.clone());
        binding.spec.policy_name = name.clone();
        let mut binding = serde_json::to_value(&binding).expect("the binding as JSON");
        binding["spec"]["matchResources"] =
            json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f.ns()}}});
        for object in [serde_json::to_value(&policy).expect("JSON"), binding] {
            f.admin_apply(&object.to_string(), "the generated policy's copy");
        }
        GeneratedCopy { cp: f.cp, name }
    }
}

impl Drop for GeneratedCopy<'_> {
    fn drop(&mut self) {
        for kind in [
            "validatingadmissionpolicybinding",
            "validatingadmissionpolicy",
        ] {
            let _ = self.cp.kubectl(
                Identity::Admin,
                &["delete", kind, &self.name, "--ignore-not-found"],
            );
        }
    }
}

#[tokio::test]
async fn the_generated_allow_list_is_empty_and_refuses_gitops_decisions() {
    let f = setup("pol-gitops-empty").await;
    f.pending("r1", Some("carol@example.com")).await;
    f.pending("r2", Some("carol@example.com")).await;
    let manifest = f.gitops_manifest("r1", "alice@example.com", Some(COMMIT));
    let copy = GeneratedCopy::install(&f);
    // A new policy takes effect a moment after it is created: wait until a server-side dry run
    // is refused by it.
    eventually(
        Duration::from_secs(60),
        "the copy to take effect",
        || async {
            let out = f.cp.kubectl_with_stdin(
                Identity::Gitops,
                &[
                    "apply",
                    "--server-side",
                    "--field-manager",
                    "gitops-sync",
                    "--dry-run=server",
                    "-f",
                    "-",
                ],
                Some(&manifest),
            );
            (!out.status.success() && stderr(&out).contains(&format!("'{}'", copy.name)))
                .then_some(())
        },
    )
    .await;
    assert_refused(
        &f.apply(Identity::Gitops, &manifest),
        "GitOps deciding while the allow-list is empty",
        &[
            &copy.name,
            GITOPS_EMPTY_ALLOW_LIST_MESSAGE,
            GITOPS_ALLOW_LIST_VARIABLE,
        ],
    );
    assert_eq!(f.get("r1").await.spec.decision, None);
    // It concerns the GitOps group only: alice decides as usual.
    assert_success(
        &f.decide(Identity::Alice, "r2", "alice@example.com"),
        "alice deciding beside the empty list",
    );
    // Without the copy, the admin's list (which names alice) lets the decision through.
    drop(copy);
    eventually(Duration::from_secs(60), "the copy to go", || async {
        f.apply(Identity::Gitops, &manifest)
            .status
            .success()
            .then_some(())
    })
    .await;
    assert_eq!(f.get("r1").await.spec.decision, Some(Decision::Approved));
}
