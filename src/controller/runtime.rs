//! The controller's runtime: the CRD check, the signing keys, the metrics, probe and JWKS
//! endpoints, leader election, the
//! watches and caches, the two `kube::runtime::Controller`s (runs, and Agents' status), and the
//! notifier ([`crate::notify`]), which taps the watches of runs and requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, future};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio_util::task::AbortOnDropHandle;
use tracing::{info, warn};

use super::cached_pod::CachedPod;
use super::event_queue::{self, EVENTS_AT_ONCE, EVENTS_QUEUED, EventQueue};
use super::shared_snapshots::SharedSnapshots;
use super::{
    ALL_CACHES, Context, ControllerConfig, DEFAULT_CONCURRENCY, StartError, agent_status, memory,
    metrics, owned::Owned, policy_status, reconcile, state_cache,
};
use crate::crd::keys::{field_managers, labels};
use crate::crd::{Agent, AgentRun, ApprovalPolicy, ApprovalRequest, ConditionType, Reason};

/// The runs' cache lists this many at a time, so that the initial list of many large runs never
/// sits in memory at once (each run is stripped of its state as it arrives).
const RUN_LIST_PAGE_SIZE: u32 = 100;

/// How many reconciles read a RunState from the API server at once (each may hold a large state
/// while it decides and writes).
const STATE_READS_AT_ONCE: usize = 8;
/// How many finished runs have their worker Pods deleted at once (the others wait their turn).
const POD_DELETIONS_AT_ONCE: usize = 16;

/// Agent events buffered for each of the Agents' two consumers.
const AGENT_EVENT_BUFFER: usize = 256;

/// The bit of each cache in [`Context::synced`].
const RUNS: u8 = 0b0001;
const PODS: u8 = 0b0010;
const REQUESTS: u8 = 0b0100;
const AGENTS: u8 = 0b1000;
/// Set once the admission policies were checked for the first time.
const POLICIES_CHECKED: u8 = 0b10000;
const APPROVAL_POLICIES: u8 = 0b10_0000;
const NAMESPACES: u8 = 0b100_0000;

/// ApprovalPolicy events buffered for each of the policies' two consumers.
const POLICY_EVENT_BUFFER: usize = 64;
/// Compiled ApprovalPolicies kept (one per policy generation).
const COMPILED_POLICIES: u64 = 1024;

/// Checks the CRDs are served, serves metrics and probes, takes the leader lease when configured,
/// then runs the controller until a shutdown signal (or until it loses the lease).
pub async fn run(client: Client, config: ControllerConfig) -> Result<(), StartError> {
    let runs: Api<AgentRun> = scoped(&client, &config.namespace);
    if let Err(e) = runs.list(&ListParams::default().limit(1)).await {
        return Err(match e {
            kube::Error::Api(s) if s.code == 404 => StartError::CrdsMissing(s.message),
            other => StartError::Kube(other),
        });
    }
    let issuer = match &config.signing {
        Some(signing) => Some(Arc::new(
            super::signing::load_or_create(&client, signing).await?,
        )),
        None => None,
    };
    let probe = metrics::Probe {
        metrics: Arc::default(),
        ready: Arc::default(),
        synced: Arc::default(),
        caches: Arc::default(),
        jwks: issuer.as_ref().map(|i| Arc::from(i.jwks().to_json())),
    };
    let _server = match config.metrics_addr {
        Some(addr) => {
            let listener_probe = probe.clone();
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartError::Metrics { addr, source })?;
            info!(%addr, "serving /metrics, /healthz, /readyz and the approval keys' JWKS");
            Some(AbortOnDropHandle::new(tokio::spawn(async move {
                if let Err(error) = metrics::serve(listener, listener_probe).await {
                    warn!(%error, "metrics endpoint stopped");
                }
            })))
        }
        None => None,
    };
    let Some(election) = config.leader_election.clone() else {
        run_controllers(client, config, probe, issuer).await;
        return Ok(());
    };
    let manager =
        kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &election.lease_name)
            .with_namespace(&election.namespace)
            .with_identity(&election.identity)
            .with_duration(election.lease_duration.as_secs().max(2))
            .with_grace(
                election
                    .grace
                    .as_secs()
                    .clamp(1, election.lease_duration.as_secs().max(2) - 1),
            )
            .build()
            .await?;
    let (mut leader, lease_task) = manager.watch().await;
    // A standby replica is healthy and ready: it only waits for the lease.
    probe.ready.store(true, Ordering::Relaxed);
    info!(identity = %election.identity, lease = %election.lease_name, "waiting for the leader lease");
    while !*leader.borrow_and_update() {
        if leader.changed().await.is_err() {
            return Err(StartError::LostLeadership);
        }
    }
    info!(identity = %election.identity, "acquired the leader lease");
    probe.ready.store(false, Ordering::Relaxed);
    let lost = async {
        loop {
            if leader.changed().await.is_err() || !*leader.borrow_and_update() {
                return;
            }
        }
    };
    let result = tokio::select! {
        () = run_controllers(client, config, probe, issuer) => Ok(()),
        () = lost => Err(StartError::LostLeadership),
    };
    // Closing the channel releases the lease for the next leader.
    drop(leader);
    let _ = lease_task.await;
    result
}

