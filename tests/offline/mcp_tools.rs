//! The agent loop with tools of MCP servers nobody here wrote, on loopback: a server of the
//! official Python SDK (`tests/mcp/tools_server.py`, Streamable HTTP) and the reference
//! `@modelcontextprotocol/server-everything`. A gated destructive tool halts, is approved and runs
//! exactly once; a read-only one runs without approval; `isError` results, a server that is down,
//! a tool whose definition changed and a missing header become tool results, never a crash.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun::agent::{
    Agent, HookError, RunHooks, RunStatus, Runner, ToolCallGate, ToolCallStart, mcp,
};
use agentrun::crd::{AgentSpec, McpToolBinding};
use agentrun::state::Approval;
use agentrun_testkit::mcp_servers::{EverythingServer, PythonMcpOptions, PythonMcpServer};
use agentrun_testkit::model_server::{ModelServer, Reply};
use futures::future::BoxFuture;
use serde_json::{Value as Json, json};

fn spec(model: &ModelServer, server: Json) -> AgentSpec {
    serde_json::from_value(json!({
        "name": "files-agent",
        "instructions": "Manage files.",
        "model": {"baseUrl": model.base_url(), "name": "test-model", "maxRetries": 0, "timeoutSeconds": 10},
        "mcpServers": [server]
    }))
    .expect("agent spec")
}

async fn bind(spec: &AgentSpec, headers: Vec<(String, String)>) -> Vec<McpToolBinding> {
    let client = mcp::client().expect("client");
    mcp::discover(&client, spec, |_| headers.clone(), Duration::from_secs(20))
        .await
        .unwrap_or_else(|(server, e)| panic!("listing {server}: {e}"))
}

/// The text of the tool result for `id` in the state's history.
fn result_of(state: &agentrun::state::RunState, id: &str) -> String {
    state
        .messages
        .iter()
        .find(|m| m.get("tool_call_id").and_then(|v| v.as_str()) == Some(id))
        .and_then(|m| m.get("content").and_then(|v| v.as_str()).map(str::to_owned))
        .unwrap_or_else(|| panic!("no result for {id}"))
}

/// Records what the runner asks before each call and which calls were superseded.
#[derive(Default)]
struct Recorder {
    sent: Mutex<Vec<(String, Option<String>)>>,
    superseded: Mutex<Vec<(String, String)>>,
}

impl RunHooks for Recorder {
    fn before_tool_call<'a>(
        &'a self,
        call: ToolCallStart<'a>,
    ) -> BoxFuture<'a, Result<ToolCallGate, HookError>> {
        let digest = call.definition_digest.map(str::to_owned);
        self.sent
            .lock()
            .unwrap()
            .push((call.tool_name.to_owned(), digest));
        Box::pin(async { Ok(ToolCallGate::Send) })
    }

    fn tool_superseded<'a>(
        &'a self,
        call: ToolCallStart<'a>,
        why: &'a str,
    ) -> BoxFuture<'a, Result<(), HookError>> {
        self.superseded
            .lock()
            .unwrap()
            .push((call.tool_name.to_owned(), why.to_owned()));
        Box::pin(async { Ok(()) })
    }
}

