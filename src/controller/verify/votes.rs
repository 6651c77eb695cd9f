//! Votes on a request that needs several approvals: each counts only when the admission policy
//! stamped, into the vote, the identity that cast it and that identity is the vote's key; the
//! same checks as a single decision follow (separation of duties, the rule's approvers).

use super::{
    DecisionContext, DecisionRules, Refusal, check_separation, normalize, not_an_approver_message,
};
use crate::crd::policy::DecidedBy;
use crate::crd::{ApprovalRequest, Decision, VerifiedIdentity, Vote};

/// Checks the vote under `key` of `request`; `Ok` holds who cast it.
pub fn verify_vote(
    request: &ApprovalRequest,
    key: &str,
    vote: &Vote,
    cx: DecisionContext<'_>,
    rules: &DecisionRules,
) -> Result<VerifiedIdentity, Refusal> {
    if !cx.policies_installed {
        return Err(Refusal::unverified(
            "the admission policies that stamp votes are not installed, so no vote can be verified",
        ));
    }
    let Some(text) = vote.decided_by.as_deref() else {
        return Err(Refusal::unverified(format!(
            "the vote of {key} carries no decidedBy stamp of who cast it"
        )));
    };
    let stamp = DecidedBy::parse(text).map_err(|e| Refusal::unverified(e.to_string()))?;
    if normalize(&stamp.username) != normalize(key) {
        return Err(Refusal::unverified(format!(
            "the vote of {key} was cast by {}",
            stamp.username
        )));
    }
    check_separation(&[Some(key)], &stamp.username, cx, rules).map_err(|refusal| Refusal {
        message: format!("the vote of {key} does not count: {}", refusal.message),
        ..refusal
    })?;
    if let Some(approvers) = &request.spec.approvers
        && !approvers.permits(&stamp.username, &stamp.groups)
    {
        return Err(Refusal::not_an_approver(format!(
            "the vote of {key} does not count: {}",
            not_an_approver_message(key)
        )));
    }
    Ok(stamp.to_verified_identity())
}

/// The votes of a request counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Rejected (by the first verified rejection) or Approved (by enough distinct verified
    /// approvals), with whose votes counted; `None` while more votes are needed.
    pub outcome: Option<(Decision, Vec<VerifiedIdentity>)>,
    /// The votes that do not count, by voter, with why.
    pub refused: Vec<(String, Refusal)>,
}

/// Counts the votes of `request`: any verified rejection rejects it; `requiredApprovals`
/// verified approvals of distinct people (compared normalised) approve it.
pub fn tally(request: &ApprovalRequest, cx: DecisionContext<'_>, rules: &DecisionRules) -> Tally {
    let mut tally = Tally::default();
    let mut approvals: Vec<VerifiedIdentity> = vec![];
    let mut rejection = None;
    for (key, vote) in &request.spec.votes {
        match verify_vote(request, key, vote, cx, rules) {
            Err(refusal) => tally.refused.push((key.clone(), refusal)),
            Ok(identity) if vote.decision == Decision::Rejected => {
                rejection.get_or_insert(identity);
            }
            Ok(identity) => {
                let person = normalize(&identity.username);
                if !approvals.iter().any(|a| normalize(&a.username) == person) {
                    approvals.push(identity);
                }
            }
        }
    }
    tally.outcome = match rejection {
        Some(rejecter) => Some((Decision::Rejected, vec![rejecter])),
        None if approvals.len() >= request.spec.approvals_needed() as usize => {
            Some((Decision::Approved, approvals))
        }
        None => None,
    };
    tally
}
