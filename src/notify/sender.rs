//! Delivering one sink's events: in the order they were minted, one request at a time, each
//! signed ([`signature`](super::signature)); a failed attempt is retried after an exponential
//! backoff with jitter (`backon`), reset by a success or a change of the sink. Every attempt is
//! reported to the [`hub`](super::hub), which records deliveries in the outbox and the sink's
//! condition; the sender itself keeps nothing durable.
//!
//! A sink that fails holds back its own later events (so a receiver sees each object's events in
//! order); other sinks, and the approvals themselves, never wait for it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;

use super::http::{answer_excerpt, error_chain};
use super::signature::{ID_HEADER, SIGNATURE_HEADER, SigningKey, TIMESTAMP_HEADER};
use super::sink_status::{Outcome, SinkReason};
use crate::crd::{NotificationSink, SigningSecretRef};

/// The media type of a structured-mode CloudEvent.
pub const CONTENT_TYPE: &str = "application/cloudevents+json; charset=utf-8";
/// Seconds one attempt may take unless the sink says otherwise.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 10;
/// How long a signing key read from its Secret is used before it is read again (a rotated key
/// is picked up within this time, or at once after a failed attempt).
const KEY_TTL: Duration = Duration::from_secs(60);

/// One event to deliver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The event id.
    pub id: String,
    /// The request body: the event in CloudEvents structured JSON.
    pub body: Arc<str>,
}

/// The outcome of one attempt, for the hub.
#[derive(Clone, Debug)]
pub struct Report {
    /// The sink's name.
    pub sink: String,
    /// The sink's uid (a report about a deleted and re-created sink of the same name is ignored).
    pub sink_uid: String,
    /// The event attempted.
    pub id: String,
    /// How it ended.
    pub outcome: Outcome,
}

/// What every sender shares.
pub struct Settings {
    /// The Kubernetes client (reads the signing Secrets).
    pub client: Client,
    /// The controller's namespace, where the signing Secrets are.
    pub namespace: String,
    /// The HTTP client.
    pub http: reqwest::Client,
    /// The first wait after a failure.
    pub min_backoff: Duration,
    /// The longest wait.
    pub max_backoff: Duration,
}

