//! Identities are compared normalised (issue 12, items 4 and 6): surrounding whitespace trimmed
//! and ASCII letters lowercased, so that a username differing from the run creator's only by
//! case or spaces is still the creator, for a person deciding and for a GitOps claim alike.
//!
//! `approverId` itself must be the decider's exact username: "ALICE@example.com " written by
//! alice is refused rather than accepted as alice, so the record never holds two spellings of one
//! person and the controller compares it with the stamp exactly.

use serde_json::json;

use super::{ALICE_NOT_BOB, assert_refused, assert_success, decided_by, setup};
use agentrun_testkit::cluster::Identity;

const COMMIT: &str = "9fceb02d0ae598e95dc970b74767f19372d61af8";

#[tokio::test]
async fn identities_are_compared_trimmed_and_lowercased() {
    let f = setup("pol-normalise").await;

    // An approver whose username differs from the creator's only by case is the creator.
    f.pending("case", Some("carol@example.com")).await;
    let decision = json!({"spec": {"decision": "Approved", "approverId": "Carol@Example.com", "reason": "ok"}});
    let out = f.kubectl_as(
        Identity::Admin,
        "Carol@Example.com",
        &[
            "--as-group",
            "agentrun:approvers",
            "patch",
            "apr",
            "case",
            "--type=merge",
            "-p",
            &decision.to_string(),
        ],
    );
    assert_refused(
        &out,
        "Carol@Example.com deciding carol's run",
        &["separation of duties: carol@example.com created this run"],
    );

    // ... and so is one whose recorded creator differs only by case and surrounding spaces.
    f.pending("space", Some(" Alice@Example.com ")).await;
    assert_refused(
        &f.decide(Identity::Alice, "space", "alice@example.com"),
        "alice deciding the run of \" Alice@Example.com \"",
        &["separation of duties:  Alice@Example.com  created this run"],
    );

    // A GitOps claim cannot name the creator under another spelling either (carol is on the
    // allow-list: the claim is refused for separation of duties alone).
    f.pending("gitops", Some("carol@example.com")).await;
    let manifest = f.gitops_manifest("gitops", "\"CAROL@example.com \"", Some(COMMIT));
    assert_refused(
        &f.apply(Identity::Gitops, &manifest),
        "GitOps recording \"CAROL@example.com \" on carol's run",
        &["separation of duties: carol@example.com created this run"],
    );

    // approverId is the exact username: another spelling of alice's own name is refused.
    f.pending("spelling", None).await;
    assert_refused(
        &f.decide(Identity::Alice, "spelling", "ALICE@example.com "),
        "alice writing her name in capitals",
        &[ALICE_NOT_BOB],
    );
    assert_success(
        &f.decide(Identity::Alice, "spelling", "alice@example.com"),
        "alice writing her name as it is",
    );

    // Different people stay different: bob decides carol's and alice's runs.
    for name in ["case", "space"] {
        assert_success(
            &f.decide(Identity::Bob, name, "bob@example.com"),
            &format!("bob deciding {name}"),
        );
        assert_eq!(decided_by(&f.get(name).await).username, "bob@example.com");
    }
    assert_eq!(f.get("gitops").await.spec.decision, None);
}
