//! Model providers: an OpenAI-compatible chat-completions API over HTTP, and a scripted model
//! that plays fixed turns (demos and tests). Both answer with one assistant message in the
//! OpenAI shape, kept as written in the run's history.

use std::collections::HashSet;
use std::fmt;
use std::time::Duration;

use rand::Rng;
use serde::Serialize;

use super::AgentError;
use super::http::{error_chain, excerpt, read_body_limited};
use super::tool::Tool;
use crate::crd::{ModelSpec, ScriptedModel, SecretKeyRef};
use crate::state::pyjson::{self, Value};

/// Seconds to wait for one model response when `model.timeoutSeconds` is not set.
pub const DEFAULT_MODEL_TIMEOUT_SECONDS: u32 = 60;
/// Retries on 429, 5xx and connection errors when `model.maxRetries` is not set.
pub const DEFAULT_MODEL_MAX_RETRIES: u32 = 3;
/// The largest model response body accepted.
pub const MAX_MODEL_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

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

/// How failed model requests are retried: exponential backoff from `base_delay`, capped at
/// `max_delay`, each delay scaled by a random factor in [0.5, 1.0]; a `Retry-After` (or
/// `retry-after-ms`) header from the server is honoured up to `max_retry_after`.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// The delay before the first retry (before jitter).
    pub base_delay: Duration,
    /// The longest computed backoff delay.
    pub max_delay: Duration,
    /// The longest delay taken from a `Retry-After` header.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `retry` (1 for the first retry).
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(wait) = retry_after {
            return wait.min(self.max_retry_after);
        }
        let factor = 2u32.saturating_pow(retry.saturating_sub(1).min(20));
        let backoff = self.base_delay.saturating_mul(factor).min(self.max_delay);
        backoff.mul_f64(rand::rng().random_range(0.5..=1.0))
    }
}

/// Errors from a model provider.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The API answered with an error status (after retries, for 429 and 5xx).
    #[error(
        "model request to {endpoint} failed with HTTP {status} after {attempts} attempt(s): {body}"
    )]
    Status {
        /// The endpoint (without credentials or query).
        endpoint: String,
        /// The HTTP status code.
        status: u16,
        /// How many requests were sent.
        attempts: u32,
        /// A short excerpt of the response body.
        body: String,
    },
    /// The request could not be sent or the response not read (after retries).
    #[error("model request to {endpoint} failed after {attempts} attempt(s): {message}")]
    Transport {
        /// The endpoint (without credentials or query).
        endpoint: String,
        /// How many requests were sent.
        attempts: u32,
        /// What went wrong.
        message: String,
    },
    /// The API answered 2xx with a body that is not a chat completion.
    #[error("invalid model response from {endpoint}: {reason}")]
    InvalidResponse {
        /// The endpoint (without credentials or query), or `scripted`.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The scripted model has no turn left to play.
    #[error(
        "the scripted model has no turn {turn}: it has {available} turn(s) (model.scripted.turns)"
    )]
    ScriptExhausted {
        /// The 1-based turn that was asked for.
        turn: usize,
        /// How many turns the script has.
        available: usize,
    },
    /// The request body could not be encoded as JSON.
    #[error("cannot encode the model request as JSON: {0}")]
    Encode(String),
}

/// What the runner asks a model: the instructions, the history, the tools.
#[derive(Clone, Copy, Debug)]
pub struct ModelRequest<'a> {
    /// System instructions, sent first (omitted when empty).
    pub instructions: &'a str,
    /// The conversation so far (user, assistant and tool messages).
    pub history: &'a [Value],
    /// The tools the model may call.
    pub tools: &'a [Tool],
}

/// One model answer.
#[derive(Clone, Debug)]
pub struct ModelResponse {
    /// The assistant message (`choices[0].message`), as the API wrote it.
    pub message: Value,
    /// Prompt tokens reported by the API (0 when not reported).
    pub input_tokens: u64,
    /// Completion tokens reported by the API (0 when not reported).
    pub output_tokens: u64,
}

