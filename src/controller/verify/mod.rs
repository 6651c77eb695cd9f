//! What the controller checks before it trusts anything it did not write itself (see
//! `docs/security.md`), pure:
//!
//! - a decision counts only when the API server stamped the identity that set it and that
//!   identity is the approver the decision names (or a GitOps identity applied it, which is
//!   recorded as such), and the approver is not the run's creator;
//!   a request restricted to `approvers` takes decisions only from them;
//! - a vote on a request that needs several approvals counts only when the API server stamped it
//!   into the vote of the same person ([`votes`]);
//! - the RunState's copy of the decisions (`approved_tools`, `rejected_tools`,
//!   `approval_metadata`) matches the ApprovalRequests, and the calls' arguments in the
//!   conversation are the ones the requests show ([`copy`]).

mod copy;
mod votes;

use std::collections::BTreeMap;

use kube::ResourceExt;

use crate::crd::keys::annotations;
use crate::crd::policy::{DecidedBy, GITOPS_GROUP};
use crate::crd::{ApprovalRequest, GitOpsDecision, Reason, VerifiedIdentity};

pub use copy::verify_copy;
pub use votes::{Tally, tally, verify_vote};

/// The admin's rules for decisions (controller flags; never an Agent's or a run's field).
#[derive(Clone, Debug)]
pub struct DecisionRules {
    /// Let a run's creator decide its own requests.
    pub allow_self_approval: bool,
    /// Apply decisions without an API-server stamp (clusters without the admission policies):
    /// the approverId is then recorded as claimed, never as verified.
    pub allow_unverified_decisions: bool,
    /// Refuse decisions of approvers who may create runs or impersonate ServiceAccounts in the
    /// run's namespace (and so could approve runs they requested under another name).
    pub strict_separation_of_duties: bool,
    /// The group whose members may apply decisions claimed for someone else (with a commit).
    pub gitops_group: String,
}

impl Default for DecisionRules {
    fn default() -> Self {
        DecisionRules {
            allow_self_approval: false,
            allow_unverified_decisions: false,
            strict_separation_of_duties: false,
            gitops_group: GITOPS_GROUP.to_owned(),
        }
    }
}

/// An identity as compared: surrounding whitespace trimmed, lowercase.
pub fn normalize(identity: &str) -> String {
    identity.trim().to_lowercase()
}

/// Who decided, as far as the controller can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decider {
    /// The API server stamped this identity, which is the approverId.
    Verified(VerifiedIdentity),
    /// A GitOps identity applied a decision claimed for the approverId.
    GitOps(GitOpsDecision),
    /// Nothing verified it (allowed only by `allow_unverified_decisions`).
    Claimed,
    /// Several people approved (or one rejected) by votes the API server stamped.
    Voters(Vec<VerifiedIdentity>),
    /// An ApprovalPolicy decided (its rule is on the request).
    Policy,
}

/// What a decider may do in the run's namespace (strict separation of duties).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeciderRights {
    /// May create AgentRuns.
    pub create_runs: bool,
    /// May impersonate ServiceAccounts.
    pub impersonate_service_accounts: bool,
}

/// What the decision check needs besides the request.
#[derive(Clone, Copy, Debug)]
pub struct DecisionContext<'a> {
    /// The admission policies that stamp and check decisions are installed.
    pub policies_installed: bool,
    /// The run's creator (its stamped `created-by`).
    pub creator: Option<&'a str>,
    /// What the deciders may do, by stamped username, when strict separation of duties asked.
    pub rights: &'a BTreeMap<String, DeciderRights>,
}

/// A decision that is not applied, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `UnverifiedDecision` or `SeparationOfDuties`.
    pub reason: Reason,
    /// What was wrong, for people.
    pub message: String,
}

impl Refusal {
    fn unverified(message: impl Into<String>) -> Refusal {
        Refusal {
            reason: Reason::UnverifiedDecision,
            message: message.into(),
        }
    }

    fn separation(message: impl Into<String>) -> Refusal {
        Refusal {
            reason: Reason::SeparationOfDuties,
            message: message.into(),
        }
    }

    fn not_an_approver(message: impl Into<String>) -> Refusal {
        Refusal {
            reason: Reason::NotAnApprover,
            message: message.into(),
        }
    }
}

