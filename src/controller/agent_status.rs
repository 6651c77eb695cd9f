//! The status of `Agent`s, kept by a controller of its own: their tool names (shown by
//! `kubectl get agents`), what their MCP servers list (discovery), and whether their spec is one a
//! worker can run.
//!
//! Discovery (`tools/list` on each MCP server, with the headers its Secrets hold) runs when the
//! spec's servers are new to the status and then every [`Context::rediscover`]; its result is
//! recorded in `status.mcpServers` (the allowed tools, a digest per definition, when the server
//! last answered, its last error) and summed up by the `ToolsDiscovered` condition. Runs started
//! later are bound to the definitions recorded here (their snapshot). The desired status is a
//! pure function of the Agent and what discovery found ([`desired_status`]); [`reconcile`] patches
//! it only when it differs from what the Agent already holds, and a failed write is retried.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use tracing::warn;

use crate::agent::mcp::{McpEndpoint, list_tools};
use crate::crd::agent::discovered_tools;
use crate::crd::keys::field_managers;
use crate::crd::status_patch::StatusPatch;
use crate::crd::{
    Agent, AgentStatus, ConditionStatus, ConditionType, McpServerSpec, McpServerStatus,
    McpToolStatus, Reason, find_condition, new_condition, remove_condition,
};

/// How often MCP servers are listed again when not configured.
pub const DEFAULT_REDISCOVERY: Duration = Duration::from_secs(300);

/// How long a server's listing may take.
const LISTING_TIMEOUT: Duration = Duration::from_secs(15);

/// The longest error message kept in a server's status.
const MAX_ERROR: usize = 1000;

/// What one `tools/list` of one server gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Listing {
    /// The server's name in the spec.
    pub server: String,
    /// The URL listed.
    pub url: String,
    /// The tools as listed, or why the listing failed.
    pub result: Result<Vec<serde_json::Value>, String>,
    /// When.
    pub at: DateTime<Utc>,
}

/// The status the controller wants an Agent to show, given what discovery found now (`listings`;
/// a server not listed now keeps what the status recorded).
pub fn desired_status(agent: &Agent, listings: &[Listing], now: DateTime<Utc>) -> AgentStatus {
    let mut status = agent.status.clone().unwrap_or_default();
    let previous = std::mem::take(&mut status.mcp_servers);
    status.mcp_servers = agent
        .spec
        .mcp_servers
        .iter()
        .map(|server| server_status(server, &previous, listings))
        .collect();
    let at = crate::time::to_k8s(now);
    if agent.spec.mcp_servers.is_empty() {
        remove_condition(
            &mut status.conditions,
            ConditionType::ToolsDiscovered.as_ref(),
        );
    } else {
        let (state, reason, message) = discovery_summary(&status.mcp_servers);
        crate::crd::set_condition(
            &mut status.conditions,
            new_condition(
                ConditionType::ToolsDiscovered,
                state,
                reason,
                &message,
                agent.metadata.generation,
                at.clone(),
            ),
        );
    }
    let bound = discovered_tools(&agent.spec, Some(&status));
    let (condition_status, reason, message) =
        match crate::agent::Agent::from_bound(&agent.name_any(), &agent.spec, &bound) {
            Ok(built) => (
                ConditionStatus::True,
                Reason::Valid,
                format!("{} tool(s); runs can use this agent", built.tools().len()),
            ),
            Err(e) => (ConditionStatus::False, Reason::InvalidSpec, e.to_string()),
        };
    crate::crd::set_condition(
        &mut status.conditions,
        new_condition(
            ConditionType::Ready,
            condition_status,
            reason,
            &message,
            agent.metadata.generation,
            at,
        ),
    );
    status.observed_generation = agent.metadata.generation;
    status.tool_names = Some(AgentStatus::tool_names_of(&agent.spec, Some(&status)));
    status
}

/// The status of `server`: its listing now, else what was recorded for the same name and URL.
fn server_status(
    server: &McpServerSpec,
    previous: &[McpServerStatus],
    listings: &[Listing],
) -> McpServerStatus {
    let mut entry = previous
        .iter()
        .find(|p| p.name == server.name && p.url == server.url)
        .cloned()
        .unwrap_or_else(|| McpServerStatus {
            name: server.name.clone(),
            url: server.url.clone(),
            ..Default::default()
        });
    let Some(listing) = listings
        .iter()
        .find(|l| l.server == server.name && l.url == server.url)
    else {
        return entry;
    };
    match &listing.result {
        Ok(tools) => {
            entry.tools = server
                .bindings(tools)
                .into_iter()
                .map(|b| McpToolStatus {
                    name: b.name,
                    definition_digest: b.definition_digest,
                    definition: b.definition,
                })
                .collect();
            entry.last_listed = Some(crate::time::to_k8s(listing.at));
            entry.error = None;
        }
        Err(error) => {
            entry.error = Some(crate::controller::plan::truncate(error, MAX_ERROR));
        }
    }
    entry
}

