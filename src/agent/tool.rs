//! Tools: an HTTP tool's spec or an MCP tool's bound definition validated into a [`Tool`],
//! argument checking against the tool's JSON Schema, and the call itself (an HTTP POST, or an MCP
//! `tools/call` after checking the server still defines the tool as the run is bound to).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::AgentError;
use super::http::{error_chain, excerpt, read_body_limited};
use super::mcp::{McpEndpoint, McpSession, listed_digest};
use crate::crd::{McpServerSpec, McpToolBinding, ToolSpec};

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
    /// The URL exactly as the spec writes it (what requests show and digests cover).
    endpoint: String,
    timeout: Duration,
    mcp: Option<McpTarget>,
}

/// Where an MCP tool lives and the definition a run is bound to.
#[derive(Clone)]
struct McpTarget {
    server: String,
    definition_digest: String,
    /// The configured headers' values (read from Secrets by the worker), never shown.
    headers: Vec<(String, String)>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("requires_approval", &self.requires_approval)
            .field("url", &self.url.as_str())
            .field("mcp_server", &self.mcp.as_ref().map(|m| m.server.as_str()))
            .finish_non_exhaustive()
    }
}

/// A tool ready to be called: an HTTP tool, or an MCP tool whose server still defines it as bound
/// (its session open).
#[derive(Debug)]
pub enum Prepared {
    /// An HTTP tool.
    Http,
    /// An MCP tool, with the digest of the definition its server lists now.
    Mcp {
        /// The open session.
        session: McpSession,
        /// The digest of the definition the server lists now (equal to the bound one).
        definition_digest: String,
    },
}

/// Why a tool call is not sent: the text the model gets instead.
#[derive(Debug)]
pub enum NotSent {
    /// The server could not be reached or listed: a tool error.
    Failed(String),
    /// The MCP server defines the tool otherwise than when the run started.
    Superseded {
        /// For the record: the digests.
        why: String,
        /// The tool result.
        result: String,
    },
}

