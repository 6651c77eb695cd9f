//! The first half of planning, pure: from what was observed (the run, its Agent, its worker Pods
//! and ApprovalRequests, and its RunState when needed) to the one next [`Action`]. The
//! [`plan`](super::plan) turns the action into the writes that carry it out.

use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::observe::Observed;
use super::verify::{self, Decider, DecisionContext, DecisionRules, Refusal};
use crate::crd::{
    AgentRun, AgentRunPhase, ApprovalPhase, ApprovalRequest, Decision, Reason,
    approval_request_name, worker_pod_name,
};
use crate::state::{DeferredToolCall, RunState};
use crate::time::from_k8s;

/// Settings of the decision step.
#[derive(Clone, Debug)]
pub struct Policy {
    /// How many times a failed worker of one step is retried before the run fails.
    pub max_retries: u32,
    /// The delay before the first retry; doubled for each further retry.
    pub retry_backoff: Duration,
    /// How often a run waiting on something without a watch event (expiry, a missing Agent) is
    /// looked at again.
    pub recheck: Duration,
    /// The admin's rules for decisions.
    pub decisions: DecisionRules,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_retries: 3,
            retry_backoff: Duration::from_secs(5),
            recheck: Duration::from_secs(30),
            decisions: DecisionRules::default(),
        }
    }
}

/// How a worker Pod ended, or that it has not yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodOutcome {
    /// Not created yet.
    Missing,
    /// Created, not finished.
    InProgress,
    /// Exited 0.
    Succeeded,
    /// Exited non-zero (or could not start), with the termination message and when it ended.
    Failed {
        /// The container's exit code, if it ran.
        exit_code: Option<i32>,
        /// The container's termination message.
        message: String,
        /// When it ended.
        finished_at: Option<DateTime<Utc>>,
    },
}

/// A call's decision, as the controller records it on its request and applies it to the
/// RunState.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedDecision {
    /// The ApprovalRequest's name.
    pub request: String,
    /// The tool call id.
    pub tool_call_id: String,
    /// What happens to the call.
    pub kind: ResolvedKind,
    /// When the controller first observed it (the audit's time: never a client-written field).
    pub decided_at: DateTime<Utc>,
    /// Who decided (`None` for expiries and refusals).
    pub decider: Option<Decider>,
    /// Observed in this reconcile: its request's status does not record it yet.
    pub new: bool,
}

/// How a call was resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolvedKind {
    /// A person approved it.
    Approved {
        /// Who approved (the policy-verified `approverId`).
        approver_id: Option<String>,
        /// Why, for the audit.
        reason: Option<String>,
    },
    /// A person rejected it.
    Rejected {
        /// Who rejected.
        approver_id: Option<String>,
        /// Why, for the audit.
        reason: Option<String>,
        /// What the model is told.
        message: Option<String>,
    },
    /// Nobody decided in time: rejected with "approval timed out", reason `expired`.
    Expired,
    /// The request no longer matches the call (arguments digest, run uid or step): rejected,
    /// never approved.
    Superseded {
        /// Why it no longer matches.
        why: String,
    },
}

/// A request to create for a pending call.
#[derive(Clone, Debug, PartialEq)]
pub struct NewRequest {
    /// The ApprovalRequest's name.
    pub name: String,
    /// The deferred call.
    pub call: DeferredToolCall,
    /// The call's arguments as stored (Python-compatible JSON).
    pub arguments: String,
    /// When it expires, if the tool has an approval timeout.
    pub expires_at: Option<DateTime<Utc>>,
}

/// The one next thing to do for a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Nothing until something changes (a watch event brings the run back).
    Wait,
    /// Look again after this long.
    Recheck(Duration),
    /// The run's Agent is missing: say so in a condition and look again later.
    AgentMissing,
    /// Start (or restart) the worker of `step`: `attempt` 0 is the first try.
    StartStep {
        /// The step.
        step: u32,
        /// The retry number.
        attempt: u32,
    },
    /// The current worker Pod is missing (e.g. a crash after the status was written): create it.
    CreatePod {
        /// The step.
        step: u32,
        /// The retry number.
        attempt: u32,
    },
    /// Some calls of the halt were resolved (or their decisions refused) and others still wait:
    /// record the resolutions, report the refusals.
    Record {
        /// Resolutions to record now.
        resolved: Vec<ResolvedDecision>,
        /// Decisions not applied, by request, with why.
        refused: Vec<(String, Refusal)>,
        /// Look again after this long (the next expiry), if anything expires.
        recheck: Option<Duration>,
    },
    /// The worker halted: create the ApprovalRequests that are missing and wait for decisions.
    RequestApprovals {
        /// Requests to create.
        create: Vec<NewRequest>,
        /// How many calls wait for a decision.
        pending: u32,
    },
    /// Every call of the halt is resolved: apply the decisions to the RunState and start the
    /// next step.
    Resume {
        /// The decisions, in the order of the halt's calls.
        decisions: Vec<ResolvedDecision>,
    },
    /// The run finished with this answer.
    Succeed {
        /// The final output.
        output: String,
    },
    /// The run failed for good.
    Fail {
        /// The condition's reason.
        reason: Reason,
        /// What went wrong, for people.
        message: String,
    },
}

