//! The API server's guards around the custom resources, generated beside the CRDs so that
//! `kubectl apply -f crds/` installs them together: admission policies
//! (`crds/admission-policies.yaml`) and aggregated RBAC roles (`crds/roles.yaml`).
//!
//! # Admission policies
//!
//! Mutating policies run before validating ones, so the validating policies see (and check) what
//! the stamps wrote:
//!
//! 1. `agentrun-stamp-creator` (MutatingAdmissionPolicy): on CREATE of an AgentRun, sets the
//!    annotation [`CREATED_BY_ANNOTATION`] to the authenticated username, overwriting whatever the
//!    user wrote.
//! 2. `agentrun-stamp-decider` (MutatingAdmissionPolicy): when a CREATE or UPDATE of an
//!    ApprovalRequest sets a decision that was not there before, sets the annotation
//!    [`DECIDED_BY_ANNOTATION`] to the authenticated identity as JSON
//!    (`{"username":…,"uid":…,"groups":[…]}`, see [`DecidedBy`]).
//! 3. `agentrun-approval-identity` (ValidatingAdmissionPolicy) on ApprovalRequests (the main
//!    resource; status updates are not matched): a new decision's `approverId` is the requester's
//!    own username unless the requester is in [`GITOPS_GROUP`] and the object names the commit in
//!    [`GITOPS_COMMIT_ANNOTATION`]; the run's creator (`spec.runCreator`) can neither decide nor be
//!    recorded as the approver (separation of duties); Expired and Superseded requests cannot be
//!    decided; [`DECIDED_BY_ANNOTATION`] holds only what the stamp writes, and it and
//!    [`GITOPS_COMMIT_ANNOTATION`] are frozen once a decision exists.
//! 4. `agentrun-run-creator` (ValidatingAdmissionPolicy) on AgentRuns: [`CREATED_BY_ANNOTATION`]
//!    is the creator's own username at CREATE and immutable afterwards.
//!
//! Both stamps use `reinvocationPolicy: IfNeeded`: they are idempotent, and re-running them after
//! a later mutation (another policy or webhook rewriting annotations) restores the verified value.
//! A request that creates an ApprovalRequest without a decision (what the controller does) and
//! any status update are untouched by the decision checks.
//!
//! # Roles
//!
//! `agentrun-viewer` (aggregated into `view`), `agentrun-editor` (aggregated into `edit`, and so
//! `admin`; it can read ApprovalRequests but not decide them) and `agentrun-approver` (deciding
//! ApprovalRequests; deliberately not aggregated anywhere: approval rights are granted
//! explicitly with a RoleBinding or ClusterRoleBinding).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    JSONPatch, MatchCondition, MatchResources, MutatingAdmissionPolicy,
    MutatingAdmissionPolicyBinding, MutatingAdmissionPolicyBindingSpec,
    MutatingAdmissionPolicySpec, Mutation, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation, Variable,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{CrdError, GROUP, PART_OF_LABEL, VERSION, VerifiedIdentity};

/// The group whose members may record another person as a decision's approver (with
/// [`GITOPS_COMMIT_ANNOTATION`]). A Helm chart templates its own value.
pub const GITOPS_GROUP: &str = "agentrun:gitops";
/// The AgentRun annotation holding the username of the run's creator, stamped at CREATE.
pub const CREATED_BY_ANNOTATION: &str = "agentrun.dev/created-by";
/// The ApprovalRequest annotation holding the identity that set the decision, as JSON
/// (see [`DecidedBy`]), stamped when the decision is set.
pub const DECIDED_BY_ANNOTATION: &str = "agentrun.dev/decided-by";
/// The ApprovalRequest annotation naming the commit a GitOps decision comes from.
pub const GITOPS_COMMIT_ANNOTATION: &str = "agentrun.dev/gitops-commit";

