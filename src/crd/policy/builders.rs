//! Small constructors of the admission-policy objects, so each policy reads as its rules.

use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    MutatingAdmissionPolicyBindingSpec, MutatingAdmissionPolicySpec, Mutation,
    NamedRuleWithOperations, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicyBindingSpec, ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::super::{GROUP, PART_OF_LABEL, VERSION};

/// A validating policy and its binding.
pub type Validating = (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding);
/// A mutating policy and its binding.
pub type Mutating = (MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding);

/// A named CEL variable.
pub fn variable(name: &str, expression: impl Into<String>) -> Variable {
    Variable {
        name: name.to_owned(),
        expression: expression.into(),
    }
}

/// A named match condition.
pub fn match_condition(name: &str, expression: impl Into<String>) -> MatchCondition {
    MatchCondition {
        name: name.to_owned(),
        expression: expression.into(),
    }
}

/// The message of a failed validation.
pub enum Message {
    /// A fixed text.
    Fixed(&'static str),
    /// A CEL expression computing the text.
    Expression(String),
}

/// A validation refusing with `Forbidden` when `expression` is false.
pub fn validation(expression: impl Into<String>, message: Message) -> Validation {
    let (message, message_expression) = match message {
        Message::Fixed(m) => (Some(m.to_owned()), None),
        Message::Expression(e) => (None, Some(e)),
    };
    Validation {
        expression: expression.into(),
        message,
        message_expression,
        reason: Some("Forbidden".to_owned()),
    }
}

/// Metadata of a generated object: its name and the part-of label.
pub fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(part_of()),
        ..Default::default()
    }
}

/// The part-of label every generated object carries.
pub fn part_of() -> BTreeMap<String, String> {
    [(PART_OF_LABEL.0.to_owned(), PART_OF_LABEL.1.to_owned())].into()
}

/// `items` as the owned list the API types want.
pub fn strings(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| (*s).to_owned()).collect())
}

/// Matches `resources` of the agentrun group (a main resource like `agentruns`, or a subresource
/// like `agentruns/status`) for `operations`.
pub fn match_resources(resources: &[&str], operations: &[&str]) -> MatchResources {
    MatchResources {
        match_policy: Some("Equivalent".to_owned()),
        resource_rules: Some(vec![NamedRuleWithOperations {
            api_groups: strings(&[GROUP]),
            api_versions: strings(&[VERSION]),
            operations: strings(operations),
            resources: strings(resources),
            scope: Some("Namespaced".to_owned()),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// A mutating policy (failing closed, reinvoked when needed) and its binding.
pub fn mutating(
    name: &str,
    match_constraints: MatchResources,
    match_conditions: Option<Vec<MatchCondition>>,
    variables: Option<Vec<Variable>>,
    mutations: Vec<Mutation>,
) -> Mutating {
    let policy = MutatingAdmissionPolicy {
        metadata: metadata(name),
        spec: Some(MutatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            match_constraints: Some(match_constraints),
            match_conditions,
            variables,
            mutations: Some(mutations),
            reinvocation_policy: Some("IfNeeded".to_owned()),
            param_kind: None,
        }),
    };
    let binding = MutatingAdmissionPolicyBinding {
        metadata: metadata(name),
        spec: Some(MutatingAdmissionPolicyBindingSpec {
            policy_name: Some(name.to_owned()),
            match_resources: None,
            param_ref: None,
        }),
    };
    (policy, binding)
}

/// A validating policy (failing closed) and its binding (denying).
pub fn validating(
    name: &str,
    match_constraints: MatchResources,
    variables: Vec<Variable>,
    validations: Vec<Validation>,
) -> Validating {
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata(name),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            match_constraints: Some(match_constraints),
            variables: Some(variables),
            validations: Some(validations),
            ..Default::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata: metadata(name),
        spec: ValidatingAdmissionPolicyBindingSpec {
            policy_name: name.to_owned(),
            validation_actions: vec!["Deny".to_owned()],
            match_resources: None,
            param_ref: None,
        },
    };
    (policy, binding)
}

/// `policy` evaluated only for requests meeting every condition.
pub fn with_match_conditions(
    mut policy: Validating,
    conditions: Vec<MatchCondition>,
) -> Validating {
    if let Some(spec) = policy.0.spec.as_mut() {
        spec.match_conditions = Some(conditions);
    }
    policy
}