fn discovery_summary(servers: &[McpServerStatus]) -> (ConditionStatus, Reason, String) {
    let failed: Vec<String> = servers
        .iter()
        .filter_map(|s| {
            let error = s
                .error
                .as_deref()
                .or(s.last_listed.is_none().then_some("not listed yet"))?;
            let kept = if s.last_listed.is_some() {
                format!(
                    " (runs get the {} tool(s) of its last listing)",
                    s.tools.len()
                )
            } else {
                " (runs get none of its tools)".to_owned()
            };
            Some(format!(
                "MCP server `{}` ({}): {error}{kept}",
                s.name, s.url
            ))
        })
        .collect();
    if failed.is_empty() {
        let listed: Vec<String> = servers
            .iter()
            .map(|s| format!("{} ({} tool(s))", s.name, s.tools.len()))
            .collect();
        (
            ConditionStatus::True,
            Reason::Discovered,
            format!("listed {}", listed.join(", ")),
        )
    } else {
        (
            ConditionStatus::False,
            Reason::DiscoveryFailed,
            failed.join("; "),
        )
    }
}

/// Whether the Agent's status differs from `desired` (transition times aside).
pub fn needs_update(agent: &Agent, desired: &AgentStatus) -> bool {
    let current = agent.status.clone().unwrap_or_default();
    let same = |type_: ConditionType| match (
        find_condition(&current.conditions, type_),
        find_condition(&desired.conditions, type_),
    ) {
        (Some(a), Some(b)) => {
            a.status == b.status
                && a.reason == b.reason
                && a.message == b.message
                && a.observed_generation == b.observed_generation
        }
        (None, None) => true,
        _ => false,
    };
    !same(ConditionType::Ready)
        || !same(ConditionType::ToolsDiscovered)
        || current.observed_generation != desired.observed_generation
        || current.tool_names != desired.tool_names
        || current.mcp_servers != desired.mcp_servers
}

/// An Agent's namespace and name.
type AgentKey = (String, String);

/// What the Agents' status controller shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// How often MCP servers are listed again.
    pub rediscover: Duration,
    http: Option<reqwest::Client>,
    /// When each Agent's servers were last listed (namespace, name) and for which generation.
    listed: Mutex<HashMap<AgentKey, (Option<i64>, Instant)>>,
}

