//! The user ClusterRoles installed beside the CRDs: viewer and editor (aggregated into the
//! built-in `view` and `edit`), approver (granted explicitly).
//!
//! None of them grants a status subresource (`agentruns/status`, `approvalrequests/status`:
//! the controller's, and through the per-run Role the controller builds, the worker's) or
//! create, update or delete of ApprovalRequests (the controller's).

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::super::GROUP;
use super::builders::{part_of, strings};
use super::{APPROVER_ROLE, AUDITOR_ROLE, EDITOR_ROLE, VIEWER_ROLE};

fn rule(resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: strings(&[GROUP]),
        resources: strings(resources),
        verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
        ..Default::default()
    }
}

const READ: &[&str] = &["get", "list", "watch"];

fn cluster_role(name: &str, aggregate_to: Option<&str>, rules: Vec<PolicyRule>) -> ClusterRole {
    let mut labels = part_of();
    if let Some(target) = aggregate_to {
        labels.insert(
            format!("rbac.authorization.k8s.io/aggregate-to-{target}"),
            "true".to_owned(),
        );
    }
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..Default::default()
        },
        rules: Some(rules),
        aggregation_rule: None,
    }
}

/// The ClusterRoles: `agentrun-approver` (not aggregated), `agentrun-editor` (aggregated into
/// `edit`), `agentrun-viewer` (aggregated into `view`) and `agentrun-auditor` (reading the
/// cluster-scoped ApprovalRecords and ApprovalPolicies; bound with a ClusterRoleBinding, not
/// aggregated). Whoever reads runs also reads their offloaded states (RunStateChunks); approvers
/// may read the ApprovalPolicies (when bound with a ClusterRoleBinding) to see why a call needs
/// them. Writing ApprovalPolicies is for cluster admins only: no role here grants it.
pub fn cluster_roles() -> Vec<ClusterRole> {
    vec![
        cluster_role(
            APPROVER_ROLE,
            None,
            vec![
                rule(&["approvalrequests"], &["get", "list", "watch", "patch"]),
                rule(
                    &["agentruns", "agents", "runstatechunks", "approvalpolicies"],
                    READ,
                ),
            ],
        ),
        cluster_role(
            EDITOR_ROLE,
            Some("edit"),
            vec![
                rule(
                    &["agents", "agentruns"],
                    &[
                        "get", "list", "watch", "create", "update", "patch", "delete",
                    ],
                ),
                rule(&["approvalrequests", "runstatechunks"], READ),
            ],
        ),
        cluster_role(
            VIEWER_ROLE,
            Some("view"),
            vec![rule(
                &["agents", "agentruns", "approvalrequests", "runstatechunks"],
                READ,
            )],
        ),
        cluster_role(
            AUDITOR_ROLE,
            None,
            vec![rule(&["approvalrecords", "approvalpolicies"], READ)],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::PART_OF_LABEL;

    fn grants(role: &ClusterRole, resource: &str, verb: &str) -> bool {
        role.rules.as_ref().unwrap().iter().any(|r| {
            r.resources
                .as_ref()
                .unwrap()
                .iter()
                .any(|x| x == resource || x == "*")
                && r.verbs.iter().any(|v| v == verb || v == "*")
        })
    }

    #[test]
    fn roles_grant_what_they_say_and_approval_is_not_aggregated() {
        let roles = cluster_roles();
        let find = |name: &str| {
            roles
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(name))
                .unwrap()
        };
        let approver = find(APPROVER_ROLE);
        assert!(grants(approver, "approvalrequests", "patch"));
        assert!(!grants(approver, "approvalrequests", "create"));
        assert!(!grants(approver, "agentruns", "patch"));
        let editor = find(EDITOR_ROLE);
        assert!(grants(editor, "agentruns", "create"));
        assert!(grants(editor, "agents", "delete"));
        assert!(grants(editor, "approvalrequests", "get"));
        assert!(!grants(editor, "approvalrequests", "patch"));
        assert!(!grants(editor, "approvalrequests", "update"));
        let viewer = find(VIEWER_ROLE);
        for resource in ["agents", "agentruns", "approvalrequests"] {
            assert!(grants(viewer, resource, "watch"));
            assert!(!grants(viewer, resource, "patch"));
        }
        let labels = |role: &ClusterRole| role.metadata.labels.clone().unwrap();
        assert!(!labels(approver).keys().any(|k| k.contains("aggregate-to")));
        assert_eq!(
            labels(editor)["rbac.authorization.k8s.io/aggregate-to-edit"],
            "true"
        );
        assert_eq!(
            labels(viewer)["rbac.authorization.k8s.io/aggregate-to-view"],
            "true"
        );
        for role in &roles {
            assert_eq!(labels(role)[PART_OF_LABEL.0], PART_OF_LABEL.1);
        }
    }

    /// The controller's writes stay the controller's: no user role, aggregated or not, grants a
    /// status subresource or creates, replaces or deletes ApprovalRequests.
    #[test]
    fn no_user_role_grants_status_or_request_lifecycle() {
        for role in cluster_roles() {
            let name = role.metadata.name.clone().unwrap();
            for rule in role.rules.as_ref().unwrap() {
                assert_eq!(rule.api_groups.as_deref(), Some(&[GROUP.to_owned()][..]));
                for resource in rule.resources.as_ref().unwrap() {
                    assert!(
                        !resource.contains('/') && resource != "*",
                        "{name} grants {resource}"
                    );
                }
                assert!(!rule.verbs.iter().any(|v| v == "*"), "{name}");
            }
            for verb in ["create", "update", "delete", "deletecollection"] {
                assert!(
                    !grants(&role, "approvalrequests", verb),
                    "{name} grants {verb} on approvalrequests"
                );
            }
        }
    }
}
