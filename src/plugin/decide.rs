//! `kubectl agentrun approve` and `reject`: a decision written as exactly the merge patch a
//! person would write by hand, with `approverId` taken from the current identity (on a request
//! that needs several approvals, the person's vote under `spec.votes`); or, with `--dry-run`, the
//! manifest to commit for a GitOps decision.

use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::{Map, Value, json};

use super::cli::{ApproveArgs, DryRunArgs, ManifestFormat, RejectArgs};
use super::{FIELD_MANAGER, PluginError, Session, render_manifest};
use crate::crd::approval_request::{
    MAX_ARGUMENTS_LENGTH, MAX_DECISION_TEXT_LENGTH, MAX_IDENTITY_LENGTH,
};
use crate::crd::{API_VERSION, ApprovalPhase, ApprovalRequest, Decision, PolicyAction};

pub use crate::crd::policy::GITOPS_COMMIT_ANNOTATION;
/// The annotation value `--dry-run` writes when no `--commit` is given: replace it with the
/// commit before applying.
pub const COMMIT_PLACEHOLDER: &str = "REPLACE-WITH-THE-COMMIT-SHA";

/// A decision to write, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionInput {
    /// Approved or Rejected.
    pub decision: Decision,
    /// Why (audit only).
    pub reason: String,
    /// Rejected only: what the model is told.
    pub message: Option<String>,
    /// Approved only: the arguments approved instead of the model's (a JSON object).
    pub edited_arguments: Option<String>,
}