/// The MutatingAdmissionPolicy (and binding) stamping an AgentRun's creator.
pub const STAMP_CREATOR_POLICY: &str = "agentrun-stamp-creator";
/// The MutatingAdmissionPolicy (and binding) stamping the identity that decides a request.
pub const STAMP_DECIDER_POLICY: &str = "agentrun-stamp-decider";
/// The ValidatingAdmissionPolicy (and binding) checking who decides a request.
pub const APPROVAL_IDENTITY_POLICY: &str = "agentrun-approval-identity";
/// The ValidatingAdmissionPolicy (and binding) keeping an AgentRun's creator annotation honest.
pub const RUN_CREATOR_POLICY: &str = "agentrun-run-creator";

/// The ClusterRole that may decide ApprovalRequests (and read runs and agents).
pub const APPROVER_ROLE: &str = "agentrun-approver";
/// The ClusterRole that may manage Agents and AgentRuns and read ApprovalRequests.
pub const EDITOR_ROLE: &str = "agentrun-editor";
/// The ClusterRole that may read all three resources.
pub const VIEWER_ROLE: &str = "agentrun-viewer";

/// The file under `crds/` holding the admission policies and their bindings.
pub const ADMISSION_POLICIES_FILE: &str = "admission-policies.yaml";
/// The file under `crds/` holding the ClusterRoles.
pub const ROLES_FILE: &str = "roles.yaml";

/// The comment at the top of each generated policy file.
pub const POLICY_HEADER: &str = "# Generated by `agentrun crdgen` from src/crd/policy.rs.\n# Do not edit: change src/crd/policy.rs, then run `cargo run -- crdgen`.\n";

/// The message when a new decision names someone else as approver without the GitOps exception.
pub const APPROVER_IDENTITY_MESSAGE: &str = "approverId must be your own username";
/// The start of the message refusing a decision by (or in the name of) the run's creator.
pub const SEPARATION_OF_DUTIES_MESSAGE: &str = "separation of duties";
/// The message refusing a change of the decision annotations once a decision exists.
pub const FROZEN_ANNOTATIONS_MESSAGE: &str = "annotations agentrun.dev/decided-by and agentrun.dev/gitops-commit cannot be changed or removed once a decision exists";
/// The message refusing a `decided-by` annotation the stamp did not write.
pub const DECIDED_BY_MESSAGE: &str = "annotation agentrun.dev/decided-by is written by the agentrun-stamp-decider policy when a decision is set and holds the identity of the user who set it; it cannot be written by hand";
/// The message refusing a change of an AgentRun's creator annotation.
pub const CREATED_BY_IMMUTABLE_MESSAGE: &str =
    "annotation agentrun.dev/created-by is immutable: it records who created the run";

/// The identity stamped into [`DECIDED_BY_ANNOTATION`]: the API server's `request.userInfo` of
/// the request that set the decision.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecidedBy {
    /// The authenticated username.
    pub username: String,
    /// The user's uid; empty when the authenticator gives none.
    pub uid: String,
    /// The user's groups, in the order the API server listed them.
    pub groups: Vec<String>,
}

impl DecidedBy {
    /// Parses the annotation's value. The policy writes exactly this shape; anything else means
    /// the annotation did not come from it.
    pub fn parse(value: &str) -> Result<DecidedBy, CrdError> {
        let parsed: DecidedBy =
            serde_json::from_str(value).map_err(|source| CrdError::DecidedBy {
                value: value.chars().take(200).collect(),
                source,
            })?;
        Ok(parsed)
    }

    /// The identity as recorded in an ApprovalRequest's `status.verifiedIdentity` (an empty uid
    /// becomes absent).
    pub fn to_verified_identity(&self) -> VerifiedIdentity {
        VerifiedIdentity {
            username: self.username.clone(),
            uid: (!self.uid.is_empty()).then(|| self.uid.clone()),
            groups: self.groups.clone(),
        }
    }
}