/// Whether [`decide`] needs the full RunState for this observation (so the caller reads it only
/// then: the cache does not hold states).
pub fn needs_state(
    run: &AgentRun,
    pods: &[Pod],
    requests: &[ApprovalRequest],
    now: DateTime<Utc>,
) -> bool {
    let status = run.status.clone().unwrap_or_default();
    match status.phase {
        Some(AgentRunPhase::AwaitingApproval) => awaiting_needs_state(run, requests, now),
        Some(AgentRunPhase::Running) => {
            let step = status.step.unwrap_or(0);
            let attempt = status.retries.unwrap_or(0);
            pod_outcome(find_pod(
                pods,
                &worker_pod_name(&run.name_any(), step, attempt),
            )) == PodOutcome::Succeeded
        }
        _ => false,
    }
}

/// A waiting run's state is read only when the cached requests say something can change: a
/// request is missing, decided, expired, or visibly does not belong to this run and step. While
/// every request waits for a person, the RunState (which can be large) stays on the API server.
fn awaiting_needs_state(run: &AgentRun, requests: &[ApprovalRequest], now: DateTime<Utc>) -> bool {
    let status = run.status.clone().unwrap_or_default();
    let Some(pending) = status.pending_approvals.filter(|&p| p > 0) else {
        return true;
    };
    let uid = run.uid().unwrap_or_default();
    let open = open_requests(run, requests);
    if open.len() < pending as usize {
        return true;
    }
    open.iter().any(|r| {
        r.spec.decision.is_some()
            || r.spec.agent_run_ref.uid != uid
            || !r.spec.digest_matches()
            || expires_at(r).is_some_and(|at| at <= now)
    })
}

/// The run's requests of its current step that nobody has resolved yet.
fn open_requests<'a>(run: &AgentRun, requests: &'a [ApprovalRequest]) -> Vec<&'a ApprovalRequest> {
    let step = run.status.as_ref().and_then(|s| s.step).unwrap_or(0);
    requests
        .iter()
        .filter(|r| r.spec.step == step)
        .filter(|r| {
            r.status
                .as_ref()
                .and_then(|s| s.phase)
                .is_none_or(|p| p == ApprovalPhase::Pending)
        })
        .collect()
}

fn expires_at(request: &ApprovalRequest) -> Option<DateTime<Utc>> {
    request
        .status
        .as_ref()
        .and_then(|s| s.expires_at.as_ref())
        .map(from_k8s)
}

/// A waiting run whose state was not read (nothing to decide yet): look again when the first
/// open request expires, otherwise wait for a change.
fn recheck_at_next_expiry(observed: &Observed, policy: &Policy) -> Action {
    let next = open_requests(&observed.run, &observed.requests)
        .into_iter()
        .filter_map(expires_at)
        .min();
    recheck_at(next, observed.now, policy)
}

/// Look again at `next` (an expiry), or wait for a change when there is none.
fn recheck_at(next: Option<DateTime<Utc>>, now: DateTime<Utc>, policy: &Policy) -> Action {
    match next {
        Some(at) => Action::Recheck(
            (at - now)
                .to_std()
                .unwrap_or(policy.recheck)
                .max(Duration::from_millis(200)),
        ),
        None => Action::Wait,
    }
}

fn find_pod<'a>(pods: &'a [Pod], name: &str) -> Option<&'a Pod> {
    pods.iter().find(|p| p.name_any() == name)
}

/// How a worker Pod ended, from its status.
pub fn pod_outcome(pod: Option<&Pod>) -> PodOutcome {
    let Some(pod) = pod else {
        return PodOutcome::Missing;
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return PodOutcome::Failed {
            exit_code: None,
            message: "the worker Pod was deleted before it finished".into(),
            finished_at: None,
        };
    }
    let status = pod.status.clone().unwrap_or_default();
    match status.phase.as_deref() {
        Some("Succeeded") => PodOutcome::Succeeded,
        Some("Failed") => {
            let terminated = status
                .container_statuses
                .unwrap_or_default()
                .into_iter()
                .find_map(|c| c.state.and_then(|s| s.terminated));
            let exit_code = terminated.as_ref().map(|t| t.exit_code);
            let (message, finished_at) = match terminated {
                Some(t) => {
                    let code = t.exit_code;
                    let text = t.message.unwrap_or_default();
                    let text = if text.trim().is_empty() {
                        format!("the worker exited with code {code}")
                    } else {
                        format!("the worker exited with code {code}: {}", text.trim())
                    };
                    (text, t.finished_at.as_ref().map(from_k8s))
                }
                None => (
                    status
                        .message
                        .unwrap_or_else(|| "the worker Pod failed".to_owned()),
                    None,
                ),
            };
            PodOutcome::Failed {
                exit_code,
                message,
                finished_at,
            }
        }
        _ => PodOutcome::InProgress,
    }
}