#[tokio::test]
async fn a_gated_destructive_mcp_tool_halts_is_approved_and_runs_exactly_once() {
    let server = PythonMcpServer::start(&PythonMcpOptions::default());
    let model = ModelServer::start().await;
    let spec = spec(
        &model,
        json!({"name": "files", "url": server.url(), "requireApproval": "fromAnnotations", "tools": ["*_file"]}),
    );
    let bound = bind(&spec, vec![]).await;
    let names: Vec<&str> = bound.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        names,
        ["delete_file", "read_file"],
        "the allow-list applies"
    );
    let agent = Agent::from_bound("files-agent", &spec, &bound).expect("agent");
    assert!(agent.tool("delete_file").unwrap().requires_approval());
    assert!(!agent.tool("read_file").unwrap().requires_approval());
    assert!(agent.tool("read_file").unwrap().idempotent());
    assert!(!agent.tool("delete_file").unwrap().idempotent());

    model
        .push(Reply::tool_calls(&[
            ("call_r", "read_file", json!({"path": "/etc/motd"})),
            ("call_d", "delete_file", json!({"path": "/tmp/x"})),
        ]))
        .push(Reply::text("Read it and deleted it."));
    let hooks = Arc::new(Recorder::default());
    let runner = Runner::new().unwrap().with_hooks(hooks.clone());
    let outcome = runner.run(&agent, "clean up").await.expect("first step");
    assert_eq!(outcome.status, RunStatus::AwaitingApproval);
    assert_eq!(server.executed("read_file"), 1, "read-only: no approval");
    assert_eq!(server.executed("delete_file"), 0, "gated: halted");
    assert!(result_of(&outcome.state, "call_r").contains("contents of /etc/motd"));
    // The model was shown the server's definitions under their MCP names.
    let first: Json = serde_json::from_str(&model.requests()[0].body).unwrap();
    let offered: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(offered, ["delete_file", "read_file"]);
    assert_eq!(
        first["tools"][0]["function"]["description"],
        "Deletes a file for good."
    );

    let mut state = outcome.state;
    state.approve("call_d", Approval::new()).expect("approve");
    let outcome = runner.resume(&agent, state).await.expect("resume");
    assert_eq!(outcome.status, RunStatus::Completed);
    assert_eq!(server.executed("delete_file"), 1, "exactly once");
    assert_eq!(server.executed("read_file"), 1, "not sent again");
    assert_eq!(result_of(&outcome.state, "call_d"), "deleted /tmp/x");
    // The hook saw the digest of the definition the server listed just before the call: the
    // one the run is bound to.
    let sent = hooks.sent.lock().unwrap().clone();
    let bound_digest = bound[0].definition_digest.clone();
    assert!(sent.contains(&("delete_file".to_owned(), Some(bound_digest))));
}

#[tokio::test]
async fn a_tool_whose_definition_changed_after_the_halt_is_superseded_never_sent() {
    let mut server = PythonMcpServer::start(&PythonMcpOptions::default());
    let model = ModelServer::start().await;
    let spec = spec(
        &model,
        json!({"name": "files", "url": server.url(), "requireApproval": true}),
    );
    let bound = bind(&spec, vec![]).await;
    let agent = Agent::from_bound("files-agent", &spec, &bound).expect("agent");
    model
        .push(Reply::tool_calls(&[(
            "call_d",
            "delete_file",
            json!({"path": "/tmp/x"}),
        )]))
        .push(Reply::text("It was not deleted."));
    let hooks = Arc::new(Recorder::default());
    let runner = Runner::new().unwrap().with_hooks(hooks.clone());
    let mut state = runner.run(&agent, "clean up").await.expect("halt").state;
    // Between the halt and the execution the server starts defining the tool otherwise.
    server.restart(&PythonMcpOptions {
        changed: true,
        ..Default::default()
    });
    state.approve("call_d", Approval::new()).expect("approve");
    let outcome = runner.resume(&agent, state).await.expect("resume");
    assert_eq!(outcome.status, RunStatus::Completed);
    assert_eq!(server.executed("delete_file"), 0, "never sent");
    let result = result_of(&outcome.state, "call_d");
    assert!(
        result.contains("was not sent") && result.contains("changed the definition"),
        "{result}"
    );
    let superseded = hooks.superseded.lock().unwrap().clone();
    assert_eq!(superseded.len(), 1);
    assert!(
        superseded[0].1.contains(&bound[0].definition_digest),
        "{superseded:?}"
    );
    assert!(
        hooks.sent.lock().unwrap().is_empty(),
        "the send hook was never asked"
    );
}

#[tokio::test]
async fn an_is_error_result_is_a_tool_error_the_model_reads() {
    let server = PythonMcpServer::start(&PythonMcpOptions::default());
    let model = ModelServer::start().await;
    let spec = spec(
        &model,
        json!({"name": "files", "url": server.url(), "requireApproval": false}),
    );
    let bound = bind(&spec, vec![]).await;
    let agent = Agent::from_bound("files-agent", &spec, &bound).expect("agent");
    model
        .push(Reply::tool_calls(&[(
            "call_f",
            "fail",
            json!({"reason": "disk full"}),
        )]))
        .push(Reply::text("The disk is full."));
    let outcome = Runner::new().unwrap().run(&agent, "go").await.unwrap();
    assert_eq!(outcome.status, RunStatus::Completed);
    let failed = result_of(&outcome.state, "call_f");
    assert!(
        failed.starts_with("tool error:") && failed.contains("disk full"),
        "{failed}"
    );
    assert_eq!(server.executed("fail"), 1);
    // The model got it as the call's result.
    assert!(model.requests()[1].body.contains("disk full"));
}

