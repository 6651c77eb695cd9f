//! The driver of one reconcile: observe → plan → execute, under the run's finalizer.

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use tracing::{Instrument, info_span, warn};

use super::observe::observe;
use super::plan::{Requeue, plan};
use super::{Context, ReconcileError, execute};
use crate::crd::AgentRun;
use crate::crd::keys::finalizers;

/// Reconciles one run.
pub async fn reconcile(run: Arc<AgentRun>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let ns = run.namespace().ok_or(ReconcileError::NoNamespace)?;
    if !ctx.synced() {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let span = info_span!("reconcile", run = %run.name_any(), namespace = %ns);
    let started = std::time::Instant::now();
    let api: Api<AgentRun> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, finalizers::RUN_CLEANUP, run, |event| async {
        match event {
            Event::Apply(run) => apply(&run, &ctx).await,
            Event::Cleanup(run) => {
                execute::release_requests(&run, &ctx).await?;
                Ok(Action::await_change())
            }
        }
    })
    .instrument(span)
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)));
    let label = match &result {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    ctx.metrics.reconciled(label, started.elapsed());
    result
}

/// One reconcile of a run that is not being deleted.
async fn apply(run: &AgentRun, ctx: &Arc<Context>) -> Result<Action, ReconcileError> {
    // Held until the writes are done: it bounds how many large states are in memory.
    let (observed, _state_read) = observe(run, ctx).await?;
    let plan = plan(
        &observed,
        &ctx.config.policy,
        &ctx.config.worker,
        ctx.issuer.as_deref(),
    );
    tracing::debug!(steps = plan.steps.len(), after = plan.after.len(), requeue = ?plan.requeue, "planned");
    Ok(match execute::execute(plan, &observed.run, ctx).await? {
        Requeue::AwaitChange => Action::await_change(),
        Requeue::After(after) => Action::requeue(after),
    })
}

/// Requeues a failed reconcile with a delay (conflicts quickly, others slower).
pub fn error_policy(run: Arc<AgentRun>, error: &ReconcileError, _: Arc<Context>) -> Action {
    warn!(run = %run.name_any(), error = %error, label = error.metric_label(), "reconcile error");
    match error {
        ReconcileError::Kube(kube::Error::Api(s)) if s.code == 409 => {
            Action::requeue(Duration::from_millis(200))
        }
        _ => Action::requeue(Duration::from_secs(5)),
    }
}