/// Runs the runs' controller and the Agents' status controller until a shutdown signal.
async fn run_controllers(
    client: Client,
    config: ControllerConfig,
    probe: metrics::Probe,
    issuer: Option<Arc<super::Issuer>>,
) {
    let states = Arc::new(state_cache::StateCache::new(
        config
            .state_cache_bytes
            .unwrap_or(state_cache::DEFAULT_BUDGET_BYTES),
        state_cache::MAX_ENTRY_BYTES,
    ));
    // Notifications see what the watches of runs and requests bring (see crate::notify::tap).
    let notifier = config.notifications.clone().map(|notify| {
        crate::notify::Notifier::new(
            client.clone(),
            notify,
            config.namespace.clone(),
            probe.metrics.notifications.clone(),
        )
    });
    let run_tap = notifier.as_ref().map(crate::notify::Notifier::tap);
    let request_tap = run_tap.clone();
    let (run_reader, run_writer) = reflector::store();
    let observed_states = states.clone();
    // The Pods and requests of runs in progress (see Owned::observe_owner_event), and the Pods of
    // finished runs that are to be deleted, until they are.
    let deletion = config.worker.pod_deletion;
    let pods = Arc::new(Owned::<CachedPod>::new());
    let requests = Arc::new(Owned::<ApprovalRequest>::new());
    let (run_pods, run_requests) = (pods.clone(), requests.clone());
    let snapshots = SharedSnapshots::default();
    let run_stream = watcher(
        scoped::<AgentRun>(&client, &config.namespace),
        list_config(&config).page_size(RUN_LIST_PAGE_SIZE),
    )
    .default_backoff()
    .inspect_ok(move |event| observed_states.observe_event(event))
    .inspect_ok(move |event| {
        run_pods.observe_owner_event(event, |run| {
            run.is_finished() && !deletion.deletes_pods_of(run)
        });
        run_requests.observe_owner_event(event, AgentRun::is_finished);
    })
    .modify(move |run| strip_run(run, &snapshots))
    .inspect_ok(move |event| {
        if let Some(tap) = &run_tap {
            tap.run(event);
        }
    })
    .reflect(run_writer)
    .inspect_ok(synced(&probe, RUNS))
    .touched_objects();
    let pod_index = pods.clone();
    let managed_by = format!("{}={}", labels::MANAGED_BY.0, labels::MANAGED_BY.1);
    let pod_stream = watcher(
        scoped::<CachedPod>(&client, &config.namespace),
        list_config(&config).labels(&managed_by),
    )
    .default_backoff()
    .modify(CachedPod::strip)
    .inspect_ok(move |event| pod_index.observe_event(event))
    .inspect_ok(synced(&probe, PODS))
    .touched_objects();
    let request_index = requests.clone();
    let request_stream = watcher(
        scoped::<ApprovalRequest>(&client, &config.namespace),
        list_config(&config),
    )
    .default_backoff()
    .modify(strip_request)
    .inspect_ok(move |event| {
        if let Some(tap) = &request_tap {
            tap.request(event);
        }
    })
    .inspect_ok(move |event| request_index.observe_event(event))
    .inspect_ok(synced(&probe, REQUESTS))
    .touched_objects();
    // Agents are shared by the runs' controller (its cache, and waking runs that wait for
    // their Agent) and the Agents' status controller.
    let (agent_reader, agent_writer) = reflector::store_shared(AGENT_EVENT_BUFFER);
    let (Some(agents_for_runs), Some(agents_for_status)) =
        (agent_writer.subscribe(), agent_writer.subscribe())
    else {
        warn!("the Agents' cache cannot be shared; the controller does not start");
        return;
    };
    let agent_watch = watcher(
        scoped::<Agent>(&client, &config.namespace),
        list_config(&config),
    )
    .default_backoff()
    .modify(|a: &mut Agent| a.metadata.managed_fields = None)
    .reflect_shared(agent_writer)
    .inspect_ok(synced(&probe, AGENTS))
    .for_each(|_| future::ready(()));
    // ApprovalPolicies are shared by the runs' controller (evaluated on each halt) and the
    // policies' status controller; the namespaces' labels select which policies apply.
    let (policy_reader, policy_writer) = reflector::store_shared(POLICY_EVENT_BUFFER);
    let Some(policies_for_status) = policy_writer.subscribe() else {
        warn!("the ApprovalPolicies' cache cannot be shared; the controller does not start");
        return;
    };
    let policy_watch = watcher(
        Api::<ApprovalPolicy>::all(client.clone()),
        list_config(&config),
    )
    .default_backoff()
    .modify(|p: &mut ApprovalPolicy| p.metadata.managed_fields = None)
    .reflect_shared(policy_writer)
    .inspect_ok(synced(&probe, APPROVAL_POLICIES))
    .for_each(|_| future::ready(()));
    let (namespace_reader, namespace_writer) = reflector::store();
    let namespace_config = match &config.namespace {
        Some(ns) => list_config(&config).fields(&format!("metadata.name={ns}")),
        None => list_config(&config),
    };
    let namespace_watch = watcher(
        Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
        namespace_config,
    )
    .default_backoff()
    .modify(|n| n.metadata.managed_fields = None)
    .reflect(namespace_writer)
    .inspect_ok(synced(&probe, NAMESPACES))
    .for_each(|_| future::ready(()));
    let waiting_for_agent = run_reader.clone();
    let agent_mapper = move |agent: Arc<Agent>| {
        let ns = agent.namespace();
        let name = agent.name_any();
        waiting_for_agent
            .state()
            .into_iter()
            .filter(|run| run.namespace() == ns && run.spec.agent_ref.name == name)
            .filter(|run| {
                run.status
                    .as_ref()
                    .and_then(|s| crate::crd::find_condition(&s.conditions, ConditionType::Ready))
                    .is_some_and(|c| c.reason == Reason::AgentNotFound.as_ref())
            })
            .map(|run| ObjectRef::from_obj(&*run))
            .collect::<Vec<_>>()
    };

    let _ = probe.caches.set((run_reader.clone(), requests.clone()));
    let reporter = Reporter {
        controller: field_managers::CONTROLLER.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let (events, queued_events) = EventQueue::new(EVENTS_QUEUED, probe.metrics.clone());
    let _event_publishers = AbortOnDropHandle::new(tokio::spawn(event_queue::publish_all(
        queued_events,
        EVENTS_AT_ONCE,
        probe.metrics.clone(),
        event_queue::publisher(client.clone(), reporter),
    )));
    let concurrency = config.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    let policies = Arc::new(AtomicBool::new(false));
    let _policy_watch = AbortOnDropHandle::new(tokio::spawn(watch_policies(
        client.clone(),
        policy_names(config.admission_policy_prefix.as_deref()),
        policies.clone(),
        synced(&probe, POLICIES_CHECKED),
    )));
    let rediscover = config
        .mcp_rediscovery
        .unwrap_or(agent_status::DEFAULT_REDISCOVERY);
    let context = Arc::new(Context {
        events,
        client: client.clone(),
        config,
        metrics: probe.metrics.clone(),
        issuer,
        pods,
        requests,
        agents: agent_reader.clone(),
        approval_policies: policy_reader.clone(),
        namespaces: namespace_reader,
        compiled: moka::sync::Cache::new(COMPILED_POLICIES),
        synced: probe.synced.clone(),
        policies: policies.clone(),
        memory: memory::Memory::default(),
        states,
        state_reads: Arc::new(tokio::sync::Semaphore::new(STATE_READS_AT_ONCE)),
        pod_deletions: tokio::sync::Semaphore::new(POD_DELETIONS_AT_ONCE),
    });
    let _notifications = notifier.map(|n| AbortOnDropHandle::new(tokio::spawn(n.run())));
    info!("agentrun controller started");
    let runs = Controller::for_stream(run_stream, run_reader)
        .owns_stream(pod_stream)
        .owns_stream(request_stream)
        .watches_shared_stream(agents_for_runs, agent_mapper)
        .with_config(Config::default().concurrency(concurrency))
        .shutdown_on_signal()
        .run(reconcile::reconcile, reconcile::error_policy, context)
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::debug!(%error, "reconcile failed");
            }
        });
    let statuses = Controller::for_shared_stream(agents_for_status, agent_reader)
        .shutdown_on_signal()
        .run(
            agent_status::reconcile,
            agent_status::error_policy,
            Arc::new(agent_status::Context::new(client.clone(), rediscover)),
        )
        .for_each(|_| future::ready(()));
    let policy_statuses = Controller::for_shared_stream(policies_for_status, policy_reader)
        .shutdown_on_signal()
        .run(
            policy_status::reconcile,
            policy_status::error_policy,
            Arc::new(policy_status::Context {
                client: client.clone(),
            }),
        )
        .for_each(|_| future::ready(()));
    tokio::select! {
        () = runs => {}
        () = statuses => {}
        () = policy_statuses => {}
        () = agent_watch => {}
        () = policy_watch => {}
        () = namespace_watch => {}
    }
    info!("agentrun controller stopped");
}