#[tokio::test]
async fn a_server_that_is_down_gives_a_tool_error_not_a_crash() {
    let mut server = PythonMcpServer::start(&PythonMcpOptions::default());
    let model = ModelServer::start().await;
    let spec = spec(
        &model,
        json!({"name": "files", "url": server.url(), "requireApproval": false, "timeoutSeconds": 5}),
    );
    let bound = bind(&spec, vec![]).await;
    let agent = Agent::from_bound("files-agent", &spec, &bound).expect("agent");
    server.stop();
    model
        .push(Reply::tool_calls(&[(
            "call_r",
            "read_file",
            json!({"path": "/a"}),
        )]))
        .push(Reply::text("The file server is down."));
    let outcome = Runner::new()
        .unwrap()
        .run(&agent, "read /a")
        .await
        .expect("the run goes on");
    assert_eq!(outcome.status, RunStatus::Completed);
    let result = result_of(&outcome.state, "call_r");
    assert!(
        result.starts_with("tool error: MCP server `files` is unavailable"),
        "{result}"
    );
}

#[tokio::test]
async fn headers_from_secrets_reach_the_server_and_are_required_by_it() {
    let token = ("Authorization".to_owned(), "Bearer s3cret".to_owned());
    let server = PythonMcpServer::start(&PythonMcpOptions {
        require_header: Some(token.clone()),
        ..Default::default()
    });
    let model = ModelServer::start().await;
    let spec = spec(
        &model,
        json!({"name": "files", "url": server.url(), "requireApproval": false}),
    );
    let client = mcp::client().unwrap();
    let refused = mcp::discover(&client, &spec, |_| vec![], Duration::from_secs(10)).await;
    assert!(refused.is_err(), "listing without the header is refused");
    let bound = bind(&spec, vec![token.clone()]).await;
    let agent = Agent::from_bound("files-agent", &spec, &bound)
        .expect("agent")
        .with_mcp_headers("files", std::slice::from_ref(&token));
    model
        .push(Reply::tool_calls(&[(
            "call_r",
            "read_file",
            json!({"path": "/a"}),
        )]))
        .push(Reply::text("done"));
    let outcome = Runner::new().unwrap().run(&agent, "read").await.unwrap();
    assert_eq!(result_of(&outcome.state, "call_r"), "contents of /a: hello");
    let headers = server.call_headers("read_file");
    assert_eq!(headers.len(), 1);
    assert_eq!(headers[0]["authorization"], "Bearer s3cret");
}

#[tokio::test]
async fn the_reference_server_everything_gated_and_read_only_tools() {
    let everything = EverythingServer::start();
    let model = ModelServer::start().await;
    let spec: AgentSpec = serde_json::from_value(json!({
        "name": "everything-agent",
        "model": {"baseUrl": model.base_url(), "name": "test-model", "maxRetries": 0},
        "mcpServers": [
            {"name": "math", "url": everything.url(), "tools": ["get-sum"], "requireApproval": true},
            {"name": "say", "url": everything.url(), "tools": ["echo"], "requireApproval": "fromAnnotations"}
        ]
    }))
    .unwrap();
    let bound = bind(&spec, vec![]).await;
    let names: Vec<(&str, &str)> = bound
        .iter()
        .map(|b| (b.server.as_str(), b.name.as_str()))
        .collect();
    assert_eq!(names, [("math", "get-sum"), ("say", "echo")]);
    let agent = Agent::from_bound("everything-agent", &spec, &bound).expect("agent");
    assert!(
        agent.tool("get-sum").unwrap().requires_approval(),
        "explicit true wins over readOnlyHint"
    );
    assert!(
        !agent.tool("echo").unwrap().requires_approval(),
        "readOnlyHint: true"
    );
    model
        .push(Reply::tool_calls(&[
            ("call_e", "echo", json!({"message": "hi"})),
            ("call_s", "get-sum", json!({"a": 2, "b": 3})),
        ]))
        .push(Reply::text("2 + 3 = 5"));
    let runner = Runner::new().unwrap();
    let outcome = runner.run(&agent, "add").await.unwrap();
    assert_eq!(outcome.status, RunStatus::AwaitingApproval);
    assert!(result_of(&outcome.state, "call_e").contains("hi"));
    let mut state = outcome.state;
    state.approve("call_s", Approval::new()).unwrap();
    let outcome = runner.resume(&agent, state).await.unwrap();
    assert_eq!(outcome.status, RunStatus::Completed);
    let sum = result_of(&outcome.state, "call_s");
    assert!(sum.contains('5'), "{sum}");
}

