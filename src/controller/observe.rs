//! The first step of a reconcile: what the caches (and, only when a decision depends on it, the
//! API server) say about one run, gathered into [`Observed`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::OwnedSemaphorePermit;

use super::cached_pod::CachedPod;
use super::verify::DeciderRights;
use super::{Context, ReconcileError, decide};
use crate::approval_policy::{self, CallFacts, CompiledPolicy, Requirement};
use crate::chunk_store;
use crate::crd::keys::annotations;
use crate::crd::policy::DecidedBy;
use crate::crd::stored_state::{self, StoredStateError};
use crate::crd::{
    Agent, AgentRun, AgentRunPhase, AgentSnapshot, AgentSpec, ApprovalRequest, ToolBinding,
};
use crate::crd::{PolicyAction, PolicyDecision};
use crate::state::RunState;

/// What one reconcile observed about a run. Plain data: planning is a pure function of it.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The run; with its `status.runState` when [`state`](Self::state) was read.
    pub run: AgentRun,
    /// The run's Agent, if it exists.
    pub agent: Option<Arc<Agent>>,
    /// The run's worker Pods.
    pub pods: Vec<CachedPod>,
    /// The run's ApprovalRequests.
    pub requests: Vec<ApprovalRequest>,
    /// The run's RunState, read only when the next action depends on it (see
    /// [`decide::needs_state`]); `Err` holds why it could not be read.
    pub state: Option<Result<RunState, String>>,
    /// The run's requests whose resolution this replica recorded recently (the cache may not
    /// show it yet).
    pub recorded: BTreeSet<String>,
    /// The run's worker Pods this replica created recently that [`pods`](Self::pods) does not
    /// show yet (the Pod watch has not delivered them).
    pub created_unseen: BTreeSet<String>,
    /// This replica wrote over this version of the run: the watch has not delivered the write.
    pub stale: bool,
    /// The run's cached version, the watch's, has finished: every later reconcile starts from
    /// a finished run (a status this reconcile read from the API server does not say so).
    pub finished_in_cache: bool,
    /// The admission policies that stamp and check decisions are installed.
    pub policies_installed: bool,
    /// What the deciders and voters of undecided requests may do in the namespace, by stamped
    /// username (asked only under strict separation of duties).
    pub rights: BTreeMap<String, DeciderRights>,
    /// The ApprovalPolicies that select the run's namespace.
    pub policies: Vec<Arc<CompiledPolicy>>,
    /// The time of the observation.
    pub now: DateTime<Utc>,
}

impl Observed {
    /// How long a call of `tool` may wait for a decision, if its Agent sets a timeout.
    pub fn approval_timeout(&self, tool: &str) -> Option<Duration> {
        crate::agent::tool::parse_duration(self.tool_binding(tool)?.approval_timeout.as_deref()?)
    }

    /// Where a call of `tool` (an HTTP or MCP tool) goes and the definition it is bound to, in
    /// the run's snapshot or (before it started) its Agent now.
    pub fn tool_binding(&self, tool: &str) -> Option<ToolBinding> {
        match self.run.status.as_ref().and_then(|s| s.agent.as_ref()) {
            Some(snapshot) => snapshot.tool_binding(tool),
            None => AgentSnapshot::of(self.agent.as_deref()?).tool_binding(tool),
        }
    }

    /// Whether the Agent the run uses requires approval for `tool` (an unknown tool: yes).
    pub fn agent_requires_approval(&self, tool: &str) -> bool {
        let Some(spec) = self.agent_spec() else {
            return true;
        };
        if let Some(http) = spec.tools.iter().find(|t| t.name == tool) {
            return http.requires_approval;
        }
        let of_agent;
        let snapshot = match self.run.status.as_ref().and_then(|s| s.agent.as_deref()) {
            Some(snapshot) => snapshot,
            None => match self.agent.as_deref() {
                Some(agent) => {
                    of_agent = AgentSnapshot::of(agent);
                    &of_agent
                }
                None => return true,
            },
        };
        let Some(binding) = snapshot.mcp_tools.iter().find(|t| t.name == tool) else {
            return true;
        };
        spec.mcp_servers
            .iter()
            .find(|s| s.name == binding.server)
            .is_none_or(|server| server.require_approval.requires_approval(&binding.hints()))
    }

