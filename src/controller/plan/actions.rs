//! The steps of each action but a resume: starting a step, creating a Pod, requesting approvals,
//! reporting a missing Agent, success and failure.

use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::{Plan, Requeue, Step, announce, patch_run, truncate, with_condition};
use crate::controller::children::{self, WorkerSettings};
use crate::controller::decide::{NewRequest, Policy};
use crate::controller::observe::Observed;
use crate::controller::signing::Issuer;
use crate::crd::keys::{finalizers, labels};
use crate::crd::names::{run_label_value, worker_pod_name};
use crate::crd::status_patch::{AgentRunStatusPatch, ApprovalRequestStatusPatch};
use crate::crd::{
    Agent, AgentRunPhase, AgentRunRef, AgentSnapshot, ApprovalPhase, ApprovalRequest,
    ApprovalRequestSpec, ConditionStatus, ConditionType, EventReason, PolicyAction, PolicyDecision,
    Reason,
};
use crate::time::to_k8s;

/// Builds the steps of one action.
pub(super) struct Planner<'a> {
    pub(super) o: &'a Observed,
    pub(super) worker: &'a WorkerSettings,
    pub(super) policy: &'a Policy,
    /// Signs the assertions of the approvals recorded (none when `None`).
    pub(super) issuer: Option<&'a Issuer>,
}

