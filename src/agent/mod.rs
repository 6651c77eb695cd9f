//! The agent loop: a declarative agent, its model and tools, and the runner that halts for approval.
//!
//! - [`Agent`]: a validated agent built from an [`AgentSpec`](crate::crd::AgentSpec), the
//!   declarative shape a user writes (YAML/JSON locally, the `Agent` custom resource).
//! - [`model`]: the model providers (OpenAI-compatible HTTP API, scripted turns).
//! - [`tool`]: HTTP and MCP tools, argument validation; [`mcp`]: the MCP client (discovery and
//!   calls over Streamable HTTP).
//! - [`runner`]: the loop itself, [`Runner`], which halts when a tool call needs a person's
//!   decision and resumes from a [`RunState`](crate::state::RunState).

mod http;
pub mod mcp;
pub mod model;
pub mod runner;
pub mod tool;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

pub use model::{ApiKey, ModelError, ModelProvider, OpenAiProvider, RetryPolicy, ScriptedProvider};
pub use runner::{
    HookError, RunError, RunHooks, RunOutcome, RunStatus, Runner, RunnerConfig, ToolCallGate,
    ToolCallStart,
};
pub use tool::Tool;

use crate::crd::agent::DEFAULT_MAX_TURNS;
use crate::crd::{AgentSpec, McpToolBinding};

/// Errors loading or validating an agent definition.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The agent file could not be read.
    #[error("cannot read agent file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The agent file is not valid YAML/JSON or does not have the agent's shape.
    #[error("cannot parse agent file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (with line and column where known).
        message: String,
    },
    /// A field of the spec has a value the runner cannot use.
    #[error("invalid agent: {field}: {reason}")]
    Invalid {
        /// The field, as written in the spec (e.g. `tools[1].parameters`).
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `model.apiKeyEnv` names an environment variable that is not set.
    #[error("the environment variable {var} named by model.apiKeyEnv is not set")]
    ApiKeyEnvMissing {
        /// The variable's name.
        var: String,
    },
}

impl AgentError {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        AgentError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A validated agent: its name, instructions, model and tools, and its turn limit.
#[derive(Clone, Debug)]
pub struct Agent {
    name: String,
    instructions: String,
    model: ModelProvider,
    tools: Vec<Tool>,
    max_turns: u32,
}

impl Agent {
    /// Builds an agent from a spec whose `name` is set (local runs).
    pub fn from_spec(spec: &AgentSpec) -> Result<Agent, AgentError> {
        let name = spec
            .name
            .as_deref()
            .ok_or_else(|| AgentError::invalid("name", "is required"))?;
        Agent::from_spec_with_name(name, spec)
    }

    /// Builds an agent from a spec under the given name (e.g. the `Agent` resource's
    /// `metadata.name`); the spec's own `name`, if any, is ignored. Its MCP servers contribute no
    /// tools: see [`Agent::from_bound`].
    pub fn from_spec_with_name(name: &str, spec: &AgentSpec) -> Result<Agent, AgentError> {
        Agent::from_bound(name, spec, &[])
    }