/// The admission policies and their bindings, in the order they are written.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionPolicies {
    /// The stamps: `agentrun-stamp-creator`, `agentrun-stamp-decider`.
    pub mutating: Vec<(MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding)>,
    /// The checks: `agentrun-approval-identity`, `agentrun-run-creator`.
    pub validating: Vec<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding)>,
}

/// One generated manifest file and its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeneratedManifest {
    /// The file name under `crds/`.
    pub file_name: &'static str,
    /// The file's content: [`POLICY_HEADER`] followed by one YAML document per object.
    pub yaml: String,
}

/// A CEL expression for the JSON string literal (quotes included) of the string `expr`: it
/// escapes the backslash, the double quote and every control character as JSON requires.
pub fn cel_json_string(expr: &str) -> String {
    let mut out = format!("({expr}).replace('\\\\', '\\\\\\\\').replace('\"', '\\\\\"')");
    for code in 0u32..0x20 {
        let escaped = match code {
            0x08 => "\\\\b".to_owned(),
            0x09 => "\\\\t".to_owned(),
            0x0a => "\\\\n".to_owned(),
            0x0c => "\\\\f".to_owned(),
            0x0d => "\\\\r".to_owned(),
            _ => format!("\\\\u{code:04x}"),
        };
        out.push_str(&format!(".replace('\\u{code:04x}', '{escaped}')"));
    }
    format!("'\"' + {out} + '\"'")
}

/// The CEL expression both the stamp and the check compute: `request.userInfo` as the JSON of
/// [`DecidedBy`].
pub fn decided_by_stamp_expression() -> String {
    format!(
        "'{{\"username\":' + {username} + ',\"uid\":' + {uid} + ',\"groups\":[' + (has(request.userInfo.groups) ? request.userInfo.groups.map(g, {group}).join(',') : '') + ']}}'",
        username = cel_json_string("request.userInfo.username"),
        uid = cel_json_string("has(request.userInfo.uid) ? request.userInfo.uid : ''"),
        group = cel_json_string("g"),
    )
}

fn variable(name: &str, expression: impl Into<String>) -> Variable {
    Variable {
        name: name.to_owned(),
        expression: expression.into(),
    }
}

fn validation(expression: String, message: Message) -> Validation {
    let (message, message_expression) = match message {
        Message::Fixed(m) => (Some(m.to_owned()), None),
        Message::Expression(e) => (None, Some(e)),
    };
    Validation {
        expression,
        message,
        message_expression,
        reason: Some("Forbidden".to_owned()),
    }
}

enum Message {
    Fixed(&'static str),
    Expression(String),
}

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        labels: Some(part_of()),
        ..Default::default()
    }
}

fn part_of() -> BTreeMap<String, String> {
    [(PART_OF_LABEL.0.to_owned(), PART_OF_LABEL.1.to_owned())].into()
}

fn strings(items: &[&str]) -> Option<Vec<String>> {
    Some(items.iter().map(|s| (*s).to_owned()).collect())
}