    /// What the ApprovalPolicies selecting the run's namespace require of a call of `tool` with
    /// `args`, if a rule matches it.
    pub fn evaluate_policies(&self, tool: &str, args: &serde_json::Value) -> Option<Requirement> {
        let run = &self.run;
        approval_policy::evaluate(
            &self.policies,
            &CallFacts {
                tool,
                args,
                agent: &run.spec.agent_ref.name,
                namespace: run.metadata.namespace.as_deref().unwrap_or_default(),
                run: run.metadata.name.as_deref().unwrap_or_default(),
                labels: run.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            },
        )
    }

    /// What a halted call of `tool` with `arguments` (its stored JSON) needs: the policies'
    /// requirement; or, when no rule matches, `None` if the Agent requires approval (one person
    /// decides) and an Allow recorded as `policy:none` if it does not (only a policy's tool globs
    /// halted it).
    pub fn requirement_for(&self, tool: &str, arguments: &str) -> Option<Requirement> {
        // Arguments that are not plain JSON (e.g. NaN) fail the conditions: fail closed.
        let args = serde_json::from_str(arguments).unwrap_or(serde_json::Value::Null);
        if let Some(requirement) = self.evaluate_policies(tool, &args) {
            return Some(requirement);
        }
        if self.agent_requires_approval(tool) {
            return None;
        }
        Some(Requirement {
            decision: PolicyDecision {
                action: PolicyAction::Allow,
                note: Some(format!(
                    "no ApprovalPolicy rule matched this call, and Agent {} does not require approval for {tool}",
                    self.run.spec.agent_ref.name
                )),
                ..Default::default()
            },
            required_approvals: None,
            approvers: None,
        })
    }

    /// The tool globs the run's workers halt on for the policies.
    pub fn approval_gates(&self) -> Vec<String> {
        approval_policy::gates(&self.policies)
    }

    /// The run's creator, as the admission policy stamped it at creation.
    pub fn creator(&self) -> Option<&str> {
        self.run
            .annotations()
            .get(annotations::CREATED_BY)
            .map(String::as_str)
            .or(self
                .run
                .status
                .as_ref()
                .and_then(|s| s.created_by.as_deref()))
    }

    /// The spec the run uses: its snapshot, or (before it started) its Agent's.
    pub fn agent_spec(&self) -> Option<&AgentSpec> {
        let snapshot = self.run.status.as_ref().and_then(|s| s.agent.as_ref());
        match snapshot {
            Some(snapshot) => snapshot.verified_spec(),
            None => self.agent.as_ref().map(|a| &a.spec),
        }
    }

    /// The definition digest of `tool` in the spec the run uses.
    pub fn tool_definition_digest(&self, tool: &str) -> Option<String> {
        self.tool_binding(tool).map(|b| b.definition_digest)
    }

    /// Whether the run has finished for good.
    pub fn is_terminal(&self) -> bool {
        self.run.is_finished()
    }