impl Tool {
    /// Validates the spec of the tool at `tools[index]`.
    pub fn from_spec(index: usize, spec: &ToolSpec) -> Result<Tool, AgentError> {
        let field = |name: &str| format!("tools[{index}].{name}");
        if !valid_name(&spec.name) {
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
            endpoint: spec.http.url.clone(),
            timeout: Duration::from_secs(u64::from(timeout_seconds)),
            mcp: None,
        })
    }

    /// Validates an MCP tool the run is bound to (`server` is the spec of its server).
    pub fn from_mcp(server: &McpServerSpec, bound: &McpToolBinding) -> Result<Tool, AgentError> {
        let field = format!("mcpServers[{}].tools[{}]", server.name, bound.name);
        if !valid_name(&bound.name) {
            return Err(AgentError::invalid(
                &field,
                format!(
                    "the server's tool name `{}` cannot be offered to a model (1 to 64 letters, digits, `_` or `-`): leave it out of `tools`",
                    bound.name
                ),
            ));
        }
        let definition = &bound.definition;
        let parameters = match definition.get("inputSchema") {
            Some(schema @ serde_json::Value::Object(_)) => schema.clone(),
            None => serde_json::json!({"type": "object", "properties": {}}),
            Some(_) => {
                return Err(AgentError::invalid(
                    &field,
                    "the server's inputSchema is not a JSON Schema object",
                ));
            }
        };
        let validator = jsonschema::validator_for(&parameters).map_err(|e| {
            AgentError::invalid(
                &field,
                format!("the server's inputSchema is not a valid JSON Schema: {e}"),
            )
        })?;
        let url = reqwest::Url::parse(&server.url).map_err(|e| {
            AgentError::invalid(
                format!("mcpServers[{}].url", server.name),
                format!("`{}`: {e}", server.url),
            )
        })?;
        let text = |key: &str| definition.get(key).and_then(serde_json::Value::as_str);
        let description = text("description")
            .or(text("title"))
            .unwrap_or_default()
            .to_owned();
        let hints = bound.hints();
        let approval_timeout = server
            .approval_timeout
            .as_deref()
            .map(|t| {
                parse_duration(t).ok_or_else(|| {
                    AgentError::invalid(
                        format!("mcpServers[{}].approvalTimeout", server.name),
                        format!("`{t}` is not a duration like `30m`, `24h` or `1h30m`"),
                    )
                })
            })
            .transpose()?;
        Ok(Tool {
            name: bound.name.clone(),
            description,
            parameters,
            validator: Arc::new(validator),
            requires_approval: server.require_approval.requires_approval(&hints),
            approval_timeout,
            // MCP has no idempotency key: only a tool the server declares idempotent is re-sent
            // after a crash left its outcome unknown.
            idempotent: hints.idempotent == Some(true),
            url,
            endpoint: server.url.clone(),
            timeout: Duration::from_secs(u64::from(
                server
                    .timeout_seconds
                    .unwrap_or(DEFAULT_TOOL_TIMEOUT_SECONDS)
                    .max(1),
            )),
            mcp: Some(McpTarget {
                server: server.name.clone(),
                definition_digest: bound.definition_digest.clone(),
                headers: vec![],
            }),
        })
    }

    /// The MCP server's name, for an MCP tool.
    pub fn mcp_server(&self) -> Option<&str> {
        self.mcp.as_ref().map(|m| m.server.as_str())
    }

    /// Sets the headers sent to this tool's MCP server (no effect on HTTP tools).
    pub(crate) fn set_mcp_headers(&mut self, headers: Vec<(String, String)>) {
        if let Some(mcp) = self.mcp.as_mut() {
            mcp.headers = headers;
        }
    }

    /// Makes a call ready: nothing for an HTTP tool; for an MCP tool, opens a session (with
    /// `extra_headers`, e.g. `traceparent`) and checks that the server lists the tool with the
    /// definition the run is bound to.
    pub async fn prepare(
        &self,
        client: &reqwest::Client,
        extra_headers: &[(String, String)],
    ) -> Result<Prepared, NotSent> {
        let Some(mcp) = &self.mcp else {
            return Ok(Prepared::Http);
        };
        let headers: Vec<(String, String)> =
            mcp.headers.iter().chain(extra_headers).cloned().collect();
        let endpoint = McpEndpoint {
            url: &self.endpoint,
            headers: &headers,
        };
        let checked = tokio::time::timeout(self.timeout, async {
            let session = McpSession::open(client, &endpoint).await?;
            let listed = session.list_tools().await?;
            Ok::<_, super::mcp::McpError>((session, listed))
        })
        .await;
        let (session, listed) = match checked {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                tracing::warn!(tool = %self.name, server = %mcp.server, error = %e, "MCP server unavailable");
                return Err(NotSent::Failed(format!(
                    "tool error: MCP server `{}` is unavailable: {e}",
                    mcp.server
                )));
            }
            Err(_) => {
                return Err(NotSent::Failed(format!(
                    "tool error: MCP server `{}` did not answer within {} seconds",
                    mcp.server,
                    self.timeout.as_secs()
                )));
            }
        };
        match listed_digest(&listed, &mcp.server, &self.endpoint, &self.name) {
            Some(digest) if digest == mcp.definition_digest => Ok(Prepared::Mcp {
                session,
                definition_digest: digest,
            }),
            found => {
                session.close().await;
                let now = found
                    .as_deref()
                    .unwrap_or("none: the server no longer lists it");
                let why = format!(
                    "MCP server `{}` defines `{}` otherwise than when the run started (definition digest now {now}, bound {})",
                    mcp.server, self.name, mcp.definition_digest
                );
                tracing::warn!(tool = %self.name, server = %mcp.server, %why, "not sending a call of a changed tool");
                Err(NotSent::Superseded {
                    result: format!(
                        "tool error: the call was not sent: MCP server `{}` changed the definition of `{}` since this run started, so an approval or the tool list the run was given no longer describes it. Start a new run to use the changed tool.",
                        mcp.server, self.name
                    ),
                    why,
                })
            }
        }
    }

    /// The URL calls go to, exactly as the spec writes it (an HTTP tool's `http.url`, an MCP
    /// server's `url`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// `http` or `mcp`.
    pub fn kind(&self) -> &'static str {
        if self.mcp.is_some() { "mcp" } else { "http" }
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

    /// Sends the call made ready by [`Tool::prepare`]: POSTs the JSON `body` with the
    /// `Idempotency-Key` `key` (see [`idempotency_key`]) to an HTTP tool, or calls the MCP tool
    /// with `body` as its arguments; with the approved call's signed approval assertion, when
    /// given, in the [`HEADER`](crate::assertion::HEADER) header, and `extra_headers` (e.g.
    /// `traceparent`). Returns the text the model gets as the result.
    pub async fn call(
        &self,
        client: &reqwest::Client,
        prepared: Prepared,
        key: &str,
        body: String,
        assertion: Option<&str>,
        extra_headers: &[(String, String)],
    ) -> String {
        match prepared {
            Prepared::Http => {
                self.call_http(client, key, body, assertion, extra_headers)
                    .await
            }
            Prepared::Mcp { session, .. } => {
                self.call_mcp(client, session, &body, assertion, extra_headers)
                    .await
            }
        }
    }

    async fn call_mcp(
        &self,
        client: &reqwest::Client,
        session: McpSession,
        body: &str,
        assertion: Option<&str>,
        extra_headers: &[(String, String)],
    ) -> String {
        let server = self.mcp_server().unwrap_or_default().to_owned();
        let called = tokio::time::timeout(self.timeout, async {
            // The assertion is a header of the request that carries the call: a session of its
            // own (the listing's session was opened before the approval was checked).
            let session = match (assertion, &self.mcp) {
                (Some(assertion), Some(mcp)) => {
                    session.close().await;
                    let headers: Vec<(String, String)> = mcp
                        .headers
                        .iter()
                        .chain(extra_headers)
                        .cloned()
                        .chain([(crate::assertion::HEADER.to_owned(), assertion.to_owned())])
                        .collect();
                    let endpoint = McpEndpoint {
                        url: &self.endpoint,
                        headers: &headers,
                    };
                    McpSession::open(client, &endpoint).await?
                }
                _ => session,
            };
            let result = session.call(&self.name, body).await;
            session.close().await;
            result
        })
        .await;
        match called {
            Ok(Ok((text, false))) => text,
            Ok(Ok((text, true))) => format!("tool error: {text}"),
            Ok(Err(e)) => {
                tracing::warn!(tool = %self.name, %server, error = %e, "MCP tool call failed");
                format!("tool error: MCP server `{server}`: {e}")
            }
            Err(_) => format!(
                "tool error: no response from `{}` (MCP server `{server}`) within {} seconds",
                self.name,
                self.timeout.as_secs()
            ),
        }
    }

    async fn call_http(
        &self,
        client: &reqwest::Client,
        key: &str,
        body: String,
        assertion: Option<&str>,
        extra_headers: &[(String, String)],
    ) -> String {
        let mut request = client
            .post(self.url.clone())
            .timeout(self.timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("Idempotency-Key", key);
        for (name, value) in extra_headers {
            request = request.header(name, value);
        }
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

/// Whether a model can be offered a tool of this name: 1 to 64 letters, digits, `_` or `-`.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
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