/// The model an agent talks to.
#[derive(Clone, Debug)]
pub enum ModelProvider {
    /// An OpenAI-compatible chat-completions API.
    OpenAi(Box<OpenAiProvider>),
    /// Fixed assistant turns, for demos and tests.
    Scripted(ScriptedProvider),
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

/// A scripted model: the assistant messages it plays, pre-rendered in the OpenAI shape.
#[derive(Clone, Debug)]
pub struct ScriptedProvider {
    turns: Vec<serde_json::Value>,
}

impl ModelProvider {
    /// Validates `model` of an agent spec.
    pub fn from_spec(spec: &ModelSpec) -> Result<ModelProvider, AgentError> {
        match (&spec.scripted, &spec.base_url, &spec.name) {
            (Some(scripted), None, None) => Ok(ModelProvider::Scripted(
                ScriptedProvider::from_spec(scripted)?,
            )),
            (Some(_), _, _) => Err(AgentError::invalid(
                "model",
                "set either baseUrl and name (an API) or scripted, not both",
            )),
            (None, Some(base_url), Some(name)) => Ok(ModelProvider::OpenAi(Box::new(
                OpenAiProvider::from_spec(spec, base_url, name)?,
            ))),
            (None, None, None) => Err(AgentError::invalid(
                "model",
                "set baseUrl and name (an OpenAI-compatible API) or scripted",
            )),
            (None, None, Some(_)) => Err(AgentError::invalid(
                "model.baseUrl",
                "is required with model.name",
            )),
            (None, Some(_), None) => Err(AgentError::invalid(
                "model.name",
                "is required with model.baseUrl",
            )),
        }
    }

    pub(crate) fn set_api_key(&mut self, key: ApiKey) {
        if let ModelProvider::OpenAi(provider) = self {
            provider.api_key = Some(key);
        }
    }

    /// The environment variable holding the API key for local runs, if configured.
    pub fn api_key_env(&self) -> Option<&str> {
        match self {
            ModelProvider::OpenAi(provider) => provider.api_key_env.as_deref(),
            ModelProvider::Scripted(_) => None,
        }
    }

    /// The Secret key holding the API key in a cluster, if configured.
    pub fn api_key_secret_ref(&self) -> Option<&SecretKeyRef> {
        match self {
            ModelProvider::OpenAi(provider) => provider.api_key_secret_ref.as_ref(),
            ModelProvider::Scripted(_) => None,
        }
    }

