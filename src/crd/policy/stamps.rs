//! The mutating policies: the API server stamps who created a run and who decided a request.

use k8s_openapi::api::admissionregistration::v1::{JSONPatch, Mutation};

use super::builders::{Mutating, match_condition, match_resources, mutating, variable};
use super::cel::decided_by_stamp_expression;
use super::{
    CREATED_BY_ANNOTATION, DECIDED_BY_ANNOTATION, STAMP_CREATOR_POLICY, STAMP_DECIDER_POLICY,
};

/// A JSON patch setting one annotation to the CEL string `value`, whether or not the object has
/// annotations, when the CEL condition `when` holds (otherwise no change). (A JSON patch rather
/// than an apply configuration: an apply configuration first converts the object to its schema's
/// type, so a malformed object would get a conversion error from the policy instead of the
/// schema's clear message.)
fn set_annotation(key: &str, value: &str, when: &str) -> Mutation {
    let pointer = key.replace('~', "~0").replace('/', "~1");
    json_patch(format!(
        "!({when}) ? [] : has(object.metadata.annotations) ? [JSONPatch{{op: 'add', path: '/metadata/annotations/{pointer}', value: {value}}}] : [JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{'{key}': {value}}}}}]"
    ))
}

fn json_patch(expression: String) -> Mutation {
    Mutation {
        patch_type: "JSONPatch".to_owned(),
        apply_configuration: None,
        json_patch: Some(JSONPatch {
            expression: Some(expression),
        }),
    }
}

/// `agentrun-stamp-creator`: the creator's exact username into [`CREATED_BY_ANNOTATION`] at
/// CREATE.
pub fn stamp_creator() -> Mutating {
    mutating(
        STAMP_CREATOR_POLICY,
        match_resources(&["agentruns"], &["CREATE"]),
        None,
        None,
        vec![set_annotation(
            CREATED_BY_ANNOTATION,
            "request.userInfo.username",
            "true",
        )],
    )
}

/// `agentrun-stamp-decider`: the decider's identity into [`DECIDED_BY_ANNOTATION`] when a
/// decision is set (CREATE with a decision, or UPDATE adding one), and into the `decidedBy` of the
/// requester's own vote when they add it (`spec.votes[<username>]`).
pub fn stamp_decider() -> Mutating {
    // Mutation runs before schema validation: nothing may be assumed present.
    let decision_is_new = "has(object.spec) && has(object.spec.decision) && (oldObject == null || !has(oldObject.spec) || !has(oldObject.spec.decision))";
    let vote_is_new = "has(object.spec) && has(object.spec.votes) && request.userInfo.username in object.spec.votes && (oldObject == null || !has(oldObject.spec) || !has(oldObject.spec.votes) || !(request.userInfo.username in oldObject.spec.votes))";
    mutating(
        STAMP_DECIDER_POLICY,
        match_resources(&["approvalrequests"], &["CREATE", "UPDATE"]),
        Some(vec![match_condition(
            "decision-or-vote-is-being-set",
            format!("({decision_is_new}) || ({vote_is_new})"),
        )]),
        Some(vec![
            variable("stamp", decided_by_stamp_expression()),
            variable("decisionIsNew", decision_is_new),
            variable("voteIsNew", vote_is_new),
            variable(
                "votePointer",
                "request.userInfo.username.replace('~', '~0').replace('/', '~1')",
            ),
        ]),
        vec![
            set_annotation(
                DECIDED_BY_ANNOTATION,
                "variables.stamp",
                "variables.decisionIsNew",
            ),
            json_patch(
                "variables.voteIsNew ? [JSONPatch{op: 'add', path: '/spec/votes/' + variables.votePointer + '/decidedBy', value: variables.stamp}] : []".to_owned(),
            ),
        ],
    )
}