impl Settings {
    fn backoff(&self) -> ExponentialBackoff {
        ExponentialBuilder::new()
            .with_min_delay(self.min_backoff)
            .with_max_delay(self.max_backoff)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// The running sender of one sink; it stops when dropped.
pub struct Sender {
    queue: mpsc::UnboundedSender<Outgoing>,
    sink: watch::Sender<Arc<NotificationSink>>,
    _task: AbortOnDropHandle<()>,
}

impl Sender {
    /// Starts the sender of `sink`, reporting each attempt on `reports`.
    pub fn start(
        sink: Arc<NotificationSink>,
        settings: Arc<Settings>,
        reports: mpsc::UnboundedSender<Report>,
    ) -> Sender {
        let (queue, queued) = mpsc::unbounded_channel();
        let (sink, sink_changes) = watch::channel(sink);
        let task = tokio::spawn(deliver(sink_changes, queued, settings, reports));
        Sender {
            queue,
            sink,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// Queues an event (after the ones queued before).
    pub fn push(&self, event: Outgoing) {
        let _ = self.queue.send(event);
    }

    /// Uses the sink's new spec (URL, key, timeout) from the next attempt on, and retries at once.
    pub fn update(&self, sink: Arc<NotificationSink>) {
        self.sink.send_replace(sink);
    }
}

/// A signing key and where and when it was read.
struct CachedKey {
    reference: SigningSecretRef,
    key: SigningKey,
    read_at: Instant,
}

async fn deliver(
    mut sink: watch::Receiver<Arc<NotificationSink>>,
    mut queued: mpsc::UnboundedReceiver<Outgoing>,
    settings: Arc<Settings>,
    reports: mpsc::UnboundedSender<Report>,
) {
    let mut queue: VecDeque<Outgoing> = VecDeque::new();
    let mut backoff = settings.backoff();
    let mut key: Option<CachedKey> = None;
    loop {
        while let Ok(event) = queued.try_recv() {
            queue.push_back(event);
        }
        let Some(head) = queue.front().cloned() else {
            tokio::select! {
                next = queued.recv() => match next {
                    Some(event) => queue.push_back(event),
                    None => return,
                },
                changed = sink.changed() => if changed.is_err() { return },
            }
            continue;
        };
        let current = sink.borrow_and_update().clone();
        let outcome = attempt(&settings, &current, &mut key, &head).await;
        let delivered = outcome == Outcome::Delivered;
        let report = Report {
            sink: current.name_any(),
            sink_uid: current.uid().unwrap_or_default(),
            id: head.id,
            outcome,
        };
        if reports.send(report).is_err() {
            return;
        }
        if delivered {
            queue.pop_front();
            backoff = settings.backoff();
            continue;
        }
        // The key may have been rotated: read it again for the next attempt.
        key = None;
        let wait = backoff.next().unwrap_or(settings.max_backoff);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            changed = sink.changed() => {
                if changed.is_err() {
                    return;
                }
                backoff = settings.backoff();
            }
        }
    }
}

/// One signed POST of `event` to the sink.
async fn attempt(
    settings: &Settings,
    sink: &NotificationSink,
    cache: &mut Option<CachedKey>,
    event: &Outgoing,
) -> Outcome {
    let key = match signing_key(settings, &sink.spec.signing_secret_ref, cache).await {
        Ok(key) => key,
        Err(message) => return Outcome::Failed(SinkReason::SecretUnavailable, message),
    };
    let timestamp = chrono::Utc::now().timestamp();
    let signature = key.sign(&event.id, timestamp, event.body.as_bytes());
    let timeout = sink.spec.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
    let sent = settings
        .http
        .post(&sink.spec.url)
        .timeout(Duration::from_secs(timeout.into()))
        .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
        .header(ID_HEADER, &event.id)
        .header(TIMESTAMP_HEADER, timestamp.to_string())
        .header(SIGNATURE_HEADER, signature)
        .body(event.body.to_string())
        .send()
        .await;
    match sent {
        Ok(answer) if answer.status().is_success() => Outcome::Delivered,
        Ok(answer) => {
            let status = answer.status();
            let body = answer_excerpt(answer).await;
            Outcome::Failed(
                SinkReason::DeliveryFailing,
                format!("the sink answered HTTP {status}: {body}"),
            )
        }
        // Without the URL: it may carry a token.
        Err(error) => Outcome::Failed(
            SinkReason::DeliveryFailing,
            format!("the request failed: {}", error_chain(&error.without_url())),
        ),
    }
}

/// The sink's signing key, read from its Secret (again after [`KEY_TTL`] or a change of the
/// reference); the error says what is wrong.
async fn signing_key(
    settings: &Settings,
    reference: &SigningSecretRef,
    cache: &mut Option<CachedKey>,
) -> Result<SigningKey, String> {
    if let Some(cached) = cache.as_ref()
        && cached.reference == *reference
        && cached.read_at.elapsed() < KEY_TTL
    {
        return Ok(cached.key.clone());
    }
    let where_ = format!("Secret {}/{}", settings.namespace, reference.name);
    let secret = Api::<Secret>::namespaced(settings.client.clone(), &settings.namespace)
        .get_opt(&reference.name)
        .await
        .map_err(|e| format!("cannot read {where_}: {}", api_message(&e)))?
        .ok_or_else(|| format!("{where_} not found"))?;
    let value = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&reference.key))
        .ok_or_else(|| format!("{where_} has no key {}", reference.key))?;
    let key = SigningKey::from_secret(&value.0)
        .map_err(|e| format!("{where_}, key {}: {e}", reference.key))?;
    *cache = Some(CachedKey {
        reference: reference.clone(),
        key: key.clone(),
        read_at: Instant::now(),
    });
    Ok(key)
}

/// The API server's own message for a failed request.
fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        other => other.to_string(),
    }
}
