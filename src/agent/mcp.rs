//! MCP tools over the Streamable HTTP transport, through the official Rust SDK (`rmcp`): listing
//! a server's tools (discovery, and the check just before a call) and calling one.
//!
//! Each call opens its own session: `initialize`, `tools/list` (the definition the server gives
//! now must have the digest the run is bound to, or the call is not sent), then `tools/call` with
//! the approved arguments. Sessions are never re-initialized to retry a request (the SDK's
//! `reinit_on_expired_session` is off), so a `tools/call` is sent at most once per attempt.

use std::collections::HashMap;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResponse, ContentBlock};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

use super::tool::MAX_TOOL_RESULT_BYTES;
use crate::crd::mcp::definition_digest;

/// Errors talking to an MCP server.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// A configured header cannot be sent (its name or value is not valid in HTTP).
    #[error("header {0} is not a valid HTTP header")]
    InvalidHeader(String),
    /// The session could not be opened (`initialize`): the server is down, refused, or is not an
    /// MCP server.
    #[error("cannot open an MCP session with {url}: {message}")]
    Connect {
        /// The server's URL.
        url: String,
        /// Why.
        message: String,
    },
    /// A request of the session failed (transport error, or an MCP error answer).
    #[error("{method} failed: {message}")]
    Request {
        /// `tools/list` or `tools/call`.
        method: &'static str,
        /// Why.
        message: String,
    },
    /// The server did not answer in time.
    #[error("no answer within {0} seconds")]
    Timeout(u64),
}

/// Where an MCP server is and what to send it with every request.
#[derive(Clone, Debug)]
pub struct McpEndpoint<'a> {
    /// The Streamable HTTP URL.
    pub url: &'a str,
    /// Headers (name, value), e.g. `Authorization` from a Secret and `traceparent`.
    pub headers: &'a [(String, String)],
}

/// An open session with an MCP server.
pub struct McpSession {
    service: RunningService<RoleClient, ()>,
}

impl std::fmt::Debug for McpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSession").finish_non_exhaustive()
    }
}

impl McpSession {
    /// Opens a session (`initialize`) through `client` (which must not follow redirects).
    pub async fn open(
        client: &reqwest::Client,
        endpoint: &McpEndpoint<'_>,
    ) -> Result<McpSession, McpError> {
        let mut headers = HashMap::new();
        for (name, value) in endpoint.headers {
            let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| McpError::InvalidHeader(name.clone()))?;
            let value = reqwest::header::HeaderValue::from_str(value)
                .map_err(|_| McpError::InvalidHeader(name.clone()))?;
            headers.insert(header, value);
        }
        let config = StreamableHttpClientTransportConfig::with_uri(endpoint.url)
            .custom_headers(headers)
            // A re-initialized session would re-send the request that hit the expired one: a
            // tools/call could run twice.
            .reinit_on_expired_session(false);
        let transport = StreamableHttpClientTransport::with_client(client.clone(), config);
        let service = ().serve(transport).await.map_err(|e| McpError::Connect {
            url: endpoint.url.to_owned(),
            message: super::http::error_chain(&e),
        })?;
        Ok(McpSession { service })
    }

    /// The server's tools (`tools/list`, every page), each as the JSON the server sent.
    pub async fn list_tools(&self) -> Result<Vec<serde_json::Value>, McpError> {
        let tools = self
            .service
            .list_all_tools()
            .await
            .map_err(|e| McpError::Request {
                method: "tools/list",
                message: super::http::error_chain(&e),
            })?;
        Ok(tools
            .iter()
            .map(|t| serde_json::to_value(t).unwrap_or_default())
            .collect())
    }

    /// Calls `tool` with `arguments` (a JSON object's text, exactly the approved body) once:
    /// `Ok` holds the result text and whether the server flagged it `isError`.
    pub async fn call(&self, tool: &str, arguments: &str) -> Result<(String, bool), McpError> {
        let arguments: serde_json::Map<String, serde_json::Value> = serde_json::from_str(arguments)
            .map_err(|e| McpError::Request {
                method: "tools/call",
                message: format!("the arguments are not a JSON object: {e}"),
            })?;
        let mut params = CallToolRequestParams::new(tool.to_owned());
        params.arguments = Some(arguments);
        let response =
            self.service
                .call_tool_once(params)
                .await
                .map_err(|e| McpError::Request {
                    method: "tools/call",
                    message: super::http::error_chain(&e),
                })?;
        let CallToolResponse::Complete(result) = response else {
            return Err(McpError::Request {
                method: "tools/call",
                message: "the server asked for more input or started a task, which agentrun does not support".into(),
            });
        };
        let mut parts: Vec<String> = result
            .content
            .iter()
            .map(|block| match block {
                ContentBlock::Text(text) => text.text.clone(),
                other => serde_json::to_string(other).unwrap_or_default(),
            })
            .collect();
        if parts.is_empty()
            && let Some(structured) = &result.structured_content
        {
            parts.push(structured.to_string());
        }
        Ok((bounded(parts.join("\n")), result.is_error.unwrap_or(false)))
    }

    /// Ends the session (best effort).
    pub async fn close(mut self) {
        let _ = self
            .service
            .close_with_timeout(Duration::from_secs(2))
            .await;
    }
}

/// An HTTP client for MCP servers (no redirects followed; per-request timeouts by the callers).
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    super::http::build_client()
}

/// Lists the tools of the server at `endpoint` within `timeout`: one session, `tools/list`.
pub async fn list_tools(
    client: &reqwest::Client,
    endpoint: &McpEndpoint<'_>,
    timeout: Duration,
) -> Result<Vec<serde_json::Value>, McpError> {
    tokio::time::timeout(timeout, async {
        let session = McpSession::open(client, endpoint).await?;
        let tools = session.list_tools().await;
        session.close().await;
        tools
    })
    .await
    .map_err(|_| McpError::Timeout(timeout.as_secs()))?
}

/// Lists the tools of each MCP server of `spec` now (with the headers `headers` gives a server)
/// and binds the ones the spec allows: what a run outside Kubernetes (or a test) is bound to. The
/// first server that cannot be listed is an error.
pub async fn discover(
    client: &reqwest::Client,
    spec: &crate::crd::AgentSpec,
    headers: impl Fn(&str) -> Vec<(String, String)>,
    timeout: Duration,
) -> Result<Vec<crate::crd::McpToolBinding>, (String, McpError)> {
    let mut bound = vec![];
    for server in &spec.mcp_servers {
        let headers = headers(&server.name);
        let endpoint = McpEndpoint {
            url: &server.url,
            headers: &headers,
        };
        let listed = list_tools(client, &endpoint, timeout)
            .await
            .map_err(|e| (server.name.clone(), e))?;
        bound.extend(server.bindings(&listed));
    }
    Ok(bound)
}

/// The digest of the definition `name` has in `listed` (a `tools/list` answer of the server
/// `server` at `url`), if it lists that tool.
pub fn listed_digest(
    listed: &[serde_json::Value],
    server: &str,
    url: &str,
    name: &str,
) -> Option<String> {
    listed
        .iter()
        .find(|t| t.get("name").and_then(serde_json::Value::as_str) == Some(name))
        .map(|t| definition_digest(server, url, t))
}

fn bounded(mut text: String) -> String {
    if text.len() > MAX_TOOL_RESULT_BYTES {
        let mut end = MAX_TOOL_RESULT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(&format!(
            "\n[tool result truncated to {MAX_TOOL_RESULT_BYTES} bytes]"
        ));
    }
    text
}
