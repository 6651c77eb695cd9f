//! The `Agent` custom resource: the declarative agent (its instructions, the model it talks to
//! and the tools it may call), which is also the shape a user writes in YAML or JSON for a local
//! run, and its status. Field docs become the CRD's schema descriptions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::mcp::{McpServerSpec, McpServerStatus, McpToolBinding};

/// Default number of model turns before a run fails with `MaxTurnsExceeded`.
pub const DEFAULT_MAX_TURNS: u32 = 20;

/// A declarative agent: its instructions, the model it talks to and the tools it may call.
// It is also the `spec` of the `Agent` custom resource (`agentrun.dev/v1alpha1`, short name `agt`),
// derived here.
#[derive(
    Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema, kube::CustomResource,
)]
// The printer columns repeat `type_ = "string"`, which clippy takes for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[kube(
    group = "agentrun.dev",
    version = "v1alpha1",
    kind = "Agent",
    namespaced,
    shortname = "agt",
    category = "agentrun-all",
    status = "crate::crd::AgentStatus",
    derive = "PartialEq",
    derive = "Default",
    label("app.kubernetes.io/part-of", "agentrun"),
    doc = "An agent: the instructions, model and tools that AgentRuns of this namespace run with.",
    printcolumn(
        name = "Model",
        type_ = "string",
        json_path = ".spec.model.name",
        description = "The model name sent in each request"
    ),
    printcolumn(
        name = "Tools",
        type_ = "string",
        json_path = ".status.toolNames",
        description = "The tools the model may call"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentSpec {
    /// The agent's name when the spec is used outside Kubernetes; the `Agent` resource uses its
    /// `metadata.name` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub name: Option<String>,
    /// The system instructions sent to the model before the conversation on every turn.
    #[serde(default)]
    #[schemars(length(max = 65536))]
    pub instructions: String,
    /// The model endpoint: an OpenAI-compatible chat-completions API, or the built-in scripted
    /// provider for demos and tests.
    pub model: ModelSpec,
    /// The tools the model may call.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub tools: Vec<ToolSpec>,
    /// MCP servers (Streamable HTTP) whose tools the model may call, under their MCP names. The
    /// controller lists their tools (`status.mcpServers`); a run is bound to the definitions
    /// listed when it started.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = super::mcp::MAX_MCP_SERVERS))]
    pub mcp_servers: Vec<McpServerSpec>,
    /// The most model turns one run may take before it fails (default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_turns: Option<u32>,
}

/// Which model the agent talks to. Exactly one of `baseUrl` (with `name`) or `scripted` is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    /// Base URL of an OpenAI-compatible API, e.g. `https://api.openai.com/v1`; the runner POSTs to
    /// `{baseUrl}/chat/completions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub base_url: Option<String>,
    /// The model name sent in each request, e.g. `gpt-4o-mini`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub name: Option<String>,
    /// Local runs only: the environment variable holding the API key (sent as a bearer token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub api_key_env: Option<String>,
    /// In a cluster: the Secret key holding the API key. The worker reads it; it is never copied
    /// into any status, Event or log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret_ref: Option<SecretKeyRef>,
    /// Seconds to wait for one model response (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<u32>,
    /// Retries on 429 and 5xx responses and connection errors, with exponential backoff (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10))]
    pub max_retries: Option<u32>,
    /// For demos and tests only: a fixed list of assistant turns played back in order instead of
    /// calling a model. The turn played is the number of assistant messages already in the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scripted: Option<ScriptedModel>,
}

/// A reference to one key of a Secret in the agent's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key inside the Secret's data.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A scripted model: the assistant turns it answers with, in order. For demos and tests.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptedModel {
    /// The assistant turns, played in order.
    #[schemars(length(max = 1000))]
    pub turns: Vec<ScriptedTurn>,
}

/// One scripted assistant turn: text, tool calls, or both.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptedTurn {
    /// The assistant's text. A turn without tool calls ends the run with this as its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool calls the assistant makes in this turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ScriptedToolCall>,
}

/// One scripted tool call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScriptedToolCall {
    /// The tool call id the model would have chosen, e.g. `call_1`.
    #[schemars(length(min = 1, max = 128))]
    pub id: String,
    /// The name of the tool to call.
    #[schemars(length(min = 1, max = 64))]
    pub name: String,
    /// The call's arguments, a JSON object.
    #[serde(default)]
    #[schemars(schema_with = "crate::crd::agent::any_json_object")]
    pub arguments: serde_json::Value,
}