    /// An observation of `run` alone, now, with [`Agent::test`] as its Agent.
    #[cfg(test)]
    pub fn of(run: AgentRun) -> Observed {
        Observed {
            finished_in_cache: run.is_finished(),
            run,
            agent: Some(Arc::new(Agent::test())),
            pods: vec![],
            requests: vec![],
            state: None,
            recorded: BTreeSet::new(),
            created_unseen: BTreeSet::new(),
            stale: false,
            policies_installed: true,
            rights: BTreeMap::new(),
            policies: vec![],
            now: Utc::now(),
        }
    }
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// The name of the worker Pod of the run's current step and attempt, while it runs one.
fn current_worker_pod(run: &AgentRun) -> Option<String> {
    let status = run.status.as_ref()?;
    (status.phase == Some(AgentRunPhase::Running)).then(|| {
        crate::crd::worker_pod_name(
            &run.name_any(),
            status.step.unwrap_or(0),
            status.retries.unwrap_or(0),
        )
    })
}

/// Observes `run`. The returned permit, when there is one, bounds how many large states are in
/// memory at once: hold it until the reconcile is done.
pub async fn observe(
    run: &AgentRun,
    ctx: &Context,
) -> Result<(Observed, Option<OwnedSemaphorePermit>), ReconcileError> {
    let ns = run.namespace().ok_or(ReconcileError::NoNamespace)?;
    let requests = ctx.requests.of(run);
    let recorded = requests
        .iter()
        .map(|r| r.name_any())
        .filter(|name| ctx.memory.was_recorded(&ns, name))
        .collect();
    let pods = ctx.pods.of(run);
    let created_unseen = match current_worker_pod(run) {
        Some(name) if pods.iter().any(|p| p.name_any() == name) => {
            ctx.memory.saw_pod(&ns, &name);
            BTreeSet::new()
        }
        Some(name) if ctx.memory.created_unseen(&ns, &name) => BTreeSet::from([name]),
        _ => BTreeSet::new(),
    };
    let mut observed = Observed {
        run: run.clone(),
        agent: ctx
            .agents
            .get(&ObjectRef::new(&run.spec.agent_ref.name).within(&ns)),
        pods,
        requests,
        state: None,
        recorded,
        created_unseen,
        stale: ctx.memory.is_stale(run),
        finished_in_cache: run.is_finished(),
        policies_installed: ctx.policies_installed(),
        rights: BTreeMap::new(),
        policies: ctx.policies_for(&ns),
        now: Utc::now(),
    };
    let mut permit = None;
    if observed.is_terminal()
        || observed.stale
        || !decide::needs_state(run, &observed.pods, &observed.requests, observed.now)
    {
        return Ok((observed, permit));
    }
    // A cached state is decoded here; one read from the API server (or its chunks) below.
    let cached = ctx.states.restore(run).and_then(|full| {
        let decoded = stored_state::decode(full.status.as_ref()?);
        may_use_cached(run, &decoded).then_some((full, decoded))
    });
    let (full, decoded) = match cached {
        Some(cached) => cached,
        None => {
            // A large state read from the API server takes memory: few at once bound it, whatever
            // the reconcile concurrency. Small ones need no bound, and must not wait behind the
            // large ones (the waiting reconcile holds one of the concurrency's slots meanwhile).
            if !is_small(run) {
                permit = ctx.state_reads.clone().acquire_owned().await.ok();
            }
            let full = Api::<AgentRun>::namespaced(ctx.client.clone(), &ns)
                .get(&run.name_any())
                .await?;
            let decoded = chunk_store::load(&ctx.client, &full).await;
            (full, decoded)
        }
    };
    if ctx.config.policy.decisions.strict_separation_of_duties {
        observed.rights = decider_rights(ctx, &ns, &observed.requests).await?;
    }
    observed.state = Some(match decoded {
        Ok(Some(state)) => Ok(state),
        Ok(None) => Err("status.runState is missing".to_owned()),
        // An API failure reading chunks is retried; anything else is a bad state.
        Err(StoredStateError::Kube(e)) => return Err(e.into()),
        Err(e) => Err(e.to_string()),
    });
    observed.run = full;
    Ok((observed, permit))
}

/// Whether a reconcile of `run` may act on `full`, the cached state of exactly its version.
///
/// Applying a decision may: its writes are guarded by that same resourceVersion. A finished step
/// may only when the cached state is the worker's last write, as its Pod's success can reach the
/// cache before that write does. At a step's first attempt the worker writes the state once, at
/// its end, and the state before it (the controller's, when it resumed the run) neither finishes
/// nor halts: so a cached state that finishes or halts is that last write. A retry's cached state
/// may be the earlier attempt's and is read fresh.
fn may_use_cached(run: &AgentRun, decoded: &Result<Option<RunState>, StoredStateError>) -> bool {
    let status = run.status.clone().unwrap_or_default();
    match status.phase {
        Some(AgentRunPhase::AwaitingApproval) => true,
        Some(AgentRunPhase::Running) if status.retries.unwrap_or(0) == 0 => {
            matches!(decoded, Ok(Some(state))
                if state.final_output.is_some() || !state.pending_approvals().is_empty())
        }
        _ => false,
    }
}

/// Whether the run's stored state is small enough to be read without a permit (no larger than
/// what the state cache keeps).
fn is_small(run: &AgentRun) -> bool {
    run.status
        .as_ref()
        .and_then(|s| s.run_state_bytes)
        .is_some_and(|bytes| bytes <= super::state_cache::MAX_ENTRY_BYTES as u64)
}

/// Under strict separation of duties: what the decider or voters of each undecided request may do
/// in `ns` (two SubjectAccessReviews per stamped identity).
async fn decider_rights(
    ctx: &Context,
    ns: &str,
    requests: &[ApprovalRequest],
) -> Result<BTreeMap<String, DeciderRights>, ReconcileError> {
    let reviews: Api<SubjectAccessReview> = Api::all(ctx.client.clone());
    let mut stamps: BTreeMap<String, DecidedBy> = BTreeMap::new();
    for request in requests {
        let undecided = request
            .status
            .as_ref()
            .and_then(|s| s.phase)
            .is_none_or(|p| !p.is_final());
        if !undecided {
            continue;
        }
        let decision_stamp = request
            .spec
            .decision
            .and(request.annotations().get(annotations::DECIDED_BY));
        let vote_stamps = request
            .spec
            .votes
            .values()
            .filter_map(|v| v.decided_by.as_ref());
        for text in decision_stamp.into_iter().chain(vote_stamps) {
            if let Ok(stamp) = DecidedBy::parse(text) {
                stamps.entry(stamp.username.clone()).or_insert(stamp);
            }
        }
    }
    let mut rights = BTreeMap::new();
    for (username, stamp) in stamps {
        let allowed = |group: &str, resource: &str, verb: &str| {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(stamp.username.clone()),
                    uid: (!stamp.uid.is_empty()).then(|| stamp.uid.clone()),
                    groups: Some(stamp.groups.clone()),
                    resource_attributes: Some(ResourceAttributes {
                        namespace: Some(ns.to_owned()),
                        group: Some(group.to_owned()),
                        resource: Some(resource.to_owned()),
                        verb: Some(verb.to_owned()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let reviews = reviews.clone();
            async move {
                let answer = reviews.create(&PostParams::default(), &review).await?;
                Ok::<bool, kube::Error>(answer.status.is_some_and(|s| s.allowed))
            }
        };
        let create_runs = allowed(crate::crd::GROUP, "agentruns", "create").await?;
        let impersonate_service_accounts = allowed("", "serviceaccounts", "impersonate").await?;
        rights.insert(
            username,
            DeciderRights {
                create_runs,
                impersonate_service_accounts,
            },
        );
    }
    Ok(rights)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::AgentRunStatus;

    fn with_bytes(bytes: Option<u64>) -> AgentRun {
        let mut run = AgentRun::new("r", Default::default());
        run.status = Some(AgentRunStatus {
            run_state_bytes: bytes,
            ..Default::default()
        });
        run
    }

    #[test]
    fn a_finished_step_uses_the_cached_state_only_when_it_is_the_workers_last_write() {
        use crate::state::DeferredToolCall;
        let finished = RunState {
            final_output: Some("done".into()),
            ..Default::default()
        };
        let mut halted = RunState::default();
        halted
            .deferred_tool_requests
            .approvals
            .push(DeferredToolCall {
                tool_call_id: "c1".into(),
                tool_name: "delete_user".into(),
                args: serde_json::json!({}).into(),
            });
        let resumed = RunState::default();
        let running = AgentRun::test().in_phase(Some(AgentRunPhase::Running));
        let ok = |state: &RunState| Ok(Some(state.clone()));
        assert!(may_use_cached(&running, &ok(&finished)));
        assert!(may_use_cached(&running, &ok(&halted)));
        assert!(
            !may_use_cached(&running, &ok(&resumed)),
            "the controller's state from before the worker ran"
        );
        assert!(!may_use_cached(&running, &Ok(None)));
        let retry = running.clone().with_retries(1);
        assert!(
            !may_use_cached(&retry, &ok(&finished)),
            "may be the earlier attempt's write"
        );
        let awaiting = AgentRun::test().in_phase(Some(AgentRunPhase::AwaitingApproval));
        assert!(may_use_cached(&awaiting, &ok(&resumed)));
        let done = AgentRun::test().in_phase(Some(AgentRunPhase::Succeeded));
        assert!(!may_use_cached(&done, &ok(&finished)));
    }

    #[test]
    fn only_states_the_cache_could_hold_are_read_without_a_permit() {
        assert!(is_small(&with_bytes(Some(2_000))));
        assert!(is_small(&with_bytes(Some(16 << 10))));
        assert!(!is_small(&with_bytes(Some((16 << 10) + 1))));
        assert!(!is_small(&with_bytes(None)));
    }
}
