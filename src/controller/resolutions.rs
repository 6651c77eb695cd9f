//! How the controller resolves ApprovalRequests: what a request's status records once its call
//! is decided (approved, rejected, expired or superseded), when the decision was made and by whom,
//! and the repair of resolutions a stopped controller applied but did not record. Pure.

use chrono::{DateTime, Utc};
use kube::{Resource, ResourceExt};

use super::assertions;
use super::observe::Observed;
use super::signing::Issuer;
use crate::crd::keys::{annotations, field_managers};
use crate::crd::policy::DecidedBy;
use crate::crd::status_patch::ApprovalRequestStatusPatch;
use crate::crd::{ApprovalPhase, ApprovalRequest, Decision, VerifiedIdentity};
use crate::time::{from_jiff, to_k8s};

/// How the controller resolved one ApprovalRequest: what its status records.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    /// The request's name.
    pub request: String,
    /// Its final phase.
    pub phase: ApprovalPhase,
    /// When it was decided.
    pub decided_at: DateTime<Utc>,
    /// Who decided, as the API server verified it.
    pub identity: Option<VerifiedIdentity>,
    /// Approved only, when the controller signs assertions: the signed approval assertion.
    pub assertion: Option<String>,
}

impl Resolution {
    /// The request's status patch recording this resolution.
    pub fn status_patch(&self) -> ApprovalRequestStatusPatch {
        ApprovalRequestStatusPatch {
            phase: Some(self.phase),
            decided_at: Some(to_k8s(self.decided_at)),
            verified_identity: self.identity.clone(),
            assertion: self.assertion.clone(),
            ..Default::default()
        }
    }

    /// Whether `request`'s status already records this resolution (a retry after a failed run
    /// patch finds it so).
    pub fn is_recorded_on(&self, request: &ApprovalRequest) -> bool {
        request
            .status
            .as_ref()
            .is_some_and(|s| s.phase == Some(self.phase) && s.decided_at.is_some())
    }
}

/// When a person set the decision: the latest write to the request's spec by anyone but the
/// controller (from its managed fields).
pub fn decision_time(request: &ApprovalRequest) -> Option<DateTime<Utc>> {
    request
        .meta()
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.manager.as_deref() != Some(field_managers::CONTROLLER) && m.subresource.is_none()
        })
        .filter_map(|m| m.time.as_ref())
        .map(|t| from_jiff(&t.0))
        .max()
}

/// The identity the admission policy verified and stamped when the decision was set.
pub fn verified_identity(request: &ApprovalRequest) -> Option<VerifiedIdentity> {
    let stamp = request.annotations().get(annotations::DECIDED_BY)?;
    DecidedBy::parse(stamp)
        .ok()
        .map(|d| d.to_verified_identity())
}

/// The identity the stamping policy recorded; on servers without it, the approverId the
/// validating policy checked against the authenticated user.
pub fn verified_identity_or_claimed(request: &ApprovalRequest) -> Option<VerifiedIdentity> {
    verified_identity(request).or_else(|| {
        request
            .spec
            .approver_id
            .clone()
            .map(|username| VerifiedIdentity {
                username,
                uid: None,
                groups: vec![],
            })
    })
}

/// The resolutions to record again: requests of earlier steps of this run that a person decided
/// but whose status still says Pending (the resume that applied them stopped before recording
/// them; its run patch, the proof the decision was applied, came first), and that this replica
/// has not just recorded. Everything their status needs is on the request itself (and, with an
/// `issuer`, an approval's assertion is issued now).
pub fn repairs(observed: &Observed, issuer: Option<&Issuer>) -> Vec<Resolution> {
    let step = observed
        .run
        .status
        .as_ref()
        .and_then(|s| s.step)
        .unwrap_or(0);
    let uid = observed.run.uid().unwrap_or_default();
    observed
        .requests
        .iter()
        .filter(|r| r.spec.step < step && r.spec.agent_run_ref.uid == uid)
        .filter(|r| {
            r.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_none_or(|p| p == ApprovalPhase::Pending)
        })
        .filter(|r| !observed.recorded.contains(&r.name_any()))
        .filter_map(|r| {
            let phase = match r.spec.decision? {
                Decision::Approved => ApprovalPhase::Approved,
                Decision::Rejected => ApprovalPhase::Rejected,
            };
            Some(Resolution {
                request: r.name_any(),
                phase,
                decided_at: decision_time(r).unwrap_or(observed.now),
                identity: verified_identity_or_claimed(r),
                assertion: issuer.and_then(|i| assertions::issue(i, observed, r).ok()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AgentRun, AgentRunPhase, halted_state};

    #[test]
    fn decisions_applied_but_not_recorded_are_found() {
        let halted = halted_state();
        let mut o = Observed::of(
            AgentRun::test()
                .in_phase(Some(AgentRunPhase::Running))
                .at_step(1),
        );
        let decided = ApprovalRequest::test_for(&halted, Some(Decision::Approved));
        o.requests = vec![decided.clone()];
        let found = repairs(&o, None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].phase, ApprovalPhase::Approved);
        assert_eq!(
            found[0].identity.as_ref().unwrap().username,
            "alice@example.com"
        );

        let mut recorded = decided.clone();
        recorded.status.as_mut().unwrap().phase = Some(ApprovalPhase::Approved);
        let undecided = ApprovalRequest::test_for(&halted, None);
        let mut other_run = decided.clone();
        other_run.spec.agent_run_ref.uid = "uid-2".into();
        o.requests = vec![recorded, undecided, other_run];
        assert!(repairs(&o, None).is_empty());
        // Just recorded by this replica: the cache lags, nothing to repeat.
        o.requests = vec![decided.clone()];
        o.recorded.insert(decided.name_any());
        assert!(repairs(&o, None).is_empty());
        // The current step's decisions are the resume's to apply, not a repair's.
        o.recorded.clear();
        o.run.status.as_mut().unwrap().step = Some(0);
        assert!(repairs(&o, None).is_empty());
    }

    #[test]
    fn the_stamped_identity_wins_over_the_claimed_one() {
        let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
        assert_eq!(
            verified_identity_or_claimed(&request).unwrap().username,
            "alice@example.com"
        );
        request.metadata.annotations = Some(
            [(
                annotations::DECIDED_BY.to_owned(),
                r#"{"username":"alice@example.com","uid":"","groups":["agentrun:approvers"]}"#
                    .to_owned(),
            )]
            .into(),
        );
        let identity = verified_identity(&request).unwrap();
        assert_eq!(identity.groups, ["agentrun:approvers"]);
        assert_eq!(identity.uid, None);
    }
}
