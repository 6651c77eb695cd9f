//! The OpenAI-compatible chat-completions provider.

use std::fmt;
use std::time::Duration;

use backon::Retryable;
use serde::Serialize;

use super::{
    DEFAULT_MODEL_MAX_RETRIES, DEFAULT_MODEL_TIMEOUT_SECONDS, MAX_MODEL_RESPONSE_BYTES, ModelError,
    ModelRequest, ModelResponse, RetryPolicy, tool_calls,
};
use crate::agent::AgentError;
use crate::agent::http::{error_chain, excerpt, read_body_limited};
use crate::agent::tool::Tool;
use crate::crd::{ModelSpec, SecretKeyRef};
use crate::state::pyjson::{self, Value};

/// An API key. Its `Debug` output is redacted, so it cannot leak through logs or error values.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key (surrounding whitespace, e.g. a trailing newline from a Secret, is removed).
    pub fn new(key: impl Into<String>) -> ApiKey {
        let key: String = key.into();
        ApiKey(key.trim().to_owned())
    }

    /// The key itself, for the `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// An OpenAI-compatible chat-completions endpoint.
#[derive(Clone, Debug)]
pub struct OpenAiProvider {
    endpoint: reqwest::Url,
    model: String,
    api_key: Option<ApiKey>,
    api_key_env: Option<String>,
    api_key_secret_ref: Option<SecretKeyRef>,
    timeout: Duration,
    max_retries: u32,
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<&'a Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<serde_json::Value>,
}