/// Checks who made the decision on `request` (which must have one).
pub fn verify_decision(
    request: &ApprovalRequest,
    cx: DecisionContext<'_>,
    rules: &DecisionRules,
) -> Result<Decider, Refusal> {
    let approver = request.spec.approver_id.as_deref().unwrap_or_default();
    if approver.trim().is_empty() {
        return Err(Refusal::unverified("the decision names no approverId"));
    }
    let decider = if cx.policies_installed {
        stamped_decider(request, approver, rules)?
    } else if rules.allow_unverified_decisions {
        // Without the policies a stamp can be written by anyone: it is not evidence.
        Decider::Claimed
    } else {
        return Err(Refusal::unverified(
            "the admission policies that stamp who decided are not installed, so no decision can be verified",
        ));
    };
    let stamped = stamped_username(&decider);
    let who = stamped.unwrap_or(approver);
    check_separation(&[Some(approver), stamped], who, cx, rules)?;
    if let Some(approvers) = &request.spec.approvers {
        let permitted = match &decider {
            Decider::Verified(identity) => approvers.permits(&identity.username, &identity.groups),
            // Only the approver's name is known: it must be listed by name.
            _ => approvers.permits(approver, &[]),
        };
        if !permitted {
            return Err(Refusal::not_an_approver(not_an_approver_message(approver)));
        }
    }
    Ok(decider)
}

/// The decider the admission policy's stamp shows.
fn stamped_decider(
    request: &ApprovalRequest,
    approver: &str,
    rules: &DecisionRules,
) -> Result<Decider, Refusal> {
    let Some(text) = request.annotations().get(annotations::DECIDED_BY) else {
        if rules.allow_unverified_decisions {
            return Ok(Decider::Claimed);
        }
        return Err(Refusal::unverified(format!(
            "the decision carries no {} stamp of who set it",
            annotations::DECIDED_BY
        )));
    };
    let stamp = DecidedBy::parse(text).map_err(|e| Refusal::unverified(e.to_string()))?;
    if normalize(&stamp.username) == normalize(approver) {
        return Ok(Decider::Verified(stamp.to_verified_identity()));
    }
    let commit = request
        .annotations()
        .get(annotations::GITOPS_COMMIT)
        .map(|c| c.trim().to_owned())
        .unwrap_or_default();
    if stamp.groups.contains(&rules.gitops_group) && !commit.is_empty() {
        return Ok(Decider::GitOps(GitOpsDecision {
            commit,
            applied_by: stamp.to_verified_identity(),
        }));
    }
    Err(Refusal::unverified(format!(
        "approverId {approver} is not {}, who set the decision",
        stamp.username
    )))
}

fn stamped_username(decider: &Decider) -> Option<&str> {
    match decider {
        Decider::Verified(identity) => Some(&identity.username),
        Decider::GitOps(gitops) => Some(&gitops.applied_by.username),
        Decider::Claimed | Decider::Voters(_) | Decider::Policy => None,
    }
}

/// The message refusing a decision by someone the request's `approvers` do not list.
fn not_an_approver_message(who: &str) -> String {
    format!("{who} is not among the approvers the ApprovalPolicy rule allows for this call")
}

/// Separation of duties: none of `names` (the approver named, the identity stamped) is the run's
/// creator, and under strict separation `who` may neither create runs nor impersonate
/// ServiceAccounts in the namespace.
fn check_separation(
    names: &[Option<&str>],
    who: &str,
    cx: DecisionContext<'_>,
    rules: &DecisionRules,
) -> Result<(), Refusal> {
    if !rules.allow_self_approval
        && let Some(creator) = cx.creator
    {
        let creator = normalize(creator);
        if names.iter().flatten().any(|d| normalize(d) == creator) {
            return Err(Refusal::separation(format!(
                "{creator} created this run and cannot decide its own requests"
            )));
        }
    }
    if rules.strict_separation_of_duties {
        match cx.rights.get(who) {
            None => {
                return Err(Refusal::separation(format!(
                    "the rights of {who} in this namespace could not be checked"
                )));
            }
            Some(rights) if rights.create_runs || rights.impersonate_service_accounts => {
                return Err(Refusal::separation(format!(
                    "{who} may create AgentRuns or impersonate ServiceAccounts in this namespace, so could have requested this run under another name (strict separation of duties)"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