/// A tool the model may call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolSpec {
    /// The tool's name as the model sees it (letters, digits, `_` and `-`).
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub name: String,
    /// What the tool does, shown to the model.
    #[serde(default)]
    #[schemars(length(max = 4096))]
    pub description: String,
    /// JSON Schema of the tool's arguments. Arguments that fail it go back to the model as an
    /// error result and never reach the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::crd::agent::any_json_object_opt")]
    pub parameters: Option<serde_json::Value>,
    /// When true, each call of this tool halts the run until a person approves or rejects it.
    #[serde(default)]
    pub requires_approval: bool,
    /// How long a call may wait for a decision before it expires and is treated as rejected,
    /// e.g. `30m` or `24h`. Unset: no expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(s|m|h))+$"))]
    pub approval_timeout: Option<String>,
    /// Whether calling the tool twice with the same `Idempotency-Key` is safe (default true).
    /// A call of a non-idempotent tool whose outcome is unknown after a crash is not re-sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotent: Option<bool>,
    /// The HTTP endpoint implementing the tool.
    pub http: HttpTool,
}

/// An HTTP tool: the runner POSTs the JSON arguments with an `Idempotency-Key: <tool_call_id>`
/// header; the response body is the tool result.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpTool {
    /// The URL to POST to.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// Seconds to wait for the tool's response (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<u32>,
}

impl AgentSpec {
    /// The SHA-256 (lowercase hex) of the spec's JSON: what a run's snapshot of its Agent is
    /// checked against.
    pub fn digest(&self) -> String {
        json_digest(self)
    }
}

impl ToolSpec {
    /// The SHA-256 (lowercase hex) of the tool's definition as JSON (name, description, schema,
    /// approval and idempotency settings, endpoint and timeout): an approval holds only for a
    /// tool with exactly this definition.
    pub fn definition_digest(&self) -> String {
        json_digest(self)
    }

    /// The URL a call of this tool is sent to.
    pub fn endpoint(&self) -> &str {
        &self.http.url
    }
}

fn json_digest<T: Serialize>(value: &T) -> String {
    use sha2::{Digest, Sha256};
    // Serializing a spec (plain structs and JSON values) cannot fail.
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))
}

/// The Agent a run is bound to, recorded by the controller when the run starts: every step of the
/// run uses this spec, so editing the Agent affects new runs only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSnapshot {
    /// The Agent's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The Agent's uid when the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub uid: Option<String>,
    /// The Agent's metadata.generation when the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The SHA-256 (lowercase hex) of spec.
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub spec_digest: String,
    /// The Agent's spec as the run uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<AgentSpec>,
    /// The MCP tools the run may call, as their servers defined them when it started (from the
    /// Agent's `status.mcpServers`): the model is shown these definitions, and each call is sent
    /// only if the server still defines the tool so (same digest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub mcp_tools: Vec<McpToolBinding>,
}

/// Where a call of a tool goes and what it is bound to, from a run's snapshot: what its
/// ApprovalRequest shows and what the worker checks before sending it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolBinding {
    /// The URL the call is sent to (an HTTP tool's URL, an MCP server's URL).
    pub endpoint: String,
    /// The digest of the tool's definition ([`ToolSpec::definition_digest`] or
    /// [`definition_digest`](super::mcp::definition_digest)).
    pub definition_digest: String,
    /// How long a call may wait for a decision (`approvalTimeout`), as written.
    pub approval_timeout: Option<String>,
}

impl AgentSnapshot {
    /// A snapshot of `agent` now: its spec, and the tools its MCP servers listed at the last
    /// discovery of this spec's servers (an undiscovered server contributes none).
    pub fn of(agent: &Agent) -> AgentSnapshot {
        AgentSnapshot {
            name: agent.metadata.name.clone().unwrap_or_default(),
            uid: agent.metadata.uid.clone(),
            generation: agent.metadata.generation,
            spec_digest: agent.spec.digest(),
            spec: Some(agent.spec.clone()),
            mcp_tools: discovered_tools(&agent.spec, agent.status.as_ref()),
        }
    }

    /// The spec, when it is present and matches its digest.
    pub fn verified_spec(&self) -> Option<&AgentSpec> {
        self.spec
            .as_ref()
            .filter(|s| s.digest() == self.spec_digest)
    }

    /// The MCP tools, when each matches its digest and belongs to a server of the verified spec
    /// that allows it (`None` otherwise: the snapshot is not usable).
    pub fn verified_mcp_tools(&self) -> Option<&[McpToolBinding]> {
        let spec = self.verified_spec()?;
        let ok = self.mcp_tools.iter().all(|tool| {
            tool.verified()
                && spec
                    .mcp_servers
                    .iter()
                    .any(|s| s.name == tool.server && s.url == tool.url && s.allows(&tool.name))
        });
        ok.then_some(self.mcp_tools.as_slice())
    }