impl OpenAiProvider {
    pub(super) fn from_spec(
        spec: &ModelSpec,
        base_url: &str,
        name: &str,
    ) -> Result<OpenAiProvider, AgentError> {
        let base = reqwest::Url::parse(base_url)
            .map_err(|e| AgentError::invalid("model.baseUrl", format!("`{base_url}`: {e}")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(AgentError::invalid(
                "model.baseUrl",
                format!("`{base_url}` must be an http or https URL"),
            ));
        }
        let endpoint_text = format!("{}/chat/completions", base_url.trim_end_matches('/'));
        let endpoint = reqwest::Url::parse(&endpoint_text)
            .map_err(|e| AgentError::invalid("model.baseUrl", format!("`{base_url}`: {e}")))?;
        if name.trim().is_empty() {
            return Err(AgentError::invalid("model.name", "must not be empty"));
        }
        let timeout_seconds = spec
            .timeout_seconds
            .unwrap_or(DEFAULT_MODEL_TIMEOUT_SECONDS);
        if timeout_seconds == 0 {
            return Err(AgentError::invalid(
                "model.timeoutSeconds",
                "must be at least 1",
            ));
        }
        let max_retries = spec.max_retries.unwrap_or(DEFAULT_MODEL_MAX_RETRIES);
        if max_retries > 10 {
            return Err(AgentError::invalid(
                "model.maxRetries",
                "must be at most 10",
            ));
        }
        if let Some(var) = &spec.api_key_env
            && var.is_empty()
        {
            return Err(AgentError::invalid("model.apiKeyEnv", "must not be empty"));
        }
        Ok(OpenAiProvider {
            endpoint,
            model: name.to_owned(),
            api_key: None,
            api_key_env: spec.api_key_env.clone(),
            api_key_secret_ref: spec.api_key_secret_ref.clone(),
            timeout: Duration::from_secs(u64::from(timeout_seconds)),
            max_retries,
        })
    }

    /// The model name sent in each request.
    pub(super) fn model(&self) -> &str {
        &self.model
    }

    /// The chat-completions URL.
    pub(super) fn url(&self) -> &reqwest::Url {
        &self.endpoint
    }

    pub(super) fn set_api_key(&mut self, key: ApiKey) {
        self.api_key = Some(key);
    }

    pub(super) fn api_key_env(&self) -> Option<&str> {
        self.api_key_env.as_deref()
    }

    pub(super) fn api_key_secret_ref(&self) -> Option<&SecretKeyRef> {
        self.api_key_secret_ref.as_ref()
    }

    /// The endpoint without user info or query, for messages.
    fn shown_endpoint(&self) -> String {
        let mut url = self.endpoint.clone();
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.set_query(None);
        url.to_string()
    }

    pub(super) async fn complete(
        &self,
        client: &reqwest::Client,
        policy: &RetryPolicy,
        request: ModelRequest<'_>,
    ) -> Result<ModelResponse, ModelError> {
        let system = (!request.instructions.is_empty()).then(|| {
            Value::from(serde_json::json!({"role": "system", "content": request.instructions}))
        });
        let body = ChatRequest {
            model: &self.model,
            messages: system.iter().chain(request.history.iter()).collect(),
            tools: request.tools.iter().map(Tool::openai_definition).collect(),
        };
        let body = serde_json::to_vec(&body).map_err(|e| ModelError::Encode(e.to_string()))?;
        let endpoint = self.shown_endpoint();
        let mut attempts: u32 = 0;
        let send = || {
            attempts += 1;
            self.attempt(client, &body, &endpoint, attempts)
        };
        send.retry(policy.backoff(self.max_retries))
            .when(|failed| failed.retry.is_some())
            .adjust(|failed, delay| delay.map(|delay| policy.wait(failed.retry_after, delay)))
            .notify(|failed, delay| {
                tracing::warn!(
                    endpoint = %endpoint,
                    attempt = failed.attempt,
                    delay_ms = delay.as_millis() as u64,
                    "model request failed ({}); retrying",
                    failed.retry.as_deref().unwrap_or_default()
                );
            })
            .await
            .map_err(|failed| failed.error)
    }

    async fn attempt(
        &self,
        client: &reqwest::Client,
        body: &[u8],
        endpoint: &str,
        attempts: u32,
    ) -> Result<ModelResponse, Failed> {
        let mut builder = client
            .post(self.endpoint.clone())
            .timeout(self.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        for (name, value) in crate::telemetry::current_headers() {
            builder = builder.header(name, value);
        }
        if let Some(key) = &self.api_key {
            builder = builder.bearer_auth(key.expose());
        }
        let transport = |e: reqwest::Error| {
            let message = if e.is_timeout() {
                format!("no response within {} seconds", self.timeout.as_secs())
            } else {
                error_chain(&e.without_url())
            };
            ModelError::Transport {
                endpoint: endpoint.to_owned(),
                attempts,
                message,
            }
        };
        let response = match builder.send().await {
            Ok(response) => response,
            Err(e) => {
                let retryable = e.is_connect() || e.is_timeout() || e.is_request();
                let error = transport(e);
                return Err(if retryable {
                    Failed::retryable(error, attempts)
                } else {
                    Failed::last(error, attempts)
                });
            }
        };
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let read = read_body_limited(response, MAX_MODEL_RESPONSE_BYTES).await;
        if status.is_success() {
            return match read {
                Ok((_, true)) => Err(Failed::last(
                    ModelError::InvalidResponse {
                        endpoint: endpoint.to_owned(),
                        reason: format!("the body is larger than {MAX_MODEL_RESPONSE_BYTES} bytes"),
                    },
                    attempts,
                )),
                Ok((bytes, false)) => parse_chat_completion(&bytes).map_err(|reason| {
                    Failed::last(
                        ModelError::InvalidResponse {
                            endpoint: endpoint.to_owned(),
                            reason,
                        },
                        attempts,
                    )
                }),
                Err(e) => Err(Failed::retryable(transport(e), attempts)),
            };
        }
        let body = match &read {
            Ok((bytes, _)) => excerpt(bytes),
            Err(_) => "(body unreadable)".to_owned(),
        };
        let error = ModelError::Status {
            endpoint: endpoint.to_owned(),
            status: status.as_u16(),
            attempts,
            body,
        };
        Err(if status.as_u16() == 429 || status.is_server_error() {
            Failed {
                error,
                attempt: attempts,
                retry: Some(format!("HTTP {}", status.as_u16())),
                retry_after,
            }
        } else {
            Failed::last(error, attempts)
        })
    }
}

/// A failed request: the error to report if no retry follows, and whether one may.
struct Failed {
    error: ModelError,
    /// The attempt that failed (1 for the first request).
    attempt: u32,
    /// Why a retry may succeed, for the log; `None` when retrying cannot help.
    retry: Option<String>,
    /// The wait the server asked for.
    retry_after: Option<Duration>,
}

impl Failed {
    fn last(error: ModelError, attempt: u32) -> Failed {
        Failed {
            error,
            attempt,
            retry: None,
            retry_after: None,
        }
    }

    fn retryable(error: ModelError, attempt: u32) -> Failed {
        Failed {
            retry: Some(error.to_string()),
            error,
            attempt,
            retry_after: None,
        }
    }
}

/// The wait a server asked for: `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let when = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = when.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

/// Extracts `choices[0].message` and `usage` from a chat-completions response body.
fn parse_chat_completion(bytes: &[u8]) -> Result<ModelResponse, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| format!("the body is not UTF-8 text: {}", excerpt(bytes)))?;
    let body = pyjson::loads(text)
        .map_err(|e| format!("the body is not JSON ({e}): {}", excerpt(bytes)))?;
    let Value::Dict(root) = &body else {
        return Err(format!("the body is not a JSON object: {}", excerpt(bytes)));
    };
    let message = match root.get("choices") {
        Some(Value::List(choices)) => match choices.first() {
            Some(Value::Dict(choice)) => choice.get("message"),
            _ => None,
        },
        _ => None,
    };
    let Some(Value::Dict(message)) = message else {
        return Err(format!(
            "no choices[0].message object in {}",
            excerpt(bytes)
        ));
    };
    let mut message = message.clone();
    if !message.contains_key("role") {
        message.insert("role", Value::from("assistant"));
    }
    let message = Value::Dict(message);
    tool_calls(&message).map_err(|e| format!("choices[0].message: {e}"))?;
    let usage = root.get("usage");
    let tokens = |key: &str| {
        usage
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Ok(ModelResponse {
        input_tokens: tokens("prompt_tokens"),
        output_tokens: tokens("completion_tokens"),
        message,
    })
}
