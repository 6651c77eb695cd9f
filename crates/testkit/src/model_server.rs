//! A scripted OpenAI-compatible chat-completions server on 127.0.0.1, for tests.
//!
//! Start it with [`ModelServer::start`] (inside a tokio runtime), queue the replies with
//! [`ModelServer::push`], point the agent's `model.baseUrl` at [`ModelServer::base_url`], and
//! inspect every request it received with [`ModelServer::requests`]. When the queue is empty it
//! answers 500 with a body saying so, so a test that asks the model more often than scripted
//! fails clearly. Replies can also be error statuses, non-JSON bodies, delays or hangs.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio_util::task::AbortOnDropHandle;

pub use crate::recorded::RecordedRequest;
use crate::recorded::lock;

/// One scripted reply of the model server.
#[derive(Clone, Debug)]
pub enum Reply {
    /// HTTP 200 with this JSON body.
    Json(serde_json::Value),
    /// Any status and raw body, with extra headers.
    Raw {
        /// The HTTP status code.
        status: u16,
        /// The body, sent as is.
        body: String,
        /// Extra response headers.
        headers: Vec<(String, String)>,
    },
    /// Wait, then send the inner reply.
    Delay(Duration, Box<Reply>),
    /// Never answer (the client must time out).
    Hang,
}

impl Reply {
    /// A chat completion whose message is a final text answer.
    pub fn text(content: &str) -> Reply {
        Reply::message(serde_json::json!({"role": "assistant", "content": content}))
    }

    /// A chat completion whose message calls tools: `(id, name, arguments object)`; the
    /// arguments are sent as a JSON string, as OpenAI does.
    pub fn tool_calls(calls: &[(&str, &str, serde_json::Value)]) -> Reply {
        Reply::message(assistant_tool_calls(calls))
    }

    /// A chat completion with this assistant message (any JSON).
    pub fn message(message: serde_json::Value) -> Reply {
        Reply::Json(serde_json::json!({
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "test-model",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        }))
    }

    /// An error status with a short JSON error body.
    pub fn status(status: u16, message: &str) -> Reply {
        Reply::Raw {
            status,
            body: serde_json::json!({"error": {"message": message}}).to_string(),
            headers: Vec::new(),
        }
    }

    /// HTTP 200 with a body that is not JSON.
    pub fn garbage() -> Reply {
        Reply::Raw {
            status: 200,
            body: "<html>502 Bad Gateway (not JSON)</html>".to_owned(),
            headers: Vec::new(),
        }
    }

    /// The same reply with an extra response header (only for [`Reply::Raw`]; other replies
    /// are turned into a raw 200 first).
    pub fn with_header(self, name: &str, value: &str) -> Reply {
        let (status, body, mut headers) = match self {
            Reply::Raw {
                status,
                body,
                headers,
            } => (status, body, headers),
            Reply::Json(json) => (200, json.to_string(), Vec::new()),
            other => return other,
        };
        headers.push((name.to_owned(), value.to_owned()));
        Reply::Raw {
            status,
            body,
            headers,
        }
    }
}

/// An assistant message calling tools, in the OpenAI shape.
pub fn assistant_tool_calls(calls: &[(&str, &str, serde_json::Value)]) -> serde_json::Value {
    let calls: Vec<serde_json::Value> = calls
        .iter()
        .map(|(id, name, args)| {
            serde_json::json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": args.to_string()},
            })
        })
        .collect();
    serde_json::json!({"role": "assistant", "content": null, "tool_calls": calls})
}

#[derive(Default)]
struct Shared {
    replies: Mutex<VecDeque<Reply>>,
    requests: Mutex<Vec<RecordedRequest>>,
}

/// The running server; it stops when dropped.
pub struct ModelServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _task: AbortOnDropHandle<()>,
}

impl ModelServer {
    /// Starts the server on 127.0.0.1 with a free port. Needs a tokio runtime.
    pub async fn start() -> ModelServer {
        let shared = Arc::new(Shared::default());
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the model server to 127.0.0.1:0");
        let addr = listener.local_addr().expect("model server address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        ModelServer {
            addr,
            shared,
            _task: AbortOnDropHandle::new(task),
        }
    }

    /// The base URL to put in `model.baseUrl` (`http://127.0.0.1:PORT/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues a reply; replies are sent in order, one per request.
    pub fn push(&self, reply: Reply) -> &ModelServer {
        lock(&self.shared.replies).push_back(reply);
        self
    }

    /// How many queued replies are left.
    pub fn remaining(&self) -> usize {
        lock(&self.shared.replies).len()
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests were received.
    pub fn request_count(&self) -> usize {
        lock(&self.shared.requests).len()
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    lock(&shared.requests).push(RecordedRequest::new(
        &method,
        uri.to_string(),
        &headers,
        &body,
    ));
    if method != Method::POST || uri.path() != "/v1/chat/completions" {
        return (
            StatusCode::NOT_FOUND,
            "model server: only POST /v1/chat/completions",
        )
            .into_response();
    }
    let reply = lock(&shared.replies).pop_front();
    match reply {
        Some(reply) => respond(reply).await,
        None => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "model server: no scripted reply left",
        )
            .into_response(),
    }
}

async fn respond(mut reply: Reply) -> Response {
    loop {
        match reply {
            Reply::Delay(wait, inner) => {
                tokio::time::sleep(wait).await;
                reply = *inner;
            }
            Reply::Hang => std::future::pending::<()>().await,
            Reply::Json(json) => return axum::Json(json).into_response(),
            Reply::Raw {
                status,
                body,
                headers,
            } => {
                let mut response = (
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                    body,
                )
                    .into_response();
                for (name, value) in headers {
                    if let (Ok(name), Ok(value)) = (
                        HeaderName::try_from(name.as_str()),
                        HeaderValue::try_from(value.as_str()),
                    ) {
                        response.headers_mut().insert(name, value);
                    }
                }
                return response;
            }
        }
    }
}