/// The next action for a run.
pub fn decide(observed: &Observed, policy: &Policy) -> Action {
    let run = &observed.run;
    let status = run.status.clone().unwrap_or_default();
    let phase = status.phase;
    if phase.is_some_and(AgentRunPhase::is_terminal) {
        return Action::Wait;
    }
    if observed.agent.is_none() {
        return Action::AgentMissing;
    }
    let step = status.step.unwrap_or(0);
    let attempt = status.retries.unwrap_or(0);
    match phase {
        None | Some(AgentRunPhase::Pending) => Action::StartStep { step, attempt },
        Some(AgentRunPhase::Running) => {
            let name = worker_pod_name(&run.name_any(), step, attempt);
            match pod_outcome(find_pod(&observed.pods, &name)) {
                PodOutcome::Missing => Action::CreatePod { step, attempt },
                PodOutcome::InProgress => Action::Wait,
                PodOutcome::Failed {
                    exit_code: Some(code),
                    message,
                    ..
                } if code == i32::from(crate::worker::TAMPERED_EXIT_CODE) => Action::Fail {
                    reason: Reason::TamperedState,
                    message,
                },
                PodOutcome::Failed {
                    message,
                    finished_at,
                    ..
                } => {
                    if attempt >= policy.max_retries {
                        return Action::Fail {
                            reason: Reason::WorkerFailed,
                            message: format!(
                                "step {step} failed {} times; last error: {message}",
                                attempt + 1
                            ),
                        };
                    }
                    let backoff = policy.retry_backoff * 2u32.saturating_pow(attempt);
                    let ready_at = finished_at.unwrap_or(observed.now)
                        + chrono::Duration::from_std(backoff).unwrap_or_default();
                    if observed.now < ready_at {
                        Action::Recheck((ready_at - observed.now).to_std().unwrap_or(backoff))
                    } else {
                        Action::StartStep {
                            step,
                            attempt: attempt + 1,
                        }
                    }
                }
                PodOutcome::Succeeded => match &observed.state {
                    None => Action::Wait,
                    Some(Err(why)) => Action::Fail {
                        reason: Reason::InvalidRunState,
                        message: why.clone(),
                    },
                    Some(Ok(state)) => after_step(observed, state, policy),
                },
            }
        }
        Some(AgentRunPhase::AwaitingApproval) => match &observed.state {
            None => recheck_at_next_expiry(observed, policy),
            Some(Err(why)) => Action::Fail {
                reason: Reason::InvalidRunState,
                message: why.clone(),
            },
            Some(Ok(state)) => awaiting(observed, state, policy),
        },
        Some(_) => Action::Wait,
    }
}

/// The worker of the current step exited 0: what its RunState says happened.
fn after_step(observed: &Observed, state: &RunState, policy: &Policy) -> Action {
    if let Err(why) = verify_copy(observed, state, policy) {
        return tampered(why);
    }
    if let Some(output) = &state.final_output {
        return Action::Succeed {
            output: output.clone(),
        };
    }
    if !state.pending_approvals().is_empty() {
        return awaiting_requests(observed, state);
    }
    Action::Fail {
        reason: Reason::NoResult,
        message:
            "the worker exited successfully but its RunState neither finished nor awaits approval"
                .into(),
    }
}

fn tampered(why: String) -> Action {
    Action::Fail {
        reason: Reason::TamperedState,
        message: format!(
            "the run's state does not match its approval requests: {why}; nothing was sent"
        ),
    }
}

/// [`verify::verify_copy`] for the observed run: an approval counts when its request records it
/// or its decision passes the checks the controller records it with.
fn verify_copy(observed: &Observed, state: &RunState, policy: &Policy) -> Result<(), String> {
    let run = &observed.run;
    verify::verify_copy(
        state,
        &run.name_any(),
        &run.uid().unwrap_or_default(),
        &observed.requests,
        |request| match request.status.as_ref().and_then(|s| s.phase) {
            Some(ApprovalPhase::Approved) => true,
            None | Some(ApprovalPhase::Pending) => verify::verify_decision(
                request,
                decision_context(observed, request),
                &policy.decisions,
            )
            .is_ok(),
            Some(_) => false,
        },
    )
}

/// What checking a decision on `request` needs from the observation.
fn decision_context<'a>(observed: &'a Observed, request: &ApprovalRequest) -> DecisionContext<'a> {
    DecisionContext {
        policies_installed: observed.policies_installed,
        creator: observed.creator(),
        rights: observed.rights.get(&request.name_any()).copied(),
    }
}

fn awaiting_requests(observed: &Observed, state: &RunState) -> Action {
    let run_name = observed.run.name_any();
    let pending = state.pending_approvals();
    let create = pending
        .iter()
        .filter(|call| {
            let name = approval_request_name(&run_name, &call.tool_call_id);
            !observed.requests.iter().any(|r| r.name_any() == name)
        })
        .map(|call| NewRequest {
            name: approval_request_name(&run_name, &call.tool_call_id),
            call: (*call).clone(),
            arguments: call.arguments_json(),
            expires_at: observed.approval_timeout(&call.tool_name).map(|t| {
                observed.now
                    + chrono::Duration::from_std(t)
                        .unwrap_or_else(|_| chrono::Duration::days(36500))
            }),
        })
        .collect();
    Action::RequestApprovals {
        create,
        pending: pending.len() as u32,
    }
}

