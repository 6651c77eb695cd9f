//! How the controller records the resolution of an ApprovalRequest (approved, rejected, expired
//! or superseded) in the request's status, as soon as it observes it: the phase, when it observed
//! the decision (the audit's time, never a field a client writes), and who decided as the API
//! server verified it. Pure.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

use super::decide::{ResolvedDecision, ResolvedKind};
use super::verify::{Decider, Refusal};
use crate::crd::status_patch::{ApprovalRequestStatusPatch, StatusPatch};
use crate::crd::{
    ApprovalPhase, ApprovalRequest, ConditionStatus, ConditionType, GitOpsDecision,
    VerifiedIdentity, arguments_digest, new_condition, set_condition,
};
use crate::time::to_k8s;

/// What a request's status records once its call is resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    /// The request's name.
    pub request: String,
    /// The request's resourceVersion the resolution was made on (the write is guarded by it).
    pub resource_version: Option<String>,
    /// Its final phase.
    pub phase: ApprovalPhase,
    /// When the controller first observed it.
    pub decided_at: DateTime<Utc>,
    /// Who decided, as the API server stamped it (only when that is the approverId).
    pub identity: Option<VerifiedIdentity>,
    /// A GitOps decision: its commit and who applied it.
    pub gitops: Option<GitOpsDecision>,
    /// A quorum's decision: whose votes counted.
    pub voters: Option<Vec<VerifiedIdentity>>,
    /// Approved with edited arguments: their digest.
    pub edited_arguments_digest: Option<String>,
    /// Approved only, when the controller signs assertions: the signed approval assertion.
    pub assertion: Option<String>,
}

impl Resolution {
    /// The resolution of `decision` on `request`.
    pub fn of(decision: &ResolvedDecision, request: Option<&ApprovalRequest>) -> Resolution {
        let (identity, gitops, voters) = match &decision.decider {
            Some(Decider::Verified(identity)) => (Some(identity.clone()), None, None),
            Some(Decider::GitOps(gitops)) => (None, Some(gitops.clone()), None),
            Some(Decider::Voters(voters)) => (None, None, Some(voters.clone())),
            Some(Decider::Claimed | Decider::Policy) | None => (None, None, None),
        };
        let edited_arguments_digest = match &decision.kind {
            ResolvedKind::Approved {
                edited_arguments: Some(edited),
                ..
            } => Some(arguments_digest(edited)),
            _ => None,
        };
        Resolution {
            request: decision.request.clone(),
            resource_version: request.and_then(|r| r.resource_version()),
            phase: phase_of(&decision.kind),
            decided_at: decision.decided_at,
            identity,
            gitops,
            voters,
            edited_arguments_digest,
            assertion: None,
        }
    }

    /// The request's status patch recording this resolution, guarded by the version it was
    /// made on.
    pub fn status_patch(&self) -> StatusPatch<ApprovalRequestStatusPatch> {
        StatusPatch::guarded(
            ApprovalRequestStatusPatch {
                phase: Some(self.phase),
                decided_at: Some(to_k8s(self.decided_at)),
                verified_identity: self.identity.clone(),
                gitops: self.gitops.clone(),
                voters: self.voters.clone(),
                edited_arguments_digest: self.edited_arguments_digest.clone(),
                assertion: self.assertion.clone(),
                ..Default::default()
            },
            self.resource_version.clone(),
        )
    }
}

/// The final phase of a request resolved so.
pub fn phase_of(kind: &ResolvedKind) -> ApprovalPhase {
    match kind {
        ResolvedKind::Approved { .. } => ApprovalPhase::Approved,
        ResolvedKind::Rejected { .. } => ApprovalPhase::Rejected,
        ResolvedKind::Expired => ApprovalPhase::Expired,
        ResolvedKind::Superseded { .. } => ApprovalPhase::Superseded,
    }
}

/// The conditions of `request` saying its decision was refused, if they do not say so already.
pub fn refused_conditions(
    request: &ApprovalRequest,
    refusal: &Refusal,
    now: DateTime<Utc>,
) -> Option<Vec<Condition>> {
    let mut conditions = request
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let changed = set_condition(
        &mut conditions,
        new_condition(
            ConditionType::Verified,
            ConditionStatus::False,
            refusal.reason,
            &refusal.message,
            request.metadata.generation,
            to_k8s(now),
        ),
    );
    changed.then_some(conditions)
}
