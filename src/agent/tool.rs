//! HTTP tools: the spec validated into a [`Tool`], argument checking against the tool's JSON
//! Schema, and the HTTP call itself.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::AgentError;
use super::http::{error_chain, excerpt, read_body_limited};
use crate::crd::ToolSpec;

/// Seconds to wait for a tool's response when `http.timeoutSeconds` is not set.
pub const DEFAULT_TOOL_TIMEOUT_SECONDS: u32 = 30;

/// The most bytes of a tool's response kept as its result; the rest is cut with a note.
pub const MAX_TOOL_RESULT_BYTES: usize = 256 * 1024;

/// A validated tool: what the model sees (name, description, parameters schema) and how the
/// runner calls it (HTTP POST, approval, timeout).
#[derive(Clone)]
pub struct Tool {
    name: String,
    description: String,
    parameters: serde_json::Value,
    validator: Arc<jsonschema::Validator>,
    requires_approval: bool,
    approval_timeout: Option<Duration>,
    idempotent: bool,
    url: reqwest::Url,
    timeout: Duration,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("requires_approval", &self.requires_approval)
            .field("url", &self.url.as_str())
            .finish_non_exhaustive()
    }
}

impl Tool {
    /// Validates the spec of the tool at `tools[index]`.
    pub fn from_spec(index: usize, spec: &ToolSpec) -> Result<Tool, AgentError> {
        let field = |name: &str| format!("tools[{index}].{name}");
        let name_ok = !spec.name.is_empty()
            && spec.name.len() <= 64
            && spec
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(AgentError::invalid(
                field("name"),
                format!(
                    "`{}` must be 1 to 64 letters, digits, `_` or `-`",
                    spec.name
                ),
            ));
        }
        let parameters = match &spec.parameters {
            Some(schema @ serde_json::Value::Object(_)) => schema.clone(),
            Some(_) => {
                return Err(AgentError::invalid(
                    field("parameters"),
                    "must be a JSON Schema object",
                ));
            }
            None => serde_json::json!({"type": "object", "properties": {}}),
        };
        let validator = jsonschema::validator_for(&parameters).map_err(|e| {
            AgentError::invalid(
                field("parameters"),
                format!("is not a valid JSON Schema: {e}"),
            )
        })?;
        let url = reqwest::Url::parse(&spec.http.url).map_err(|e| {
            AgentError::invalid(field("http.url"), format!("`{}`: {e}", spec.http.url))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(AgentError::invalid(
                field("http.url"),
                format!("`{}` must be an http or https URL", spec.http.url),
            ));
        }
        let timeout_seconds = spec
            .http
            .timeout_seconds
            .unwrap_or(DEFAULT_TOOL_TIMEOUT_SECONDS);
        if timeout_seconds == 0 {
            return Err(AgentError::invalid(
                field("http.timeoutSeconds"),
                "must be at least 1",
            ));
        }
        let approval_timeout = spec
            .approval_timeout
            .as_deref()
            .map(|text| {
                parse_duration(text).ok_or_else(|| {
                    AgentError::invalid(
                        field("approvalTimeout"),
                        format!("`{text}` is not a duration like `30m`, `24h` or `1h30m`"),
                    )
                })
            })
            .transpose()?;
        Ok(Tool {
            name: spec.name.clone(),
            description: spec.description.clone(),
            parameters,
            validator: Arc::new(validator),
            requires_approval: spec.requires_approval,
            approval_timeout,
            idempotent: spec.idempotent.unwrap_or(true),
            url,
            timeout: Duration::from_secs(u64::from(timeout_seconds)),
        })
    }

    /// The tool's name as the model sees it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The description shown to the model.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The JSON Schema of the arguments (an empty object schema when the spec has none).
    pub fn parameters(&self) -> &serde_json::Value {
        &self.parameters
    }

    /// Whether each call halts the run until a person decides it.
    pub fn requires_approval(&self) -> bool {
        self.requires_approval
    }

    /// How long a call may wait for a decision before it expires, if limited.
    pub fn approval_timeout(&self) -> Option<Duration> {
        self.approval_timeout
    }

