//! The last step of a reconcile: carrying out a [`Plan`], one write after the other, with the
//! controller's field manager. Nothing is decided here.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Event;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use tracing::{Instrument, info, warn};

use super::cached_pod::CachedPod;
use super::plan::{Announcement, Plan, Requeue, Step};
use super::{Context, ReconcileError};
use crate::chunk_store;
use crate::crd::keys::{field_managers, finalizers, labels};
use crate::crd::names::run_label_value;
use crate::crd::status_patch::{ApprovalRequestStatusPatch, StatusPatch};
use crate::crd::{AgentRun, ApprovalRecord, ApprovalRequest};

/// Carries out `plan` for `run`: its steps in order (the first failure ends the reconcile), then
/// its `after` steps in a task of their own.
pub async fn execute(
    plan: Plan,
    run: &AgentRun,
    ctx: &Arc<Context>,
) -> Result<Requeue, ReconcileError> {
    if plan.worker_failed {
        ctx.metrics.worker_failures.inc();
    }
    for waited in &plan.approval_waits {
        ctx.metrics.approval_wait.observe(*waited);
    }
    for reason in &plan.refusals {
        ctx.metrics.refused(*reason);
    }
    let executor = Executor::new(ctx, run)?;
    for step in plan.steps {
        executor.perform(step).await?;
    }
    if !plan.after.is_empty() {
        // Marked recorded now, so that a reconcile meanwhile does not repeat them; one that
        // fails is unmarked and repaired later.
        for step in &plan.after {
            if let Step::RecordResolution(resolution) = step {
                ctx.memory.recorded(&executor.ns, &resolution.request);
            }
        }
        tokio::spawn(
            async move {
                for step in plan.after {
                    let recording = match &step {
                        Step::RecordResolution(r) => Some(r.request.clone()),
                        _ => None,
                    };
                    if let Err(error) = executor.perform(step).await
                        && let Some(request) = recording
                    {
                        executor.ctx.memory.forget_recorded(&executor.ns, &request);
                        warn!(%request, %error, "could not record a decision; retried at the run's next reconcile");
                    }
                }
            }
            .in_current_span(),
        );
    }
    Ok(plan.requeue)
}

/// Performs the steps of one run's plans.
struct Executor {
    ctx: Arc<Context>,
    /// The run without its state (steps need only its identity).
    run: AgentRun,
    ns: String,
    regarding: ObjectReference,
}