    /// Where a call of `tool` goes and the digest of the definition it is bound to.
    pub fn tool_binding(&self, tool: &str) -> Option<ToolBinding> {
        let spec = self.verified_spec()?;
        if let Some(http) = spec.tools.iter().find(|t| t.name == tool) {
            return Some(ToolBinding {
                endpoint: http.endpoint().to_owned(),
                definition_digest: http.definition_digest(),
                approval_timeout: http.approval_timeout.clone(),
            });
        }
        let mcp = self.verified_mcp_tools()?.iter().find(|t| t.name == tool)?;
        let server = spec.mcp_servers.iter().find(|s| s.name == mcp.server)?;
        Some(ToolBinding {
            endpoint: mcp.url.clone(),
            definition_digest: mcp.definition_digest.clone(),
            approval_timeout: server.approval_timeout.clone(),
        })
    }
}

/// The tools of `spec`'s MCP servers that `status` recorded for the same server name and URL,
/// limited to those the server's allow-list names.
pub fn discovered_tools(spec: &AgentSpec, status: Option<&AgentStatus>) -> Vec<McpToolBinding> {
    let Some(status) = status else {
        return vec![];
    };
    let mut tools = vec![];
    for server in &spec.mcp_servers {
        let Some(found) = status
            .mcp_servers
            .iter()
            .find(|s| s.name == server.name && s.url == server.url)
        else {
            continue;
        };
        for tool in found.tools.iter().filter(|t| server.allows(&t.name)) {
            tools.push(McpToolBinding {
                server: server.name.clone(),
                url: server.url.clone(),
                name: tool.name.clone(),
                definition_digest: tool.definition_digest.clone(),
                definition: tool.definition.clone(),
            });
        }
    }
    tools
}

/// Schema for a free-form JSON object that the API server keeps as written.
pub fn any_json_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Like [`any_json_object`], for an optional field.
pub fn any_json_object_opt(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    any_json_object(generator)
}

/// The observed state of an Agent, written by the controller. Secrets the agent references are
/// never copied here.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// The latest observations of the agent's state (e.g. whether its spec is valid), one per
    /// type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// The names of the agent's tools, comma-separated, as the controller last saw them (shown by
    /// `kubectl get agents`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TOOL_NAMES_LENGTH))]
    pub tool_names: Option<String>,
    /// What each MCP server of the spec listed (`tools/list`) at its last discovery: the tools
    /// the Agent allows, a digest per tool definition, when it last answered, and its last error.
    /// The condition `ToolsDiscovered` sums it up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = super::mcp::MAX_MCP_SERVERS))]
    pub mcp_servers: Vec<McpServerStatus>,
}

impl AgentStatus {
    /// The `toolNames` value for a spec: its HTTP tool names, then the MCP tools `status`
    /// recorded, joined with `,`, cut to the schema bound.
    pub fn tool_names_of(spec: &AgentSpec, status: Option<&AgentStatus>) -> String {
        let mcp = discovered_tools(spec, status);
        let mut names = spec
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .chain(mcp.iter().map(|t| t.name.as_str()))
            .collect::<Vec<_>>()
            .join(",");
        if names.len() > MAX_TOOL_NAMES_LENGTH {
            let mut end = MAX_TOOL_NAMES_LENGTH;
            while !names.is_char_boundary(end) {
                end -= 1;
            }
            names.truncate(end);
        }
        names
    }
}

/// The longest `status.toolNames` the API server accepts.
pub const MAX_TOOL_NAMES_LENGTH: usize = 8192;

#[cfg(test)]
mod tests {
    use super::AgentStatus;
    use super::{Agent, AgentSpec};

    #[test]
    fn an_agent_reads_from_yaml_and_cannot_switch_separation_of_duties_off() {
        let yaml = "apiVersion: agentrun.dev/v1alpha1\nkind: Agent\nmetadata: {name: ops}\nspec:\n  instructions: be careful\n  model: {baseUrl: 'http://127.0.0.1:1/v1', name: m, apiKeySecretRef: {name: s, key: k}}\n";
        let agent: Agent = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(agent.spec.model.name.as_deref(), Some("m"));
        // Self-approval is an admin setting of the controller, not the Agent's.
        let with = format!("{yaml}  approvals: {{allowSelfApproval: true}}\n");
        let err = serde_yaml_ng::from_str::<Agent>(&with)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `approvals`"), "{err}");
    }

    #[test]
    fn tool_names_are_joined_and_bounded() {
        use super::ToolSpec;
        let tool = |name: &str| ToolSpec {
            name: name.into(),
            ..Default::default()
        };
        let mut spec = AgentSpec {
            tools: vec![tool("restart"), tool("read")],
            ..Default::default()
        };
        assert_eq!(AgentStatus::tool_names_of(&spec, None), "restart,read");
        spec.tools = (0..200)
            .map(|i| tool(&format!("{i}{}", "x".repeat(60))))
            .collect();
        assert_eq!(
            AgentStatus::tool_names_of(&spec, None).len(),
            super::MAX_TOOL_NAMES_LENGTH
        );
        assert_eq!(AgentStatus::tool_names_of(&AgentSpec::default(), None), "");
    }
}