    /// Whether sending the same call twice (same `Idempotency-Key`, see [`idempotency_key`]) is
    /// safe.
    pub fn idempotent(&self) -> bool {
        self.idempotent
    }

    /// The URL the arguments are POSTed to.
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }

    /// How long to wait for the tool's response.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The tool as listed in a chat-completions request.
    pub fn openai_definition(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }

    /// Checks arguments against the tool's schema; the error lists up to three problems.
    pub fn check_arguments(&self, arguments: &serde_json::Value) -> Result<(), String> {
        const MAX_SHOWN: usize = 3;
        let mut problems = Vec::new();
        let mut total = 0usize;
        for error in self.validator.iter_errors(arguments) {
            total += 1;
            if problems.len() < MAX_SHOWN {
                let path = error.instance_path().to_string();
                let place = if path.is_empty() {
                    "the arguments".to_owned()
                } else {
                    format!("`{path}`")
                };
                problems.push(format!("{place}: {error}"));
            }
        }
        if total == 0 {
            return Ok(());
        }
        let mut message = problems.join("; ");
        if total > MAX_SHOWN {
            message.push_str(&format!(" (and {} more)", total - MAX_SHOWN));
        }
        Err(message)
    }

    /// POSTs the JSON `body` with the `Idempotency-Key` `key` (see [`idempotency_key`]) and,
    /// when given, the approved call's signed approval assertion in the
    /// [`HEADER`](crate::assertion::HEADER) header; returns the text the model gets as the result.
    pub async fn call(
        &self,
        client: &reqwest::Client,
        key: &str,
        body: String,
        assertion: Option<&str>,
    ) -> String {
        let mut request = client
            .post(self.url.clone())
            .timeout(self.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", key);
        if let Some(assertion) = assertion {
            request = request.header(crate::assertion::HEADER, assertion);
        }
        let sent = request.body(body).send().await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => return self.transport_error(e),
        };
        let status = response.status();
        let (bytes, truncated) = match read_body_limited(response, MAX_TOOL_RESULT_BYTES).await {
            Ok(read) => read,
            Err(e) => return self.transport_error(e),
        };
        if !status.is_success() {
            tracing::warn!(tool = %self.name, key, status = status.as_u16(), "tool returned an error status");
            return format!("tool error: HTTP {}: {}", status.as_u16(), excerpt(&bytes));
        }
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if truncated {
            text.push_str(&format!(
                "\n[tool result truncated to {MAX_TOOL_RESULT_BYTES} bytes]"
            ));
        }
        text
    }

    fn transport_error(&self, error: reqwest::Error) -> String {
        tracing::warn!(tool = %self.name, error = %error_chain(&error), "tool call failed");
        if error.is_timeout() {
            format!(
                "tool error: no response from `{}` within {} seconds",
                self.name,
                self.timeout.as_secs()
            )
        } else if error.is_connect() {
            format!("tool error: cannot connect to `{}`", self.name)
        } else {
            format!(
                "tool error: request to `{}` failed: {}",
                self.name,
                error_chain(&error.without_url())
            )
        }
    }
}

/// Parses durations like `30s`, `30m`, `24h`, `1h30m`.
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    if text.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    let mut number: Option<u64> = None;
    for c in text.chars() {
        if let Some(digit) = c.to_digit(10) {
            number = Some(
                number
                    .unwrap_or(0)
                    .checked_mul(10)?
                    .checked_add(u64::from(digit))?,
            );
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => return None,
        };
        total = total.checked_add(number.take()?.checked_mul(unit)?)?;
    }
    if number.is_some() {
        return None;
    }
    Some(Duration::from_secs(total))
}

/// The `Idempotency-Key` of a call: `<run id>/<tool call id>`. Unique per run and call (a model
/// may reuse its call ids across runs), and the same for every attempt of the call, so a tool that
/// honours the header runs it once.
pub fn idempotency_key(run_id: &str, tool_call_id: &str) -> String {
    format!("{run_id}/{tool_call_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("45s"), Some(Duration::from_secs(45)));
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("30"), None);
        assert_eq!(parse_duration("m"), None);
        assert_eq!(parse_duration("3d"), None);
    }
}
