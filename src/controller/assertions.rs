//! The approval assertion of an approved request: the claims the controller signs when it records
//! the request's resolution (see [`crate::assertion`]). Pure.
//!
//! An assertion is issued only for an approval the controller verified: the API server stamped
//! the approver it names (`approver_kind: verified`), or a member of the GitOps group applied it
//! with a commit (`approver_kind: gitops`, naming who applied it). A decision applied without a
//! stamp (only under `--allow-unverified-decisions`) gets none, so a tool that requires one
//! refuses the call (fail closed). The endpoint and the tool definition are those of the Agent
//! the run is bound to: an HTTP tool's URL and definition digest, or an MCP tool's server URL and
//! the digest of the definition the run's snapshot holds.

use kube::ResourceExt;

use super::decide::{ResolvedDecision, ResolvedKind};
use super::observe::Observed;
use super::signing::Issuer;
use super::verify::Decider;
use crate::assertion::{ApproverKind, Claims};
use crate::crd::{ApprovalRequest, arguments_digest};

/// Why no assertion was issued for a request.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotIssued {
    /// The request is not approved.
    #[error("the request is not approved")]
    NotApproved,
    /// Nothing verified who approved (the decision is claimed).
    #[error("the approval is not verified")]
    Unverified,
    /// The run's Agent has no such tool, so the endpoint is unknown.
    #[error("the Agent has no tool `{0}`")]
    ToolMissing(String),
    /// The tool's URL does not parse.
    #[error("the tool's URL `{0}` is not a URL")]
    BadEndpoint(String),
    /// Signing failed.
    #[error("{0}")]
    Signing(String),
}

/// The signed assertion of the approval `decision` on `request`, issued now.
pub fn issue(
    issuer: &Issuer,
    observed: &Observed,
    request: &ApprovalRequest,
    decision: &ResolvedDecision,
) -> Result<String, NotIssued> {
    let claims = claims_for(observed, request, decision)?;
    issuer
        .issue(claims, observed.now)
        .map_err(|e| NotIssued::Signing(e.to_string()))
}

/// The claims of the assertion of `decision` on `request` (their validity times are set when
/// signed).
pub fn claims_for(
    observed: &Observed,
    request: &ApprovalRequest,
    decision: &ResolvedDecision,
) -> Result<Claims, NotIssued> {
    let spec = &request.spec;
    let ResolvedKind::Approved {
        approver_id,
        edited_arguments,
        ..
    } = &decision.kind
    else {
        return Err(NotIssued::NotApproved);
    };
    let (approver_kind, applied_by, gitops_commit) = match &decision.decider {
        Some(Decider::Verified(_)) => (ApproverKind::Verified, None, None),
        Some(Decider::Voters(_)) => (ApproverKind::Quorum, None, None),
        Some(Decider::Policy) => (ApproverKind::Policy, None, None),
        Some(Decider::GitOps(gitops)) => (
            ApproverKind::Gitops,
            Some(gitops.applied_by.username.clone()),
            Some(gitops.commit.clone()),
        ),
        Some(Decider::Claimed) | None => return Err(NotIssued::Unverified),
    };
    // An HTTP tool of the run's Agent, or a tool of one of its MCP servers (the definition the
    // run is bound to).
    let tool = observed
        .tool_binding(&spec.tool_name)
        .ok_or_else(|| NotIssued::ToolMissing(spec.tool_name.clone()))?;
    // The URL exactly as the worker's HTTP client sends to it.
    let endpoint = reqwest::Url::parse(&tool.endpoint)
        .map_err(|_| NotIssued::BadEndpoint(tool.endpoint.clone()))?
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
        arguments_sha256: edited_arguments
            .as_deref()
            .map_or_else(|| spec.arguments_digest.clone(), arguments_digest),
        original_arguments_sha256: edited_arguments
            .as_ref()
            .map(|_| spec.arguments_digest.clone()),
        tool_definition_sha256: tool.definition_digest,
        approver: approver_id.clone().unwrap_or_default(),
        approver_kind,
        applied_by,
        gitops_commit,
        decided_at: decision.decided_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assertion::{Expected, Jwks, Signer, verify};
    use crate::crd::{AgentRun, Decision, GitOpsDecision, VerifiedIdentity, halted_state};

    fn approval(decider: Option<Decider>) -> (ApprovalRequest, ResolvedDecision) {
        let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
        request.metadata.uid = Some("req-uid-1".into());
        let decision = ResolvedDecision {
            request: request.name_any(),
            tool_call_id: "call_1".into(),
            kind: ResolvedKind::Approved {
                approver_id: Some("alice@example.com".into()),
                reason: Some("CR-1234".into()),
                edited_arguments: None,
            },
            decided_at: chrono::Utc::now(),
            decider,
            new: true,
        };
        (request, decision)
    }

    fn alice() -> Option<Decider> {
        Some(Decider::Verified(VerifiedIdentity {
            username: "alice@example.com".into(),
            ..Default::default()
        }))
    }

    #[test]
    fn a_verified_approval_is_asserted_for_its_endpoint_tool_and_arguments() {
        let observed = Observed::of(AgentRun::test());
        let (request, decision) = approval(alice());
        let signer = Signer::generate().unwrap();
        let jwks = Jwks::new([signer.jwk()]);
        let issuer = Issuer::new(signer, jwks.clone(), std::time::Duration::from_secs(60));
        let token = issue(&issuer, &observed, &request, &decision).unwrap();
        let body = request.spec.arguments.as_bytes();
        let claims = verify(&token, &jwks, &Expected::new("http://127.0.0.1:2/d", body)).unwrap();
        assert_eq!(claims.approver, "alice@example.com");
        assert_eq!(claims.approver_kind, ApproverKind::Verified);
        assert_eq!(claims.jti, "req-uid-1");
        assert_eq!(claims.run_uid, "uid-1");
        assert_eq!(claims.tool, "delete_user");
        assert_eq!(
            Some(claims.tool_definition_sha256),
            request.spec.tool_definition_digest
        );
        assert_eq!(claims.exp - claims.iat, 60);
    }

    #[test]
    fn gitops_approvals_say_so_and_claimed_ones_get_nothing() {
        let observed = Observed::of(AgentRun::test());
        let (request, decision) = approval(Some(Decider::GitOps(GitOpsDecision {
            commit: "4b825dc".into(),
            applied_by: VerifiedIdentity {
                username: "flux".into(),
                ..Default::default()
            },
        })));
        let claims = claims_for(&observed, &request, &decision).unwrap();
        assert_eq!(claims.approver_kind, ApproverKind::Gitops);
        assert_eq!(claims.approver, "alice@example.com");
        assert_eq!(claims.applied_by.as_deref(), Some("flux"));
        assert_eq!(claims.gitops_commit.as_deref(), Some("4b825dc"));

        let (request, claimed) = approval(Some(Decider::Claimed));
        assert_eq!(
            claims_for(&observed, &request, &claimed),
            Err(NotIssued::Unverified)
        );
        let mut rejected = claimed.clone();
        rejected.kind = ResolvedKind::Expired;
        assert_eq!(
            claims_for(&observed, &request, &rejected),
            Err(NotIssued::NotApproved)
        );
        let mut no_agent = observed.clone();
        no_agent.agent = None;
        let (request, verified) = approval(alice());
        assert!(matches!(
            claims_for(&no_agent, &request, &verified),
            Err(NotIssued::ToolMissing(_))
        ));
    }
}
