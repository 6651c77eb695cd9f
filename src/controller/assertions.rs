//! The approval assertion of an approved request: the claims the controller signs when it records
//! the request's resolution (see [`crate::assertion`]). Pure.
//!
//! An assertion is issued only for a decision the API server stamped (the admission policy's
//! `agentrun.dev/decided-by` annotation): either the stamped user is the `approverId`
//! (`approver_kind: verified`), or a member of the GitOps group applied it with a commit
//! (`approver_kind: gitops`, naming who applied it). Without a stamp no assertion is issued, so
//! a tool that requires one refuses the call (fail closed).

use kube::ResourceExt;

use super::observe::Observed;
use super::resolutions::decision_time;
use super::signing::Issuer;
use crate::assertion::{ApproverKind, Claims};
use crate::crd::keys::annotations;
use crate::crd::policy::{DecidedBy, GITOPS_GROUP};
use crate::crd::{ApprovalRequest, Decision};

/// Why no assertion was issued for a request.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotIssued {
    /// The request is not approved.
    #[error("the request is not approved")]
    NotApproved,
    /// No identity stamp: the decision was not verified by the admission policy.
    #[error("the decision carries no identity stamped by the admission policy")]
    Unverified,
    /// The stamped identity is neither the approver nor a GitOps identity with a commit.
    #[error("the stamped identity {stamped} is not the approver {approver}")]
    ApproverMismatch {
        /// Who set the decision.
        stamped: String,
        /// Whom it names.
        approver: String,
    },
    /// The run's Agent or its tool is gone, so the endpoint is unknown.
    #[error("the Agent has no tool `{0}`")]
    ToolMissing(String),
    /// The tool's URL does not parse.
    #[error("the tool's URL `{0}` is not a URL")]
    BadEndpoint(String),
    /// Signing failed.
    #[error("{0}")]
    Signing(String),
}

/// The signed assertion of `request`, issued now.
pub fn issue(
    issuer: &Issuer,
    observed: &Observed,
    request: &ApprovalRequest,
) -> Result<String, NotIssued> {
    let claims = claims_for(observed, request)?;
    issuer
        .issue(claims, observed.now)
        .map_err(|e| NotIssued::Signing(e.to_string()))
}

