//! What the loopback test servers (model, tools) record of each request they receive.

use std::sync::{Mutex, MutexGuard, PoisonError};

use axum::http::{HeaderMap, Method};

/// One request a test server received.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    /// The HTTP method.
    pub method: String,
    /// The request path (the model server keeps the query too), e.g. `/delete_user`.
    pub path: String,
    /// The request headers (names lowercase), in order.
    pub headers: Vec<(String, String)>,
    /// The raw body.
    pub body: String,
}

impl RecordedRequest {
    /// Records a request; header values and the body are read as UTF-8, lossily.
    pub(crate) fn new(method: &Method, path: String, headers: &HeaderMap, body: &[u8]) -> Self {
        RecordedRequest {
            method: method.to_string(),
            path,
            headers: headers
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str().to_owned(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: String::from_utf8_lossy(body).into_owned(),
        }
    }

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

    /// The `messages` of a chat-completions request.
    pub fn messages(&self) -> Vec<serde_json::Value> {
        self.json()
            .get("messages")
            .and_then(|m| m.as_array())
            .cloned()
            .unwrap_or_default()
    }
}

/// Locks `mutex`, also after a panic elsewhere while it was held (a test's assertion failed).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
