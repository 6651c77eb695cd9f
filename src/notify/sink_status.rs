//! A sink's `Ready` condition, from the outcome of the last delivery attempt. Written only when it
//! changes (not on every attempt), with the controller's field manager.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::crd::keys::field_managers;
use crate::crd::{ConditionStatus, NotificationSink, new_condition, set_condition};

/// The condition type.
pub const READY: &str = "Ready";

/// The reasons of a sink's `Ready` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::AsRefStr, strum::Display)]
pub enum SinkReason {
    /// The last attempt was accepted.
    Delivered,
    /// The last attempt failed: a network error or a non-2xx answer.
    DeliveryFailing,
    /// The signing key cannot be read or is unusable: nothing is sent unsigned.
    SecretUnavailable,
}

/// How the last attempt to deliver to a sink ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted.
    Delivered,
    /// Not delivered, and why.
    Failed(SinkReason, String),
}

impl Outcome {
    /// The condition's status, reason and message.
    pub fn condition(&self) -> (ConditionStatus, SinkReason, String) {
        match self {
            Outcome::Delivered => (
                ConditionStatus::True,
                SinkReason::Delivered,
                "the sink accepts the events sent to it".to_owned(),
            ),
            Outcome::Failed(reason, message) => (
                ConditionStatus::False,
                *reason,
                format!("{message}; the events wait in the outbox and are retried with backoff"),
            ),
        }
    }
}

/// The sink's conditions with `outcome` recorded, or `None` when they say so already.
pub fn conditions_after(sink: &NotificationSink, outcome: &Outcome) -> Option<Vec<Condition>> {
    let mut conditions = sink
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let (status, reason, message) = outcome.condition();
    let changed = set_condition(
        &mut conditions,
        new_condition(
            READY,
            status,
            reason,
            &message,
            sink.metadata.generation,
            crate::time::to_k8s(chrono::Utc::now()),
        ),
    );
    changed.then_some(conditions)
}

/// Writes the sink's conditions (a merge patch of its status).
pub async fn write(
    client: &Client,
    sink: &NotificationSink,
    conditions: Vec<Condition>,
) -> Result<(), kube::Error> {
    let api: Api<NotificationSink> = Api::all(client.clone());
    let patch = serde_json::json!({
        "status": {"conditions": conditions, "observedGeneration": sink.metadata.generation}
    });
    let params = PatchParams {
        field_manager: Some(field_managers::CONTROLLER.into()),
        ..Default::default()
    };
    match api
        .patch_status(&sink.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        // Deleted meanwhile.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        other => other.map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{NotificationSinkSpec, NotificationSinkStatus, find_condition};

    #[test]
    fn the_condition_changes_only_with_the_outcome() {
        let mut sink = NotificationSink::new("ops", NotificationSinkSpec::default());
        sink.metadata.generation = Some(2);
        let failing = Outcome::Failed(
            SinkReason::DeliveryFailing,
            "POST http://127.0.0.1:1/: connection refused".into(),
        );
        let conditions = conditions_after(&sink, &failing).unwrap();
        let ready = find_condition(&conditions, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "DeliveryFailing")
        );
        assert!(
            ready.message.contains("connection refused"),
            "{}",
            ready.message
        );
        assert_eq!(ready.observed_generation, Some(2));
        sink.status = Some(NotificationSinkStatus {
            conditions,
            observed_generation: Some(2),
        });
        assert_eq!(
            conditions_after(&sink, &failing),
            None,
            "no write for the same failure"
        );
        let recovered = conditions_after(&sink, &Outcome::Delivered).unwrap();
        assert_eq!(
            find_condition(&recovered, READY).unwrap().reason,
            "Delivered"
        );
    }
}
