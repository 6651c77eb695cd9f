//! HTTP tools on 127.0.0.1, for tests.
//!
//! Start it with [`ToolServer::start`] (inside a tokio runtime) and use [`ToolServer::url`] as a
//! tool's `http.url`. By default every path answers 200 with JSON echoing the call
//! (`{"ok": true, "tool": PATH, "arguments": BODY}`); [`ToolServer::set_reply`] sets a path's
//! standing reply, [`ToolServer::push`] queues one-shot replies. Every request is recorded
//! (path, headers, body), and calls are counted per `Idempotency-Key`.
//!
//! [`ToolServer::require_assertions`] makes a path behave like a tool that refuses calls without
//! a valid signed approval assertion (`Agentrun-Approval` header, checked with
//! `agentrun::assertion::verify` against the given JWKS, the path's URL and the body): a refused
//! call gets 401, is not executed and is recorded in [`ToolServer::refused`] instead of
//! [`ToolServer::requests`].

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio_util::task::AbortOnDropHandle;

pub use crate::recorded::RecordedRequest as ToolRequest;
use crate::recorded::{RecordedRequest, lock};

use agentrun::assertion::{Claims, Expected, HEADER, Jwks, verify_header};

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

/// A call refused for want of a valid approval assertion.
#[derive(Clone, Debug)]
pub struct RefusedCall {
    /// The call.
    pub request: ToolRequest,
    /// Why ([`AssertionError::label`], e.g. `missing`, `bad_signature`).
    pub reason: &'static str,
    /// The error's message.
    pub message: String,
}

#[derive(Default)]
struct Shared {
    addr: std::sync::OnceLock<SocketAddr>,
    standing: Mutex<HashMap<String, ToolReply>>,
    queued: Mutex<HashMap<String, VecDeque<ToolReply>>>,
    requests: Mutex<Vec<ToolRequest>>,
    required: Mutex<HashMap<String, Jwks>>,
    refused: Mutex<Vec<RefusedCall>>,
    verified: Mutex<Vec<(String, Claims)>>,
}

fn normalize(path: &str) -> String {
    format!("/{}", path.trim_start_matches('/'))
}

/// The running server; it stops when dropped.
pub struct ToolServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _task: AbortOnDropHandle<()>,
}

impl ToolServer {
    /// Starts the server on 127.0.0.1 with a free port. Needs a tokio runtime.
    pub async fn start() -> ToolServer {
        Self::try_start()
            .await
            .expect("start the tool server on 127.0.0.1")
    }

    /// [`ToolServer::start`], returning the error when no port can be bound.
    pub async fn try_start() -> std::io::Result<ToolServer> {
        Self::try_start_on(std::net::Ipv4Addr::LOCALHOST.into()).await
    }

    /// Starts the server on one of this machine's own addresses (e.g. a node's address, which
    /// containers reach) with a free port. Needs a tokio runtime.
    pub async fn start_on(ip: std::net::IpAddr) -> ToolServer {
        Self::try_start_on(ip)
            .await
            .unwrap_or_else(|e| panic!("bind the tool server to {ip}:0: {e}"))
    }

    /// [`ToolServer::start_on`], returning the error when no port can be bound.
    pub async fn try_start_on(ip: std::net::IpAddr) -> std::io::Result<ToolServer> {
        let shared = Arc::new(Shared::default());
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let _ = shared.addr.set(addr);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(ToolServer {
            addr,
            shared,
            _task: AbortOnDropHandle::new(task),
        })
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

    /// Makes `path` refuse (401) every call without a valid approval assertion, verified with
    /// `jwks` for the endpoint [`ToolServer::url`]`(path)` and the body received.
    pub fn require_assertions(&self, path: &str, jwks: Jwks) -> &ToolServer {
        lock(&self.shared.required).insert(normalize(path), jwks);
        self
    }

    /// The calls refused for want of a valid assertion, in order.
    pub fn refused(&self) -> Vec<RefusedCall> {
        lock(&self.shared.refused).clone()
    }

    /// The claims of each verified assertion, with the path it was sent to, in order.
    pub fn verified(&self) -> Vec<(String, Claims)> {
        lock(&self.shared.verified).clone()
    }

    /// Every call received so far (and not refused), in order.
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

    /// How many calls were received so far.
    pub fn request_count(&self) -> usize {
        lock(&self.shared.requests).len()
    }

    /// How many calls carried this `Idempotency-Key`.
    pub fn calls_with_key(&self, key: &str) -> usize {
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.idempotency_key() == Some(key))
            .count()
    }

    /// How many calls of the model's tool call `tool_call_id` were received, in any run: calls
    /// whose `Idempotency-Key` (`<run id>/<tool call id>`) names it.
    pub fn calls_of(&self, tool_call_id: &str) -> usize {
        let suffix = format!("/{tool_call_id}");
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.idempotency_key().is_some_and(|k| k.ends_with(&suffix)))
            .count()
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
    let request = RecordedRequest::new(&method, path.clone(), &headers, &body);
    let arguments = request.json();
    let jwks = lock(&shared.required).get(&path).cloned();
    if let Some(jwks) = jwks {
        let endpoint = format!("http://{}{path}", shared.addr.get().expect("address"));
        let header = request.header(HEADER).map(str::to_owned);
        match verify_header(header.as_deref(), &jwks, &Expected::new(&endpoint, &body)) {
            Ok(claims) => lock(&shared.verified).push((path.clone(), claims)),
            Err(error) => {
                let message = error.to_string();
                lock(&shared.refused).push(RefusedCall {
                    request,
                    reason: error.label(),
                    message: message.clone(),
                });
                return (StatusCode::UNAUTHORIZED, message).into_response();
            }
        }
    }
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
