//! The `NotificationSink` custom resource: where the controller sends CloudEvents about approvals
//! and runs (see `docs/notifications.md`).
//!
//! Cluster-scoped, so that no namespace role (the editors of a run's namespace among them) can
//! create, change or delete one: no role agentrun generates or aggregates grants it, only cluster
//! admins (or the chart, from its values) write sinks. The signing key a sink names lives in the
//! controller's own namespace, out of the editors' reach too.

use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::CrdError;

/// The longest `spec.url` the API server accepts.
pub const MAX_URL_LENGTH: usize = 2048;
/// The most seconds `spec.timeoutSeconds` may be.
pub const MAX_TIMEOUT_SECONDS: u32 = 60;

/// An HTTP endpoint that receives signed CloudEvents about ApprovalRequests and AgentRuns.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
// The printer columns repeat `type_ = "string"`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "agentrun.dev",
    version = "v1alpha1",
    kind = "NotificationSink",
    shortname = "nsink",
    category = "agentrun-all",
    status = "NotificationSinkStatus",
    derive = "PartialEq",
    derive = "Default",
    label("app.kubernetes.io/part-of", "agentrun"),
    doc = "An HTTP endpoint the agentrun controller sends signed CloudEvents 1.0 to (approval requested, decided, expired or superseded; run succeeded or failed), at least once, from a durable outbox. Cluster-scoped: written by cluster admins only.",
    printcolumn(
        name = "URL",
        type_ = "string",
        json_path = ".spec.url",
        description = "Where the events are POSTed"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Whether the last delivery succeeded"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "Why (DeliveryFailing, SecretUnavailable, ...)"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NotificationSinkSpec {
    /// The http:// or https:// URL each event is POSTed to (CloudEvents structured mode,
    /// `Content-Type: application/cloudevents+json`).
    #[schemars(length(min = 1, max = MAX_URL_LENGTH))]
    #[x_kube(
        validation = Rule::new("isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''")
            .message("url must be an absolute http:// or https:// URL")
    )]
    pub url: String,
    /// The key that signs each request (HMAC-SHA256, Standard Webhooks headers `webhook-id`,
    /// `webhook-timestamp`, `webhook-signature`): a key of a Secret in the controller's own
    /// namespace, as `whsec_<base64>` or raw text of at least 16 bytes.
    pub signing_secret_ref: SigningSecretRef,
    /// The event types sent to this sink; empty: all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub types: Vec<NotificationType>,
    /// The namespaces whose runs and requests are reported; absent or empty: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Seconds one delivery attempt may take (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_TIMEOUT_SECONDS))]
    pub timeout_seconds: Option<u32>,
}

/// A key of a Secret in the controller's namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SigningSecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key in the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// What the controller last observed delivering to a sink.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotificationSinkStatus {
    /// `Ready`: True while the sink accepts the events sent to it; False with `DeliveryFailing`
    /// (the error of the last attempt; events stay in the outbox and are retried with backoff) or
    /// `SecretUnavailable` (nothing is sent unsigned).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation the conditions are about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
}

/// The type of a notification: the CloudEvents `type` attribute.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[schemars(transform = super::field_docs_only)]
pub enum NotificationType {
    /// An ApprovalRequest was created: a tool call waits for a decision.
    #[serde(rename = "dev.agentrun.approval.requested")]
    #[strum(serialize = "dev.agentrun.approval.requested")]
    ApprovalRequested,
    /// A person (or a GitOps identity on their behalf) approved or rejected the call, as the
    /// controller recorded it.
    #[serde(rename = "dev.agentrun.approval.decided")]
    #[strum(serialize = "dev.agentrun.approval.decided")]
    ApprovalDecided,
    /// Nobody decided in time.
    #[serde(rename = "dev.agentrun.approval.expired")]
    #[strum(serialize = "dev.agentrun.approval.expired")]
    ApprovalExpired,
    /// The call changed after the request was made; no decision was applied.
    #[serde(rename = "dev.agentrun.approval.superseded")]
    #[strum(serialize = "dev.agentrun.approval.superseded")]
    ApprovalSuperseded,
    /// A run finished with a final output.
    #[serde(rename = "dev.agentrun.run.succeeded")]
    #[strum(serialize = "dev.agentrun.run.succeeded")]
    RunSucceeded,
    /// A run failed for good.
    #[serde(rename = "dev.agentrun.run.failed")]
    #[strum(serialize = "dev.agentrun.run.failed")]
    RunFailed,
}

impl NotificationType {
    /// The CloudEvents `type`, e.g. `dev.agentrun.approval.requested`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The last part of the type (`requested`, `decided`, ...), which ends each event id.
    pub fn suffix(self) -> &'static str {
        self.as_str().rsplit('.').next().unwrap_or_default()
    }
}

impl FromStr for NotificationType {
    type Err = CrdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        super::parse_value("NotificationSink spec.types", s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_their_cloudevents_names() {
        for &t in <NotificationType as strum::VariantArray>::VARIANTS {
            assert_eq!(
                serde_json::to_value(t).unwrap(),
                serde_json::json!(t.as_str())
            );
            assert_eq!(t.as_str().parse::<NotificationType>().unwrap(), t);
            assert!(t.as_str().starts_with("dev.agentrun."), "{t}");
        }
        assert_eq!(NotificationType::ApprovalSuperseded.suffix(), "superseded");
        assert_eq!(NotificationType::RunFailed.suffix(), "failed");
        assert!("approval.requested".parse::<NotificationType>().is_err());
    }

    #[test]
    fn a_sink_reads_from_yaml() {
        let sink: NotificationSink = serde_yaml_ng::from_str(
            "apiVersion: agentrun.dev/v1alpha1\nkind: NotificationSink\nmetadata: {name: ops}\nspec:\n  url: https://hooks.example.com/agentrun\n  signingSecretRef: {name: hooks, key: secret}\n  types: [dev.agentrun.approval.requested]\n  namespaceSelector: {matchLabels: {tier: prod}}\n",
        )
        .unwrap();
        assert_eq!(sink.spec.types, vec![NotificationType::ApprovalRequested]);
        let selector = sink.spec.namespace_selector.unwrap();
        assert_eq!(selector.match_labels.unwrap()["tier"], "prod");
    }
}
