//! What a request's decision says, whoever made it: a person (`spec.decision`), a quorum of
//! people (`spec.votes`, the votes that counted named in `status.voters`) or an ApprovalPolicy
//! (`spec.policy`). The controller records it in the RunState's `approval_metadata`, and the
//! controller and the worker check the copy against it, so all read it here.

use super::approval_request::arguments_digest;
use super::{ApprovalRequest, ApprovalRequestSpec, Decision, PolicyAction};
use crate::state::pyjson;

/// A request's decision as the RunState records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecisionOf {
    /// Approved or Rejected.
    pub decision: Decision,
    /// Who decided: a username, several joined with `, ` (a quorum), or `policy:<policy>/<rule>`.
    pub approver_id: String,
    /// Why, for the audit.
    pub reason: Option<String>,
    /// Rejected only: what the model is told.
    pub message: Option<String>,
}

/// The decision on the request `spec`, counting the votes of `voters` (usernames, in the order
/// they counted) when it needs several approvals; `None` while undecided.
pub fn decision_of(spec: &ApprovalRequestSpec, voters: &[String]) -> Option<DecisionOf> {
    if let Some(policy) = spec.policy_decision() {
        let approver_id = policy.approver_id();
        let rule = match (&policy.name, &policy.rule) {
            (Some(name), Some(rule)) => format!("rule {rule} of ApprovalPolicy {name}"),
            _ => "no ApprovalPolicy rule".to_owned(),
        };
        return Some(match policy.action {
            PolicyAction::Deny => DecisionOf {
                decision: Decision::Rejected,
                approver_id,
                reason: Some(policy.note.clone().unwrap_or(format!("denied by {rule}"))),
                message: policy.message.clone(),
            },
            _ => DecisionOf {
                decision: Decision::Approved,
                approver_id,
                reason: Some(policy.note.clone().unwrap_or(format!("allowed by {rule}"))),
                message: None,
            },
        });
    }
    if spec.is_quorum() {
        let votes: Vec<(&String, &super::Vote)> = voters
            .iter()
            .filter_map(|v| spec.votes.get(v).map(|vote| (v, vote)))
            .collect();
        if let Some((who, vote)) = votes.iter().find(|(_, v)| v.decision == Decision::Rejected) {
            return Some(DecisionOf {
                decision: Decision::Rejected,
                approver_id: (*who).clone(),
                reason: vote.reason.clone(),
                message: vote.message.clone(),
            });
        }
        if votes.is_empty() {
            return None;
        }
        let names: Vec<&str> = votes.iter().map(|(who, _)| who.as_str()).collect();
        let reasons: Vec<String> = votes
            .iter()
            .map(|(who, v)| {
                format!(
                    "{who}: {}",
                    v.reason.as_deref().unwrap_or("no reason given")
                )
            })
            .collect();
        return Some(DecisionOf {
            decision: Decision::Approved,
            approver_id: names.join(", "),
            reason: Some(reasons.join("; ")),
            message: None,
        });
    }
    spec.decision.map(|decision| DecisionOf {
        decision,
        approver_id: spec.approver_id.clone().unwrap_or_default(),
        reason: spec.reason.clone(),
        message: spec.message.clone(),
    })
}

/// The decision recorded on `request`: [`decision_of`] with the voters its status names.
pub fn recorded_decision(request: &ApprovalRequest) -> Option<DecisionOf> {
    let voters: Vec<String> = request
        .status
        .iter()
        .flat_map(|s| s.voters.iter().map(|v| v.username.clone()))
        .collect();
    decision_of(&request.spec, &voters)
}

/// The edited arguments of an approval as the run stores them and the tool receives them
/// (Python-compatible JSON of the approver's JSON object); `Ok(None)` without an edit, `Err`
/// when the edit is not a JSON object.
pub fn edited_arguments(spec: &ApprovalRequestSpec) -> Result<Option<String>, String> {
    let Some(text) = spec.edited_arguments.as_deref() else {
        return Ok(None);
    };
    let value = pyjson::loads(text).map_err(|e| format!("editedArguments is not JSON: {e}"))?;
    if !matches!(value, pyjson::Value::Dict(_)) {
        return Err("editedArguments is not a JSON object".to_owned());
    }
    pyjson::dumps(&value)
        .map(Some)
        .map_err(|e| format!("editedArguments cannot be stored: {e}"))
}