/// Matches the main resource (not its subresources) of `resource` for `operations`.
fn match_resource(resource: &str, operations: &[&str]) -> MatchResources {
    MatchResources {
        match_policy: Some("Equivalent".to_owned()),
        resource_rules: Some(vec![NamedRuleWithOperations {
            api_groups: strings(&[GROUP]),
            api_versions: strings(&[VERSION]),
            operations: strings(operations),
            resources: strings(&[resource]),
            scope: Some("Namespaced".to_owned()),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

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

fn mutating(
    name: &str,
    match_constraints: MatchResources,
    match_conditions: Option<Vec<MatchCondition>>,
    variables: Option<Vec<Variable>>,
    mutation: Mutation,
) -> (MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding) {
    let policy = MutatingAdmissionPolicy {
        metadata: metadata(name),
        spec: Some(MutatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_owned()),
            match_constraints: Some(match_constraints),
            match_conditions,
            variables,
            mutations: Some(vec![mutation]),
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

fn validating(
    name: &str,
    match_constraints: MatchResources,
    variables: Vec<Variable>,
    validations: Vec<Validation>,
) -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
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

/// CEL: annotation `key` is the same in `variables.annotations` and `variables.oldAnnotations`
/// (present in both with the same value, or absent from both).
fn annotation_unchanged(key: &str) -> String {
    format!(
        "(('{key}' in variables.annotations) == ('{key}' in variables.oldAnnotations) && (!('{key}' in variables.annotations) || variables.annotations['{key}'] == variables.oldAnnotations['{key}']))"
    )
}

fn annotations_variables() -> [Variable; 2] {
    [
        variable(
            "annotations",
            "has(object.metadata.annotations) ? object.metadata.annotations : {}",
        ),
        variable(
            "oldAnnotations",
            "oldObject != null && has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}",
        ),
    ]
}

/// `agentrun-stamp-creator`: the creator's username into [`CREATED_BY_ANNOTATION`] at CREATE.
fn stamp_creator() -> (MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding) {
    mutating(
        STAMP_CREATOR_POLICY,
        match_resource("agentruns", &["CREATE"]),
        None,
        None,
        set_annotation(CREATED_BY_ANNOTATION, "request.userInfo.username"),
    )
}

/// `agentrun-stamp-decider`: the decider's identity into [`DECIDED_BY_ANNOTATION`] when a
/// decision is set (CREATE with a decision, or UPDATE adding one).
fn stamp_decider() -> (MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding) {
    mutating(
        STAMP_DECIDER_POLICY,
        match_resource("approvalrequests", &["CREATE", "UPDATE"]),
        Some(vec![MatchCondition {
            name: "decision-is-being-set".to_owned(),
            // Mutation runs before schema validation: nothing may be assumed present.
            expression: "has(object.spec) && has(object.spec.decision) && (oldObject == null || !has(oldObject.spec) || !has(oldObject.spec.decision))".to_owned(),
        }]),
        Some(vec![variable("stamp", decided_by_stamp_expression())]),
        set_annotation(DECIDED_BY_ANNOTATION, "variables.stamp"),
    )
}

/// `agentrun-approval-identity`: who may decide an ApprovalRequest, and the decision
/// annotations' integrity.
fn approval_identity() -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let [annotations, old_annotations] = annotations_variables();
    let variables = vec![
        variable(
            "decisionIsNew",
            "has(object.spec.decision) && (oldObject == null || !has(oldObject.spec.decision))",
        ),
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
        variable(
            "gitops",
            format!("has(request.userInfo.groups) && '{GITOPS_GROUP}' in request.userInfo.groups"),
        ),
        annotations,
        old_annotations,
        variable(
            "gitopsCommit",
            format!(
                "'{GITOPS_COMMIT_ANNOTATION}' in variables.annotations ? variables.annotations['{GITOPS_COMMIT_ANNOTATION}'].trim() : ''"
            ),
        ),
        variable("stamp", decided_by_stamp_expression()),
    ];
    let validations = vec![
        validation(
            "!variables.decisionIsNew || variables.approver == request.userInfo.username || (variables.gitops && variables.gitopsCommit != '')".to_owned(),
            Message::Expression(format!(
                "'{APPROVER_IDENTITY_MESSAGE} (' + request.userInfo.username + '); only members of {GITOPS_GROUP} may record another approver, with the {GITOPS_COMMIT_ANNOTATION} annotation naming the commit'"
            )),
        ),
        validation(
            "!variables.decisionIsNew || variables.runCreator == '' || (variables.runCreator != request.userInfo.username && variables.runCreator != variables.approver)".to_owned(),
            Message::Expression(format!(
                "'{SEPARATION_OF_DUTIES_MESSAGE}: ' + variables.runCreator + ' created this run and cannot decide its own requests'"
            )),
        ),
        validation(
            "!variables.decisionIsNew || !has(object.status) || !has(object.status.phase) || !(object.status.phase in ['Expired', 'Superseded'])".to_owned(),
            Message::Expression(
                "'this request is ' + object.status.phase + ': it can no longer be decided'"
                    .to_owned(),
            ),
        ),
        validation(
            format!(
                "!variables.wasDecided || ({} && {})",
                annotation_unchanged(DECIDED_BY_ANNOTATION),
                annotation_unchanged(GITOPS_COMMIT_ANNOTATION)
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
        match_resource("approvalrequests", &["CREATE", "UPDATE"]),
        variables,
        validations,
    )
}

/// `agentrun-run-creator`: [`CREATED_BY_ANNOTATION`] is the creator's own username and never
/// changes.
fn run_creator() -> (ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding) {
    let [annotations, old_annotations] = annotations_variables();
    let key = CREATED_BY_ANNOTATION;
    let validations = vec![
        validation(
            format!(
                "request.operation != 'CREATE' || !('{key}' in variables.annotations) || variables.annotations['{key}'] == request.userInfo.username"
            ),
            Message::Expression(format!(
                "'annotation {key} must be your own username (' + request.userInfo.username + '): it records who created the run'"
            )),
        ),
        validation(
            format!(
                "request.operation != 'UPDATE' || {}",
                annotation_unchanged(key)
            ),
            Message::Fixed(CREATED_BY_IMMUTABLE_MESSAGE),
        ),
    ];
    validating(
        RUN_CREATOR_POLICY,
        match_resource("agentruns", &["CREATE", "UPDATE"]),
        vec![annotations, old_annotations],
        validations,
    )
}

/// Every admission policy with its binding.
pub fn admission_policies() -> AdmissionPolicies {
    AdmissionPolicies {
        mutating: vec![stamp_creator(), stamp_decider()],
        validating: vec![approval_identity(), run_creator()],
    }
}

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
/// `edit`) and `agentrun-viewer` (aggregated into `view`).
pub fn cluster_roles() -> Vec<ClusterRole> {
    vec![
        cluster_role(
            APPROVER_ROLE,
            None,
            vec![
                rule(&["approvalrequests"], &["get", "list", "watch", "patch"]),
                rule(&["agentruns", "agents"], READ),
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
                rule(&["approvalrequests"], READ),
            ],
        ),
        cluster_role(
            VIEWER_ROLE,
            Some("view"),
            vec![rule(&["agents", "agentruns", "approvalrequests"], READ)],
        ),
    ]
}

/// One YAML document (with its `---` separator) for `object`.
fn document<T: Serialize>(file: &'static str, object: &T) -> Result<String, CrdError> {
    let body = serde_yaml_ng::to_string(object)
        .map_err(|source| CrdError::RenderManifest { file, source })?;
    Ok(format!("---\n{body}"))
}

/// Renders the policy files committed under `crds/`: [`ADMISSION_POLICIES_FILE`] (each policy
/// followed by its binding, mutating first) and [`ROLES_FILE`]. Deterministic.
pub fn generate() -> Result<Vec<GeneratedManifest>, CrdError> {
    let file = ADMISSION_POLICIES_FILE;
    let policies = admission_policies();
    let mut policy_yaml = POLICY_HEADER.to_owned();
    for (policy, binding) in &policies.mutating {
        policy_yaml.push_str(&document(file, policy)?);
        policy_yaml.push_str(&document(file, binding)?);
    }
    for (policy, binding) in &policies.validating {
        policy_yaml.push_str(&document(file, policy)?);
        policy_yaml.push_str(&document(file, binding)?);
    }
    let mut roles_yaml = POLICY_HEADER.to_owned();
    for role in cluster_roles() {
        roles_yaml.push_str(&document(ROLES_FILE, &role)?);
    }
    Ok(vec![
        GeneratedManifest {
            file_name: ADMISSION_POLICIES_FILE,
            yaml: policy_yaml,
        },
        GeneratedManifest {
            file_name: ROLES_FILE,
            yaml: roles_yaml,
        },
    ])
}

/// Writes the generated policy files into `dir` (which must exist), returning the paths.
/// Files already up to date are left untouched.
pub fn write_manifests(dir: &Path) -> Result<Vec<PathBuf>, CrdError> {
    let mut written = Vec::new();
    for manifest in generate()? {
        let path = dir.join(manifest.file_name);
        let current = std::fs::read_to_string(&path).ok();
        if current.as_deref() != Some(manifest.yaml.as_str()) {
            std::fs::write(&path, &manifest.yaml).map_err(|source| CrdError::Write {
                path: path.clone(),
                source,
            })?;
        }
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validations(name: &str) -> Vec<Validation> {
        admission_policies()
            .validating
            .into_iter()
            .find(|(p, _)| p.metadata.name.as_deref() == Some(name))
            .and_then(|(p, _)| p.spec?.validations)
            .unwrap()
    }

    #[test]
    fn generation_is_deterministic_and_has_the_header() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_eq!(a, b);
        let names: Vec<_> = a.iter().map(|m| m.file_name).collect();
        assert_eq!(names, [ADMISSION_POLICIES_FILE, ROLES_FILE]);
        for manifest in &a {
            assert!(manifest.yaml.starts_with(POLICY_HEADER));
        }
    }

    #[test]
    fn the_policy_file_holds_each_policy_followed_by_its_binding() {
        let yaml = &generate().unwrap()[0].yaml;
        let kinds_and_names: Vec<(String, String)> = serde_yaml_ng::Deserializer::from_str(yaml)
            .map(|doc| {
                let v = serde_json::Value::deserialize(doc).unwrap();
                (
                    v["kind"].as_str().unwrap().to_owned(),
                    v["metadata"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        let expected = [
            ("MutatingAdmissionPolicy", STAMP_CREATOR_POLICY),
            ("MutatingAdmissionPolicyBinding", STAMP_CREATOR_POLICY),
            ("MutatingAdmissionPolicy", STAMP_DECIDER_POLICY),
            ("MutatingAdmissionPolicyBinding", STAMP_DECIDER_POLICY),
            ("ValidatingAdmissionPolicy", APPROVAL_IDENTITY_POLICY),
            ("ValidatingAdmissionPolicyBinding", APPROVAL_IDENTITY_POLICY),
            ("ValidatingAdmissionPolicy", RUN_CREATOR_POLICY),
            ("ValidatingAdmissionPolicyBinding", RUN_CREATOR_POLICY),
        ]
        .map(|(k, n)| (k.to_owned(), n.to_owned()));
        assert_eq!(kinds_and_names, expected);
    }

    #[test]
    fn policies_fail_closed_and_bindings_deny() {
        let policies = admission_policies();
        for (policy, binding) in &policies.mutating {
            let spec = policy.spec.as_ref().unwrap();
            assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
            assert_eq!(spec.reinvocation_policy.as_deref(), Some("IfNeeded"));
            assert_eq!(
                binding.spec.as_ref().unwrap().policy_name,
                policy.metadata.name
            );
        }
        for (policy, binding) in &policies.validating {
            let spec = policy.spec.as_ref().unwrap();
            assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
            let binding = &binding.spec;
            assert_eq!(Some(&binding.policy_name), policy.metadata.name.as_ref());
            assert_eq!(binding.validation_actions, ["Deny"]);
            // Only the main resource: status updates (the controller's) are not matched.
            let rules = spec
                .match_constraints
                .as_ref()
                .unwrap()
                .resource_rules
                .as_ref()
                .unwrap();
            for rule in rules {
                assert_eq!(rule.api_groups.as_deref(), Some(&[GROUP.to_owned()][..]));
                for resource in rule.resources.as_ref().unwrap() {
                    assert!(!resource.contains('/'), "{resource}");
                }
            }
            for v in spec.validations.as_ref().unwrap() {
                assert!(
                    v.message.is_some() || v.message_expression.is_some(),
                    "{}",
                    v.expression
                );
            }
        }
    }

    #[test]
    fn the_identity_checks_name_the_gitops_group_and_annotations() {
        let rules = validations(APPROVAL_IDENTITY_POLICY);
        let identity = rules[0].message_expression.as_deref().unwrap();
        for needle in [
            APPROVER_IDENTITY_MESSAGE,
            GITOPS_GROUP,
            GITOPS_COMMIT_ANNOTATION,
        ] {
            assert!(identity.contains(needle), "{identity}");
        }
        assert!(
            rules[1]
                .message_expression
                .as_deref()
                .unwrap()
                .contains("cannot decide its own requests")
        );
        let creator = validations(RUN_CREATOR_POLICY);
        assert_eq!(
            creator[1].message.as_deref(),
            Some(CREATED_BY_IMMUTABLE_MESSAGE)
        );
    }

    #[test]
    fn the_stamp_escapes_every_character_json_requires() {
        let expr = cel_json_string("x");
        assert!(expr.starts_with("'\"' + (x)"), "{expr}");
        assert!(expr.contains(r#".replace('\\', '\\\\')"#), "{expr}");
        assert!(expr.contains(r#".replace('"', '\\"')"#), "{expr}");
        assert!(expr.contains(r#".replace('\u000a', '\\n')"#), "{expr}");
        assert!(expr.contains(r#".replace('\u0000', '\\u0000')"#), "{expr}");
        assert!(expr.contains(r#".replace('\u001f', '\\u001f')"#), "{expr}");
        assert_eq!(expr.matches(".replace(").count(), 34);
        // The backslash goes first, or the escapes added later would be doubled.
        assert!(expr.find(r#"'\\', '\\\\'"#).unwrap() < expr.find(r#"'"', '\\"'"#).unwrap());
        let stamp = decided_by_stamp_expression();
        for field in ["username", "uid", "groups"] {
            assert!(stamp.contains(&format!("\"{field}\":")), "{stamp}");
        }
    }

    #[test]
    fn the_decided_by_annotation_parses_into_a_verified_identity() {
        let stamp = DecidedBy::parse(
            r#"{"username":"alice@example.com","uid":"uid-alice","groups":["agentrun:approvers","system:authenticated"]}"#,
        )
        .unwrap();
        let identity = stamp.to_verified_identity();
        assert_eq!(identity.username, "alice@example.com");
        assert_eq!(identity.uid.as_deref(), Some("uid-alice"));
        assert_eq!(identity.groups.len(), 2);
        let no_uid = DecidedBy::parse(r#"{"username":"a","uid":"","groups":[]}"#).unwrap();
        assert_eq!(no_uid.to_verified_identity().uid, None);
        let err = DecidedBy::parse(r#"{"username":"a"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains(DECIDED_BY_ANNOTATION), "{err}");
        assert!(DecidedBy::parse("alice").is_err());
        assert!(DecidedBy::parse(r#"{"username":"a","uid":"","groups":[],"x":1}"#).is_err());
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
        let grants = |role: &ClusterRole, resource: &str, verb: &str| {
            role.rules.as_ref().unwrap().iter().any(|r| {
                r.resources.as_ref().unwrap().iter().any(|x| x == resource)
                    && r.verbs.iter().any(|v| v == verb)
            })
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

    #[test]
    fn write_manifests_writes_and_keeps_up_to_date_files() {
        let dir = tempfile::tempdir().unwrap();
        let paths = write_manifests(dir.path()).unwrap();
        assert_eq!(paths.len(), 2);
        for manifest in generate().unwrap() {
            let text = std::fs::read_to_string(dir.path().join(manifest.file_name)).unwrap();
            assert_eq!(text, manifest.yaml);
        }
        let missing = dir.path().join("missing");
        let err = write_manifests(&missing).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
    }
}
