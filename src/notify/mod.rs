//! Notifications: CloudEvents 1.0 about approvals and runs, sent to the HTTP sinks cluster admins
//! configure ([`NotificationSink`](crate::crd::NotificationSink)), signed, at least once, from a
//! durable outbox. `docs/notifications.md` is the user's guide; this is how it works.
//!
//! - **Derived from state, never from a hook.** [`tap::Tap`] sees every object the controller's
//!   own watches of AgentRuns and ApprovalRequests bring (no extra watch, no write on those
//!   objects) and [`events`] derives from each object the events its state implies: a request
//!   with a status was `requested`; one whose phase is Approved or Rejected was `decided`, Expired
//!   `expired`, Superseded `superseded`; a run in phase Succeeded or Failed `succeeded` or `failed`.
//!   Each event's id is `<object uid>:<suffix>` and its time a server-side time of the object
//!   (creation, `decidedAt`, `completedAt`), so deriving it again, after a restart or a relist,
//!   gives the same id.
//! - **Durable outbox.** [`hub`] matches the events against the sinks (types, namespace selector,
//!   only events newer than the sink and than the horizon) and records each new one in the sink's
//!   [`outbox::Outbox`], persisted by [`store`] in one ConfigMap in the controller's namespace,
//!   before [`sender`] may send it. The outbox keeps the exact bytes of each pending event, so every
//!   attempt sends the same body, and the ids delivered (until the horizon), so an event already
//!   delivered is not minted again after a restart.
//! - **At least once, with backoff, signed.** One [`sender`] per sink POSTs its events in order,
//!   retrying a failed attempt with exponential backoff (`backon`); each request is signed with
//!   HMAC-SHA256 ([`signature`], the Standard Webhooks headers). A failing sink delays only its
//!   own events: the approval path never waits for a notification. [`sink_status`] writes the
//!   sink's `Ready` condition and [`metrics`] counts deliveries, failures, drops and what is
//!   pending.
//!
//! Restarts: what was persisted is sent (again, if the delivery mark had not been persisted yet:
//! the same id and the same bytes); what was not yet minted is derived again from the objects.
//! Bounds: events older than the horizon (24 h by default) are neither minted nor kept (a pending
//! one is dropped and counted), events are remembered for sinks not seen yet only for a few
//! minutes after they arrived ([`remembered`]), delivery marks are kept only until the horizon, and the outbox
//! ConfigMap never exceeds [`NotifyConfig::outbox_bytes`]: the oldest marks, then the oldest
//! pending events, are evicted first (counted too).

pub mod events;
pub mod http;
pub mod hub;
pub mod metrics;
pub mod outbox;
pub mod remembered;
pub mod sender;
pub mod signature;
pub mod sink_status;
pub mod store;
pub mod tap;

use std::time::Duration;

pub use events::Candidate;
pub use hub::Notifier;
pub use signature::{SignatureError, SigningKey};
pub use tap::Tap;

/// The default name of the outbox ConfigMap.
pub const DEFAULT_OUTBOX_CONFIG_MAP: &str = "agentrun-notification-outbox";
/// How long an event may wait for delivery, and how long a delivery is remembered, by default.
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(24 * 3600);
/// The default bound of the outbox ConfigMap's content (the API server refuses objects above
/// about 1.5 MiB; this leaves room for the rest of the object).
pub const DEFAULT_OUTBOX_BYTES: usize = 900 * 1024;

/// How the controller sends notifications.
#[derive(Clone, Debug)]
pub struct NotifyConfig {
    /// The controller's own namespace: the sinks' signing Secrets and the outbox ConfigMap are
    /// there.
    pub namespace: String,
    /// The outbox ConfigMap's name.
    pub outbox_config_map: String,
    /// Events older than this are neither minted nor kept; delivery marks are kept this long.
    pub horizon: Duration,
    /// The wait after a failed delivery attempt (doubled after each further failure).
    pub min_backoff: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
    /// The most bytes the outbox ConfigMap's data may hold, all sinks together.
    pub outbox_bytes: usize,
}

impl NotifyConfig {
    /// The defaults, with the outbox and the signing Secrets in `namespace`.
    pub fn new(namespace: &str) -> NotifyConfig {
        NotifyConfig {
            namespace: namespace.to_owned(),
            outbox_config_map: DEFAULT_OUTBOX_CONFIG_MAP.to_owned(),
            horizon: DEFAULT_HORIZON,
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(300),
            outbox_bytes: DEFAULT_OUTBOX_BYTES,
        }
    }
}