impl Context {
    /// A context listing MCP servers every `rediscover`.
    pub fn new(client: Client, rediscover: Duration) -> Context {
        let http = crate::agent::mcp::client()
            .map_err(|e| warn!(error = %e, "no HTTP client: MCP servers are not listed"))
            .ok();
        Context {
            client,
            rediscover,
            http,
            listed: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `agent`'s servers are due for a listing: never listed for this generation, a
    /// server missing from the status, or the last listing older than [`Self::rediscover`].
    fn due(&self, agent: &Agent) -> bool {
        let key = (agent.namespace().unwrap_or_default(), agent.name_any());
        let listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        let recorded = agent.status.as_ref().map(|s| &s.mcp_servers);
        let all_recorded = agent.spec.mcp_servers.iter().all(|server| {
            recorded.is_some_and(|r| {
                r.iter()
                    .any(|s| s.name == server.name && s.url == server.url)
            })
        });
        match listed.get(&key) {
            Some((generation, at)) => {
                *generation != agent.metadata.generation
                    || !all_recorded
                    || at.elapsed() >= self.rediscover
            }
            None => true,
        }
    }

    fn mark_listed(&self, agent: &Agent) {
        let key = (agent.namespace().unwrap_or_default(), agent.name_any());
        self.listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (agent.metadata.generation, Instant::now()));
    }
}

/// Errors writing an Agent's status.
#[derive(Debug, thiserror::Error)]
pub enum AgentStatusError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Lists the tools of each of `agent`'s MCP servers.
async fn discover(agent: &Agent, ctx: &Context) -> Vec<Listing> {
    let ns = agent.namespace().unwrap_or_default();
    let mut listings = Vec::with_capacity(agent.spec.mcp_servers.len());
    for server in &agent.spec.mcp_servers {
        let result = match (&ctx.http, headers(&ctx.client, &ns, server).await) {
            (None, _) => Err("the controller has no HTTP client".to_owned()),
            (_, Err(e)) => Err(e),
            (Some(http), Ok(headers)) => {
                let endpoint = McpEndpoint {
                    url: &server.url,
                    headers: &headers,
                };
                list_tools(http, &endpoint, LISTING_TIMEOUT)
                    .await
                    .map_err(|e| e.to_string())
            }
        };
        if let Err(error) = &result {
            warn!(agent = %agent.name_any(), server = %server.name, %error, "MCP server not listed");
        }
        listings.push(Listing {
            server: server.name.clone(),
            url: server.url.clone(),
            result,
            at: Utc::now(),
        });
    }
    listings
}

/// The headers of `server`, their values read from the Secrets they name.
async fn headers(
    client: &Client,
    ns: &str,
    server: &McpServerSpec,
) -> Result<Vec<(String, String)>, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let mut headers = vec![];
    for header in &server.headers {
        let r = &header.secret_key_ref;
        let secret = secrets
            .get_opt(&r.name)
            .await
            .map_err(|e| format!("reading Secret {}: {e}", r.name))?
            .ok_or_else(|| format!("Secret {} (header {}) not found", r.name, header.name))?;
        let value = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&r.key))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
            .ok_or_else(|| {
                format!(
                    "Secret {} has no UTF-8 key {} (header {})",
                    r.name, r.key, header.name
                )
            })?;
        headers.push((header.name.clone(), value.trim().to_owned()));
    }
    Ok(headers)
}

/// Lists the Agent's MCP servers when due, then writes its status when it differs from
/// [`desired_status`], guarded by the Agent's resourceVersion (a newer Agent is reconciled again
/// when the watch brings it).
pub async fn reconcile(agent: Arc<Agent>, ctx: Arc<Context>) -> Result<Action, AgentStatusError> {
    let Some(ns) = agent.namespace() else {
        return Ok(Action::await_change());
    };
    let has_servers = !agent.spec.mcp_servers.is_empty();
    let listings = if has_servers && ctx.due(&agent) {
        let listings = discover(&agent, &ctx).await;
        ctx.mark_listed(&agent);
        listings
    } else {
        vec![]
    };
    let desired = desired_status(&agent, &listings, Utc::now());
    let again = if has_servers {
        Action::requeue(ctx.rediscover)
    } else {
        Action::await_change()
    };
    if !needs_update(&agent, &desired) {
        return Ok(again);
    }
    let patch = StatusPatch::guarded(desired, agent.resource_version());
    let params = PatchParams {
        field_manager: Some(field_managers::CONTROLLER.into()),
        ..Default::default()
    };
    let api: Api<Agent> = Api::namespaced(ctx.client.clone(), &ns);
    match api
        .patch_status(&agent.name_any(), &params, &Patch::Merge(&patch))
        .await
    {
        // Changed or deleted since: the watch brings the newer Agent (listed again then).
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
            ctx.listed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&(ns, agent.name_any()));
        }
        other => {
            other?;
        }
    }
    Ok(again)
}

