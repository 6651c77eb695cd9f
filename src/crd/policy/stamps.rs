//! The mutating policies: the API server stamps who created a run and who decided a request.

use k8s_openapi::api::admissionregistration::v1::{JSONPatch, Mutation};

use super::builders::{Mutating, match_condition, match_resources, mutating, variable};
use super::cel::decided_by_stamp_expression;
use super::{
    CREATED_BY_ANNOTATION, DECIDED_BY_ANNOTATION, STAMP_CREATOR_POLICY, STAMP_DECIDER_POLICY,
};

/// A JSON patch setting one annotation to the CEL string `value`, whether or not the object has
/// annotations. (A JSON patch rather than an apply configuration: an apply configuration first
/// converts the object to its schema's type, so a malformed object would get a conversion error
/// from the policy instead of the schema's clear message.)
fn set_annotation(key: &str, value: &str) -> Mutation {
    let pointer = key.replace('~', "~0").replace('/', "~1");
    Mutation {
        patch_type: "JSONPatch".to_owned(),
        apply_configuration: None,
        json_patch: Some(JSONPatch {
            expression: Some(format!(
                "has(object.metadata.annotations) ? [JSONPatch{{op: 'add', path: '/metadata/annotations/{pointer}', value: {value}}}] : [JSONPatch{{op: 'add', path: '/metadata/annotations', value: {{'{key}': {value}}}}}]"
            )),
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
        set_annotation(CREATED_BY_ANNOTATION, "request.userInfo.username"),
    )
}

/// `agentrun-stamp-decider`: the decider's identity into [`DECIDED_BY_ANNOTATION`] when a
/// decision is set (CREATE with a decision, or UPDATE adding one).
pub fn stamp_decider() -> Mutating {
    mutating(
        STAMP_DECIDER_POLICY,
        match_resources(&["approvalrequests"], &["CREATE", "UPDATE"]),
        Some(vec![match_condition(
            "decision-is-being-set",
            // Mutation runs before schema validation: nothing may be assumed present.
            "has(object.spec) && has(object.spec.decision) && (oldObject == null || !has(oldObject.spec) || !has(oldObject.spec.decision))",
        )]),
        Some(vec![variable("stamp", decided_by_stamp_expression())]),
        set_annotation(DECIDED_BY_ANNOTATION, "variables.stamp"),
    )
}