impl Planner<'_> {
    pub(super) fn run_name(&self) -> String {
        self.o.run.name_any()
    }

    pub(super) fn step(&self) -> u32 {
        self.o.run.status.as_ref().and_then(|s| s.step).unwrap_or(0)
    }

    /// The run's conditions with `Ready` set.
    pub(super) fn ready(
        &self,
        status: ConditionStatus,
        reason: Reason,
        message: &str,
    ) -> Option<Vec<Condition>> {
        Some(with_condition(
            self.o,
            ConditionType::Ready,
            status,
            reason,
            message,
        ))
    }

    pub(super) fn generation(&self) -> Option<Option<i64>> {
        Some(self.o.run.metadata.generation)
    }

    pub(super) fn agent_missing(&self, plan: &mut Plan, policy: &Policy) {
        plan.requeue = Requeue::After(policy.recheck);
        let already = self
            .o
            .run
            .status
            .as_ref()
            .and_then(|s| crate::crd::find_condition(&s.conditions, ConditionType::Ready))
            .is_some_and(|c| c.reason == Reason::AgentNotFound.as_ref());
        if already {
            return;
        }
        let message = format!(
            "Agent {} not found in namespace {}",
            self.o.run.spec.agent_ref.name,
            self.o.run.namespace().unwrap_or_default()
        );
        let phase = self.o.run.status.as_ref().and_then(|s| s.phase);
        plan.steps.push(patch_run(
            AgentRunStatusPatch {
                conditions: self.ready(ConditionStatus::False, Reason::AgentNotFound, &message),
                observed_generation: self.generation(),
                phase: phase.is_none().then_some(AgentRunPhase::Pending),
                ..Default::default()
            },
            None,
        ));
        plan.steps.push(announce(
            EventType::Warning,
            EventReason::AgentNotFound,
            message,
        ));
    }

    /// Starts a step's worker. The first start binds the run to its Agent (the snapshot every
    /// step uses) and creates the run's worker identity from it.
    pub(super) fn start_step(&self, agent: Option<&Agent>, step: u32, attempt: u32) -> Vec<Step> {
        let run = &self.o.run;
        let mut steps = vec![];
        let bound = run.status.as_ref().and_then(|s| s.agent.as_ref()).is_some();
        let snapshot = (!bound).then(|| agent.map(AgentSnapshot::of)).flatten();
        let own_account = run
            .spec
            .worker
            .as_ref()
            .and_then(|w| w.service_account_name.as_ref())
            .is_none();
        if step == 0
            && attempt == 0
            && own_account
            && let Some(spec) = snapshot.as_ref().and_then(|s| s.spec.as_ref())
        {
            steps.push(Step::ApplyWorkerIdentity(Box::new(
                children::worker_identity(run, spec),
            )));
        }
        let pod = worker_pod_name(&self.run_name(), step, attempt);
        let status = run.status.clone().unwrap_or_default();
        let created_by = status
            .created_by
            .is_none()
            .then(|| {
                run.annotations()
                    .get(crate::crd::keys::annotations::CREATED_BY)
                    .cloned()
            })
            .flatten();
        steps.push(patch_run(
            AgentRunStatusPatch {
                phase: Some(AgentRunPhase::Running),
                step: Some(step),
                retries: Some(attempt),
                worker_pod: Some(pod.clone()),
                pending_approvals: Some(0),
                observed_generation: self.generation(),
                conditions: self.ready(
                    ConditionStatus::False,
                    Reason::Running,
                    &format!("worker Pod {pod} runs step {step}"),
                ),
                started_at: status.started_at.is_none().then(|| to_k8s(self.o.now)),
                created_by,
                agent: snapshot,
                approval_gates: Some(self.o.approval_gates()),
                ..Default::default()
            },
            run.resource_version(),
        ));
        steps.push(self.create_pod(step, attempt, true, vec![]));
        steps
    }

    /// Creates the worker Pod of a step's attempt; `announce` publishes a `WorkerStarted` Event
    /// (a resume is announced by its decisions' Events instead).
    pub(super) fn create_pod(
        &self,
        step: u32,
        attempt: u32,
        announce: bool,
        resumes: Vec<DateTime<Utc>>,
    ) -> Step {
        let pod = children::worker_pod(&self.o.run, step, attempt, self.worker);
        let name = pod.name_any();
        let announce = announce.then(|| match attempt {
            0 => format!("Started worker Pod {name} for step {step}"),
            _ => format!("Started worker Pod {name} for step {step} (retry {attempt})"),
        });
        Step::CreatePod {
            pod: Box::new(pod),
            announce,
            resumes,
        }
    }

    pub(super) fn request_approvals(&self, create: Vec<NewRequest>, pending: u32) -> Vec<Step> {
        let run = &self.o.run;
        let run_name = self.run_name();
        // With self-approval allowed (an admin setting) the creator is not copied, so the
        // policy does not refuse it.
        let creator = if self.policy.decisions.allow_self_approval {
            None
        } else {
            self.o.creator().map(str::to_owned)
        };
        let mut steps = vec![];
        for new in create {
            let tool = self.o.tool_binding(&new.call.tool_name);
            let requirement = new.requirement.clone();
            let (policy, required_approvals, approvers) = match requirement {
                Some(r) => (Some(r.decision), r.required_approvals, r.approvers),
                None => (None, None, None),
            };
            let announce = announcement(&new, policy.as_ref(), required_approvals, &run_name);
            let mut request = ApprovalRequest::new(
                &new.name,
                ApprovalRequestSpec {
                    agent_run_ref: AgentRunRef {
                        name: run_name.clone(),
                        uid: run.uid().unwrap_or_default(),
                    },
                    step: self.step(),
                    tool_call_id: new.call.tool_call_id.clone(),
                    tool_name: new.call.tool_name.clone(),
                    arguments_digest: crate::crd::arguments_digest(&new.arguments),
                    arguments: new.arguments.clone(),
                    run_creator: creator.clone(),
                    tool_endpoint: tool.as_ref().map(|t| t.endpoint.clone()),
                    tool_definition_digest: tool.map(|t| t.definition_digest),
                    policy,
                    required_approvals,
                    approvers,
                    ..Default::default()
                },
            );
            request.metadata.namespace = run.namespace();
            request.metadata.labels =
                Some([(labels::RUN.to_owned(), run_label_value(&run_name))].into());
            // The run's trace context (only a well-formed one), which the notifications about the
            // request carry.
            let trace = crate::notify::events::trace_context(run.annotations()).annotations();
            if !trace.is_empty() {
                request.metadata.annotations = Some(trace);
            }
            request.metadata.owner_references = run.controller_owner_ref(&()).map(|o| vec![o]);
            request.metadata.finalizers = Some(vec![finalizers::KEEP_WITH_RUN.to_owned()]);
            steps.push(Step::CreateRequest {
                request: Box::new(request),
                status: ApprovalRequestStatusPatch {
                    phase: Some(ApprovalPhase::Pending),
                    expires_at: new.expires_at.map(to_k8s),
                    ..Default::default()
                },
                announce,
            });
        }
        let status = run.status.clone().unwrap_or_default();
        if status.phase != Some(AgentRunPhase::AwaitingApproval)
            || status.pending_approvals != Some(pending)
        {
            // The ApprovalRequested Events say what awaits a decision: no Event of its own.
            steps.push(patch_run(
                AgentRunStatusPatch {
                    phase: Some(AgentRunPhase::AwaitingApproval),
                    pending_approvals: Some(pending),
                    observed_generation: self.generation(),
                    conditions: self.ready(
                        ConditionStatus::False,
                        Reason::AwaitingApproval,
                        &format!("{pending} tool call(s) await a decision"),
                    ),
                    ..Default::default()
                },
                None,
            ));
        }
        steps
    }

    pub(super) fn succeed(&self, output: &str) -> Vec<Step> {
        vec![
            patch_run(
                AgentRunStatusPatch {
                    phase: Some(AgentRunPhase::Succeeded),
                    final_output: Some(truncate(
                        output,
                        crate::crd::agent_run::MAX_FINAL_OUTPUT_LENGTH,
                    )),
                    completed_at: Some(to_k8s(self.o.now)),
                    pending_approvals: Some(0),
                    observed_generation: self.generation(),
                    conditions: self.ready(
                        ConditionStatus::True,
                        Reason::Succeeded,
                        "the run finished",
                    ),
                    ..Default::default()
                },
                None,
            ),
            announce(
                EventType::Normal,
                EventReason::Succeeded,
                format!("Run finished: {}", truncate(output, 200)),
            ),
        ]
    }

    pub(super) fn fail(&self, reason: Reason, message: &str) -> Vec<Step> {
        vec![
            patch_run(
                AgentRunStatusPatch {
                    phase: Some(AgentRunPhase::Failed),
                    completed_at: Some(to_k8s(self.o.now)),
                    observed_generation: self.generation(),
                    conditions: self.ready(ConditionStatus::False, reason, message),
                    ..Default::default()
                },
                None,
            ),
            announce(
                EventType::Warning,
                EventReason::Failed,
                format!("{reason}: {message}"),
            ),
        ]
    }
}

/// The `ApprovalRequested` Event's note: how to decide the request, or which policy decided it.
fn announcement(
    new: &NewRequest,
    policy: Option<&PolicyDecision>,
    required_approvals: Option<u32>,
    run_name: &str,
) -> String {
    let call = format!(
        "Tool call {} ({}) of run {run_name}",
        new.call.tool_name, new.call.tool_call_id
    );
    if let Some(policy) = policy.filter(|p| p.decides()) {
        return format!(
            "{call} is {} by {}",
            if policy.action == PolicyAction::Deny {
                "denied"
            } else {
                "allowed"
            },
            policy.approver_id()
        );
    }
    match required_approvals.filter(|&n| n > 1) {
        Some(n) => format!(
            "{call} needs {n} approvals: each approver runs kubectl agentrun approve {} --reason '<why>' (or adds their vote under spec.votes)",
            new.name
        ),
        None => format!(
            "{call} awaits a decision: kubectl patch apr {} --type merge -p '{{\"spec\":{{\"decision\":\"Approved\",\"approverId\":\"<you>\",\"reason\":\"<why>\"}}}}'",
            new.name
        ),
    }
}
