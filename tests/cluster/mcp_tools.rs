//! MCP tools and traces end to end: the controller (in this process) lists the Agent's MCP server
//! (the official Python SDK's, on loopback), binds each run to the definitions it listed, shows the
//! server URL and definition digest on the ApprovalRequest; real `agentrun worker` processes call
//! the server with the header its Secret holds; alice approves with her own token. The spans of the
//! run (controller and workers) go to a real OpenTelemetry Collector and are read back.

use std::collections::BTreeSet;
use std::time::Duration;

use agentrun::assertion;
use agentrun::controller::SigningConfig;
use agentrun::controller::signing;
use agentrun::crd::{
    Agent, AgentRun, AgentRunPhase, ConditionType, find_condition, mcp::definition_digest,
};
use agentrun::telemetry::{Telemetry, run_span_context};
use agentrun_testkit::cluster::{ControlPlane, Identity, TestNamespace, assert_success};
use agentrun_testkit::mcp_servers::{PythonMcpOptions, PythonMcpServer};
use agentrun_testkit::model_server::{ModelServer, Reply};
use agentrun_testkit::operator::{Operator, start_operator_with, test_config};
use agentrun_testkit::otel_collector::{Collector, ExportedSpan};
use agentrun_testkit::runs::{approvers_role, requests_of, run_yaml, wait_for_phase};
use agentrun_testkit::tool_server::ToolServer;
use agentrun_testkit::wait::eventually;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::Role;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const TOKEN: &str = "Bearer mcp-s3cret";

async fn operator(
    cp: &ControlPlane,
    ns: &TestNamespace,
    worker_env: Vec<(String, String)>,
) -> Operator {
    let mut config = test_config(&ns.name);
    config.mcp_rediscovery = Some(Duration::from_secs(2));
    config.worker.env = worker_env;
    // Approved calls carry the signed approval assertion.
    config.signing = Some(SigningConfig::new(&ns.name));
    let operator = start_operator_with(cp, ns, config).await;
    cp.apply(
        Identity::Admin,
        &approvers_role(&ns.name, &["agentrun:approvers"]),
    );
    operator
}

/// The Secret holding the MCP server's `Authorization` header.
async fn token_secret(cp: &ControlPlane, ns: &str) {
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(cp.client(Identity::Admin).await, ns);
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(json!({
        "metadata": {"name": "files-token"},
        "stringData": {"authorization": TOKEN}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the Secret");
}

fn agent(ns: &str, model: &ModelServer, servers: Value, tools: Value) -> String {
    json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "files", "namespace": ns},
        "spec": {
            "instructions": "Manage files.",
            "model": {"baseUrl": model.base_url(), "name": "test-model", "maxRetries": 0, "timeoutSeconds": 10},
            "tools": tools,
            "mcpServers": servers
        }
    })
    .to_string()
}

fn files_server(server: &PythonMcpServer) -> Value {
    json!({
        "name": "files", "url": server.url(), "requireApproval": "fromAnnotations",
        "headers": [{"name": "Authorization", "secretKeyRef": {"name": "files-token", "key": "authorization"}}]
    })
}

async fn agent_status(cp: &ControlPlane, ns: &str) -> agentrun::crd::AgentStatus {
    let agents: Api<Agent> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    agents
        .get("files")
        .await
        .expect("the Agent")
        .status
        .unwrap_or_default()
}

/// Waits until the Agent's condition `type_` has `reason`; returns its status.
async fn wait_for_condition(
    cp: &ControlPlane,
    ns: &str,
    type_: ConditionType,
    reason: &str,
) -> agentrun::crd::AgentStatus {
    eventually(
        Duration::from_secs(60),
        &format!("Agent condition {type_} with reason {reason}"),
        || async {
            let status = agent_status(cp, ns).await;
            find_condition(&status.conditions, type_)
                .is_some_and(|c| c.reason == reason)
                .then_some(status)
        },
    )
    .await
}

fn approve(cp: &ControlPlane, ns: &str, request: &str) {
    let patch = json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ticket FILES-42 (confidential)"}});
    let out = cp.kubectl(
        Identity::Alice,
        &[
            "patch",
            "apr",
            request,
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            &patch.to_string(),
        ],
    );
    assert_success(&out, "kubectl patch apr");
}

