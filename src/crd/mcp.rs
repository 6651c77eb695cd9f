//! The MCP side of an Agent: the servers whose tools the model may call (`spec.mcpServers`), what
//! their discovery (`tools/list`) found (`status.mcpServers`), and the tool definitions a run is
//! bound to (its snapshot's `mcpTools`), each with the digest that approvals and the worker check.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::agent::SecretKeyRef;

/// The most MCP servers one Agent may name.
pub const MAX_MCP_SERVERS: usize = 16;

/// An MCP server whose tools the model may call, over the Streamable HTTP transport.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpServerSpec {
    /// The server's name in this Agent (letters, digits, `_` and `-`), used in the status,
    /// conditions and traces.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub name: String,
    /// The Streamable HTTP endpoint of the server, e.g. `http://tools.example:8000/mcp`.
    #[schemars(length(min = 1, max = 2048))]
    pub url: String,
    /// HTTP headers sent with every request to the server (e.g. `Authorization`), their values
    /// read from Secrets of the Agent's namespace. The values are never copied into any status,
    /// Event, log or trace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub headers: Vec<McpHeader>,
    /// The server's tools the model may call: names or globs (`*` any run of characters, `?` one
    /// character), e.g. `["get_*", "echo"]`. Empty: all of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub tools: Vec<String>,
    /// Which calls halt the run for a person's decision: `true` (every call, the default),
    /// `false` (none), or `fromAnnotations` (calls of tools the server annotates
    /// `destructiveHint: true`, or does not annotate `readOnlyHint: true`). Annotations are hints
    /// from the server, not guarantees: an explicit `true` or `false` always wins over them.
    #[serde(default)]
    #[schemars(schema_with = "require_approval_schema")]
    pub require_approval: McpApproval,
    /// How long a call may wait for a decision before it expires and is treated as rejected,
    /// e.g. `30m` or `24h`. Unset: no expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(s|m|h))+$"))]
    pub approval_timeout: Option<String>,
    /// Seconds to wait for the server's answer to one call, the listing that precedes it
    /// included (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub timeout_seconds: Option<u32>,
}

/// One HTTP header of an MCP server, its value from a Secret.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct McpHeader {
    /// The header's name, e.g. `Authorization`.
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
    )]
    pub name: String,
    /// The Secret key holding the header's whole value (e.g. `Bearer abc…`).
    pub secret_key_ref: SecretKeyRef,
}

/// When calls of an MCP server's tools need a person's decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum McpApproval {
    /// Every call (`true`).
    #[default]
    Always,
    /// No call (`false`).
    Never,
    /// As the tool's annotations say (`fromAnnotations`): `destructiveHint: true`, or no
    /// `readOnlyHint: true`, needs approval.
    FromAnnotations,
}

impl McpApproval {
    /// Whether a call of a tool with these annotations needs approval.
    pub fn requires_approval(self, annotations: &ToolHints) -> bool {
        match self {
            McpApproval::Always => true,
            McpApproval::Never => false,
            McpApproval::FromAnnotations => {
                annotations.destructive == Some(true) || annotations.read_only != Some(true)
            }
        }
    }
}

impl Serialize for McpApproval {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            McpApproval::Always => serializer.serialize_bool(true),
            McpApproval::Never => serializer.serialize_bool(false),
            McpApproval::FromAnnotations => serializer.serialize_str("fromAnnotations"),
        }
    }
}

impl<'de> Deserialize<'de> for McpApproval {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = McpApproval;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or \"fromAnnotations\"")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<McpApproval, E> {
                Ok(if v {
                    McpApproval::Always
                } else {
                    McpApproval::Never
                })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<McpApproval, E> {
                match v {
                    "fromAnnotations" => Ok(McpApproval::FromAnnotations),
                    "true" => Ok(McpApproval::Always),
                    "false" => Ok(McpApproval::Never),
                    other => Err(E::invalid_value(serde::de::Unexpected::Str(other), &self)),
                }
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// `requireApproval` is a boolean or the string `fromAnnotations`: a structural schema cannot
/// say "boolean or string", so the node keeps the value as written, and its `enum` holds the three
/// values allowed. (A CEL rule cannot check it: the API server compiles no rules on a node without
/// a type.)
fn require_approval_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
        "enum": [true, false, "fromAnnotations"]
    })
}