    /// Asks the model for the next assistant message.
    pub async fn complete(
        &self,
        client: &reqwest::Client,
        retry: &RetryPolicy,
        request: ModelRequest<'_>,
    ) -> Result<ModelResponse, ModelError> {
        match self {
            ModelProvider::OpenAi(provider) => provider.complete(client, retry, request).await,
            ModelProvider::Scripted(provider) => provider.complete(request),
        }
    }
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<&'a Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<serde_json::Value>,
}

/// Outcome of one attempt that may be retried.
enum Attempt {
    Done(Result<ModelResponse, ModelError>),
    Retry {
        why: String,
        retry_after: Option<Duration>,
        last_error: ModelError,
    },
}

impl OpenAiProvider {
    fn from_spec(
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

    /// The endpoint without user info or query, for messages.
    fn shown_endpoint(&self) -> String {
        let mut url = self.endpoint.clone();
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.set_query(None);
        url.to_string()
    }

    async fn complete(
        &self,
        client: &reqwest::Client,
        retry: &RetryPolicy,
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
        loop {
            attempts += 1;
            match self.attempt(client, &body, &endpoint, attempts).await {
                Attempt::Done(result) => return result,
                Attempt::Retry {
                    why,
                    retry_after,
                    last_error,
                } => {
                    if attempts > self.max_retries {
                        return Err(last_error);
                    }
                    let delay = retry.delay(attempts, retry_after);
                    tracing::warn!(
                        endpoint = %endpoint,
                        attempt = attempts,
                        delay_ms = delay.as_millis() as u64,
                        "model request failed ({why}); retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    async fn attempt(
        &self,
        client: &reqwest::Client,
        body: &[u8],
        endpoint: &str,
        attempts: u32,
    ) -> Attempt {
        let mut builder = client
            .post(self.endpoint.clone())
            .timeout(self.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
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
                let last_error = transport(e);
                return if retryable {
                    Attempt::Retry {
                        why: last_error.to_string(),
                        retry_after: None,
                        last_error,
                    }
                } else {
                    Attempt::Done(Err(last_error))
                };
            }
        };
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let read = read_body_limited(response, MAX_MODEL_RESPONSE_BYTES).await;
        if status.is_success() {
            return match read {
                Ok((_, true)) => Attempt::Done(Err(ModelError::InvalidResponse {
                    endpoint: endpoint.to_owned(),
                    reason: format!("the body is larger than {MAX_MODEL_RESPONSE_BYTES} bytes"),
                })),
                Ok((bytes, false)) => {
                    Attempt::Done(parse_chat_completion(&bytes).map_err(|reason| {
                        ModelError::InvalidResponse {
                            endpoint: endpoint.to_owned(),
                            reason,
                        }
                    }))
                }
                Err(e) => {
                    let last_error = transport(e);
                    Attempt::Retry {
                        why: last_error.to_string(),
                        retry_after: None,
                        last_error,
                    }
                }
            };
        }
        let body = match &read {
            Ok((bytes, _)) => excerpt(bytes),
            Err(_) => "(body unreadable)".to_owned(),
        };
        let last_error = ModelError::Status {
            endpoint: endpoint.to_owned(),
            status: status.as_u16(),
            attempts,
            body,
        };
        if status.as_u16() == 429 || status.is_server_error() {
            Attempt::Retry {
                why: format!("HTTP {}", status.as_u16()),
                retry_after,
                last_error,
            }
        } else {
            Attempt::Done(Err(last_error))
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
        message.insert("role".to_owned(), Value::Str("assistant".to_owned()));
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

impl ScriptedProvider {
    fn from_spec(spec: &ScriptedModel) -> Result<ScriptedProvider, AgentError> {
        let mut seen_ids = HashSet::new();
        let mut turns = Vec::with_capacity(spec.turns.len());
        for (t, turn) in spec.turns.iter().enumerate() {
            let mut calls = Vec::with_capacity(turn.tool_calls.len());
            for (c, call) in turn.tool_calls.iter().enumerate() {
                let field = |name: &str| format!("model.scripted.turns[{t}].toolCalls[{c}].{name}");
                if call.id.is_empty() {
                    return Err(AgentError::invalid(field("id"), "must not be empty"));
                }
                if !seen_ids.insert(call.id.as_str()) {
                    return Err(AgentError::invalid(
                        field("id"),
                        format!(
                            "tool call id `{}` is used twice; approvals are keyed by tool call id, \
                             so ids must be unique in the script",
                            call.id
                        ),
                    ));
                }
                if call.name.is_empty() {
                    return Err(AgentError::invalid(field("name"), "must not be empty"));
                }
                let arguments = match &call.arguments {
                    serde_json::Value::Null => "{}".to_owned(),
                    args @ serde_json::Value::Object(_) => args.to_string(),
                    _ => {
                        return Err(AgentError::invalid(
                            field("arguments"),
                            "must be a JSON object",
                        ));
                    }
                };
                calls.push(serde_json::json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }));
            }
            let mut message = serde_json::Map::new();
            message.insert("role".to_owned(), "assistant".into());
            message.insert(
                "content".to_owned(),
                turn.content
                    .clone()
                    .map_or(serde_json::Value::Null, Into::into),
            );
            if !calls.is_empty() {
                message.insert("tool_calls".to_owned(), serde_json::Value::Array(calls));
            }
            turns.push(serde_json::Value::Object(message));
        }
        Ok(ScriptedProvider { turns })
    }

    /// The number of turns in the script.
    pub fn len(&self) -> usize {
        self.turns.len()
    }

    /// Whether the script has no turns.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let played = request
            .history
            .iter()
            .filter(|m| role(m) == Some("assistant"))
            .count();
        let turn = self.turns.get(played).ok_or(ModelError::ScriptExhausted {
            turn: played + 1,
            available: self.turns.len(),
        })?;
        Ok(ModelResponse {
            message: Value::from(turn.clone()),
            input_tokens: 0,
            output_tokens: 0,
        })
    }
}

/// One tool call of an assistant message.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The id the model gave the call (`tool_calls[i].id`).
    pub id: String,
    /// The tool's name (`tool_calls[i].function.name`).
    pub name: String,
    /// The arguments as the model wrote them.
    pub arguments: ToolArguments,
}

/// Tool call arguments as written: OpenAI sends a JSON string; some compatible APIs an object.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolArguments {
    /// A JSON document in a string (the OpenAI shape).
    Text(String),
    /// An already-decoded value.
    Value(Value),
}

/// The `role` of a history message.
pub fn role(message: &Value) -> Option<&str> {
    match message {
        Value::Dict(d) => match d.get("role") {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

/// The text of a message's `content`: a string, the `text` parts of a list, or empty.
pub fn content_text(message: &Value) -> String {
    let Value::Dict(d) = message else {
        return String::new();
    };
    match d.get("content") {
        Some(Value::Str(s)) => s.clone(),
        Some(Value::List(parts)) => parts
            .iter()
            .filter_map(|part| match part {
                Value::Dict(p) => match p.get("text") {
                    Some(Value::Str(s)) => Some(s.as_str()),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

/// The tool calls of an assistant message (empty when it has none), checked for shape and
/// unique ids.
pub fn tool_calls(message: &Value) -> Result<Vec<ToolCall>, String> {
    let Value::Dict(d) = message else {
        return Err("the message is not a JSON object".to_owned());
    };
    let list = match d.get("tool_calls") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::List(list)) => list,
        Some(_) => return Err("`tool_calls` is not a list".to_owned()),
    };
    let mut calls = Vec::with_capacity(list.len());
    let mut ids = HashSet::new();
    for (i, call) in list.iter().enumerate() {
        let Value::Dict(call) = call else {
            return Err(format!("tool_calls[{i}] is not an object"));
        };
        let id = match call.get("id") {
            Some(Value::Str(id)) if !id.is_empty() => id.clone(),
            _ => return Err(format!("tool_calls[{i}].id is missing or not a string")),
        };
        if !ids.insert(id.clone()) {
            return Err(format!("tool call id `{id}` appears twice"));
        }
        let Some(Value::Dict(function)) = call.get("function") else {
            return Err(format!(
                "tool_calls[{i}].function is missing or not an object"
            ));
        };
        let name = match function.get("name") {
            Some(Value::Str(name)) => name.clone(),
            _ => {
                return Err(format!(
                    "tool_calls[{i}].function.name is missing or not a string"
                ));
            }
        };
        let arguments = match function.get("arguments") {
            None | Some(Value::Null) => ToolArguments::Text(String::new()),
            Some(Value::Str(text)) => ToolArguments::Text(text.clone()),
            Some(value @ Value::Dict(_)) => ToolArguments::Value(value.clone()),
            Some(_) => {
                return Err(format!(
                    "tool_calls[{i}].function.arguments is neither a string nor an object"
                ));
            }
        };
        calls.push(ToolCall {
            id,
            name,
            arguments,
        });
    }
    Ok(calls)
}
