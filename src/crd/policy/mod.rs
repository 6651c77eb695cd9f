//! The API server's guards around the custom resources, generated beside the CRDs so that
//! `kubectl apply -f crds/` installs them together: admission policies
//! (`crds/admission-policies.yaml`) and aggregated RBAC roles (`crds/roles.yaml`). The trust
//! model they implement is in `docs/security.md`: anything a namespace ServiceAccount can write,
//! every editor of that namespace can write.
//!
//! # Admission policies
//!
//! Mutating policies run before validating ones, so the validating policies see (and check) what
//! the stamps wrote:
//!
//! 1. `agentrun-stamp-creator` (MutatingAdmissionPolicy, `stamps.rs`): on CREATE of an AgentRun,
//!    sets the annotation [`CREATED_BY_ANNOTATION`] to the exact authenticated username,
//!    overwriting whatever the user wrote.
//! 2. `agentrun-stamp-decider` (MutatingAdmissionPolicy): when a CREATE or UPDATE of an
//!    ApprovalRequest sets a decision that was not there before, sets the annotation
//!    [`DECIDED_BY_ANNOTATION`] to the authenticated identity as JSON
//!    (`{"username":…,"uid":…,"groups":[…]}`, see [`DecidedBy`]); when it adds the requester's
//!    vote (`spec.votes[<username>]`), writes the same JSON into the vote's `decidedBy`.
//! 3. `agentrun-approval-identity` (ValidatingAdmissionPolicy, `decisions.rs`) on ApprovalRequests:
//!    a new vote is the requester's own (keyed by their exact username), one at a time, with the
//!    stamp in its `decidedBy`, and not by the run's creator; a request restricted to `approvers`
//!    (by its ApprovalPolicy rule) takes decisions and votes only from them;
//!    a new decision's `approverId` is the requester's own exact username unless the requester is
//!    in [`GITOPS_GROUP`] and the object names the commit in [`GITOPS_COMMIT_ANNOTATION`]; the
//!    run's creator (`spec.runCreator`) can neither decide nor be recorded as the approver, the
//!    identities compared normalised (trimmed, lowercased); Expired and Superseded requests cannot be
//!    decided; [`DECIDED_BY_ANNOTATION`] holds only what the stamp writes, and it and
//!    [`GITOPS_COMMIT_ANNOTATION`] are frozen once a decision exists.
//! 4. `agentrun-gitops-approvers` (ValidatingAdmissionPolicy, for requests from
//!    [`GITOPS_GROUP`] only): a GitOps decision's approver is on the admin's allow-list, kept in
//!    the policy ([`GITOPS_ALLOW_LIST_VARIABLE`]); an empty list (the default) refuses every
//!    GitOps decision.
//! 5. `agentrun-run-creator` (ValidatingAdmissionPolicy, `runs.rs`) on AgentRuns:
//!    [`CREATED_BY_ANNOTATION`] is the creator's own username at CREATE and immutable afterwards.
//! 6. `agentrun-run-status` (ValidatingAdmissionPolicy) on `agentruns/status`: anyone but a
//!    controller identity changes only [`WORKER_STATUS_FIELDS`], and only while the run is
//!    Running.
//! 7. `agentrun-record-retention` (ValidatingAdmissionPolicy, `retention.rs`): anyone but a
//!    controller identity leaves an ApprovalRequest's finalizers, ownerReferences and run label,
//!    and an AgentRun's cleanup finalizer, alone.
//!
//! A *controller identity* is a member of `system:masters`, or an identity RBAC allows the verb
//! [`CONTROLLER_VERB`] on `agentruns` in the request's namespace (checked with the CEL
//! `authorizer`, so that several releases, each watching its own namespaces, work side by side).
//!
//! Both stamps use `reinvocationPolicy: IfNeeded`: they are idempotent, and re-running them after
//! a later mutation (another policy or webhook rewriting annotations) restores the verified value.
//! A request that creates an ApprovalRequest without a decision (what the controller does) is
//! untouched by the decision checks.
//!
//! # Roles
//!
//! `agentrun-viewer` (aggregated into `view`), `agentrun-editor` (aggregated into `edit`, and so
//! `admin`; it can read ApprovalRequests but not decide them) and `agentrun-approver` (deciding
//! ApprovalRequests; deliberately not aggregated anywhere: approval rights are granted
//! explicitly with a RoleBinding or ClusterRoleBinding); see `roles.rs`.