/// The behaviour hints of an MCP tool's annotations that agentrun uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ToolHints {
    /// `readOnlyHint`.
    pub read_only: Option<bool>,
    /// `destructiveHint`.
    pub destructive: Option<bool>,
    /// `idempotentHint`.
    pub idempotent: Option<bool>,
}

impl ToolHints {
    /// The hints of a tool definition as listed (`annotations.*Hint`).
    pub fn of(definition: &serde_json::Value) -> ToolHints {
        let hint = |name: &str| {
            definition
                .get("annotations")
                .and_then(|a| a.get(name))
                .and_then(serde_json::Value::as_bool)
        };
        ToolHints {
            read_only: hint("readOnlyHint"),
            destructive: hint("destructiveHint"),
            idempotent: hint("idempotentHint"),
        }
    }
}

/// What the last discovery of one MCP server found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpServerStatus {
    /// The server's name in the Agent's spec.
    #[schemars(length(max = 63))]
    pub name: String,
    /// The URL that was listed.
    #[schemars(length(max = 2048))]
    pub url: String,
    /// The tools the Agent allows, as the last successful listing defined them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub tools: Vec<McpToolStatus>,
    /// When the server last answered `tools/list`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_listed: Option<Time>,
    /// Why the last listing failed, if it did (the tools above are then from an earlier one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub error: Option<String>,
}

/// One tool of an MCP server as listed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpToolStatus {
    /// The tool's name, which the model calls it by.
    #[schemars(length(max = 128))]
    pub name: String,
    /// The SHA-256 (lowercase hex) of the server's name and URL and the tool's definition
    /// (see [`definition_digest`]).
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub definition_digest: String,
    /// The definition as listed (`name`, `title`, `description`, `inputSchema`, `outputSchema`,
    /// `annotations`): what runs started now are bound to.
    #[schemars(schema_with = "crate::crd::agent::any_json_object")]
    pub definition: serde_json::Value,
}

/// An MCP tool a run is bound to: the definition the model was shown, and its digest, which the
/// ApprovalRequest of a call shows and the worker compares with the server's definition just
/// before it calls it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpToolBinding {
    /// The server's name in the Agent's spec.
    #[schemars(length(max = 63))]
    pub server: String,
    /// The server's URL.
    #[schemars(length(max = 2048))]
    pub url: String,
    /// The tool's name.
    #[schemars(length(max = 128))]
    pub name: String,
    /// [`definition_digest`] of the server, URL and definition.
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub definition_digest: String,
    /// The definition as listed when the run started.
    #[schemars(schema_with = "crate::crd::agent::any_json_object")]
    pub definition: serde_json::Value,
}

impl McpToolBinding {
    /// Whether the digest is the one of this server, URL and definition.
    pub fn verified(&self) -> bool {
        definition_digest(&self.server, &self.url, &self.definition) == self.definition_digest
    }

    /// The tool's behaviour hints.
    pub fn hints(&self) -> ToolHints {
        ToolHints::of(&self.definition)
    }
}

/// The fields of a listed tool that make its definition: what the model is shown and how the
/// server says the tool behaves. (`_meta` and `icons` are left out.)
pub const DEFINITION_FIELDS: [&str; 6] = [
    "name",
    "title",
    "description",
    "inputSchema",
    "outputSchema",
    "annotations",
];

/// A listed tool's definition: its [`DEFINITION_FIELDS`] only.
pub fn definition_of(listed: &serde_json::Value) -> serde_json::Value {
    let mut definition = serde_json::Map::new();
    for field in DEFINITION_FIELDS {
        if let Some(value) = listed.get(field).filter(|v| !v.is_null()) {
            definition.insert(field.to_owned(), value.clone());
        }
    }
    serde_json::Value::Object(definition)
}