/// Where one pending call of a halt stands.
enum CallOutcome {
    Resolved(ResolvedDecision),
    Refused(String, Refusal),
    /// Waiting for a person (until it expires, if it does).
    Waiting(Option<DateTime<Utc>>),
    /// This replica recorded its resolution but the cache does not show it yet.
    Lagging,
}

fn awaiting(observed: &Observed, state: &RunState, policy: &Policy) -> Action {
    let pending = state.pending_approvals();
    if pending.is_empty() {
        // Decisions were applied but the next step was not recorded: nothing to wait for.
        return Action::Fail {
            reason: Reason::InvalidRunState,
            message: "the run awaits approval but its RunState has no pending tool call".into(),
        };
    }
    if let Err(why) = verify_copy(observed, state, policy) {
        return tampered(why);
    }
    let run_name = observed.run.name_any();
    let mut outcomes = Vec::with_capacity(pending.len());
    for call in &pending {
        let name = approval_request_name(&run_name, &call.tool_call_id);
        let Some(request) = observed.requests.iter().find(|r| r.name_any() == name) else {
            return awaiting_requests(observed, state);
        };
        outcomes.push(resolve(observed, request, call, policy));
    }
    if outcomes
        .iter()
        .all(|o| matches!(o, CallOutcome::Resolved(_)))
    {
        let decisions = outcomes
            .into_iter()
            .filter_map(|o| match o {
                CallOutcome::Resolved(d) => Some(d),
                _ => None,
            })
            .collect();
        return Action::Resume { decisions };
    }
    let mut resolved = vec![];
    let mut refused = vec![];
    let mut next_expiry: Option<DateTime<Utc>> = None;
    let mut lagging = false;
    for outcome in outcomes {
        match outcome {
            CallOutcome::Resolved(d) if d.new => resolved.push(d),
            CallOutcome::Resolved(_) => {}
            CallOutcome::Refused(request, refusal) => refused.push((request, refusal)),
            CallOutcome::Waiting(Some(at)) => {
                next_expiry = Some(next_expiry.map_or(at, |n| n.min(at)));
            }
            CallOutcome::Waiting(None) => {}
            CallOutcome::Lagging => lagging = true,
        }
    }
    let recheck = match recheck_at(next_expiry, observed.now, policy) {
        Action::Recheck(after) => Some(after),
        _ => None,
    };
    if !resolved.is_empty() || !refused.is_empty() {
        return Action::Record {
            resolved,
            refused,
            recheck,
        };
    }
    if lagging {
        return Action::Recheck(Duration::from_millis(500));
    }
    recheck_at(next_expiry, observed.now, policy)
}

/// Where the call `call` of the halt stands, from its request.
fn resolve(
    observed: &Observed,
    request: &ApprovalRequest,
    call: &DeferredToolCall,
    policy: &Policy,
) -> CallOutcome {
    let name = request.name_any();
    let status = request.status.clone().unwrap_or_default();
    let resolved = |kind, decided_at, decider, new| {
        CallOutcome::Resolved(ResolvedDecision {
            request: name.clone(),
            tool_call_id: call.tool_call_id.clone(),
            kind,
            decided_at,
            decider,
            new,
        })
    };
    if let Some(phase) = status.phase.filter(|p| p.is_final()) {
        // Recorded by an earlier reconcile: applied as recorded.
        let decided_at = status.decided_at.as_ref().map_or(observed.now, from_k8s);
        let decider = status
            .verified_identity
            .clone()
            .map(Decider::Verified)
            .or(status.gitops.clone().map(Decider::GitOps));
        let kind = match phase {
            ApprovalPhase::Approved => approved(request),
            ApprovalPhase::Rejected => rejected(request),
            ApprovalPhase::Expired => ResolvedKind::Expired,
            _ => ResolvedKind::Superseded {
                why: superseded(observed, request, call)
                    .unwrap_or_else(|| "the request no longer matched the call".to_owned()),
            },
        };
        return resolved(kind, decided_at, decider, false);
    }
    if observed.recorded.contains(&name) {
        return CallOutcome::Lagging;
    }
    if let Some(why) = superseded(observed, request, call) {
        return resolved(ResolvedKind::Superseded { why }, observed.now, None, true);
    }
    let expiry = expires_at(request);
    if expiry.is_some_and(|at| at <= observed.now) {
        return resolved(ResolvedKind::Expired, observed.now, None, true);
    }
    match request.spec.decision {
        None => CallOutcome::Waiting(expiry),
        Some(decision) => {
            match verify::verify_decision(
                request,
                decision_context(observed, request),
                &policy.decisions,
            ) {
                Ok(decider) => {
                    let kind = match decision {
                        Decision::Approved => approved(request),
                        Decision::Rejected => rejected(request),
                    };
                    resolved(kind, observed.now, Some(decider), true)
                }
                Err(refusal) => CallOutcome::Refused(name, refusal),
            }
        }
    }
}