/// The digest of the arguments an approval of `spec` lets through: the edited ones when the
/// approver edited them, the requested ones otherwise. `Err` when the edit is not a JSON object.
pub fn approved_arguments_digest(spec: &ApprovalRequestSpec) -> Result<String, String> {
    Ok(match edited_arguments(spec)? {
        Some(edited) => arguments_digest(&edited),
        None => spec.arguments_digest.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{PolicyDecision, Vote};

    fn vote(decision: Decision, reason: &str) -> Vote {
        Vote {
            decision,
            reason: Some(reason.into()),
            message: (decision == Decision::Rejected).then(|| "no".to_owned()),
            decided_by: None,
        }
    }

    #[test]
    fn people_quorums_and_policies_each_name_who_decided() {
        let mut spec = ApprovalRequestSpec {
            decision: Some(Decision::Approved),
            approver_id: Some("alice".into()),
            reason: Some("ok".into()),
            ..Default::default()
        };
        let person = decision_of(&spec, &[]).unwrap();
        assert_eq!(
            (person.approver_id.as_str(), person.reason.as_deref()),
            ("alice", Some("ok"))
        );

        spec = ApprovalRequestSpec {
            required_approvals: Some(2),
            votes: [
                ("bob".to_owned(), vote(Decision::Approved, "fine")),
                ("carol".to_owned(), vote(Decision::Approved, "agreed")),
                ("dave".to_owned(), vote(Decision::Rejected, "too much")),
            ]
            .into(),
            ..Default::default()
        };
        assert_eq!(decision_of(&spec, &[]), None);
        let approved = decision_of(&spec, &["carol".into(), "bob".into()]).unwrap();
        assert_eq!(approved.decision, Decision::Approved);
        assert_eq!(approved.approver_id, "carol, bob");
        assert_eq!(approved.reason.as_deref(), Some("carol: agreed; bob: fine"));
        let rejected = decision_of(&spec, &["bob".into(), "dave".into()]).unwrap();
        assert_eq!(rejected.decision, Decision::Rejected);
        assert_eq!(rejected.approver_id, "dave");
        assert_eq!(rejected.message.as_deref(), Some("no"));

        spec.policy = Some(PolicyDecision {
            name: Some("prod".into()),
            rule: Some("no-drops".into()),
            action: PolicyAction::Deny,
            message: Some("Not from agents.".into()),
            note: None,
        });
        let denied = decision_of(&spec, &[]).unwrap();
        assert_eq!(denied.decision, Decision::Rejected);
        assert_eq!(denied.approver_id, "policy:prod/no-drops");
        assert_eq!(
            denied.reason.as_deref(),
            Some("denied by rule no-drops of ApprovalPolicy prod")
        );
        assert_eq!(denied.message.as_deref(), Some("Not from agents."));
        spec.policy = Some(PolicyDecision::default());
        let allowed = decision_of(&spec, &[]).unwrap();
        assert_eq!(allowed.approver_id, "policy:none");
        assert_eq!(allowed.decision, Decision::Approved);
    }

    #[test]
    fn edits_are_stored_as_python_json_and_must_be_objects() {
        let mut spec = ApprovalRequestSpec {
            arguments_digest: "a".repeat(64),
            ..Default::default()
        };
        assert_eq!(approved_arguments_digest(&spec).unwrap(), "a".repeat(64));
        spec.edited_arguments = Some(r#"{"amount":50,"note":"é"}"#.into());
        assert_eq!(
            edited_arguments(&spec).unwrap().as_deref(),
            Some(r#"{"amount": 50, "note": "\u00e9"}"#)
        );
        assert_eq!(
            approved_arguments_digest(&spec).unwrap(),
            arguments_digest(r#"{"amount": 50, "note": "\u00e9"}"#)
        );
        spec.edited_arguments = Some("[1]".into());
        assert!(
            edited_arguments(&spec)
                .unwrap_err()
                .contains("not a JSON object")
        );
        spec.edited_arguments = Some("{".into());
        assert!(edited_arguments(&spec).unwrap_err().contains("not JSON"));
    }
}
