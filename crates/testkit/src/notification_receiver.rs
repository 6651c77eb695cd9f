//! A notification receiver on 127.0.0.1, for tests: it accepts the controller's CloudEvents only
//! when their Standard Webhooks signature verifies (`agentrun::notify::SigningKey::verify`, as a
//! real receiver would check it), and records each accepted delivery.
//!
//! Start it with [`NotificationReceiver::start`] and use [`NotificationReceiver::url`] as a
//! NotificationSink's `spec.url`. [`NotificationReceiver::set_failing`] makes it answer 503 to
//! every (valid) request, as a receiver that is down; [`NotificationReceiver::redirect_to`] makes
//! it answer `307 Temporary Redirect` to another URL instead; refused requests (bad or missing signature,
//! wrong content type) get 401 and are only counted in [`NotificationReceiver::refused`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use agentrun::notify::SigningKey;
use agentrun::notify::signature::{
    DEFAULT_TOLERANCE_SECONDS, ID_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER,
};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio_util::task::AbortOnDropHandle;

use crate::recorded::lock;

/// One delivery the receiver accepted.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// The `webhook-id` header (the event id).
    pub id: String,
    /// The raw body.
    pub body: String,
    /// The body as JSON.
    pub event: serde_json::Value,
    /// When the receiver accepted it.
    pub received_at: std::time::SystemTime,
}

struct Shared {
    key: SigningKey,
    failing: AtomicBool,
    deliveries: Mutex<Vec<Delivery>>,
    refused: AtomicUsize,
    answered_503: AtomicUsize,
    redirect: Mutex<Option<String>>,
    redirected: AtomicUsize,
}

/// The running receiver; it stops when dropped.
pub struct NotificationReceiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _task: AbortOnDropHandle<()>,
}

impl NotificationReceiver {
    /// Starts a receiver verifying with the key a Secret value `secret` holds, on a free port of
    /// 127.0.0.1.
    pub async fn start(secret: &str) -> NotificationReceiver {
        Self::start_at(secret, SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// [`NotificationReceiver::start`] on `addr`.
    pub async fn start_at(secret: &str, addr: SocketAddr) -> NotificationReceiver {
        let key = SigningKey::from_secret(secret.as_bytes()).expect("a usable signing key");
        let shared = Arc::new(Shared {
            key,
            failing: AtomicBool::new(false),
            deliveries: Mutex::default(),
            refused: AtomicUsize::new(0),
            answered_503: AtomicUsize::new(0),
            redirect: Mutex::default(),
            redirected: AtomicUsize::new(0),
        });
        let app = Router::new().fallback(receive).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind the notification receiver to {addr}: {e}"));
        let addr = listener.local_addr().expect("the receiver's address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        NotificationReceiver {
            addr,
            shared,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// The URL to put in a sink.
    pub fn url(&self) -> String {
        format!("http://{}/events", self.addr)
    }

    /// Answer 503 to every request (while `failing`), as a receiver that is down.
    pub fn set_failing(&self, failing: bool) {
        self.shared.failing.store(failing, Ordering::Relaxed);
    }

    /// Answer every (valid) request with `307 Temporary Redirect` to `url` (while `Some`), as a
    /// receiver that tries to send the events elsewhere.
    pub fn redirect_to(&self, url: Option<String>) {
        *lock(&self.shared.redirect) = url;
    }

    /// How many valid requests were answered with a redirect.
    pub fn redirected(&self) -> usize {
        self.shared.redirected.load(Ordering::Relaxed)
    }

    /// Every accepted delivery, in order (an id may repeat: delivery is at least once).
    pub fn deliveries(&self) -> Vec<Delivery> {
        lock(&self.shared.deliveries).clone()
    }

    /// When the first delivery of `id` was accepted.
    pub fn first_received(&self, id: &str) -> Option<std::time::SystemTime> {
        self.deliveries()
            .into_iter()
            .find(|d| d.id == id)
            .map(|d| d.received_at)
    }

    /// The ids accepted.
    pub fn ids(&self) -> BTreeSet<String> {
        self.deliveries().into_iter().map(|d| d.id).collect()
    }

    /// The bodies accepted, by id.
    pub fn bodies(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for d in self.deliveries() {
            out.entry(d.id).or_default().push(d.body);
        }
        out
    }

    /// How many requests were refused (signature, content type).
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::Relaxed)
    }

    /// How many valid requests were answered 503 while failing.
    pub fn answered_503(&self) -> usize {
        self.shared.answered_503.load(Ordering::Relaxed)
    }
}

async fn receive(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let verified = shared.key.verify(
        header(ID_HEADER),
        header(TIMESTAMP_HEADER),
        header(SIGNATURE_HEADER),
        &body,
        now,
        DEFAULT_TOLERANCE_SECONDS,
    );
    let structured =
        header("content-type").is_some_and(|t| t.starts_with("application/cloudevents+json"));
    if let Err(error) = verified {
        shared.refused.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::UNAUTHORIZED, error.to_string()).into_response();
    }
    if !structured {
        shared.refused.fetch_add(1, Ordering::Relaxed);
        return (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "not a structured CloudEvent",
        )
            .into_response();
    }
    let redirect = lock(&shared.redirect).clone();
    if let Some(url) = redirect {
        shared.redirected.fetch_add(1, Ordering::Relaxed);
        return (
            StatusCode::TEMPORARY_REDIRECT,
            [(axum::http::header::LOCATION, url)],
        )
            .into_response();
    }
    if shared.failing.load(Ordering::Relaxed) {
        shared.answered_503.fetch_add(1, Ordering::Relaxed);
        return (StatusCode::SERVICE_UNAVAILABLE, "down for maintenance").into_response();
    }
    let body = String::from_utf8_lossy(&body).into_owned();
    lock(&shared.deliveries).push(Delivery {
        id: header(ID_HEADER).unwrap_or_default().to_owned(),
        event: serde_json::from_str(&body).unwrap_or(serde_json::Value::Null),
        body,
        received_at: std::time::SystemTime::now(),
    });
    StatusCode::NO_CONTENT.into_response()
}