/// Marks one cache as synced when its watch has listed everything; the replica is ready once all
/// are. (Store::wait_until_ready wakes a single waiter, which the controller itself uses.)
fn synced<K>(probe: &metrics::Probe, bit: u8) -> impl Fn(&watcher::Event<K>) + use<K> {
    let mask = probe.synced.clone();
    let ready = probe.ready.clone();
    let started = Instant::now();
    move |event| {
        if matches!(event, watcher::Event::InitDone) {
            let before = mask.fetch_or(bit, Ordering::Relaxed);
            let all = before | bit;
            let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            if before & bit == 0 {
                info!(cache = cache_name(bit), elapsed_ms, "cache synced");
            }
            if all == ALL_CACHES && !ready.swap(true, Ordering::Relaxed) {
                info!(elapsed_ms, "caches synced");
            }
        }
    }
}

/// The name of the cache behind a bit of [`Context::synced`], for the logs.
fn cache_name(bit: u8) -> &'static str {
    match bit {
        RUNS => "agentruns",
        PODS => "pods",
        REQUESTS => "approvalrequests",
        AGENTS => "agents",
        POLICIES_CHECKED => "admission policies",
        APPROVAL_POLICIES => "approvalpolicies",
        NAMESPACES => "namespaces",
        _ => "unknown",
    }
}

fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// How a cache is filled: paged lists, or a streaming list (see
/// [`ControllerConfig::streaming_lists`]).
fn list_config(config: &ControllerConfig) -> watcher::Config {
    let list = watcher::Config::default();
    if config.streaming_lists {
        list.streaming_lists()
    } else {
        list
    }
}

/// The cache keeps of a run what a reconcile and the notifier read. Its memory does not grow with
/// the runs' conversations: no RunState, no input (the worker reads it from the API server), no
/// final output (the controller writes it, nothing reads it back), no managed fields. And the runs
/// bound to one Agent snapshot share one copy of it.
fn strip_run(run: &mut AgentRun, snapshots: &SharedSnapshots) {
    run.metadata.managed_fields = None;
    run.spec.input = String::new();
    if let Some(status) = run.status.as_mut() {
        status.run_state = None;
        status.final_output = None;
        if let Some(snapshot) = status.agent.as_mut() {
            snapshots.share(snapshot);
        }
    }
}

/// The cache keeps of an ApprovalRequest what a reconcile and the notifier read: no managed
/// fields, no labels (the requests of a run are found by their owner reference), and no signed
/// assertion: the controller writes it but never reads it back (the worker reads it from the API
/// server), and at about 1 KiB it is the largest field of an approved request.
fn strip_request(request: &mut ApprovalRequest) {
    request.metadata.managed_fields = None;
    request.metadata.labels = None;
    if let Some(status) = request.status.as_mut() {
        status.assertion = None;
    }
}