fn approved(request: &ApprovalRequest) -> ResolvedKind {
    ResolvedKind::Approved {
        approver_id: request.spec.approver_id.clone(),
        reason: request.spec.reason.clone(),
    }
}

fn rejected(request: &ApprovalRequest) -> ResolvedKind {
    ResolvedKind::Rejected {
        approver_id: request.spec.approver_id.clone(),
        reason: request.spec.reason.clone(),
        message: request.spec.message.clone(),
    }
}

/// Why `request` no longer matches the pending `call` of the observed run, if it does not: a
/// decision on it must not be applied.
fn superseded(
    observed: &Observed,
    request: &ApprovalRequest,
    call: &DeferredToolCall,
) -> Option<String> {
    let spec = &request.spec;
    let uid = observed.run.uid().unwrap_or_default();
    let step = observed
        .run
        .status
        .as_ref()
        .and_then(|s| s.step)
        .unwrap_or(0);
    let expected_digest = crate::crd::arguments_digest(&call.arguments_json());
    if spec.agent_run_ref.uid != uid {
        Some(format!(
            "it names run uid {} but the run is {uid}",
            spec.agent_run_ref.uid
        ))
    } else if spec.step != step {
        Some(format!(
            "it was made at step {} but the run is at step {step}",
            spec.step
        ))
    } else if spec.tool_call_id != call.tool_call_id || spec.tool_name != call.tool_name {
        Some("its toolCallId or toolName does not match the pending call".to_owned())
    } else if spec.arguments_digest != expected_digest || !spec.digest_matches() {
        Some(
            "its argumentsDigest does not match the call's arguments in the run's state".to_owned(),
        )
    } else if spec.tool_definition_digest.is_some()
        && spec.tool_definition_digest != observed.tool_definition_digest(&call.tool_name)
    {
        Some(
            "its toolDefinitionDigest does not match the tool in the Agent the run is bound to"
                .to_owned(),
        )
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::halted_state;
    use crate::state::Approval;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    use kube::api::ObjectMeta;

    fn run(phase: Option<AgentRunPhase>, step: u32, retries: u32) -> AgentRun {
        AgentRun::test()
            .in_phase(phase)
            .at_step(step)
            .with_retries(retries)
    }

    fn pod(name: &str, phase: &str, exit: Option<(i32, &str)>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some(phase.into()),
                container_statuses: exit.map(|(code, message)| {
                    vec![ContainerStatus {
                        name: "worker".into(),
                        state: Some(ContainerState {
                            terminated: Some(ContainerStateTerminated {
                                exit_code: code,
                                message: Some(message.into()),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn request(state: &RunState, decision: Option<Decision>) -> ApprovalRequest {
        ApprovalRequest::test_for(state, decision)
    }

    fn observe(
        run: &AgentRun,
        pods: &[Pod],
        requests: &[ApprovalRequest],
        state: Option<Result<&RunState, String>>,
    ) -> Observed {
        Observed {
            pods: pods.to_vec(),
            requests: requests.to_vec(),
            state: state.map(|s| s.cloned()),
            ..Observed::of(run.clone())
        }
    }

    #[test]
    fn a_new_run_starts_step_zero() {
        let mut r = run(None, 0, 0);
        r.status = None;
        let action = decide(&observe(&r, &[], &[], None), &Policy::default());
        assert_eq!(
            action,
            Action::StartStep {
                step: 0,
                attempt: 0
            }
        );
    }

    #[test]
    fn a_missing_agent_is_reported_not_failed() {
        let r = run(None, 0, 0);
        let mut o = observe(&r, &[], &[], None);
        o.agent = None;
        assert_eq!(decide(&o, &Policy::default()), Action::AgentMissing);
    }

    #[test]
    fn terminal_runs_are_left_alone() {
        for phase in [
            AgentRunPhase::Succeeded,
            AgentRunPhase::Failed,
            AgentRunPhase::Cancelled,
        ] {
            let r = run(Some(phase), 1, 0);
            assert_eq!(
                decide(&observe(&r, &[], &[], None), &Policy::default()),
                Action::Wait
            );
        }
    }

    #[test]
    fn a_running_step_without_its_pod_recreates_it_with_the_same_name() {
        let r = run(Some(AgentRunPhase::Running), 2, 0);
        let other = [pod("r1-step-1", "Succeeded", None)];
        assert_eq!(
            decide(&observe(&r, &other, &[], None), &Policy::default()),
            Action::CreatePod {
                step: 2,
                attempt: 0
            }
        );
        let running = [pod("r1-step-2", "Running", None)];
        assert_eq!(
            decide(&observe(&r, &running, &[], None), &Policy::default()),
            Action::Wait
        );
    }

    #[test]
    fn a_failed_worker_is_retried_after_backoff_then_fails_the_run() {
        let r = run(Some(AgentRunPhase::Running), 0, 0);
        let failed = [pod(
            "r1-step-0",
            "Failed",
            Some((1, "model endpoint unreachable")),
        )];
        let policy = Policy {
            retry_backoff: Duration::ZERO,
            ..Policy::default()
        };
        assert_eq!(
            decide(&observe(&r, &failed, &[], None), &policy),
            Action::StartStep {
                step: 0,
                attempt: 1
            }
        );
        let r = run(Some(AgentRunPhase::Running), 0, 3);
        let failed = [pod(
            "r1-step-0-r3",
            "Failed",
            Some((1, "model endpoint unreachable")),
        )];
        match decide(&observe(&r, &failed, &[], None), &policy) {
            Action::Fail { reason, message } => {
                assert_eq!(reason, Reason::WorkerFailed);
                assert!(message.contains("model endpoint unreachable"), "{message}");
            }
            other => panic!("expected Fail, got {other:?}"),
        }
    }

    #[test]
    fn a_waiting_run_reads_its_state_only_when_a_decision_can_be_applied() {
        let halted = halted_state();
        let mut r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        r.status.as_mut().unwrap().pending_approvals = Some(1);
        let now = Utc::now();
        // No request yet: the state says which to create.
        assert!(needs_state(&r, &[], &[], now));
        // An undecided request: nothing to do, no read.
        let open = [request(&halted, None)];
        assert!(!needs_state(&r, &[], &open, now));
        assert_eq!(
            decide(&observe(&r, &[], &open, None), &Policy::default()),
            Action::Wait
        );
        // A decision arrived: read it.
        let decided = [request(&halted, Some(Decision::Approved))];
        assert!(needs_state(&r, &[], &decided, now));
        // An expiry ahead: look again then, without reading; once due, read.
        let mut expiring = request(&halted, None);
        expiring.status.as_mut().unwrap().expires_at =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(
                    (now + chrono::Duration::seconds(60)).timestamp(),
                )
                .unwrap(),
            ));
        let expiring = [expiring];
        assert!(!needs_state(&r, &[], &expiring, now));
        assert!(matches!(
            decide(&observe(&r, &[], &expiring, None), &Policy::default()),
            Action::Recheck(d) if d > Duration::from_secs(50)
        ));
        assert!(needs_state(
            &r,
            &[],
            &expiring,
            now + chrono::Duration::seconds(61)
        ));
        // A request of another run, another step or with a forged digest: read and supersede.
        let mut other_uid = request(&halted, None);
        other_uid.spec.agent_run_ref.uid = "uid-2".into();
        assert!(needs_state(&r, &[], &[other_uid], now));
        let mut other_step = request(&halted, None);
        other_step.spec.step = 3;
        assert!(needs_state(&r, &[], &[other_step], now));
        let mut forged = request(&halted, None);
        forged.spec.arguments = r#"{"user_id": "u-2"}"#.into();
        assert!(needs_state(&r, &[], &[forged], now));
        // Already resolved by an earlier attempt (the run patch then failed): read and resume.
        let mut resolved = request(&halted, Some(Decision::Approved));
        resolved.status.as_mut().unwrap().phase = Some(ApprovalPhase::Approved);
        assert!(needs_state(&r, &[], &[resolved], now));
        // A waiting run that claims no pending call is inconsistent: read it to fail it.
        r.status.as_mut().unwrap().pending_approvals = Some(0);
        assert!(needs_state(&r, &[], &open, now));
    }

    #[test]
    fn backoff_waits_before_the_retry() {
        let r = run(Some(AgentRunPhase::Running), 0, 0);
        let failed = [pod("r1-step-0", "Failed", Some((1, "boom")))];
        let o = observe(&r, &failed, &[], None);
        assert!(matches!(decide(&o, &Policy::default()), Action::Recheck(_)));
    }

    #[test]
    fn a_finished_step_reads_the_state() {
        let r = run(Some(AgentRunPhase::Running), 0, 0);
        let done = [pod("r1-step-0", "Succeeded", None)];
        assert!(needs_state(&r, &done, &[], Utc::now()));
        assert_eq!(
            decide(&observe(&r, &done, &[], None), &Policy::default()),
            Action::Wait
        );

        let mut finished = RunState::new("uid-1", "ops", "hi");
        finished.final_output = Some("User u-1 deleted.".into());
        assert_eq!(
            decide(
                &observe(&r, &done, &[], Some(Ok(&finished))),
                &Policy::default()
            ),
            Action::Succeed {
                output: "User u-1 deleted.".into()
            }
        );

        let halted = halted_state();
        match decide(
            &observe(&r, &done, &[], Some(Ok(&halted))),
            &Policy::default(),
        ) {
            Action::RequestApprovals { create, pending } => {
                assert_eq!(pending, 1);
                assert_eq!(create.len(), 1);
                assert_eq!(create[0].name, approval_request_name("r1", "call_1"));
                assert_eq!(create[0].arguments, r#"{"user_id": "u-1"}"#);
            }
            other => panic!("expected RequestApprovals, got {other:?}"),
        }

        let malformed = decide(
            &observe(
                &r,
                &done,
                &[],
                Some(Err("runState: field `messages`: expected a list".into())),
            ),
            &Policy::default(),
        );
        assert!(matches!(
            malformed,
            Action::Fail {
                reason: Reason::InvalidRunState,
                ..
            }
        ));
    }

    #[test]
    fn approvals_wait_for_every_decision_then_resume() {
        let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        let state = halted_state();
        let undecided = [request(&state, None)];
        assert_eq!(
            decide(
                &observe(&r, &[], &undecided, Some(Ok(&state))),
                &Policy::default()
            ),
            Action::Wait
        );
        let approved = [request(&state, Some(Decision::Approved))];
        match decide(
            &observe(&r, &[], &approved, Some(Ok(&state))),
            &Policy::default(),
        ) {
            Action::Resume { decisions } => {
                assert_eq!(decisions.len(), 1);
                assert_eq!(
                    decisions[0].kind,
                    ResolvedKind::Approved {
                        approver_id: Some("alice@example.com".into()),
                        reason: Some("CR-1234".into())
                    }
                );
            }
            other => panic!("expected Resume, got {other:?}"),
        }
    }

    #[test]
    fn a_request_whose_digest_no_longer_matches_is_superseded_never_approved() {
        let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        let state = halted_state();
        let mut tampered = request(&state, Some(Decision::Approved));
        tampered.spec.arguments = r#"{"user_id": "u-2"}"#.into();
        tampered.spec.arguments_digest = crate::crd::arguments_digest(&tampered.spec.arguments);
        match decide(
            &observe(&r, &[], &[tampered], Some(Ok(&state))),
            &Policy::default(),
        ) {
            Action::Resume { decisions } => {
                assert!(matches!(decisions[0].kind, ResolvedKind::Superseded { .. }));
            }
            other => panic!("expected Resume, got {other:?}"),
        }
        let mut other_run = request(&state, Some(Decision::Approved));
        other_run.spec.agent_run_ref.uid = "uid-old".into();
        match decide(
            &observe(&r, &[], &[other_run], Some(Ok(&state))),
            &Policy::default(),
        ) {
            Action::Resume { decisions } => {
                assert!(matches!(decisions[0].kind, ResolvedKind::Superseded { .. }));
            }
            other => panic!("expected Resume, got {other:?}"),
        }
    }

    #[test]
    fn an_expired_request_resolves_as_expired() {
        let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        let state = halted_state();
        let mut expired = request(&state, None);
        let past =
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(5);
        expired.status.as_mut().unwrap().expires_at =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(past));
        match decide(
            &observe(&r, &[], &[expired.clone()], Some(Ok(&state))),
            &Policy::default(),
        ) {
            Action::Resume { decisions } => assert_eq!(decisions[0].kind, ResolvedKind::Expired),
            other => panic!("expected Resume, got {other:?}"),
        }
        let future =
            k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(60);
        expired.status.as_mut().unwrap().expires_at =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(future));
        assert!(matches!(
            decide(
                &observe(&r, &[], &[expired], Some(Ok(&state))),
                &Policy::default()
            ),
            Action::Recheck(_)
        ));
    }

    #[test]
    fn a_decision_first_observed_after_its_expiry_is_expired() {
        let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        let state = halted_state();
        let mut late = request(&state, Some(Decision::Approved));
        late.status.as_mut().unwrap().expires_at = Some(crate::time::to_k8s(
            Utc::now() - chrono::Duration::seconds(4),
        ));
        match decide(
            &observe(&r, &[], &[late], Some(Ok(&state))),
            &Policy::default(),
        ) {
            Action::Resume { decisions } => {
                assert_eq!(decisions[0].kind, ResolvedKind::Expired);
                assert!(decisions[0].new);
                assert_eq!(decisions[0].decider, None, "nobody is named for an expiry");
            }
            other => panic!("expected Resume, got {other:?}"),
        }
    }

    #[test]
    fn an_unverified_decision_is_refused_and_the_run_keeps_waiting() {
        let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        let state = halted_state();
        let mut forged = request(&state, Some(Decision::Approved));
        forged.metadata.annotations = None;
        match decide(
            &observe(&r, &[], &[forged], Some(Ok(&state))),
            &Policy::default(),
        ) {
            Action::Record {
                resolved, refused, ..
            } => {
                assert!(resolved.is_empty());
                assert_eq!(refused[0].1.reason, Reason::UnverifiedDecision);
            }
            other => panic!("expected Record, got {other:?}"),
        }
    }

    #[test]
    fn a_decision_on_a_tool_whose_definition_changed_is_superseded() {
        let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        let state = halted_state();
        let approved = request(&state, Some(Decision::Approved));
        let mut o = observe(&r, &[], &[approved], Some(Ok(&state)));
        let mut agent = crate::crd::Agent::test();
        agent.spec.tools[0].http.url = "http://evil.example/d".into();
        o.agent = Some(std::sync::Arc::new(agent));
        match decide(&o, &Policy::default()) {
            Action::Resume { decisions } => assert!(
                matches!(&decisions[0].kind, ResolvedKind::Superseded { why } if why.contains("toolDefinitionDigest")),
                "{:?}",
                decisions[0].kind
            ),
            other => panic!("expected Resume, got {other:?}"),
        }
    }

    #[test]
    fn a_state_claiming_an_approval_nobody_gave_fails_the_run() {
        let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        let mut state = halted_state();
        state
            .approve("call_1", Approval::new().approver_id("alice@example.com"))
            .unwrap();
        state
            .deferred_tool_requests
            .approvals
            .push(crate::state::DeferredToolCall {
                tool_call_id: "call_2".into(),
                ..state.deferred_tool_requests.approvals[0].clone()
            });
        let undecided = request(&halted_state(), None);
        match decide(
            &observe(&r, &[], &[undecided], Some(Ok(&state))),
            &Policy::default(),
        ) {
            Action::Fail { reason, message } => {
                assert_eq!(reason, Reason::TamperedState);
                assert!(message.contains("call_1"), "{message}");
            }
            other => panic!("expected Fail, got {other:?}"),
        }
        // A worker that refused to send a call ends the run the same way, without a retry.
        let running = run(Some(AgentRunPhase::Running), 1, 0);
        let refused = [pod(
            "r1-step-1",
            "Failed",
            Some((3, "TamperedState: call_1: ...")),
        )];
        assert!(matches!(
            decide(&observe(&running, &refused, &[], None), &Policy::default()),
            Action::Fail {
                reason: Reason::TamperedState,
                ..
            }
        ));
    }

    #[test]
    fn a_missing_request_is_created_again() {
        let r = run(Some(AgentRunPhase::AwaitingApproval), 0, 0);
        let state = halted_state();
        match decide(&observe(&r, &[], &[], Some(Ok(&state))), &Policy::default()) {
            Action::RequestApprovals { create, .. } => assert_eq!(create.len(), 1),
            other => panic!("expected RequestApprovals, got {other:?}"),
        }
    }

    #[test]
    fn decisions_already_in_the_state_do_not_count_as_pending() {
        let mut state = halted_state();
        state
            .approve("call_1", Approval::new().approver_id("alice@example.com"))
            .unwrap();
        assert!(state.pending_approvals().is_empty());
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn phase() -> impl Strategy<Value = Option<AgentRunPhase>> {
            prop::option::of(prop::sample::select(
                <AgentRunPhase as strum::VariantArray>::VARIANTS.to_vec(),
            ))
        }

        fn pod_phase() -> impl Strategy<Value = Option<&'static str>> {
            prop::option::of(prop::sample::select(vec![
                "Pending",
                "Running",
                "Succeeded",
                "Failed",
            ]))
        }

        proptest! {
            /// Whatever is observed, decide never panics and never approves a call whose request
            /// does not carry an Approved decision for exactly that call: nothing auto-approves.
            #[test]
            fn decide_fails_closed(
                phase in phase(),
                step in 0u32..4,
                retries in 0u32..5,
                pod_state in pod_phase(),
                decision in prop::option::of(prop::sample::select(vec![Decision::Approved, Decision::Rejected])),
                tamper_digest in any::<bool>(),
                tamper_uid in any::<bool>(),
                request_step in 0u32..4,
                with_request in any::<bool>(),
                state_kind in 0u8..4,
                agent_found in any::<bool>(),
            ) {
                let r = run(phase, step, retries);
                let pods: Vec<Pod> = pod_state
                    .map(|p| pod(&worker_pod_name("r1", step, retries), p, (p == "Failed").then_some((1, "boom"))))
                    .into_iter()
                    .collect();
                let halted = halted_state();
                let mut finished = RunState::new("uid-1", "ops", "hi");
                finished.final_output = Some("done".into());
                let state: Option<Result<&RunState, String>> = match state_kind {
                    0 => None,
                    1 => Some(Ok(&halted)),
                    2 => Some(Ok(&finished)),
                    _ => Some(Err("bad state".into())),
                };
                let mut req = request(&halted, decision);
                req.spec.step = request_step;
                if tamper_digest {
                    req.spec.arguments = r#"{"user_id": "u-2"}"#.into();
                    req.spec.arguments_digest = crate::crd::arguments_digest(&req.spec.arguments);
                }
                if tamper_uid {
                    req.spec.agent_run_ref.uid = "uid-other".into();
                }
                let requests: Vec<ApprovalRequest> = with_request.then_some(req.clone()).into_iter().collect();
                let mut o = observe(&r, &pods, &requests, state);
                if !agent_found {
                    o.agent = None;
                }
                let action = decide(&o, &Policy::default());
                if let Action::Resume { decisions } = &action {
                    for d in decisions {
                        if let ResolvedKind::Approved { .. } = d.kind {
                            prop_assert!(with_request);
                            prop_assert_eq!(req.spec.decision, Some(Decision::Approved));
                            prop_assert!(!tamper_digest && !tamper_uid);
                            prop_assert_eq!(request_step, step);
                        }
                    }
                }
                if phase.is_some_and(AgentRunPhase::is_terminal) {
                    prop_assert_eq!(action, Action::Wait);
                }
            }
        }
    }
}
