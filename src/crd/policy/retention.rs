//! The validating policy keeping the decision record attached to its run: only controller
//! identities touch what ties an ApprovalRequest to its run and what keeps it alive.

use super::super::keys::finalizers::RUN_CLEANUP;
use super::super::keys::labels::RUN;
use super::builders::{
    Message, Validating, match_condition, match_resources, validating, validation, variable,
    with_match_conditions,
};
use super::cel::{controller_identity, entry_unchanged, string_list};
use super::{
    GARBAGE_COLLECTOR_USERNAMES, KUBERNETES_FINALIZERS, RECORD_RETENTION_POLICY,
    REQUEST_FINALIZERS_MESSAGE, REQUEST_OWNERS_MESSAGE, REQUEST_RUN_LABEL_MESSAGE,
    RUN_CLEANUP_MESSAGE,
};

/// `agentrun-record-retention`, on UPDATE of ApprovalRequests and AgentRuns by anyone who is not
/// a controller identity:
///
/// - an ApprovalRequest's finalizers are unchanged (Kubernetes' own `orphan` and
///   `foregroundDeletion`, which the garbage collector removes, aside);
/// - its ownerReferences are unchanged, except that Kubernetes' garbage collector may remove
///   some (it orphans dependents when their owner is deleted with `--cascade=orphan`);
/// - its [`RUN`] label is unchanged;
/// - an AgentRun keeps its [`RUN_CLEANUP`] finalizer.
pub fn record_retention() -> Validating {
    let kubernetes_finalizers = string_list(&KUBERNETES_FINALIZERS);
    let variables = vec![
        variable(
            "isRequest",
            "request.resource.resource == 'approvalrequests'",
        ),
        variable(
            "finalizers",
            "has(object.metadata.finalizers) ? object.metadata.finalizers : []",
        ),
        variable(
            "oldFinalizers",
            "has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : []",
        ),
        variable(
            "owners",
            "has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []",
        ),
        variable(
            "oldOwners",
            "has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : []",
        ),
        variable(
            "labels",
            "has(object.metadata.labels) ? object.metadata.labels : {}",
        ),
        variable(
            "oldLabels",
            "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}",
        ),
        variable(
            "garbageCollector",
            format!(
                "request.userInfo.username in {}",
                string_list(&GARBAGE_COLLECTOR_USERNAMES)
            ),
        ),
    ];
    let validations = vec![
        validation(
            format!(
                "!variables.isRequest || variables.finalizers.filter(f, !(f in {kubernetes_finalizers})) == variables.oldFinalizers.filter(f, !(f in {kubernetes_finalizers}))"
            ),
            Message::Fixed(REQUEST_FINALIZERS_MESSAGE),
        ),
        validation(
            "!variables.isRequest || variables.owners == variables.oldOwners || (variables.garbageCollector && variables.owners.all(o, o in variables.oldOwners))",
            Message::Fixed(REQUEST_OWNERS_MESSAGE),
        ),
        validation(
            format!(
                "!variables.isRequest || {}",
                entry_unchanged("variables.labels", "variables.oldLabels", RUN)
            ),
            Message::Fixed(REQUEST_RUN_LABEL_MESSAGE),
        ),
        validation(
            format!(
                "variables.isRequest || !('{RUN_CLEANUP}' in variables.oldFinalizers) || '{RUN_CLEANUP}' in variables.finalizers"
            ),
            Message::Fixed(RUN_CLEANUP_MESSAGE),
        ),
    ];
    with_match_conditions(
        validating(
            RECORD_RETENTION_POLICY,
            match_resources(&["approvalrequests", "agentruns"], &["UPDATE"]),
            variables,
            validations,
        ),
        vec![match_condition(
            "not-a-controller-identity",
            format!("!({})", controller_identity()),
        )],
    )
}