/// How often the controller checks that the admission policies are installed.
const POLICY_CHECK_INTERVAL: Duration = Duration::from_secs(30);

/// Keeps `installed` up to date with whether the admission policies that stamp and check
/// decisions (and their bindings) exist; without them no decision is verified (see
/// [`DecisionRules`](super::DecisionRules)). Warns when they are missing.
async fn watch_policies(
    client: Client,
    names: [Vec<String>; 2],
    installed: Arc<AtomicBool>,
    checked: impl Fn(&watcher::Event<()>),
) {
    let mut warned = false;
    loop {
        let found = policies_installed(&client, &names).await;
        installed.store(found.is_ok(), Ordering::Relaxed);
        checked(&watcher::Event::InitDone);
        match found {
            Err(why) if !warned => {
                warn!(%why, "decisions are not applied: the admission policies that stamp and check them are missing (install crds/admission-policies.yaml, or run with --allow-unverified-decisions on clusters without admission policies)");
                warned = true;
            }
            Ok(()) if warned => {
                info!("the admission policies are installed: decisions are applied again");
                warned = false;
            }
            _ => {}
        }
        tokio::time::sleep(POLICY_CHECK_INTERVAL).await;
    }
}

/// The names of the mutating and of the validating admission policies (each with a binding of the
/// same name), with this prefix instead of `agentrun`.
pub fn policy_names(prefix: Option<&str>) -> [Vec<String>; 2] {
    use kube::ResourceExt;
    let named = |name: String| match prefix {
        Some(prefix) => format!("{prefix}{}", name.trim_start_matches("agentrun")),
        None => name,
    };
    let policies = crate::crd::policy::admission_policies();
    [
        policies
            .mutating
            .iter()
            .map(|(p, _)| named(p.name_any()))
            .collect(),
        policies
            .validating
            .iter()
            .map(|(p, _)| named(p.name_any()))
            .collect(),
    ]
}