impl Executor {
    fn new(ctx: &Arc<Context>, run: &AgentRun) -> Result<Executor, ReconcileError> {
        let ns = run.namespace().ok_or(ReconcileError::NoNamespace)?;
        let mut run = run.clone();
        if let Some(status) = run.status.as_mut() {
            status.run_state = None;
        }
        Ok(Executor {
            ctx: Arc::clone(ctx),
            regarding: run.object_ref(&()),
            run,
            ns,
        })
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.ctx.client.clone(), &self.ns)
    }

    async fn perform(&self, step: Step) -> Result<(), ReconcileError> {
        let params = PatchParams {
            field_manager: Some(field_managers::CONTROLLER.into()),
            ..Default::default()
        };
        match step {
            Step::RecordResolution(resolution) => {
                self.api::<ApprovalRequest>()
                    .patch_status(
                        &resolution.request,
                        &params,
                        &Patch::Merge(&resolution.status_patch()),
                    )
                    .await?;
                self.ctx.memory.recorded(&self.ns, &resolution.request);
                self.trace_approval(&resolution);
            }
            Step::RecordRefusal {
                request,
                conditions,
            } => {
                let patch = StatusPatch::unguarded(ApprovalRequestStatusPatch {
                    conditions: Some(conditions),
                    ..Default::default()
                });
                self.api::<ApprovalRequest>()
                    .patch_status(&request, &params, &Patch::Merge(&patch))
                    .await?;
            }
            Step::ApplyWorkerIdentity(identity) => {
                let (account, role, binding) = *identity;
                self.apply::<ServiceAccount>(&account).await?;
                self.apply::<Role>(&role).await?;
                self.apply::<RoleBinding>(&binding).await?;
            }
            Step::WriteChunks(stored) => {
                chunk_store::write(&self.ctx.client, &self.run, &stored).await?;
            }
            Step::PatchRun(patch) => {
                self.api::<AgentRun>()
                    .patch_status(&self.run.name_any(), &params, &Patch::Merge(&*patch))
                    .await?;
                self.ctx.memory.wrote_over(&self.run);
                if let Some(phase) = patch.status.phase.filter(|p| p.is_terminal()) {
                    let message = patch
                        .status
                        .conditions
                        .as_ref()
                        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                        .map(|c| c.message.as_str());
                    crate::telemetry::spans::run_finished(&self.run, phase, message);
                }
            }
            Step::DeleteWorkerPods(pods) => self.delete_pods(&pods).await,
            Step::PruneChunks { keep_digest } => {
                chunk_store::prune(&self.ctx.client, &self.run, &keep_digest).await;
            }
            Step::CreatePod {
                pod,
                announce,
                resumes,
            } => self.create_pod(*pod, announce, resumes).await?,
            Step::CreateRequest {
                request,
                status,
                announce,
            } => {
                let name = request.name_any();
                let created = self.apply::<ApprovalRequest>(&request).await?;
                self.api::<ApprovalRequest>()
                    .patch_status(
                        &name,
                        &params,
                        &Patch::Merge(&StatusPatch::unguarded(status)),
                    )
                    .await?;
                self.publish(Announcement {
                    type_: kube::runtime::events::EventType::Normal,
                    reason: crate::crd::EventReason::ApprovalRequested,
                    note: announce,
                    related: Some(created.object_ref(&())),
                });
            }
            Step::Publish(announcement) => self.publish(announcement),
            Step::Together(steps) => {
                let done =
                    futures::future::join_all(steps.into_iter().map(|s| Box::pin(self.perform(s))))
                        .await;
                done.into_iter().collect::<Result<Vec<()>, _>>()?;
            }
            Step::InOrder(steps) => {
                for step in steps {
                    Box::pin(self.perform(step)).await?;
                }
            }
        }
        Ok(())
    }

    /// Emits the approval span of a request whose resolution was just recorded (the request as
    /// cached: its creation is the halt).
    fn trace_approval(&self, resolution: &crate::controller::resolutions::Resolution) {
        use crate::telemetry::spans::{Approver, approval};
        let Some(request) = self.ctx.requests.get(&self.ns, &resolution.request) else {
            return;
        };
        let approver = match (&resolution.identity, &resolution.gitops) {
            (Some(identity), _) => Approver::Verified(identity),
            (None, Some(gitops)) => Approver::GitOps {
                claimed: request.spec.approver_id.as_deref().unwrap_or_default(),
                applied_by: &gitops.applied_by.username,
            },
            (None, None) => Approver::None,
        };
        approval(&request, resolution.phase, resolution.decided_at, approver);
    }

    /// Server-side applies `object` with the controller's field manager, taking ownership of
    /// every field it sets.
    async fn apply<K>(&self, object: &K) -> Result<K, ReconcileError>
    where
        K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let params = PatchParams::apply(field_managers::CONTROLLER).force();
        Ok(self
            .api::<K>()
            .patch(&object.name_any(), &params, &Patch::Apply(object))
            .await?)
    }

    async fn create_pod(
        &self,
        pod: Pod,
        announce: Option<String>,
        resumes: Vec<chrono::DateTime<chrono::Utc>>,
    ) -> Result<(), ReconcileError> {
        let name = pod.name_any();
        let params = PostParams {
            field_manager: Some(field_managers::CONTROLLER.into()),
            ..Default::default()
        };
        let created = self.api::<Pod>().create(&params, &pod).await;
        if created.is_ok() || matches!(&created, Err(kube::Error::Api(s)) if s.code == 409) {
            self.ctx.memory.created_pod(&self.ns, &name);
        }
        match created {
            Ok(_) => {
                info!(pod = %name, "worker pod created");
                if let Some(note) = announce {
                    self.publish(Announcement {
                        type_: kube::runtime::events::EventType::Normal,
                        reason: crate::crd::EventReason::WorkerStarted,
                        note,
                        related: None,
                    });
                }
            }
            // Deterministic names make a repeated create a no-op.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let created = chrono::Utc::now();
        for decided_at in resumes {
            self.ctx
                .metrics
                .resume_latency
                .observe((created - decided_at).num_milliseconds().max(0) as f64 / 1000.0);
        }
        Ok(())
    }

    /// Deletes a finished run's worker Pods, a few runs' at a time: their deletion is never
    /// urgent, and must not take the API server's share of the runs in progress. A Pod whose
    /// deletion a reconcile before asked for is left to that one.
    async fn delete_pods(&self, pods: &[String]) {
        let memory = &self.ctx.memory;
        let pods: Vec<&String> = pods
            .iter()
            .filter(|pod| memory.deleting_pod(&self.ns, pod))
            .collect();
        if pods.is_empty() {
            return;
        }
        let Ok(_permit) = self.ctx.pod_deletions.acquire().await else {
            return;
        };
        let api = &self.api::<CachedPod>();
        let deletes = pods
            .into_iter()
            .map(|pod| async move { (pod, api.delete(pod, &DeleteParams::default()).await) });
        for (pod, deleted) in futures::future::join_all(deletes).await {
            match deleted {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(error) => {
                    memory.forget_deleting(&self.ns, pod);
                    warn!(run = %self.run.name_any(), %pod, %error, "could not delete a finished run's worker Pod; a later reconcile of the run tries again, and it goes with the run");
                }
            }
        }
    }

    /// Queues an Event about the run, published beside the reconcile, best effort: a failure is
    /// logged, never retried, and the reconcile does not wait for it (an Event is not worth one of
    /// the reconcile slots that decisions wait for); dropped if too many wait already.
    fn publish(&self, announcement: Announcement) {
        let reason: &'static str = announcement.reason.into();
        let event = Event {
            type_: announcement.type_,
            reason: reason.into(),
            note: Some(announcement.note),
            action: reason.into(),
            secondary: announcement.related,
        };
        self.ctx.events.enqueue(event, self.regarding.clone());
    }
}