#[tokio::test]
async fn a_call_that_outlives_its_timeout_is_a_tool_error_and_the_run_goes_on() {
    let server = PythonMcpServer::start(&PythonMcpOptions {
        slow_read_seconds: 20,
        ..Default::default()
    });
    let model = ModelServer::start().await;
    let spec = spec(
        &model,
        json!({"name": "files", "url": server.url(), "requireApproval": false, "timeoutSeconds": 2}),
    );
    let bound = bind(&spec, vec![]).await;
    let agent = Agent::from_bound("files-agent", &spec, &bound).expect("agent");
    model
        .push(Reply::tool_calls(&[(
            "call_r",
            "read_file",
            json!({"path": "/a"}),
        )]))
        .push(Reply::text("The file server is too slow."));
    let started = std::time::Instant::now();
    let outcome = Runner::new()
        .unwrap()
        .run(&agent, "read /a")
        .await
        .expect("the run goes on");
    let took = started.elapsed();
    assert_eq!(outcome.status, RunStatus::Completed);
    assert!(took < Duration::from_secs(15), "{took:?}");
    let result = result_of(&outcome.state, "call_r");
    assert_eq!(
        result,
        "tool error: no response from `read_file` (MCP server `files`) within 2 seconds"
    );
    assert_eq!(server.executed("read_file"), 1, "sent once, not retried");
}

/// Answers as the worker's gate does for calls an earlier, stopped worker had already recorded as
/// started: re-send only what is idempotent, otherwise tell the model the outcome is unknown.
struct AfterACrash;

impl RunHooks for AfterACrash {
    fn before_tool_call<'a>(
        &'a self,
        call: ToolCallStart<'a>,
    ) -> BoxFuture<'a, Result<ToolCallGate, HookError>> {
        let gate = if call.idempotent {
            ToolCallGate::Send
        } else {
            ToolCallGate::Skip {
                result: "The outcome of this tool call is unknown".into(),
            }
        };
        Box::pin(async move { Ok(gate) })
    }
}

#[tokio::test]
async fn after_a_crash_only_calls_of_tools_annotated_idempotent_are_sent_again() {
    let server = PythonMcpServer::start(&PythonMcpOptions::default());
    let model = ModelServer::start().await;
    let spec = spec(
        &model,
        json!({"name": "files", "url": server.url(), "requireApproval": false}),
    );
    let bound = bind(&spec, vec![]).await;
    let agent = Agent::from_bound("files-agent", &spec, &bound).expect("agent");
    model
        .push(Reply::tool_calls(&[
            ("call_r", "read_file", json!({"path": "/a"})),
            ("call_d", "delete_file", json!({"path": "/a"})),
            ("call_f", "fail", json!({"reason": "x"})),
        ]))
        .push(Reply::text("done"));
    let outcome = Runner::new()
        .unwrap()
        .with_hooks(Arc::new(AfterACrash))
        .run(&agent, "go")
        .await
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed);
    // read_file is annotated idempotentHint: true; delete_file and fail are not (MCP has no
    // idempotency key, so nothing else is sent twice).
    assert_eq!(server.executed("read_file"), 1);
    assert_eq!(server.executed("delete_file"), 0);
    assert_eq!(server.executed("fail"), 0);
    assert!(result_of(&outcome.state, "call_d").contains("unknown"));
}