/// Retries a failed status write after a few seconds.
pub fn error_policy(agent: Arc<Agent>, error: &AgentStatusError, _: Arc<Context>) -> Action {
    warn!(agent = %agent.name_any(), %error, "could not write the Agent's status");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::AgentSpec;

    fn agent(yaml: &str) -> Agent {
        let spec: AgentSpec = serde_yaml_ng::from_str(yaml).unwrap();
        let mut agent = Agent::new("ops", spec);
        agent.metadata.namespace = Some("ns".into());
        agent.metadata.generation = Some(3);
        agent
    }

    const VALID: &str = r#"
instructions: Help.
model: {name: m, baseUrl: "http://127.0.0.1:1/v1"}
tools:
  - {name: delete_user, description: d, requiresApproval: true, http: {url: "http://127.0.0.1:2/d"}}
  - {name: lookup, description: l, http: {url: "http://127.0.0.1:2/l"}}
"#;

    const WITH_MCP: &str = r#"
instructions: Help.
model: {name: m, baseUrl: "http://127.0.0.1:1/v1"}
tools:
  - {name: lookup, description: l, http: {url: "http://127.0.0.1:2/l"}}
mcpServers:
  - {name: files, url: "http://127.0.0.1:3/mcp", tools: ["read_*", "delete_file", "lookup"], requireApproval: fromAnnotations}
"#;

    fn listing(tools: serde_json::Value) -> Listing {
        Listing {
            server: "files".into(),
            url: "http://127.0.0.1:3/mcp".into(),
            result: Ok(tools.as_array().unwrap().clone()),
            at: Utc::now(),
        }
    }

    #[test]
    fn a_valid_agent_shows_its_tools_and_is_ready() {
        let mut a = agent(VALID);
        let status = desired_status(&a, &[], Utc::now());
        assert!(needs_update(&a, &status));
        assert_eq!(status.tool_names.as_deref(), Some("delete_user,lookup"));
        assert_eq!(status.observed_generation, Some(3));
        let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
        assert_eq!(ready.reason, "Valid");
        assert!(find_condition(&status.conditions, ConditionType::ToolsDiscovered).is_none());
        a.status = Some(status);
        let again = desired_status(&a, &[], Utc::now());
        assert!(!needs_update(&a, &again), "written once, then left alone");
        a.metadata.generation = Some(4);
        assert!(needs_update(&a, &desired_status(&a, &[], Utc::now())));
    }

    #[test]
    fn an_invalid_agent_says_why() {
        let a = agent(&VALID.replace("lookup, description", "delete_user, description"));
        let status = desired_status(&a, &[], Utc::now());
        let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
        assert_eq!(ready.reason, "InvalidSpec");
        assert!(
            ready.message.contains("duplicate tool name"),
            "{}",
            ready.message
        );
    }

    use crate::crd::mcp::definition_digest;

    #[test]
    fn discovery_records_allowed_tools_with_digests() {
        let mut a = agent(WITH_MCP);
        let tools = serde_json::json!([
            {"name": "read_file", "description": "r", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": true}, "_meta": {"x": 1}},
            {"name": "delete_file", "inputSchema": {"type": "object"}, "annotations": {"destructiveHint": true}},
            {"name": "format_disk", "inputSchema": {"type": "object"}}
        ]);
        let status = desired_status(&a, &[listing(tools.clone())], Utc::now());
        let server = &status.mcp_servers[0];
        let names: Vec<&str> = server.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            ["read_file", "delete_file"],
            "the allow-list applies"
        );
        assert_eq!(
            server.tools[0].definition_digest,
            definition_digest("files", "http://127.0.0.1:3/mcp", &tools[0])
        );
        assert!(server.tools[0].definition.get("_meta").is_none());
        assert!(server.last_listed.is_some() && server.error.is_none());
        assert_eq!(
            status.tool_names.as_deref(),
            Some("lookup,read_file,delete_file")
        );
        let discovered =
            find_condition(&status.conditions, ConditionType::ToolsDiscovered).unwrap();
        assert_eq!(
            (discovered.status.as_str(), discovered.reason.as_str()),
            ("True", "Discovered")
        );
        let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
        assert_eq!(ready.message, "3 tool(s); runs can use this agent");

        // A failed listing keeps the tools of the last one and says so.
        a.status = Some(status);
        let down = Listing {
            result: Err("cannot open an MCP session: connection refused".into()),
            ..listing(serde_json::json!([]))
        };
        let status = desired_status(&a, &[down], Utc::now());
        assert_eq!(status.mcp_servers[0].tools.len(), 2);
        let discovered =
            find_condition(&status.conditions, ConditionType::ToolsDiscovered).unwrap();
        assert_eq!(discovered.reason, "DiscoveryFailed");
        assert!(
            discovered.message.contains("connection refused")
                && discovered.message.contains("files"),
            "{}",
            discovered.message
        );
        // Not listed now: unchanged, nothing to write.
        a.status = Some(status.clone());
        assert!(!needs_update(&a, &desired_status(&a, &[], Utc::now())));
    }

    #[test]
    fn a_name_collision_makes_the_agent_invalid_naming_both() {
        let a = agent(WITH_MCP);
        let tools = serde_json::json!([{"name": "lookup", "inputSchema": {"type": "object"}}]);
        let status = desired_status(&a, &[listing(tools)], Utc::now());
        let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert!(
            ready
                .message
                .contains("tool `lookup` of MCP server `files`")
                && ready.message.contains("HTTP tool `lookup`"),
            "{}",
            ready.message
        );
    }
}
