//! Model providers: an OpenAI-compatible chat-completions API over HTTP, and a scripted model
//! that plays fixed turns (demos and tests). Both answer with one assistant message in the
//! OpenAI shape, kept as written in the run's history.
//! Submodules: `openai` (the HTTP provider and its [`ApiKey`]), `scripted`, `retry`
//! ([`RetryPolicy`]) and `message` (reading a message's role, text and tool calls).

mod message;
mod openai;
mod retry;
mod scripted;

pub use message::{
    ToolArguments, ToolCall, content_text, role, set_tool_call_arguments, tool_calls,
};
pub use openai::{ApiKey, OpenAiProvider};
pub use retry::RetryPolicy;
pub use scripted::ScriptedProvider;

use super::AgentError;
use super::tool::Tool;
use crate::crd::{ModelSpec, SecretKeyRef};
use crate::state::pyjson::Value;

/// Seconds to wait for one model response when `model.timeoutSeconds` is not set.
pub const DEFAULT_MODEL_TIMEOUT_SECONDS: u32 = 60;
/// Retries on 429, 5xx and connection errors when `model.maxRetries` is not set.
pub const DEFAULT_MODEL_MAX_RETRIES: u32 = 3;
/// The largest model response body accepted.
pub const MAX_MODEL_RESPONSE_BYTES: usize = 16 * 1024 * 1024;

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

impl ModelError {
    /// A low-cardinality label for traces (`error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            ModelError::Status { .. } => "http_status",
            ModelError::Transport { .. } => "transport",
            ModelError::InvalidResponse { .. } => "invalid_response",
            ModelError::ScriptExhausted { .. } => "script_exhausted",
            ModelError::Encode(_) => "encode",
        }
    }
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
            provider.set_api_key(key);
        }
    }

    /// The environment variable holding the API key for local runs, if configured.
    pub fn api_key_env(&self) -> Option<&str> {
        match self {
            ModelProvider::OpenAi(provider) => provider.api_key_env(),
            ModelProvider::Scripted(_) => None,
        }
    }

    /// The Secret key holding the API key in a cluster, if configured.
    pub fn api_key_secret_ref(&self) -> Option<&SecretKeyRef> {
        match self {
            ModelProvider::OpenAi(provider) => provider.api_key_secret_ref(),
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
        use tracing::Instrument as _;
        let (provider_name, model, url) = match self {
            ModelProvider::OpenAi(provider) => ("openai", provider.model(), Some(provider.url())),
            ModelProvider::Scripted(_) => ("scripted", "scripted", None),
        };
        let span = tracing::info_span!(
            target: crate::telemetry::TARGET,
            "chat",
            otel.name = %format!("chat {model}"),
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = provider_name,
            gen_ai.request.model = %model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            server.address = url.and_then(|u| u.host_str()).unwrap_or_default(),
            server.port = url.and_then(reqwest::Url::port_or_known_default).unwrap_or_default(),
            error.type = tracing::field::Empty,
        );
        let answer = async {
            match self {
                ModelProvider::OpenAi(provider) => provider.complete(client, retry, request).await,
                ModelProvider::Scripted(provider) => provider.complete(request),
            }
        }
        .instrument(span.clone())
        .await;
        match &answer {
            Ok(response) => {
                span.record("gen_ai.usage.input_tokens", response.input_tokens);
                span.record("gen_ai.usage.output_tokens", response.output_tokens);
            }
            Err(error) => {
                span.record("error.type", error.kind());
            }
        }
        answer
    }
}
