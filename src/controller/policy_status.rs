//! The status of `ApprovalPolicies`: their rule names (shown by `kubectl get approvalpolicies`)
//! and whether every rule's tools and condition compile, kept by a controller of its own like the
//! Agents' status ([`super::agent_status`]).

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use tracing::warn;

use crate::approval_policy::CompiledPolicy;
use crate::crd::keys::field_managers;
use crate::crd::status_patch::StatusPatch;
use crate::crd::{
    ApprovalPolicy, ApprovalPolicyStatus, ConditionStatus, ConditionType, Reason, find_condition,
    new_condition,
};

/// The status the controller wants a policy to show.
pub fn desired_status(policy: &ApprovalPolicy) -> ApprovalPolicyStatus {
    let mut status = policy.status.clone().unwrap_or_default();
    let errors = CompiledPolicy::compile(policy).errors();
    let rules = policy.spec.rules.len();
    let (condition_status, reason, message) = if errors.is_empty() {
        (
            ConditionStatus::True,
            Reason::Compiled,
            format!("{rules} rule(s) compiled"),
        )
    } else {
        (
            ConditionStatus::False,
            Reason::CompileError,
            format!(
                "{}; calls of a broken rule's tools need a person until it is fixed",
                errors.join("; ")
            ),
        )
    };
    crate::crd::set_condition(
        &mut status.conditions,
        new_condition(
            ConditionType::Ready,
            condition_status,
            reason,
            &message,
            policy.metadata.generation,
            crate::time::to_k8s(chrono::Utc::now()),
        ),
    );
    status.observed_generation = policy.metadata.generation;
    status.rule_names = Some(
        policy
            .spec
            .rules
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
    );
    status
}

/// Whether the policy's status differs from [`desired_status`] (transition times aside).
pub fn needs_update(policy: &ApprovalPolicy) -> bool {
    let current = policy.status.clone().unwrap_or_default();
    let desired = desired_status(policy);
    let same = |a: &ApprovalPolicyStatus, b: &ApprovalPolicyStatus| match (
        find_condition(&a.conditions, ConditionType::Ready),
        find_condition(&b.conditions, ConditionType::Ready),
    ) {
        (Some(x), Some(y)) => {
            x.status == y.status
                && x.reason == y.reason
                && x.message == y.message
                && x.observed_generation == y.observed_generation
        }
        _ => false,
    };
    !same(&current, &desired)
        || current.observed_generation != desired.observed_generation
        || current.rule_names != desired.rule_names
}

/// What the policies' status controller shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
}

/// Errors writing a policy's status.
#[derive(Debug, thiserror::Error)]
pub enum PolicyStatusError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Writes the policy's status when it differs from [`desired_status`], guarded by the policy's
/// resourceVersion.
pub async fn reconcile(
    policy: Arc<ApprovalPolicy>,
    ctx: Arc<Context>,
) -> Result<Action, PolicyStatusError> {
    if !needs_update(&policy) {
        return Ok(Action::await_change());
    }
    let patch = StatusPatch::guarded(desired_status(&policy), policy.resource_version());
    let params = PatchParams {
        field_manager: Some(field_managers::CONTROLLER.into()),
        ..Default::default()
    };
    let api: Api<ApprovalPolicy> = Api::all(ctx.client.clone());
    match api
        .patch_status(&policy.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
        other => {
            other?;
        }
    }
    Ok(Action::await_change())
}

/// Retries a failed status write after a few seconds.
pub fn error_policy(
    policy: Arc<ApprovalPolicy>,
    error: &PolicyStatusError,
    _: Arc<Context>,
) -> Action {
    warn!(policy = %policy.name_any(), %error, "could not write the ApprovalPolicy's status");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ApprovalPolicySpec;

    fn policy(yaml: &str) -> ApprovalPolicy {
        let spec: ApprovalPolicySpec = serde_yaml_ng::from_str(yaml).unwrap();
        let mut policy = ApprovalPolicy::new("prod", spec);
        policy.metadata.generation = Some(2);
        policy
    }

    #[test]
    fn a_policy_that_compiles_is_ready_and_lists_its_rules() {
        let mut p = policy(
            "rules: [{name: a, tools: [x], action: Allow}, {name: b, tools: ['y*'], when: 'args.n > 1', action: Deny}]",
        );
        assert!(needs_update(&p));
        let status = desired_status(&p);
        assert_eq!(status.rule_names.as_deref(), Some("a,b"));
        let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", "Compiled")
        );
        assert_eq!(ready.observed_generation, Some(2));
        p.status = Some(status);
        assert!(!needs_update(&p), "written once, then left alone");
    }

    #[test]
    fn a_compile_error_makes_it_not_ready_with_the_compilers_message() {
        let p = policy("rules: [{name: typo, tools: [x], when: 'args.n >', action: Allow}]");
        let status = desired_status(&p);
        let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "CompileError")
        );
        assert!(
            ready.message.starts_with("rule typo: when: "),
            "{}",
            ready.message
        );
        assert!(ready.message.contains("need a person"), "{}", ready.message);
    }
}
