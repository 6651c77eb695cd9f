//! The first half of planning, pure: from what was observed (the run, its Agent, its worker Pods
//! and ApprovalRequests, and its RunState when needed) to the one next [`Action`]. The
//! [`plan`](super::plan) turns the action into the writes that carry it out.

use std::time::Duration;

use chrono::{DateTime, Utc};
use kube::ResourceExt;

mod edits;
mod halt;

use super::cached_pod::CachedPod;
use super::observe::Observed;
use super::verify::{self, Decider, DecisionContext, DecisionRules, Refusal};
use crate::approval_policy::Requirement;
use crate::crd::{
    AgentRun, AgentRunPhase, ApprovalPhase, ApprovalRequest, Reason, approval_request_name,
    worker_pod_name,
};
use crate::state::{DeferredToolCall, RunState};
use crate::time::from_k8s;
use halt::awaiting;

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
    /// A person, a quorum of people or an ApprovalPolicy approved it.
    Approved {
        /// Who approved (the verified `approverId`, the voters, or `policy:<policy>/<rule>`).
        approver_id: Option<String>,
        /// Why, for the audit.
        reason: Option<String>,
        /// The arguments the approver approved instead of the model's (stored form).
        edited_arguments: Option<String>,
    },
    /// A person, a quorum of people or an ApprovalPolicy rejected it.
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
    /// When it expires, if the tool has an approval timeout (never for a policy decision).
    pub expires_at: Option<DateTime<Utc>>,
    /// What the ApprovalPolicies set for the call (`None`: no rule matched and the Agent
    /// requires approval: one person decides).
    pub requirement: Option<Requirement>,
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
    pods: &[CachedPod],
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
            || !r.spec.votes.is_empty()
            || r.spec.policy_decision().is_some()
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

fn find_pod<'a>(pods: &'a [CachedPod], name: &str) -> Option<&'a CachedPod> {
    pods.iter().find(|p| p.name_any() == name)
}

/// How a worker Pod ended, from its status.
pub fn pod_outcome(pod: Option<&CachedPod>) -> PodOutcome {
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
                // Created by this replica a moment ago: the Pod watch shows it soon, and then
                // the run is reconciled again.
                PodOutcome::Missing if observed.created_unseen.contains(&name) => {
                    Action::Recheck(super::memory::CREATED_POD_UNSEEN_FOR)
                }
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
            None | Some(ApprovalPhase::Pending) => {
                request.spec.decision.is_some()
                    && verify::verify_decision(
                        request,
                        decision_context(observed),
                        &policy.decisions,
                    )
                    .is_ok()
            }
            Some(_) => false,
        },
    )
}

/// What checking a decision needs from the observation.
fn decision_context(observed: &Observed) -> DecisionContext<'_> {
    DecisionContext {
        policies_installed: observed.policies_installed,
        creator: observed.creator(),
        rights: &observed.rights,
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
        .map(|call| {
            let arguments = call.arguments_json();
            let requirement = observed.requirement_for(&call.tool_name, &arguments);
            let decided = requirement.as_ref().is_some_and(|r| r.decision.decides());
            NewRequest {
                name: approval_request_name(&run_name, &call.tool_call_id),
                call: (*call).clone(),
                expires_at: observed
                    .approval_timeout(&call.tool_name)
                    .filter(|_| !decided)
                    .map(|t| {
                        observed.now
                            + chrono::Duration::from_std(t)
                                .unwrap_or_else(|_| chrono::Duration::days(36500))
                    }),
                arguments,
                requirement,
            }
        })
        .collect();
    Action::RequestApprovals {
        create,
        pending: pending.len() as u32,
    }
}

#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod tests;