fn trace_id_of(traceparent: &str) -> &str {
    traceparent.split('-').nth(1).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_mcp_call_runs_once_and_the_run_is_one_trace() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("mcp-e2e").await;
    let collector = Collector::start();
    let telemetry = Telemetry::to_endpoint(&collector.endpoint(), "agentrun-controller")
        .expect("the controller's span export");
    let _operator = operator(
        cp,
        &ns,
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), collector.endpoint()),
            ("OTEL_SERVICE_NAME".into(), "agentrun-worker".into()),
        ],
    )
    .await;
    let server = PythonMcpServer::start(&PythonMcpOptions {
        require_header: Some(("Authorization".into(), TOKEN.into())),
        ..Default::default()
    });
    let model = ModelServer::start().await;
    // An HTTP tool beside the MCP server's: it gets the run's trace context too.
    let http_tools = ToolServer::start().await;
    token_secret(cp, &ns.name).await;
    let lookup = json!([{"name": "lookup_user", "description": "Look a user up", "requiresApproval": false,
        "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}},
        "http": {"url": http_tools.url("/lookup_user"), "timeoutSeconds": 10}}]);
    cp.apply(
        Identity::Admin,
        &agent(&ns.name, &model, json!([files_server(&server)]), lookup),
    );
    let status =
        wait_for_condition(cp, &ns.name, ConditionType::ToolsDiscovered, "Discovered").await;
    let listed = &status.mcp_servers[0];
    assert_eq!(listed.url, server.url());
    assert!(listed.last_listed.is_some());
    let tools: BTreeSet<&str> = listed.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tools, BTreeSet::from(["delete_file", "fail", "read_file"]));
    let delete = listed
        .tools
        .iter()
        .find(|t| t.name == "delete_file")
        .unwrap();
    assert_eq!(
        delete.definition_digest,
        definition_digest("files", &server.url(), &delete.definition)
    );
    let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
    assert_eq!(ready.reason, "Valid", "{}", ready.message);

    model
        .push(Reply::tool_calls(&[
            ("call_r", "read_file", json!({"path": "/srv/a"})),
            ("call_u", "lookup_user", json!({"user_id": "u1"})),
            ("call_d", "delete_file", json!({"path": "/srv/a"})),
        ]))
        .push(Reply::text("Read and deleted /srv/a."));
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r1", "files", "Clean /srv/a"),
    );
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    assert_eq!(
        server.executed("read_file"),
        1,
        "read-only: ran without approval"
    );
    assert_eq!(server.executed("delete_file"), 0, "destructive: waits");

    // The request shows the server's URL, the tool and the digest of the definition the run is
    // bound to (its snapshot, from the discovery above).
    let requests = requests_of(cp, &ns.name, "r1").await;
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.spec.tool_name, "delete_file");
    assert_eq!(
        request.spec.tool_endpoint.as_deref(),
        Some(server.url().as_str())
    );
    assert_eq!(
        request.spec.tool_definition_digest.as_deref(),
        Some(delete.definition_digest.as_str())
    );
    let runs: Api<AgentRun> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let run = runs.get("r1").await.unwrap();
    let snapshot = run.status.as_ref().unwrap().agent.clone().unwrap();
    assert_eq!(snapshot.mcp_tools.len(), 3);
    // The worker reads exactly the Secret its Agent names.
    let roles: Api<Role> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let role = roles.get("r1-worker").await.expect("the worker's Role");
    let secret_rules: Vec<_> = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.resources.as_deref() == Some(&["secrets".to_owned()][..]))
        .collect();
    assert_eq!(secret_rules.len(), 1);
    assert_eq!(
        secret_rules[0].resource_names.as_deref(),
        Some(&["files-token".to_owned()][..])
    );

    approve(cp, &ns.name, &request.metadata.name.clone().unwrap());
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(
        done.status.as_ref().unwrap().final_output.as_deref(),
        Some("Read and deleted /srv/a.")
    );
    assert_eq!(server.executed("delete_file"), 1, "exactly once");
    assert_eq!(server.executed("read_file"), 1);

    // What the server received: the Secret's header, the run's trace context and, with the
    // approved call, the signed approval assertion.
    let uid = done.metadata.uid.clone().unwrap();
    let trace_id = run_span_context(&uid).trace_id().to_string();
    let calls = server.call_headers("delete_file");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["authorization"], TOKEN);
    assert_eq!(
        trace_id_of(calls[0]["traceparent"].as_str().unwrap()),
        trace_id
    );
    // The assertion names the server's URL, the approved arguments and the bound definition.
    let token = calls[0]["agentrun-approval"]
        .as_str()
        .expect("the approval assertion");
    let config_maps: Api<ConfigMap> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let jwks = config_maps
        .get(signing::DEFAULT_CONFIG_MAP)
        .await
        .expect("the JWKS ConfigMap")
        .data
        .and_then(|d| d.get(signing::JWKS_KEY).cloned())
        .expect("the JWKS");
    let claims = assertion::verify(
        token,
        &assertion::Jwks::from_json(&jwks).unwrap(),
        &assertion::Expected::new(&server.url(), request.spec.arguments.as_bytes()),
    )
    .expect("a valid assertion for this server and these arguments");
    assert_eq!(claims.tool, "delete_file");
    assert_eq!(claims.tool_call_id, "call_d");
    assert_eq!(claims.approver, "alice@example.com");
    assert_eq!(claims.tool_definition_sha256, delete.definition_digest);
    let read = server.call_headers("read_file");
    assert_eq!(
        trace_id_of(read[0]["traceparent"].as_str().unwrap()),
        trace_id
    );
    assert!(read[0].get("agentrun-approval").is_none());
    for request in model.requests() {
        let traceparent = request
            .header("traceparent")
            .expect("traceparent to the model");
        assert_eq!(trace_id_of(traceparent), trace_id);
    }
    let lookups = http_tools.requests_to("/lookup_user");
    assert_eq!(lookups.len(), 1);
    let http_traceparent = lookups[0]
        .header("traceparent")
        .expect("traceparent to the HTTP tool")
        .to_owned();
    assert_eq!(trace_id_of(&http_traceparent), trace_id);

    // One trace holds the run: the controller's root and approval spans, the workers' steps,
    // model requests and tool calls.
    telemetry.flush();
    let spans = eventually(Duration::from_secs(30), "the run's spans", || async {
        let spans: Vec<ExportedSpan> = collector
            .spans()
            .into_iter()
            .filter(|s| s.trace_id == trace_id)
            .collect();
        let names: BTreeSet<String> = spans.iter().map(|s| s.name.clone()).collect();
        let complete = [
            "agentrun.run r1",
            "agentrun.approval delete_file",
            "execute_tool delete_file",
            "execute_tool read_file",
            "execute_tool lookup_user",
        ]
        .iter()
        .all(|n| names.contains(*n))
            && spans
                .iter()
                .filter(|s| s.name == "invoke_agent files")
                .count()
                == 2;
        complete.then_some(spans)
    })
    .await;
    let named =
        |name: &str| -> Vec<&ExportedSpan> { spans.iter().filter(|s| s.name == name).collect() };
    let root = named("agentrun.run r1")[0];
    assert_eq!(root.parent_span_id, "");
    assert_eq!(root.span_id, run_span_context(&uid).span_id().to_string());
    assert_eq!(root.service, "agentrun-controller");
    assert_eq!(
        root.attr("agentrun.run.phase").as_deref(),
        Some("Succeeded")
    );
    assert_eq!(
        root.attr("gen_ai.conversation.id").as_deref(),
        Some(uid.as_str())
    );

    let steps = named("invoke_agent files");
    assert_eq!(steps.len(), 2, "one per step");
    for step in &steps {
        assert_eq!(step.parent_span_id, root.span_id);
        assert_eq!(step.service, "agentrun-worker");
        assert_eq!(
            step.attr("gen_ai.operation.name").as_deref(),
            Some("invoke_agent")
        );
        assert_eq!(step.attr("gen_ai.agent.name").as_deref(), Some("files"));
    }
    let outcomes: BTreeSet<String> = steps
        .iter()
        .filter_map(|s| s.attr("agentrun.step.outcome"))
        .collect();
    assert_eq!(
        outcomes,
        BTreeSet::from(["awaiting_approval".into(), "completed".into()])
    );

    let chats = named("chat test-model");
    assert_eq!(chats.len(), 2, "one per model request");
    for chat in &chats {
        assert_eq!(chat.attr("gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(
            chat.attr("gen_ai.request.model").as_deref(),
            Some("test-model")
        );
        assert!(chat.attr("gen_ai.usage.input_tokens").is_some());
        assert!(chat.attr("gen_ai.usage.output_tokens").is_some());
        assert!(steps.iter().any(|s| s.span_id == chat.parent_span_id));
    }

    for (tool, call) in [("delete_file", "call_d"), ("read_file", "call_r")] {
        let span = named(&format!("execute_tool {tool}"))[0];
        assert_eq!(
            span.attr("gen_ai.operation.name").as_deref(),
            Some("execute_tool")
        );
        assert_eq!(span.attr("gen_ai.tool.name").as_deref(), Some(tool));
        assert_eq!(span.attr("gen_ai.tool.call.id").as_deref(), Some(call));
        assert_eq!(span.attr("agentrun.tool.kind").as_deref(), Some("mcp"));
        assert_eq!(span.attr("agentrun.mcp.server").as_deref(), Some("files"));
        assert_eq!(span.attr("agentrun.tool.outcome").as_deref(), Some("ok"));
        // The span the MCP server got in traceparent is this one.
        let headers = server.call_headers(tool);
        let sent = headers[0]["traceparent"].as_str().unwrap();
        assert_eq!(sent.split('-').nth(2), Some(span.span_id.as_str()));
    }

    let lookup = named("execute_tool lookup_user")[0];
    assert_eq!(lookup.attr("agentrun.tool.kind").as_deref(), Some("http"));
    assert_eq!(
        lookup.attr("gen_ai.tool.call.id").as_deref(),
        Some("call_u")
    );
    assert_eq!(
        http_traceparent.split('-').nth(2),
        Some(lookup.span_id.as_str())
    );

    let approval = named("agentrun.approval delete_file")[0];
    assert_eq!(approval.parent_span_id, root.span_id);
    assert_eq!(
        approval.attr("agentrun.approval.decision").as_deref(),
        Some("approved")
    );
    assert_eq!(
        approval.attr("agentrun.approval.approver").as_deref(),
        Some("alice@example.com")
    );
    assert_eq!(
        approval.attr("agentrun.approval.approver_kind").as_deref(),
        Some("verified")
    );
    assert_eq!(
        approval.attr("gen_ai.tool.call.id").as_deref(),
        Some("call_d")
    );
    let waited: f64 = approval
        .attr("agentrun.approval.wait_seconds")
        .unwrap()
        .parse()
        .unwrap();
    assert!(waited > 0.0, "{waited}");
    // The decision's reason is never exported.
    for span in &spans {
        for value in span.attributes.values() {
            assert!(!value.to_string().contains("FILES-42"), "{span:?}");
        }
    }
    // The halt (the request's creation) and the decision bound the approval span.
    let halt_to_decision = approval.start_end.1.saturating_sub(approval.start_end.0);
    assert!(halt_to_decision > 0);
    drop(telemetry);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_is_a_condition_and_a_tool_error_and_a_changed_tool_is_superseded() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("mcp-down").await;
    let _operator = operator(cp, &ns, vec![]).await;
    let options = PythonMcpOptions {
        require_header: Some(("Authorization".into(), TOKEN.into())),
        ..Default::default()
    };
    // Two servers: `files` will change its delete_file, `backup` (its read_file) will go down.
    let mut server = PythonMcpServer::start(&options);
    let mut backup = PythonMcpServer::start(&options);
    let model = ModelServer::start().await;
    token_secret(cp, &ns.name).await;
    let mut files = files_server(&server);
    files["tools"] = json!(["delete_file"]);
    let mut second = files_server(&backup);
    second["name"] = json!("backup");
    second["tools"] = json!(["read_file"]);
    cp.apply(
        Identity::Admin,
        &agent(&ns.name, &model, json!([files, second]), json!([])),
    );
    wait_for_condition(cp, &ns.name, ConditionType::ToolsDiscovered, "Discovered").await;

    // Halted on delete_file; then `files` defines it otherwise and `backup` is down: the approval
    // does not make the changed tool run, and the call of the one that is down is a tool error.
    model
        .push(Reply::tool_calls(&[(
            "call_d",
            "delete_file",
            json!({"path": "/srv/b"}),
        )]))
        .push(Reply::tool_calls(&[(
            "call_r",
            "read_file",
            json!({"path": "/srv/b"}),
        )]))
        .push(Reply::text(
            "Nothing was deleted; the backup server is down.",
        ));
    cp.apply(
        Identity::Admin,
        &run_yaml(&ns.name, "r2", "files", "Clean /srv/b"),
    );
    wait_for_phase(cp, &ns.name, "r2", AgentRunPhase::AwaitingApproval).await;
    server.restart(&PythonMcpOptions {
        changed: true,
        ..options
    });
    backup.stop();
    let request = requests_of(cp, &ns.name, "r2").await[0]
        .metadata
        .name
        .clone()
        .unwrap();
    approve(cp, &ns.name, &request);
    let done = wait_for_phase(cp, &ns.name, "r2", AgentRunPhase::Succeeded).await;
    assert_eq!(server.executed("delete_file"), 0, "never sent");
    let status = done.status.clone().unwrap();
    let superseded = status
        .tool_calls
        .iter()
        .find(|r| r.tool_call_id == "call_d")
        .expect("the call's record");
    assert_eq!(superseded.outcome.as_deref(), Some("Superseded"));
    let state = agentrun::state::RunState::from_json(status.run_state.as_deref().unwrap()).unwrap();
    let result = |id: &str| {
        state
            .messages
            .iter()
            .find(|m| m.get("tool_call_id").and_then(|v| v.as_str()) == Some(id))
            .and_then(|m| m.get("content").and_then(|v| v.as_str()).map(str::to_owned))
            .unwrap()
    };
    assert!(
        result("call_d").contains("was not sent"),
        "{}",
        result("call_d")
    );
    assert!(
        result("call_r").starts_with("tool error: MCP server `backup` is unavailable"),
        "{}",
        result("call_r")
    );
    // Discovery says the server is down, and keeps what it listed last; `files` (restarted with
    // the new definition) is listed again.
    let status = eventually(
        Duration::from_secs(60),
        "discovery: `backup` down, `files` listed again",
        || async {
            let status = agent_status(cp, &ns.name).await;
            let condition = find_condition(&status.conditions, ConditionType::ToolsDiscovered)?;
            let files_listed = status.mcp_servers.first().is_some_and(|s| {
                s.error.is_none()
                    && s.tools.first().is_some_and(|t| {
                        t.definition["description"] == "Deletes a file and every backup of it."
                    })
            });
            (condition.reason == "DiscoveryFailed"
                && condition.message.contains("MCP server `backup`")
                && files_listed)
                .then_some(status)
        },
    )
    .await;
    let discovered = find_condition(&status.conditions, ConditionType::ToolsDiscovered).unwrap();
    assert!(
        discovered.message.contains("MCP server `backup`")
            && discovered.message.contains(&backup.url()),
        "{}",
        discovered.message
    );
    let down = &status.mcp_servers[1];
    assert!(down.error.is_some());
    assert_eq!(down.tools.len(), 1, "the last listing is kept");
    // `files` was listed again: its tool has the new definition's digest now (runs started from
    // now on are bound to it).
    let changed = &status.mcp_servers[0].tools[0];
    assert_eq!(changed.name, "delete_file");
    assert_eq!(
        changed.definition["description"],
        "Deletes a file and every backup of it."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_name_collision_makes_the_agent_invalid_and_require_approval_is_checked() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("mcp-names").await;
    let _operator = operator(cp, &ns, vec![]).await;
    let server = PythonMcpServer::start(&PythonMcpOptions::default());
    let model = ModelServer::start().await;
    let http_read_file = json!([{"name": "read_file", "description": "Reads over HTTP",
        "http": {"url": "http://127.0.0.1:9/read"}}]);
    let mut files = json!({"name": "files", "url": server.url(), "tools": ["read_*"]});
    cp.apply(
        Identity::Admin,
        &agent(
            &ns.name,
            &model,
            json!([files.clone()]),
            http_read_file.clone(),
        ),
    );
    let status = wait_for_condition(cp, &ns.name, ConditionType::Ready, "InvalidSpec").await;
    let ready = find_condition(&status.conditions, ConditionType::Ready).unwrap();
    assert!(
        ready
            .message
            .contains("tool `read_file` of MCP server `files`")
            && ready.message.contains("HTTP tool `read_file`"),
        "{}",
        ready.message
    );
    // The API server refuses anything but true, false and fromAnnotations.
    files["requireApproval"] = json!("sometimes");
    let manifest = agent(&ns.name, &model, json!([files]), http_read_file);
    let out = cp.kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&manifest));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("requireApproval")
            && stderr.contains("Unsupported value: \"sometimes\"")
            && stderr.contains("\"fromAnnotations\""),
        "{stderr}"
    );
}
