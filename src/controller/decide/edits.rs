//! An approval with edited arguments: the edit is checked against the tool's schema and the
//! ApprovalPolicies again before it can carry the call. An edit that does not fit the schema, that
//! a policy denies, or that a policy would send to more (or other) approvers than the one who
//! approved, supersedes the request: the call is not run.

use super::ResolvedKind;
use super::halt::kind_of;
use crate::controller::observe::Observed;
use crate::controller::verify::Decider;
use crate::crd::request_decision::{DecisionOf, edited_arguments};
use crate::crd::{ApprovalRequest, PolicyAction};

/// The resolution of the approval `decision` (by `decider`) of `request`, which edits the
/// call's arguments.
pub(super) fn check(
    observed: &Observed,
    request: &ApprovalRequest,
    decider: &Decider,
    decision: DecisionOf,
) -> ResolvedKind {
    match checked(observed, request, decider) {
        Ok(edited) => kind_of(decision, Some(edited)),
        Err(why) => ResolvedKind::Superseded {
            why: format!("the edited arguments of {}: {why}", decision.approver_id),
        },
    }
}

fn checked(
    observed: &Observed,
    request: &ApprovalRequest,
    decider: &Decider,
) -> Result<String, String> {
    let spec = &request.spec;
    let edited = edited_arguments(spec)?.ok_or("there are none")?;
    let json: serde_json::Value =
        serde_json::from_str(&edited).map_err(|e| format!("they are not JSON: {e}"))?;
    let tools = observed
        .agent_spec()
        .map(|a| a.tools.as_slice())
        .unwrap_or_default();
    let (index, tool_spec) = tools
        .iter()
        .enumerate()
        .find(|(_, t)| t.name == spec.tool_name)
        .ok_or_else(|| format!("the Agent has no tool {}", spec.tool_name))?;
    let tool = crate::agent::tool::Tool::from_spec(index, tool_spec).map_err(|e| e.to_string())?;
    tool.check_arguments(&json).map_err(|problems| {
        format!(
            "they do not fit the schema of {}: {problems}",
            spec.tool_name
        )
    })?;
    let Some(requirement) = observed.evaluate_policies(&spec.tool_name, &json) else {
        return Ok(edited);
    };
    let rule = requirement.decision.approver_id();
    match requirement.decision.action {
        PolicyAction::Allow => Ok(edited),
        PolicyAction::Deny => Err(format!(
            "{rule} denies them{}",
            requirement
                .decision
                .message
                .map(|m| format!(" ({m})"))
                .unwrap_or_default()
        )),
        PolicyAction::Require => {
            let needed = requirement.required_approvals.unwrap_or(1);
            if needed > 1 {
                return Err(format!(
                    "{rule} requires {needed} approvals for them, which one approval cannot carry"
                ));
            }
            let permitted = match (&requirement.approvers, decider) {
                (None, _) => true,
                (Some(approvers), Decider::Verified(identity)) => {
                    approvers.permits(&identity.username, &identity.groups)
                }
                (Some(approvers), _) => {
                    approvers.permits(request.spec.approver_id.as_deref().unwrap_or_default(), &[])
                }
            };
            if permitted {
                Ok(edited)
            } else {
                Err(format!("{rule} allows other approvers for them"))
            }
        }
    }
}