/// The digest of an MCP tool's definition: the SHA-256 (lowercase hex) of the canonical JSON (keys
/// sorted at every level, no spaces) of `{"definition": …, "server": …, "url": …}`. The same on
/// the controller (discovery), in the run's snapshot, on the ApprovalRequest, and in the worker
/// (the definition the server lists just before the call).
pub fn definition_digest(server: &str, url: &str, definition: &serde_json::Value) -> String {
    use sha2::{Digest, Sha256};
    let value = serde_json::json!({
        "definition": definition_of(definition),
        "server": server,
        "url": url,
    });
    let mut text = String::new();
    write_canonical(&value, &mut text);
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        serde_json::Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Whether `name` matches the glob `pattern` (`*` any run of characters, `?` one character).
pub fn glob_matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

impl McpServerSpec {
    /// Whether the Agent lets the model call the server's tool `name`.
    pub fn allows(&self, name: &str) -> bool {
        self.tools.is_empty() || self.tools.iter().any(|p| glob_matches(p, name))
    }

    /// The tools of a `tools/list` answer of this server that the Agent allows, each with its
    /// definition and digest.
    pub fn bindings(&self, listed: &[serde_json::Value]) -> Vec<McpToolBinding> {
        listed
            .iter()
            .filter_map(|tool| {
                let name = tool.get("name")?.as_str()?;
                self.allows(name).then(|| McpToolBinding {
                    server: self.name.clone(),
                    url: self.url.clone(),
                    name: name.to_owned(),
                    definition_digest: definition_digest(&self.name, &self.url, tool),
                    definition: definition_of(tool),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_matches("get_*", "get_user"));
        assert!(glob_matches("*", ""));
        assert!(glob_matches("a?c", "abc"));
        assert!(glob_matches("*_user*", "delete_user_now"));
        assert!(!glob_matches("get_*", "delete_user"));
        assert!(!glob_matches("a?c", "ac"));
        assert!(glob_matches("echo", "echo"));
        assert!(!glob_matches("echo", "echo2"));
    }

    #[test]
    fn require_approval_reads_booleans_and_from_annotations() {
        let read = |text: &str| serde_json::from_str::<McpApproval>(text);
        assert_eq!(read("true").unwrap(), McpApproval::Always);
        assert_eq!(read("false").unwrap(), McpApproval::Never);
        assert_eq!(
            read("\"fromAnnotations\"").unwrap(),
            McpApproval::FromAnnotations
        );
        assert!(read("\"sometimes\"").is_err());
        assert_eq!(
            serde_json::to_string(&McpApproval::FromAnnotations).unwrap(),
            "\"fromAnnotations\""
        );
        assert_eq!(serde_json::to_string(&McpApproval::Never).unwrap(), "false");
    }

    #[test]
    fn from_annotations_gates_everything_not_declared_read_only() {
        let hints = |v: serde_json::Value| ToolHints::of(&serde_json::json!({"annotations": v}));
        let mode = McpApproval::FromAnnotations;
        assert!(!mode.requires_approval(&hints(serde_json::json!({"readOnlyHint": true}))));
        assert!(mode.requires_approval(&hints(serde_json::json!({}))));
        assert!(mode.requires_approval(&hints(
            serde_json::json!({"readOnlyHint": true, "destructiveHint": true})
        )));
        assert!(mode.requires_approval(&hints(serde_json::json!({"readOnlyHint": false}))));
        // Explicit settings win over the hints.
        let read_only = hints(serde_json::json!({"readOnlyHint": true}));
        assert!(McpApproval::Always.requires_approval(&read_only));
        let destructive = hints(serde_json::json!({"destructiveHint": true}));
        assert!(!McpApproval::Never.requires_approval(&destructive));
    }

    #[test]
    fn the_digest_ignores_key_order_and_meta_but_not_the_definition() {
        let a = serde_json::json!({"name": "t", "description": "d", "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}}, "_meta": {"k": 1}});
        let b = serde_json::json!({"inputSchema": {"properties": {"x": {"type": "string"}}, "type": "object"}, "description": "d", "name": "t"});
        let digest = definition_digest("s", "http://h/mcp", &a);
        assert_eq!(digest, definition_digest("s", "http://h/mcp", &b));
        assert_ne!(digest, definition_digest("s", "http://other/mcp", &a));
        let mut changed = b.clone();
        changed["annotations"] = serde_json::json!({"destructiveHint": true});
        assert_ne!(digest, definition_digest("s", "http://h/mcp", &changed));
        assert_eq!(digest.len(), 64);
    }
}