/// Cleanup on delete: write each of the run's ApprovalRequests to its durable ApprovalRecord,
/// then release them so the garbage collector can remove them with the run (until then their
/// finalizer keeps the decision record).
pub async fn release_requests(run: &AgentRun, ctx: &Context) -> Result<(), ReconcileError> {
    let ns = run.namespace().ok_or(ReconcileError::NoNamespace)?;
    let api: Api<ApprovalRequest> = Api::namespaced(ctx.client.clone(), &ns);
    let records: Api<ApprovalRecord> = Api::all(ctx.client.clone());
    let selector = format!("{}={}", labels::RUN, run_label_value(&run.name_any()));
    let requests = api.list(&ListParams::default().labels(&selector)).await?;
    let apply = PatchParams::apply(field_managers::CONTROLLER).force();
    let answered = answered_calls(run, ctx).await;
    let uid = run.uid().unwrap_or_default();
    for request in requests.iter().filter(|r| r.spec.agent_run_ref.uid == uid) {
        let approved = request.status.as_ref().and_then(|s| s.phase)
            == Some(crate::crd::ApprovalPhase::Approved);
        let executed = answered
            .as_ref()
            .map(|answered| approved && answered.contains(&request.spec.tool_call_id));
        let record = ApprovalRecord::of(&ns, request, executed);
        records
            .patch(&record.name_any(), &apply, &Patch::Apply(&record))
            .await?;
    }
    for request in requests {
        let kept: Vec<String> = request
            .finalizers()
            .iter()
            .filter(|f| f.as_str() != finalizers::KEEP_WITH_RUN)
            .cloned()
            .collect();
        if kept.len() != request.finalizers().len() {
            let patch = serde_json::json!({
                "metadata": {"finalizers": kept, "resourceVersion": request.resource_version()}
            });
            api.patch(
                &request.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        }
    }
    Ok(())
}

/// The ids of the calls the run's state holds a tool answer for (`None` when the state cannot be
/// read: the records then say nothing about execution).
async fn answered_calls(
    run: &AgentRun,
    ctx: &Context,
) -> Option<std::collections::HashSet<String>> {
    let ns = run.namespace()?;
    let full = Api::<AgentRun>::namespaced(ctx.client.clone(), &ns)
        .get(&run.name_any())
        .await
        .ok()?;
    let state = chunk_store::load(&ctx.client, &full).await.ok()??;
    Some(
        state
            .messages
            .iter()
            .filter(|m| crate::agent::model::role(m) == Some("tool"))
            .filter_map(|m| m.get("tool_call_id").and_then(|v| v.as_str()))
            .map(str::to_owned)
            .collect(),
    )
}
