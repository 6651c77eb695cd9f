//! The validating policies on decisions: who may decide an ApprovalRequest and in whose name,
//! separation of duties, and the GitOps approver allow-list.

use k8s_openapi::api::admissionregistration::v1::Variable;

use super::builders::{
    Message, Validating, match_condition, match_resources, validating, validation, variable,
    with_match_conditions,
};
use super::cel::{decided_by_stamp_expression, entry_unchanged, in_gitops_group, normalized};
use super::{
    APPROVAL_IDENTITY_POLICY, APPROVER_IDENTITY_MESSAGE, DECIDED_BY_ANNOTATION, DECIDED_BY_MESSAGE,
    FROZEN_ANNOTATIONS_MESSAGE, GITOPS_ALLOW_LIST_VARIABLE, GITOPS_APPROVERS_POLICY,
    GITOPS_COMMIT_ANNOTATION, GITOPS_EMPTY_ALLOW_LIST_MESSAGE, GITOPS_GROUP,
    GITOPS_NOT_ALLOWED_MESSAGE, NOT_AN_APPROVER_MESSAGE, OWN_VOTE_MESSAGE,
    SEPARATION_OF_DUTIES_MESSAGE, VOTE_STAMP_MESSAGE, annotations_variables,
};

/// The variable both decision policies use: whether this request sets a decision.
fn decision_is_new() -> Variable {
    variable(
        "decisionIsNew",
        "has(object.spec.decision) && (oldObject == null || !has(oldObject.spec.decision))",
    )
}

/// `agentrun-approval-identity`: who may decide an ApprovalRequest (or vote on one that needs
/// several approvals: only your own vote, stamped, once), separation of duties (on normalised
/// identities), the request's approvers restriction, and the decision annotations' integrity.
pub fn approval_identity() -> Validating {
    let [annotations, old_annotations] = annotations_variables();
    let variables = vec![
        decision_is_new(),
        variable(
            "wasDecided",
            "oldObject != null && has(oldObject.spec.decision)",
        ),
        variable(
            "approver",
            "has(object.spec.approverId) ? object.spec.approverId : ''",
        ),
        variable(
            "runCreator",
            "has(object.spec.runCreator) ? object.spec.runCreator : ''",
        ),
        variable("requesterKey", normalized("request.userInfo.username")),
        variable("approverKey", normalized("variables.approver")),
        variable("runCreatorKey", normalized("variables.runCreator")),
        variable("gitops", in_gitops_group()),
        annotations,
        old_annotations,
        variable(
            "gitopsCommit",
            format!(
                "'{GITOPS_COMMIT_ANNOTATION}' in variables.annotations ? variables.annotations['{GITOPS_COMMIT_ANNOTATION}'].trim() : ''"
            ),
        ),
        variable("stamp", decided_by_stamp_expression()),
        variable("votes", "has(object.spec.votes) ? object.spec.votes : {}"),
        variable(
            "oldVotes",
            "oldObject != null && has(oldObject.spec.votes) ? oldObject.spec.votes : {}",
        ),
        variable(
            "newVoters",
            "variables.votes.filter(k, !(k in variables.oldVotes))",
        ),
        // The request's approvers restriction (from the ApprovalPolicy rule), for the requester
        // and, by name only, for the approver a GitOps decision names.
        variable(
            "requesterPermitted",
            "!has(object.spec.approvers) || object.spec.approvers.users.exists(u, u.trim().lowerAscii() == variables.requesterKey) || (has(request.userInfo.groups) && object.spec.approvers.groups.exists(g, g in request.userInfo.groups))",
        ),
        variable(
            "approverListed",
            "!has(object.spec.approvers) || object.spec.approvers.users.exists(u, u.trim().lowerAscii() == variables.approverKey)",
        ),
    ];
    let validations = vec![
        // approverId is the requester's exact username: a differently spelled own name is
        // refused too, so that the record never holds two spellings of one person.
        validation(
            "!variables.decisionIsNew || variables.approver == request.userInfo.username || (variables.gitops && variables.gitopsCommit != '')",
            Message::Expression(format!(
                "'{APPROVER_IDENTITY_MESSAGE} (' + request.userInfo.username + '); only members of {GITOPS_GROUP} may record another approver, with the {GITOPS_COMMIT_ANNOTATION} annotation naming the commit'"
            )),
        ),
        validation(
            "!variables.decisionIsNew || variables.runCreator == '' || (variables.runCreatorKey != variables.requesterKey && variables.runCreatorKey != variables.approverKey)",
            Message::Expression(format!(
                "'{SEPARATION_OF_DUTIES_MESSAGE}: ' + variables.runCreator + ' created this run and cannot decide its own requests (identities are compared trimmed and lowercased)'"
            )),
        ),
        validation(
            "!variables.decisionIsNew || (variables.approver == request.userInfo.username ? variables.requesterPermitted : variables.approverListed)",
            Message::Expression(format!(
                "'{NOT_AN_APPROVER_MESSAGE} (spec.approvers): ' + (variables.approver == request.userInfo.username ? request.userInfo.username + ' is neither listed nor in a listed group' : variables.approver + ' is not listed by name')"
            )),
        ),
        validation(
            "size(variables.newVoters) == 0 || (size(variables.newVoters) == 1 && variables.newVoters[0] == request.userInfo.username)",
            Message::Expression(format!(
                "'{OWN_VOTE_MESSAGE} (' + request.userInfo.username + ')'"
            )),
        ),
        validation(
            "size(variables.newVoters) == 0 || !(request.userInfo.username in variables.newVoters) || (has(variables.votes[request.userInfo.username].decidedBy) && variables.votes[request.userInfo.username].decidedBy == variables.stamp)",
            Message::Fixed(VOTE_STAMP_MESSAGE),
        ),
        validation(
            "size(variables.newVoters) == 0 || variables.runCreator == '' || variables.runCreatorKey != variables.requesterKey",
            Message::Expression(format!(
                "'{SEPARATION_OF_DUTIES_MESSAGE}: ' + variables.runCreator + ' created this run and cannot vote on its own requests (identities are compared trimmed and lowercased)'"
            )),
        ),
        validation(
            "size(variables.newVoters) == 0 || variables.requesterPermitted",
            Message::Expression(format!(
                "'{NOT_AN_APPROVER_MESSAGE} (spec.approvers): ' + request.userInfo.username + ' is neither listed nor in a listed group'"
            )),
        ),
        validation(
            "!variables.decisionIsNew || !has(object.status) || !has(object.status.phase) || !(object.status.phase in ['Expired', 'Superseded'])",
            Message::Expression(
                "'this request is ' + object.status.phase + ': it can no longer be decided'"
                    .to_owned(),
            ),
        ),
        validation(
            format!(
                "!variables.wasDecided || ({} && {})",
                entry_unchanged(
                    "variables.annotations",
                    "variables.oldAnnotations",
                    DECIDED_BY_ANNOTATION
                ),
                entry_unchanged(
                    "variables.annotations",
                    "variables.oldAnnotations",
                    GITOPS_COMMIT_ANNOTATION
                )
            ),
            Message::Fixed(FROZEN_ANNOTATIONS_MESSAGE),
        ),
        validation(
            format!(
                "!('{DECIDED_BY_ANNOTATION}' in variables.annotations) || (has(object.spec.decision) && (!variables.decisionIsNew || variables.annotations['{DECIDED_BY_ANNOTATION}'] == variables.stamp))"
            ),
            Message::Fixed(DECIDED_BY_MESSAGE),
        ),
    ];
    validating(
        APPROVAL_IDENTITY_POLICY,
        match_resources(&["approvalrequests"], &["CREATE", "UPDATE"]),
        variables,
        validations,
    )
}