mod builders;
mod cel;
mod decisions;
mod retention;
mod roles;
mod runs;
mod stamps;

use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, Variable,
};
use serde::{Deserialize, Serialize};

use super::{CrdError, VerifiedIdentity};
use builders::variable;

pub use cel::{cel_json_string, decided_by_stamp_expression};
pub use decisions::{gitops_allow_list, gitops_approvers_with};
pub use roles::cluster_roles;

/// The group whose members may record another person as a decision's approver (with
/// [`GITOPS_COMMIT_ANNOTATION`], for someone on the allow-list). A Helm chart templates its own
/// value.
pub const GITOPS_GROUP: &str = "agentrun:gitops";
pub use super::keys::annotations::{
    CREATED_BY as CREATED_BY_ANNOTATION, DECIDED_BY as DECIDED_BY_ANNOTATION,
    GITOPS_COMMIT as GITOPS_COMMIT_ANNOTATION,
};

/// The RBAC verb that makes an identity a *controller identity* for `agentruns` in a namespace
/// (besides `system:masters`): it alone may move a run or release its records there. No built-in
/// role grants it; the Helm chart grants it to its controller ServiceAccount. Any role granting
/// `*` verbs on agentrun.dev resources grants it too: do not give such roles to tenants.
pub const CONTROLLER_VERB: &str = "control";
/// The first variable of `agentrun-gitops-approvers`: the CEL list of whom the GitOps group may
/// record as approver (empty as generated; the Helm chart writes `admissionPolicies.gitopsApprovers`
/// there; without Helm, an admin patches `/spec/variables/0/expression`).
pub const GITOPS_ALLOW_LIST_VARIABLE: &str = "gitopsAllowList";
/// The status fields a worker step produces: the only ones anyone but a controller identity may
/// change.
pub const WORKER_STATUS_FIELDS: [&str; 7] = [
    "runState",
    "runStateEncoding",
    "runStateBytes",
    "runStateDigest",
    "runStateChunks",
    "toolCalls",
    "finalOutput",
];
/// The usernames of Kubernetes' garbage collector (with and without
/// `--use-service-account-credentials`): it may remove the ownerReferences of dependents it
/// orphans.
pub const GARBAGE_COLLECTOR_USERNAMES: [&str; 2] = [
    "system:serviceaccount:kube-system:generic-garbage-collector",
    "system:kube-controller-manager",
];
/// The finalizers Kubernetes itself adds and removes during a deletion.
pub const KUBERNETES_FINALIZERS: [&str; 2] = ["orphan", "foregroundDeletion"];

/// The MutatingAdmissionPolicy (and binding) stamping an AgentRun's creator.
pub const STAMP_CREATOR_POLICY: &str = "agentrun-stamp-creator";
/// The MutatingAdmissionPolicy (and binding) stamping the identity that decides a request.
pub const STAMP_DECIDER_POLICY: &str = "agentrun-stamp-decider";
/// The ValidatingAdmissionPolicy (and binding) checking who decides a request.
pub const APPROVAL_IDENTITY_POLICY: &str = "agentrun-approval-identity";
/// The ValidatingAdmissionPolicy (and binding) checking GitOps approvers against the allow-list.
pub const GITOPS_APPROVERS_POLICY: &str = "agentrun-gitops-approvers";
/// The ValidatingAdmissionPolicy (and binding) keeping an AgentRun's creator annotation honest.
pub const RUN_CREATOR_POLICY: &str = "agentrun-run-creator";
/// The ValidatingAdmissionPolicy (and binding) keeping workers from moving a run.
pub const RUN_STATUS_POLICY: &str = "agentrun-run-status";
/// The ValidatingAdmissionPolicy (and binding) keeping the records attached and alive.
pub const RECORD_RETENTION_POLICY: &str = "agentrun-record-retention";

/// The ClusterRole that may read the ApprovalRecords (the durable decision records).
pub const AUDITOR_ROLE: &str = "agentrun-auditor";
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
pub const POLICY_HEADER: &str = "# Generated by `agentrun crdgen` from src/crd/policy/.\n# Do not edit: change src/crd/policy/, then run `cargo run -- crdgen`.\n";