/// The claims of `request`'s assertion (their validity times are set when signed).
pub fn claims_for(observed: &Observed, request: &ApprovalRequest) -> Result<Claims, NotIssued> {
    let spec = &request.spec;
    if spec.decision != Some(Decision::Approved) {
        return Err(NotIssued::NotApproved);
    }
    let stamp = request
        .annotations()
        .get(annotations::DECIDED_BY)
        .and_then(|value| DecidedBy::parse(value).ok())
        .ok_or(NotIssued::Unverified)?;
    let approver = spec.approver_id.clone().unwrap_or_default();
    let commit = request
        .annotations()
        .get(annotations::GITOPS_COMMIT)
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty());
    let (approver_kind, applied_by, gitops_commit) = if stamp.username == approver {
        (ApproverKind::Verified, None, None)
    } else if stamp.groups.iter().any(|g| g == GITOPS_GROUP) && commit.is_some() {
        (ApproverKind::Gitops, Some(stamp.username.clone()), commit)
    } else {
        return Err(NotIssued::ApproverMismatch {
            stamped: stamp.username,
            approver,
        });
    };
    let tool = observed
        .agent
        .as_ref()
        .and_then(|agent| agent.spec.tools.iter().find(|t| t.name == spec.tool_name))
        .ok_or_else(|| NotIssued::ToolMissing(spec.tool_name.clone()))?;
    // The URL exactly as the worker's HTTP client sends to it.
    let endpoint = reqwest::Url::parse(&tool.http.url)
        .map_err(|_| NotIssued::BadEndpoint(tool.http.url.clone()))?
        .to_string();
    let uid = request.uid().unwrap_or_default();
    Ok(Claims {
        iss: String::new(),
        aud: endpoint.clone(),
        iat: 0,
        nbf: 0,
        exp: 0,
        jti: if uid.is_empty() {
            format!("{}/{}", spec.agent_run_ref.uid, spec.tool_call_id)
        } else {
            uid
        },
        namespace: request.namespace().unwrap_or_default(),
        run: spec.agent_run_ref.name.clone(),
        run_uid: spec.agent_run_ref.uid.clone(),
        step: spec.step,
        approval_request: request.name_any(),
        tool_call_id: spec.tool_call_id.clone(),
        tool: spec.tool_name.clone(),
        endpoint,
        arguments_sha256: spec.arguments_digest.clone(),
        tool_definition_sha256: String::new(),
        approver,
        approver_kind,
        applied_by,
        gitops_commit,
        decided_at: decision_time(request).unwrap_or(observed.now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assertion::{Expected, Jwks, Signer, verify};
    use crate::crd::{AgentRun, halted_state};

    fn stamped(username: &str, groups: &[&str]) -> ApprovalRequest {
        let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
        request.metadata.uid = Some("req-uid-1".into());
        let stamp = serde_json::json!({"username": username, "uid": "", "groups": groups});
        request
            .annotations_mut()
            .insert(annotations::DECIDED_BY.into(), stamp.to_string());
        request
    }

    #[test]
    fn a_stamped_approval_is_asserted_for_its_endpoint_and_arguments() {
        let observed = Observed::of(AgentRun::test());
        let request = stamped("alice@example.com", &["agentrun:approvers"]);
        let signer = Signer::generate().unwrap();
        let jwks = Jwks::new([signer.jwk()]);
        let issuer = Issuer::new(signer, jwks.clone(), std::time::Duration::from_secs(60));
        let token = issue(&issuer, &observed, &request).unwrap();
        let body = request.spec.arguments.as_bytes();
        let claims = verify(&token, &jwks, &Expected::new("http://127.0.0.1:2/d", body)).unwrap();
        assert_eq!(claims.approver, "alice@example.com");
        assert_eq!(claims.approver_kind, ApproverKind::Verified);
        assert_eq!(claims.jti, "req-uid-1");
        assert_eq!(claims.run_uid, "uid-1");
        assert_eq!(claims.tool, "delete_user");
        assert_eq!(claims.exp - claims.iat, 60);
    }

    #[test]
    fn gitops_decisions_say_so_and_unverified_ones_get_nothing() {
        let observed = Observed::of(AgentRun::test());
        let mut request = stamped("flux", &[GITOPS_GROUP]);
        assert!(matches!(
            claims_for(&observed, &request),
            Err(NotIssued::ApproverMismatch { .. })
        ));
        request
            .annotations_mut()
            .insert(annotations::GITOPS_COMMIT.into(), "4b825dc".into());
        let claims = claims_for(&observed, &request).unwrap();
        assert_eq!(claims.approver_kind, ApproverKind::Gitops);
        assert_eq!(claims.approver, "alice@example.com");
        assert_eq!(claims.applied_by.as_deref(), Some("flux"));
        assert_eq!(claims.gitops_commit.as_deref(), Some("4b825dc"));

        let bob = stamped("bob@example.com", &["agentrun:approvers"]);
        assert!(matches!(
            claims_for(&observed, &bob),
            Err(NotIssued::ApproverMismatch { .. })
        ));
        let unstamped = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
        assert_eq!(
            claims_for(&observed, &unstamped),
            Err(NotIssued::Unverified)
        );
        let undecided = ApprovalRequest::test_for(&halted_state(), None);
        assert_eq!(
            claims_for(&observed, &undecided),
            Err(NotIssued::NotApproved)
        );
        let mut no_agent = observed.clone();
        no_agent.agent = None;
        assert!(matches!(
            claims_for(&no_agent, &stamped("alice@example.com", &[])),
            Err(NotIssued::ToolMissing(_))
        ));
    }
}