/// `Ok` when every admission policy and its binding exist, else what is missing.
async fn policies_installed(
    client: &Client,
    [mutating, validating]: &[Vec<String>; 2],
) -> Result<(), String> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
        ValidatingAdmissionPolicyBinding,
    };
    async fn exists<K>(client: &Client, name: &str) -> Result<(), String>
    where
        K: Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        match Api::<K>::all(client.clone()).get_opt(name).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(format!("{} {name} not found", K::kind(&()))),
            Err(e) => Err(format!("{} {name}: {e}", K::kind(&()))),
        }
    }
    for name in mutating {
        exists::<MutatingAdmissionPolicy>(client, name).await?;
        exists::<MutatingAdmissionPolicyBinding>(client, name).await?;
    }
    for name in validating {
        exists::<ValidatingAdmissionPolicy>(client, name).await?;
        exists::<ValidatingAdmissionPolicyBinding>(client, name).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        ManagedFieldsEntry, OwnerReference, Time,
    };

    use super::*;
    use crate::crd::{
        Agent, AgentRunPhase, AgentSnapshot, ApprovalPhase, Decision, ToolCallRecord, halted_state,
    };

    #[test]
    fn a_cached_run_keeps_what_a_reconcile_reads_and_shares_its_agent_snapshot() {
        let snapshots = SharedSnapshots::default();
        let cached = |name: &str| {
            let mut run = AgentRun::test()
                .in_phase(Some(AgentRunPhase::AwaitingApproval))
                .with_pending(1);
            run.metadata.name = Some(name.into());
            run.metadata.labels = Some([("team".to_owned(), "ops".to_owned())].into());
            run.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
            let status = run.status.as_mut().expect("status");
            status.run_state = Some("{}".into());
            status.final_output = Some("done".into());
            status.agent = Some(Arc::new(AgentSnapshot::of(&Agent::test())));
            status.tool_calls = vec![ToolCallRecord {
                tool_call_id: "call_1".into(),
                tool_name: "delete_user".into(),
                step: 1,
                started_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
                resent: None,
                outcome: None,
            }];
            let before = run.clone();
            strip_run(&mut run, &snapshots);
            (before, run)
        };
        let (before, run) = cached("r1");

        assert_eq!(run.metadata.managed_fields, None);
        assert_eq!(run.spec.input, "");
        let status = run.status.as_ref().expect("status");
        assert_eq!(status.run_state, None);
        assert_eq!(status.final_output, None);
        // What a reconcile and the notifier read is kept as it was.
        let was = before.status.as_ref().expect("status");
        assert_eq!(run.spec.agent_ref, before.spec.agent_ref);
        assert_eq!(run.metadata.labels, before.metadata.labels);
        assert_eq!(status.agent, was.agent);
        assert_eq!(status.tool_calls, was.tool_calls);
        assert_eq!(status.phase, was.phase);
        assert_eq!(status.pending_approvals, was.pending_approvals);

        let (_, other) = cached("r2");
        let shared = |run: &AgentRun| run.status.as_ref().and_then(|s| s.agent.clone());
        assert!(Arc::ptr_eq(
            &shared(&run).expect("snapshot"),
            &shared(&other).expect("snapshot")
        ));
    }

    #[test]
    fn a_cached_request_keeps_what_a_reconcile_reads_and_drops_the_rest() {
        let mut request = ApprovalRequest::test_for(&halted_state(), Some(Decision::Approved));
        request.metadata.labels = Some([(labels::RUN.to_owned(), "r1".to_owned())].into());
        request.metadata.owner_references = Some(vec![OwnerReference {
            uid: "uid-1".into(),
            ..Default::default()
        }]);
        request.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("kubectl-patch".into()),
            ..Default::default()
        }]);
        let status = request.status.as_mut().expect("status");
        status.phase = Some(ApprovalPhase::Approved);
        status.assertion = Some("header.claims.signature".into());
        let before = request.clone();

        strip_request(&mut request);

        assert!(request.managed_fields().is_empty());
        assert_eq!(request.metadata.labels, None);
        let status = request.status.as_ref().expect("status");
        assert_eq!(status.assertion, None);
        assert_eq!(status.phase, Some(ApprovalPhase::Approved));
        // What a reconcile and the notifier read is kept as it was.
        assert_eq!(request.spec, before.spec);
        assert_eq!(request.metadata.annotations, before.metadata.annotations);
        assert_eq!(
            request.metadata.owner_references,
            before.metadata.owner_references
        );
        assert_eq!(request.metadata.name, before.metadata.name);
    }
}