/// The message when a new decision names someone else as approver without the GitOps exception.
pub const APPROVER_IDENTITY_MESSAGE: &str = "approverId must be your own username";
/// The start of the message refusing a decision by (or in the name of) the run's creator.
pub const SEPARATION_OF_DUTIES_MESSAGE: &str = "separation of duties";
/// The message refusing a change of the decision annotations once a decision exists.
pub const FROZEN_ANNOTATIONS_MESSAGE: &str = "annotations agentrun.dev/decided-by and agentrun.dev/gitops-commit cannot be changed or removed once a decision exists";
/// The start of the message refusing a decision or vote by someone the request's `approvers` do
/// not list.
pub const NOT_AN_APPROVER_MESSAGE: &str =
    "only the approvers the ApprovalPolicy rule lists may decide this request";
/// The start of the message refusing a vote added under another name (or several at once).
pub const OWN_VOTE_MESSAGE: &str =
    "you may add only your own vote, under spec.votes keyed by your exact username";
/// The message refusing a vote whose `decidedBy` the stamp did not write.
pub const VOTE_STAMP_MESSAGE: &str = "a vote's decidedBy is written by the agentrun-stamp-decider policy and holds the identity of the user who cast it; it cannot be written by hand";
/// The message refusing a `decided-by` annotation the stamp did not write.
pub const DECIDED_BY_MESSAGE: &str = "annotation agentrun.dev/decided-by is written by the agentrun-stamp-decider policy when a decision is set and holds the identity of the user who set it; it cannot be written by hand";
/// The message refusing a change of an AgentRun's creator annotation.
pub const CREATED_BY_IMMUTABLE_MESSAGE: &str =
    "annotation agentrun.dev/created-by is immutable: it records who created the run";
/// The start of the message refusing a GitOps decision while the allow-list is empty.
pub const GITOPS_EMPTY_ALLOW_LIST_MESSAGE: &str =
    "GitOps decisions are refused: the GitOps approver allow-list is empty";
/// Part of the message refusing a GitOps decision for an approver not on the allow-list.
pub const GITOPS_NOT_ALLOWED_MESSAGE: &str = "is not on the GitOps approver allow-list";
/// The start of the message refusing a status change only the controller may make.
pub const RUN_STATUS_MESSAGE: &str =
    "only the agentrun controller may change these status fields of a run";
/// The start of the message refusing a worker's write to a run that is not Running.
pub const RUN_NOT_RUNNING_MESSAGE: &str =
    "a worker writes the results of its step only while the run is Running";
/// The message refusing a change of an ApprovalRequest's finalizers.
pub const REQUEST_FINALIZERS_MESSAGE: &str = "the finalizers of an ApprovalRequest keep the decision record; only the agentrun controller may add, remove or change them";
/// The message refusing a change of an ApprovalRequest's ownerReferences.
pub const REQUEST_OWNERS_MESSAGE: &str = "the ownerReferences of an ApprovalRequest tie the decision record to its run; only the agentrun controller may add, remove or change them";
/// The message refusing a change of an ApprovalRequest's run label.
pub const REQUEST_RUN_LABEL_MESSAGE: &str = "label agentrun.dev/run of an ApprovalRequest names its run; only the agentrun controller may change it";
/// The message refusing the removal of an AgentRun's cleanup finalizer.
pub const RUN_CLEANUP_MESSAGE: &str = "finalizer agentrun.dev/cleanup is removed by the agentrun controller once the run's records are kept; it cannot be removed by hand";

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
    /// The checks: `agentrun-approval-identity`, `agentrun-gitops-approvers`,
    /// `agentrun-run-creator`, `agentrun-run-status`, `agentrun-record-retention`.
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

/// The variables `annotations` and `oldAnnotations`: the object's annotations before and after
/// (empty maps when absent).
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

/// Every admission policy with its binding.
pub fn admission_policies() -> AdmissionPolicies {
    AdmissionPolicies {
        mutating: vec![stamps::stamp_creator(), stamps::stamp_decider()],
        validating: vec![
            decisions::approval_identity(),
            decisions::gitops_approvers(),
            runs::run_creator(),
            runs::run_status(),
            retention::record_retention(),
        ],
    }
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
mod tests;