impl DecisionInput {
    /// Checks the flags the API server would refuse, with the flag's name in the error.
    pub fn validate(&self) -> Result<(), PluginError> {
        check_text("--reason", &self.reason, MAX_DECISION_TEXT_LENGTH)?;
        if let Some(message) = &self.message {
            check_text("--message", message, MAX_DECISION_TEXT_LENGTH)?;
        }
        if let Some(edited) = &self.edited_arguments {
            check_text("--edit-arguments", edited, MAX_ARGUMENTS_LENGTH)?;
            match serde_json::from_str::<Value>(edited) {
                Ok(Value::Object(_)) => {}
                Ok(_) => {
                    return Err(PluginError::Usage {
                        flag: "--edit-arguments",
                        problem: "must be a JSON object, e.g. '{\"amount\": 50}'".to_owned(),
                    });
                }
                Err(e) => {
                    return Err(PluginError::Usage {
                        flag: "--edit-arguments",
                        problem: format!("is not JSON: {e}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The `spec` fields of the decision with `approver_id`, in the order a person writes them.
    fn spec_fields(&self, approver_id: &str) -> Map<String, Value> {
        let mut spec = Map::new();
        spec.insert("decision".into(), json!(self.decision.as_str()));
        spec.insert("approverId".into(), json!(approver_id));
        spec.insert("reason".into(), json!(self.reason));
        if let Some(message) = &self.message {
            spec.insert("message".into(), json!(message));
        }
        if let Some(edited) = &self.edited_arguments {
            spec.insert("editedArguments".into(), json!(edited));
        }
        spec
    }

    /// The merge patch adding `voter`'s vote (on a request that needs several approvals):
    /// `{"spec":{"votes":{"<user>":{"decision":"Approved","reason":"<why>"}}}}`.
    pub fn vote_patch(&self, voter: &str) -> Value {
        let mut vote = Map::new();
        vote.insert("decision".into(), json!(self.decision.as_str()));
        vote.insert("reason".into(), json!(self.reason));
        if let Some(message) = &self.message {
            vote.insert("message".into(), json!(message));
        }
        json!({"spec": {"votes": {voter: vote}}})
    }

    /// The merge patch a person would write by hand:
    /// `{"spec":{"decision":"Approved","approverId":"<user>","reason":"<why>"}}` (Rejected adds
    /// `message`).
    pub fn merge_patch(&self, approver_id: &str) -> Value {
        json!({"spec": self.spec_fields(approver_id)})
    }

    /// The manifest to commit for a GitOps decision on `request`, for
    /// `kubectl apply --server-side`: apiVersion, kind, metadata (name, namespace and the
    /// [`GITOPS_COMMIT_ANNOTATION`], `commit` or [`COMMIT_PLACEHOLDER`]) and the decision fields
    /// of spec only (the request fields stay owned by the controller).
    pub fn gitops_manifest(
        &self,
        request: &ApprovalRequest,
        approver_id: &str,
        commit: Option<&str>,
    ) -> Value {
        json!({
            "apiVersion": API_VERSION,
            "kind": "ApprovalRequest",
            "metadata": {
                "name": request.name_any(),
                "namespace": request.namespace(),
                "annotations": {GITOPS_COMMIT_ANNOTATION: commit.unwrap_or(COMMIT_PLACEHOLDER)},
            },
            "spec": self.spec_fields(approver_id),
        })
    }
}

fn check_text(flag: &'static str, value: &str, max: usize) -> Result<(), PluginError> {
    if value.trim().is_empty() {
        return Err(PluginError::Usage {
            flag,
            problem: "must not be empty".to_owned(),
        });
    }
    let length = value.chars().count();
    if length > max {
        return Err(PluginError::Usage {
            flag,
            problem: format!("{length} characters; the API server accepts at most {max}"),
        });
    }
    Ok(())
}

/// Refuses a request that already has a decision (decisions are final), that a policy decided,
/// or that the controller closed as Expired or Superseded.
pub fn check_decidable(request: &ApprovalRequest) -> Result<(), PluginError> {
    let name = request.name_any();
    if let Some(policy) = request.spec.policy_decision() {
        return Err(PluginError::AlreadyDecided {
            name,
            decision: match policy.action {
                PolicyAction::Deny => Decision::Rejected.to_string(),
                _ => Decision::Approved.to_string(),
            },
            approver: policy.approver_id(),
        });
    }
    if let Some(decision) = request.spec.decision {
        return Err(PluginError::AlreadyDecided {
            name,
            decision: decision.to_string(),
            approver: request
                .spec
                .approver_id
                .clone()
                .unwrap_or_else(|| "unknown".to_owned()),
        });
    }
    match request.status.as_ref().and_then(|s| s.phase) {
        Some(phase @ (ApprovalPhase::Expired | ApprovalPhase::Superseded)) => {
            Err(PluginError::NotDecidable {
                name,
                phase: phase.to_string(),
            })
        }
        _ => Ok(()),
    }
}

/// The comment on top of a YAML GitOps manifest: what it decides and how to apply it.
fn manifest_comment(
    request: &ApprovalRequest,
    input: &DecisionInput,
    commit: Option<&str>,
) -> String {
    let spec = &request.spec;
    let mut comment = format!(
        "# {} tool call {} ({}) of agentrun {}\n# arguments sha256: {}\n",
        input.decision,
        super::text::one_line(&spec.tool_call_id),
        super::text::one_line(&spec.tool_name),
        spec.agent_run_ref.name,
        spec.arguments_digest,
    );
    if commit.is_none() {
        comment.push_str(&format!(
            "# Replace {COMMIT_PLACEHOLDER} with the commit of this file, then:\n"
        ));
    }
    comment.push_str("# kubectl apply --server-side -f <this file>\n");
    comment
}

/// Decides `name` as the current identity (or prints the GitOps manifest with `--dry-run`).
pub async fn decide(
    session: &Session,
    name: &str,
    input: &DecisionInput,
    dry_run: &DryRunArgs,
    output: Option<ManifestFormat>,
) -> Result<String, PluginError> {
    input.validate()?;
    if let Some(approver) = &dry_run.approver_id {
        check_text("--approver-id", approver, MAX_IDENTITY_LENGTH)?;
    }
    if let Some(commit) = &dry_run.commit {
        check_text("--commit", commit, 253)?;
    }
    let request = session.request(name).await?;
    check_decidable(&request)?;
    if request.spec.is_quorum() {
        return vote(session, &request, input, dry_run, output).await;
    }
    if dry_run.dry_run {
        let approver = match &dry_run.approver_id {
            Some(approver) => approver.clone(),
            None => session.username().await?,
        };
        let commit = dry_run.commit.as_deref();
        let manifest = input.gitops_manifest(&request, &approver, commit);
        let format = output.unwrap_or_default();
        let body = render_manifest(&manifest, format, "the manifest")?;
        return Ok(match format {
            ManifestFormat::Yaml => format!("{}{body}", manifest_comment(&request, input, commit)),
            ManifestFormat::Json => body,
        });
    }
    let approver = session.username().await?;
    let patch = input.merge_patch(&approver);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    let mut updated = session
        .requests()
        .patch(name, &params, &Patch::Merge(&patch))
        .await
        .map_err(|e| PluginError::api(format!("patch approvalrequest {name}"), &e))?;
    match output {
        Some(format) => {
            updated.managed_fields_mut().clear();
            render_manifest(&updated, format, "the approval request")
        }
        None => {
            let verb = match input.decision {
                Decision::Approved => "approved",
                Decision::Rejected => "rejected",
            };
            Ok(format!(
                "approvalrequest.agentrun.dev/{name} {verb} by {approver}\n"
            ))
        }
    }
}

/// Adds the current identity's vote to `request`, which needs several approvals.
async fn vote(
    session: &Session,
    request: &ApprovalRequest,
    input: &DecisionInput,
    dry_run: &DryRunArgs,
    output: Option<ManifestFormat>,
) -> Result<String, PluginError> {
    let name = request.name_any();
    let needed = request.spec.approvals_needed();
    if dry_run.dry_run {
        return Err(PluginError::Usage {
            flag: "--dry-run",
            problem: format!(
                "{name} needs {needed} approvals: each approver votes as themselves, which a GitOps identity cannot do for them"
            ),
        });
    }
    if input.edited_arguments.is_some() {
        return Err(PluginError::Usage {
            flag: "--edit-arguments",
            problem: format!(
                "{name} needs {needed} approvals: arguments can be edited only on a request one person decides"
            ),
        });
    }
    let voter = session.username().await?;
    if let Some(existing) = request.spec.votes.get(&voter) {
        return Err(PluginError::AlreadyDecided {
            name,
            decision: format!("your vote: {}", existing.decision),
            approver: voter,
        });
    }
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..Default::default()
    };
    let mut updated = session
        .requests()
        .patch(&name, &params, &Patch::Merge(&input.vote_patch(&voter)))
        .await
        .map_err(|e| PluginError::api(format!("patch approvalrequest {name}"), &e))?;
    if let Some(format) = output {
        updated.managed_fields_mut().clear();
        return render_manifest(&updated, format, "the approval request");
    }
    let approvals = updated
        .spec
        .votes
        .values()
        .filter(|v| v.decision == Decision::Approved)
        .count();
    Ok(match input.decision {
        Decision::Approved => format!(
            "approvalrequest.agentrun.dev/{name}: {voter} voted Approved ({approvals} of {needed} approvals)\n"
        ),
        Decision::Rejected => {
            format!(
                "approvalrequest.agentrun.dev/{name}: {voter} voted Rejected (a rejection rejects it)\n"
            )
        }
    })
}

/// Runs `approve`.
pub async fn approve(session: &Session, args: &ApproveArgs) -> Result<String, PluginError> {
    let input = DecisionInput {
        decision: Decision::Approved,
        reason: args.reason.clone(),
        message: None,
        edited_arguments: args.edit_arguments.clone(),
    };
    decide(session, &args.request, &input, &args.dry_run, args.output).await
}

/// Runs `reject`.
pub async fn reject(session: &Session, args: &RejectArgs) -> Result<String, PluginError> {
    let input = DecisionInput {
        decision: Decision::Rejected,
        reason: args.reason.clone(),
        message: Some(args.message.clone()),
        edited_arguments: None,
    };
    decide(session, &args.request, &input, &args.dry_run, args.output).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{ApprovalRequestSpec, ApprovalRequestStatus};

    fn approve(reason: &str) -> DecisionInput {
        DecisionInput {
            decision: Decision::Approved,
            reason: reason.into(),
            message: None,
            edited_arguments: None,
        }
    }

    fn request() -> ApprovalRequest {
        let mut r = ApprovalRequest::new(
            "r1-call-1",
            ApprovalRequestSpec {
                tool_call_id: "call_1".into(),
                tool_name: "delete_user".into(),
                arguments: "{}".into(),
                arguments_digest: crate::crd::arguments_digest("{}"),
                ..Default::default()
            },
        );
        r.spec.agent_run_ref.name = "r1".into();
        r.metadata.namespace = Some("team".into());
        r
    }

    #[test]
    fn the_patch_is_the_one_a_person_writes() {
        let patch = approve("authorized per change CR-1234").merge_patch("alice@example.com");
        assert_eq!(
            patch.to_string(),
            r#"{"spec":{"decision":"Approved","approverId":"alice@example.com","reason":"authorized per change CR-1234"}}"#
        );
        let reject = DecisionInput {
            decision: Decision::Rejected,
            reason: "policy".into(),
            message: Some("Not authorized".into()),
            edited_arguments: None,
        };
        assert_eq!(
            reject.merge_patch("bob@example.com").to_string(),
            r#"{"spec":{"decision":"Rejected","approverId":"bob@example.com","reason":"policy","message":"Not authorized"}}"#
        );
    }

    #[test]
    fn the_gitops_manifest_has_only_the_decision_fields() {
        let manifest =
            approve("CR-1").gitops_manifest(&request(), "alice@example.com", Some("abc123"));
        assert_eq!(
            manifest,
            json!({
                "apiVersion": "agentrun.dev/v1alpha1",
                "kind": "ApprovalRequest",
                "metadata": {"name": "r1-call-1", "namespace": "team",
                             "annotations": {"agentrun.dev/gitops-commit": "abc123"}},
                "spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "CR-1"}
            })
        );
        let placeholder = approve("CR-1").gitops_manifest(&request(), "alice@example.com", None);
        assert_eq!(
            placeholder["metadata"]["annotations"][GITOPS_COMMIT_ANNOTATION],
            COMMIT_PLACEHOLDER
        );
        let comment = manifest_comment(&request(), &approve("CR-1"), None);
        assert!(comment.lines().all(|l| l.starts_with("# ")), "{comment}");
        assert!(
            comment.contains(&crate::crd::arguments_digest("{}")),
            "{comment}"
        );
    }

    #[test]
    fn decided_expired_and_superseded_requests_are_refused() {
        assert!(check_decidable(&request()).is_ok());
        let mut decided = request();
        decided.spec.decision = Some(Decision::Approved);
        decided.spec.approver_id = Some("alice@example.com".into());
        let err = check_decidable(&decided).unwrap_err();
        assert_eq!(err.exit_code(), 1);
        assert_eq!(
            err.to_string(),
            "approvalrequest r1-call-1 already has a decision (Approved by alice@example.com): a decision is final and cannot be changed"
        );
        let mut expired = request();
        expired.status = Some(ApprovalRequestStatus {
            phase: Some(ApprovalPhase::Expired),
            ..Default::default()
        });
        let err = check_decidable(&expired).unwrap_err().to_string();
        assert_eq!(
            err,
            "approvalrequest r1-call-1 is Expired: it can no longer be decided"
        );
    }

    #[test]
    fn empty_or_oversized_texts_are_usage_errors() {
        let err = approve("  ").validate().unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert_eq!(err.to_string(), "invalid --reason: must not be empty");
        let err = approve(&"x".repeat(MAX_DECISION_TEXT_LENGTH + 1))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("at most 4096"), "{err}");
        let reject = DecisionInput {
            decision: Decision::Rejected,
            reason: "r".into(),
            message: Some(String::new()),
            edited_arguments: None,
        };
        assert!(
            reject
                .validate()
                .unwrap_err()
                .to_string()
                .contains("--message")
        );
        assert!(approve("CR-1").validate().is_ok());
    }

    #[test]
    fn votes_and_edits_are_the_patches_a_person_writes() {
        let vote = DecisionInput {
            decision: Decision::Rejected,
            reason: "too much".into(),
            message: Some("No.".into()),
            edited_arguments: None,
        };
        assert_eq!(
            vote.vote_patch("bob@example.com").to_string(),
            r#"{"spec":{"votes":{"bob@example.com":{"decision":"Rejected","reason":"too much","message":"No."}}}}"#
        );
        let mut edit = approve("capped");
        edit.edited_arguments = Some(r#"{"amount": 50}"#.into());
        assert!(edit.validate().is_ok());
        assert_eq!(
            edit.merge_patch("alice").to_string(),
            r#"{"spec":{"decision":"Approved","approverId":"alice","reason":"capped","editedArguments":"{\"amount\": 50}"}}"#
        );
        edit.edited_arguments = Some("[50]".into());
        assert!(
            edit.validate()
                .unwrap_err()
                .to_string()
                .contains("JSON object")
        );
        edit.edited_arguments = Some("{".into());
        assert!(
            edit.validate()
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
    }

    #[test]
    fn a_request_a_policy_decided_takes_no_decision() {
        let mut decided = request();
        decided.spec.policy = Some(crate::crd::PolicyDecision {
            name: Some("prod".into()),
            rule: Some("no-drops".into()),
            action: PolicyAction::Deny,
            ..Default::default()
        });
        let err = check_decidable(&decided).unwrap_err().to_string();
        assert!(err.contains("Rejected by policy:prod/no-drops"), "{err}");
    }
}