    /// Builds an agent from a spec and the MCP tools it is bound to (a run's snapshot, or what
    /// discovery found). Every tool name must be unique among the HTTP tools and all servers'
    /// tools: a collision is an error naming both.
    pub fn from_bound(
        name: &str,
        spec: &AgentSpec,
        mcp_tools: &[McpToolBinding],
    ) -> Result<Agent, AgentError> {
        if name.trim().is_empty() {
            return Err(AgentError::invalid("name", "must not be empty"));
        }
        if name.len() > 253 {
            return Err(AgentError::invalid("name", "is longer than 253 characters"));
        }
        let max_turns = spec.max_turns.unwrap_or(DEFAULT_MAX_TURNS);
        if max_turns == 0 {
            return Err(AgentError::invalid("maxTurns", "must be at least 1"));
        }
        let mut tools = Vec::with_capacity(spec.tools.len());
        let mut seen = HashSet::new();
        for (i, tool_spec) in spec.tools.iter().enumerate() {
            let tool = Tool::from_spec(i, tool_spec)?;
            if !seen.insert(tool.name().to_owned()) {
                return Err(AgentError::invalid(
                    format!("tools[{i}].name"),
                    format!("duplicate tool name `{}`", tool.name()),
                ));
            }
            tools.push(tool);
        }
        let mut servers = HashSet::new();
        for (i, server) in spec.mcp_servers.iter().enumerate() {
            if !servers.insert(server.name.as_str()) {
                return Err(AgentError::invalid(
                    format!("mcpServers[{i}].name"),
                    format!("duplicate MCP server name `{}`", server.name),
                ));
            }
            let url_ok = reqwest::Url::parse(&server.url)
                .is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
            if !url_ok {
                return Err(AgentError::invalid(
                    format!("mcpServers[{i}].url"),
                    format!("`{}` must be an http or https URL", server.url),
                ));
            }
        }
        for bound in mcp_tools {
            let server = spec
                .mcp_servers
                .iter()
                .find(|s| s.name == bound.server)
                .ok_or_else(|| {
                    AgentError::invalid(
                        "mcpServers",
                        format!("no server `{}` for tool `{}`", bound.server, bound.name),
                    )
                })?;
            let tool = Tool::from_mcp(server, bound)?;
            if let Some(other) = tools.iter().find(|t| t.name() == tool.name()) {
                let other = match other.mcp_server() {
                    Some(s) => format!("tool `{}` of MCP server `{s}`", other.name()),
                    None => format!("HTTP tool `{}` (tools[])", other.name()),
                };
                return Err(AgentError::invalid(
                    format!("mcpServers[{}]", server.name),
                    format!(
                        "tool `{}` of MCP server `{}` has the name of {other}: the model could not tell them apart; leave one out (`tools` allow-list) or rename the HTTP tool",
                        tool.name(),
                        server.name
                    ),
                ));
            }
            tools.push(tool);
        }
        let model = ModelProvider::from_spec(&spec.model)?;
        Ok(Agent {
            name: name.to_owned(),
            instructions: spec.instructions.clone(),
            model,
            tools,
            max_turns,
        })
    }

    /// Reads an agent spec from a YAML file, or a JSON file when the name ends in `.json`, and
    /// builds the agent. The spec's `name` is required.
    pub fn load_file(path: &Path) -> Result<Agent, AgentError> {
        let text = std::fs::read_to_string(path).map_err(|source| AgentError::Read {
            path: path.to_owned(),
            source,
        })?;
        let is_json = path
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("json"));
        let spec: AgentSpec = if is_json {
            serde_json::from_str(&text).map_err(|e| AgentError::Parse {
                path: path.to_owned(),
                message: e.to_string(),
            })?
        } else {
            serde_yaml_ng::from_str(&text).map_err(|e| AgentError::Parse {
                path: path.to_owned(),
                message: e.to_string(),
            })?
        };
        Agent::from_spec(&spec)
    }

    /// Sets the model's API key (e.g. read by the Kubernetes worker from a Secret). Has no
    /// effect for the scripted model.
    pub fn with_api_key(mut self, key: ApiKey) -> Agent {
        self.model.set_api_key(key);
        self
    }

    /// Sets the headers (name, value) sent to MCP server `server`, e.g. read from the Secrets
    /// its spec names.
    pub fn with_mcp_headers(mut self, server: &str, headers: &[(String, String)]) -> Agent {
        for tool in &mut self.tools {
            if tool.mcp_server() == Some(server) {
                tool.set_mcp_headers(headers.to_vec());
            }
        }
        self
    }

    /// For local runs: reads the API key from the environment variable named by
    /// `model.apiKeyEnv`, if set. Errors if that variable is not set.
    pub fn with_api_key_from_env(mut self) -> Result<Agent, AgentError> {
        if let Some(var) = self.model.api_key_env().map(str::to_owned) {
            match std::env::var(&var) {
                Ok(value) if !value.is_empty() => self.model.set_api_key(ApiKey::new(value)),
                _ => return Err(AgentError::ApiKeyEnvMissing { var }),
            }
        }
        Ok(self)
    }

    /// The agent's name (recorded in each run's state).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The system instructions, sent before the conversation on every model request.
    pub fn instructions(&self) -> &str {
        &self.instructions
    }

    /// The model provider.
    pub fn model(&self) -> &ModelProvider {
        &self.model
    }

    /// The tools, in spec order.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The tool with this name, if any.
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// The most model turns one run may take.
    pub fn max_turns(&self) -> u32 {
        self.max_turns
    }
}