/// `agentrun-gitops-approvers`: a decision by a member of [`GITOPS_GROUP`] may name as approver
/// only someone on the admin's allow-list, the CEL list literal in the policy's first variable,
/// [`GITOPS_ALLOW_LIST_VARIABLE`] (empty as generated: GitOps decisions are refused until an admin
/// lists someone; the Helm chart writes its value there). Entries and `approverId` are compared
/// normalised.
///
/// The list lives in the policy rather than in a ConfigMap parameter (`paramKind`) for two reasons
/// found on Kubernetes 1.36: the API server resolves a binding's parameter before it evaluates
/// `matchConditions`, so with `parameterNotFoundAction: Deny` a missing ConfigMap refuses every
/// write to ApprovalRequests (the controller's too), not only the GitOps group's; and the API
/// server's informer for a built-in `paramKind` stops for good once no binding names that kind
/// (kubernetes/kubernetes#130887): later edits of the list are silently not enforced, and a
/// recreated ConfigMap is never found. A list in the policy is only ever what the API server
/// enforces, and only those who may change admission policies (cluster admins) can change it.
pub fn gitops_approvers() -> Validating {
    gitops_approvers_with(&[])
}

/// [`gitops_approvers`] with `approvers` on the allow-list.
pub fn gitops_approvers_with(approvers: &[&str]) -> Validating {
    let variables = vec![
        variable(GITOPS_ALLOW_LIST_VARIABLE, gitops_allow_list(approvers)),
        decision_is_new(),
        variable(
            "approver",
            normalized("has(object.spec.approverId) ? object.spec.approverId : ''"),
        ),
        variable(
            "allowed",
            format!(
                "variables.{GITOPS_ALLOW_LIST_VARIABLE}.map(a, {}).filter(a, a != '')",
                normalized("a")
            ),
        ),
    ];
    let validations = vec![
        validation(
            "!variables.decisionIsNew || size(variables.allowed) > 0",
            Message::Expression(format!(
                "'{GITOPS_EMPTY_ALLOW_LIST_MESSAGE} (variable {GITOPS_ALLOW_LIST_VARIABLE} of this policy): a cluster admin lists there whom {GITOPS_GROUP} may record as approver'"
            )),
        ),
        validation(
            "!variables.decisionIsNew || variables.approver in variables.allowed",
            Message::Expression(format!(
                "'approverId ' + object.spec.approverId + ' {GITOPS_NOT_ALLOWED_MESSAGE} (variable {GITOPS_ALLOW_LIST_VARIABLE} of this policy): members of {GITOPS_GROUP} may record only the approvers a cluster admin lists there'"
            )),
        ),
    ];
    with_match_conditions(
        validating(
            GITOPS_APPROVERS_POLICY,
            match_resources(&["approvalrequests"], &["CREATE", "UPDATE"]),
            variables,
            validations,
        ),
        vec![match_condition("from-the-gitops-group", in_gitops_group())],
    )
}

/// The CEL list literal of the allow-list `approvers` (JSON string literals are CEL string
/// literals), for [`GITOPS_ALLOW_LIST_VARIABLE`]. Entries are kept as given: the policy
/// normalises them when it compares.
pub fn gitops_allow_list(approvers: &[&str]) -> String {
    serde_json::to_string(approvers).unwrap_or_else(|_| "[]".to_owned())
}
