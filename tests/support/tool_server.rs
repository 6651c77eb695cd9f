//! HTTP tools on 127.0.0.1, for tests.
//!
//! Start it with [`ToolServer::start`] (inside a tokio runtime) and use [`ToolServer::url`] as a
//! tool's `http.url`. By default every path answers 200 with JSON echoing the call
//! (`{"ok": true, "tool": PATH, "arguments": BODY}`); [`ToolServer::set_reply`] sets a path's
//! standing reply, [`ToolServer::push`] queues one-shot replies. Every request is recorded
//! (path, headers, body), and calls are counted per `Idempotency-Key`.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

/// How the tool server answers one call.
#[derive(Clone, Debug)]
pub enum ToolReply {
    /// 200 with JSON echoing the call: `{"ok": true, "tool": PATH, "arguments": BODY}`.
    Echo,
    /// 200 with this JSON body.
    Json(serde_json::Value),
    /// Any status with this raw body.
    Raw {
        /// The HTTP status code.
        status: u16,
        /// The body, sent as is.
        body: String,
    },
    /// Wait, then send the inner reply.
    Delay(Duration, Box<ToolReply>),
    /// Never answer (the client must time out).
    Hang,
}

impl ToolReply {
    /// An error status with this body.
    pub fn status(status: u16, body: &str) -> ToolReply {
        ToolReply::Raw {
            status,
            body: body.to_owned(),
        }
    }
}

/// One call the tool server received.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    /// The HTTP method.
    pub method: String,
    /// The path, e.g. `/delete_user`.
    pub path: String,
    /// The request headers (names lowercase), in order.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: String,
}

impl ToolRequest {
    /// The first header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `Idempotency-Key` header.
    pub fn idempotency_key(&self) -> Option<&str> {
        self.header("idempotency-key")
    }

    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

#[derive(Default)]
struct Shared {
    standing: Mutex<HashMap<String, ToolReply>>,
    queued: Mutex<HashMap<String, VecDeque<ToolReply>>>,
    requests: Mutex<Vec<ToolRequest>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn normalize(path: &str) -> String {
    format!("/{}", path.trim_start_matches('/'))
}

/// The running server; it stops when dropped.
pub struct ToolServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl ToolServer {
    /// Starts the server on 127.0.0.1 with a free port. Needs a tokio runtime.
    pub async fn start() -> ToolServer {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into()).await
    }

    /// Starts the server on one of this machine's own addresses (e.g. a node's address, which
    /// containers reach) with a free port. Needs a tokio runtime.
    pub async fn start_on(ip: std::net::IpAddr) -> ToolServer {
        let shared = Arc::new(Shared::default());
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind((ip, 0))
            .await
            .unwrap_or_else(|e| panic!("bind the tool server to {ip}:0: {e}"));
        let addr = listener.local_addr().expect("tool server address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ToolServer { addr, shared, task }
    }

    /// The URL of a tool path, e.g. `url("delete_user")` → `http://127.0.0.1:PORT/delete_user`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, normalize(path))
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the reply sent for every call to `path` (when no one-shot reply is queued).
    pub fn set_reply(&self, path: &str, reply: ToolReply) -> &ToolServer {
        lock(&self.shared.standing).insert(normalize(path), reply);
        self
    }

    /// Queues a one-shot reply for the next call to `path`.
    pub fn push(&self, path: &str, reply: ToolReply) -> &ToolServer {
        lock(&self.shared.queued)
            .entry(normalize(path))
            .or_default()
            .push_back(reply);
        self
    }

    /// Every call received so far, in order.
    pub fn requests(&self) -> Vec<ToolRequest> {
        lock(&self.shared.requests).clone()
    }

    /// The calls received on `path`.
    pub fn requests_to(&self, path: &str) -> Vec<ToolRequest> {
        let path = normalize(path);
        self.requests()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    /// How many calls carried this `Idempotency-Key`.
    pub fn calls_with_key(&self, key: &str) -> usize {
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.idempotency_key() == Some(key))
            .count()
    }

    /// How many calls were received per `Idempotency-Key` (calls without one are not counted).
    pub fn calls_per_key(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for request in lock(&self.shared.requests).iter() {
            if let Some(key) = request.idempotency_key() {
                *counts.entry(key.to_owned()).or_insert(0) += 1;
            }
        }
        counts
    }
}

impl Drop for ToolServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let request = ToolRequest {
        method: method.to_string(),
        path: path.clone(),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    let arguments = request.json();
    lock(&shared.requests).push(request);
    let queued = lock(&shared.queued)
        .get_mut(&path)
        .and_then(VecDeque::pop_front);
    let reply = queued
        .or_else(|| lock(&shared.standing).get(&path).cloned())
        .unwrap_or(ToolReply::Echo);
    respond(reply, &path, arguments).await
}

async fn respond(mut reply: ToolReply, path: &str, arguments: serde_json::Value) -> Response {
    loop {
        match reply {
            ToolReply::Delay(wait, inner) => {
                tokio::time::sleep(wait).await;
                reply = *inner;
            }
            ToolReply::Hang => std::future::pending::<()>().await,
            ToolReply::Echo => {
                return axum::Json(serde_json::json!({
                    "ok": true,
                    "tool": path,
                    "arguments": arguments,
                }))
                .into_response();
            }
            ToolReply::Json(json) => return axum::Json(json).into_response(),
            ToolReply::Raw { status, body } => {
                return (
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    body,
                )
                    .into_response();
            }
        }
    }
}
