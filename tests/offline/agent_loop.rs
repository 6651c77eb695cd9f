//! The agent loop against a real OpenAI-compatible HTTP model server and real HTTP tools, both
//! on loopback: halting for approval, deciding, resuming, and the failure paths.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentrun::agent::{
    Agent, AgentError, ApiKey, HookError, ModelError, RetryPolicy, RunError, RunHooks, RunOutcome,
    RunStatus, Runner, RunnerConfig, ToolCallGate, ToolCallStart,
};
use agentrun::crd::AgentSpec;
use agentrun::state::{Approval, DEFAULT_REJECTION_MESSAGE, Rejection, RunState};
use agentrun_testkit::model_server::{ModelServer, Reply};
use agentrun_testkit::tool_server::{ToolReply, ToolServer};
use futures::future::BoxFuture;
use serde_json::{Value as Json, json};

const INSTRUCTIONS: &str = "You are ops-agent. Only delete users when asked.";
const API_KEY: &str = "sk-test-secret-key-123";
const APPROVER: &str = "alice-approver@example.com";
const REASON: &str = "authorized per change CR-1234 (audit only)";
const REJECT_APPROVER: &str = "bob-reviewer@example.com";
const REJECT_REASON: &str = "policy violation: tier-0 write (audit only)";
const REJECT_MESSAGE: &str = "Not authorized for this resource";

fn runner() -> Runner {
    Runner::with_config(RunnerConfig {
        retry: RetryPolicy {
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
            max_retry_after: Duration::from_millis(200),
        },
    })
    .expect("runner")
}

fn user_schema() -> Json {
    json!({
        "type": "object",
        "properties": {"user_id": {"type": "string", "pattern": "^u-[0-9]+$"}},
        "required": ["user_id"],
        "additionalProperties": false
    })
}

/// The spec of an agent on the test model server with `delete_user` (needs approval) and
/// `lookup_user` (does not) on the test tool server.
fn spec(model: &ModelServer, tools: &ToolServer) -> Json {
    json!({
        "name": "ops-agent",
        "instructions": INSTRUCTIONS,
        "model": {"baseUrl": model.base_url(), "name": "test-model", "maxRetries": 2, "timeoutSeconds": 5},
        "tools": [
            {
                "name": "delete_user",
                "description": "Delete a user account.",
                "parameters": user_schema(),
                "requiresApproval": true,
                "http": {"url": tools.url("delete_user"), "timeoutSeconds": 5}
            },
            {
                "name": "lookup_user",
                "description": "Look a user up.",
                "parameters": user_schema(),
                "http": {"url": tools.url("lookup_user"), "timeoutSeconds": 5}
            }
        ]
    })
}

fn agent_from(spec: Json) -> Agent {
    let spec: AgentSpec = serde_json::from_value(spec).expect("agent spec");
    Agent::from_spec(&spec)
        .expect("valid agent")
        .with_api_key(ApiKey::new(API_KEY))
}

fn agent_error(spec: Json) -> AgentError {
    let spec: AgentSpec = serde_json::from_value(spec).expect("agent spec shape");
    Agent::from_spec(&spec).expect_err("the spec must be refused")
}

/// The state as it would come back from a database: serialized and loaded again.
fn roundtrip(state: &RunState) -> RunState {
    let json = state.to_json();
    let loaded = RunState::from_json(&json).expect("state loads");
    assert_eq!(&loaded, state, "the state survives to_json/from_json");
    loaded
}

fn halted(outcome: RunOutcome) -> RunState {
    assert_eq!(
        outcome.status,
        RunStatus::AwaitingApproval,
        "the run must halt"
    );
    assert!(outcome.is_halted());
    assert_eq!(outcome.final_output(), None);
    outcome.state
}

/// The content of the tool-result message for `tool_call_id` in a chat request's messages.
fn tool_result(messages: &[Json], tool_call_id: &str) -> Option<String> {
    messages
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == tool_call_id)
        .and_then(|m| m["content"].as_str())
        .map(str::to_owned)
}

/// Audit fields never reach the model (nor the tools).
fn assert_never_sent(model: &ModelServer, tools: &ToolServer, secrets: &[&str]) {
    for (i, request) in model.requests().iter().enumerate() {
        for secret in secrets {
            assert!(
                !request.body.contains(secret),
                "model request {i} contains `{secret}`: {}",
                request.body
            );
            assert!(
                request.headers.iter().all(|(_, v)| !v.contains(secret)),
                "model request {i} has `{secret}` in a header"
            );
        }
    }
    for request in tools.requests() {
        for secret in secrets {
            assert!(
                !request.body.contains(secret),
                "tool request contains `{secret}`"
            );
        }
    }
}

#[tokio::test]
async fn halt_approve_resume_runs_the_tool_once_with_the_idempotency_key() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    tools.set_reply("delete_user", ToolReply::Json(json!({"deleted": "u-1"})));
    model
        .push(Reply::tool_calls(&[(
            "call_1",
            "delete_user",
            json!({"user_id": "u-1"}),
        )]))
        .push(Reply::text("User u-1 deleted."));
    let agent = agent_from(spec(&model, &tools));
    let runner = runner();

    let state = halted(
        runner
            .run(&agent, "Delete user u-1")
            .await
            .expect("first run"),
    );
    assert_eq!(state.agent_name, "ops-agent");
    assert_eq!(state.input, "Delete user u-1");
    assert!(state.run_id.starts_with("run-"));
    let pending = state.pending_approvals();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].tool_call_id, "call_1");
    assert_eq!(pending[0].tool_name, "delete_user");
    assert_eq!(
        Json::try_from(&pending[0].args).expect("args"),
        json!({"user_id": "u-1"})
    );
    assert!(tools.requests().is_empty(), "nothing runs before approval");
    assert_eq!(model.request_count(), 1);
    assert_eq!(state.current_turn, 1);

    // Later: load, approve with an audit trail, resume.
    let mut state = roundtrip(&state);
    state
        .approve(
            "call_1",
            Approval::new().approver_id(APPROVER).reason(REASON),
        )
        .expect("approve");
    let state = roundtrip(&state);
    let outcome = runner.resume(&agent, state).await.expect("resume");
    assert_eq!(outcome.status, RunStatus::Completed);
    assert_eq!(outcome.final_output(), Some("User u-1 deleted."));
    let state = roundtrip(&outcome.state);
    assert!(state.deferred_tool_requests.approvals.is_empty());
    assert_eq!(
        state.approval_metadata["call_1"].approver_id.as_deref(),
        Some(APPROVER)
    );
    assert_eq!(state.current_turn, 2);
    assert_eq!(state.usage.requests, 2);
    assert_eq!(state.usage.input_tokens, 22);
    assert_eq!(state.usage.output_tokens, 14);

    // The tool ran exactly once, keyed by the run and the tool call id, with the JSON arguments.
    let calls = tools.requests_to("delete_user");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].method, "POST");
    let key = agentrun::agent::tool::idempotency_key(&state.run_id, "call_1");
    assert_eq!(calls[0].idempotency_key(), Some(key.as_str()));
    assert_eq!(calls[0].header("content-type"), Some("application/json"));
    assert_eq!(calls[0].json(), json!({"user_id": "u-1"}));
    assert_eq!(tools.calls_of("call_1"), 1);

    // The model got the instructions first, the tools, the key, and the tool's result.
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        assert_eq!(request.path, "/v1/chat/completions");
        assert_eq!(
            request.header("authorization"),
            Some(format!("Bearer {API_KEY}").as_str())
        );
        let body = request.json();
        assert_eq!(body["model"], "test-model");
        assert_eq!(
            body["messages"][0],
            json!({"role": "system", "content": INSTRUCTIONS})
        );
        assert_eq!(
            body["messages"][1],
            json!({"role": "user", "content": "Delete user u-1"})
        );
        assert_eq!(body["tools"][0]["type"], "function");
        assert_eq!(body["tools"][0]["function"]["name"], "delete_user");
        assert_eq!(body["tools"][0]["function"]["parameters"], user_schema());
    }
    let second = requests[1].messages();
    assert_eq!(second.len(), 4, "system, user, assistant, tool: {second:?}");
    assert_eq!(second[2]["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        tool_result(&second, "call_1").as_deref(),
        Some(r#"{"deleted":"u-1"}"#)
    );
    // The system message is sent, not stored.
    assert!(
        state
            .messages
            .iter()
            .all(|m| m.get("role").and_then(|r| r.as_str()) != Some("system"))
    );
    assert_never_sent(&model, &tools, &[APPROVER, REASON]);

    // Resuming a completed state again changes nothing and calls nothing.
    let again = runner
        .resume(&agent, state)
        .await
        .expect("resume completed");
    assert_eq!(again.final_output(), Some("User u-1 deleted."));
    assert_eq!(model.request_count(), 2);
    assert_eq!(tools.calls_of("call_1"), 1);
}

#[tokio::test]
async fn a_rejection_message_reaches_the_model_and_the_audit_fields_never_do() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::tool_calls(&[(
            "call_9",
            "delete_user",
            json!({"user_id": "u-9"}),
        )]))
        .push(Reply::text("I could not delete u-9."));
    let agent = agent_from(spec(&model, &tools));
    let runner = runner();

    let mut state = roundtrip(&halted(
        runner.run(&agent, "Delete u-9").await.expect("run"),
    ));
    state
        .reject(
            "call_9",
            Rejection::new()
                .message(REJECT_MESSAGE)
                .approver_id(REJECT_APPROVER)
                .reason(REJECT_REASON),
        )
        .expect("reject");
    let outcome = runner
        .resume(&agent, roundtrip(&state))
        .await
        .expect("resume");
    assert_eq!(outcome.final_output(), Some("I could not delete u-9."));
    assert!(tools.requests().is_empty(), "a rejected call is never sent");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        tool_result(&requests[1].messages(), "call_9").as_deref(),
        Some(REJECT_MESSAGE)
    );
    assert_never_sent(&model, &tools, &[REJECT_APPROVER, REJECT_REASON]);
    let audit = &outcome.state.approval_metadata["call_9"];
    assert_eq!(audit.reason.as_deref(), Some(REJECT_REASON));
}

#[tokio::test]
async fn a_rejection_without_message_gives_the_default_text() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::tool_calls(&[(
            "call_1",
            "delete_user",
            json!({"user_id": "u-1"}),
        )]))
        .push(Reply::text("Not deleted."));
    let agent = agent_from(spec(&model, &tools));
    let runner = runner();

    let mut state = halted(runner.run(&agent, "Delete u-1").await.expect("run"));
    state
        .reject(
            "call_1",
            Rejection::new()
                .approver_id(REJECT_APPROVER)
                .reason(REJECT_REASON),
        )
        .expect("reject");
    let outcome = runner
        .resume(&agent, roundtrip(&state))
        .await
        .expect("resume");
    assert_eq!(outcome.status, RunStatus::Completed);
    assert_eq!(
        tool_result(&model.requests()[1].messages(), "call_1").as_deref(),
        Some(DEFAULT_REJECTION_MESSAGE)
    );
    assert!(tools.requests().is_empty());
    assert_never_sent(&model, &tools, &[REJECT_APPROVER, REJECT_REASON]);
}

#[tokio::test]
async fn two_deferred_calls_in_one_halt_one_approved_one_rejected() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::tool_calls(&[
            ("call_a", "delete_user", json!({"user_id": "u-1"})),
            ("call_b", "delete_user", json!({"user_id": "u-2"})),
        ]))
        .push(Reply::text("Deleted u-1; u-2 was refused."));
    let agent = agent_from(spec(&model, &tools));
    let runner = runner();

    let mut state = halted(runner.run(&agent, "Delete u-1 and u-2").await.expect("run"));
    let ids: Vec<&str> = state
        .pending_approvals()
        .iter()
        .map(|c| c.tool_call_id.as_str())
        .collect();
    assert_eq!(ids, ["call_a", "call_b"]);
    state
        .approve(
            "call_a",
            Approval::new().approver_id(APPROVER).reason(REASON),
        )
        .expect("approve a");

    // Resuming with one call still undecided halts again at once, without sending anything.
    let still = halted(
        runner
            .resume(&agent, roundtrip(&state))
            .await
            .expect("partial"),
    );
    let pending: Vec<&str> = still
        .pending_approvals()
        .iter()
        .map(|c| c.tool_call_id.as_str())
        .collect();
    assert_eq!(pending, ["call_b"]);
    assert_eq!(
        model.request_count(),
        1,
        "no model call while a decision is missing"
    );
    assert_eq!(tools.calls_of("call_a"), 1, "the approved call ran");

    let mut state = roundtrip(&still);
    state
        .reject(
            "call_b",
            Rejection::new()
                .message(REJECT_MESSAGE)
                .approver_id(REJECT_APPROVER)
                .reason(REJECT_REASON),
        )
        .expect("reject b");
    let outcome = runner
        .resume(&agent, roundtrip(&state))
        .await
        .expect("resume");
    assert_eq!(
        outcome.final_output(),
        Some("Deleted u-1; u-2 was refused.")
    );
    assert_eq!(tools.calls_of("call_a"), 1, "call_a ran once in total");
    assert_eq!(tools.calls_of("call_b"), 0);
    let messages = model.requests()[1].messages();
    assert!(tool_result(&messages, "call_a").is_some_and(|r| r.contains("\"ok\":true")));
    assert_eq!(
        tool_result(&messages, "call_b").as_deref(),
        Some(REJECT_MESSAGE)
    );
    assert_never_sent(
        &model,
        &tools,
        &[APPROVER, REASON, REJECT_APPROVER, REJECT_REASON],
    );
}

#[tokio::test]
async fn two_halts_in_sequence() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::tool_calls(&[(
            "call_1",
            "delete_user",
            json!({"user_id": "u-1"}),
        )]))
        .push(Reply::tool_calls(&[(
            "call_2",
            "delete_user",
            json!({"user_id": "u-2"}),
        )]))
        .push(Reply::text("Both deleted."));
    let agent = agent_from(spec(&model, &tools));
    let runner = runner();

    let mut state = halted(
        runner
            .run(&agent, "Delete u-1, then u-2")
            .await
            .expect("run"),
    );
    state
        .approve("call_1", Approval::new().approver_id(APPROVER))
        .expect("approve 1");
    let mut state = halted(
        runner
            .resume(&agent, roundtrip(&state))
            .await
            .expect("resume 1"),
    );
    let pending = state.pending_approvals();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].tool_call_id, "call_2");
    assert_eq!(tools.calls_of("call_1"), 1);
    assert_eq!(tools.calls_of("call_2"), 0);

    state
        .approve("call_2", Approval::new().reason(REASON))
        .expect("approve 2");
    let outcome = runner
        .resume(&agent, roundtrip(&state))
        .await
        .expect("resume 2");
    assert_eq!(outcome.final_output(), Some("Both deleted."));
    assert_eq!(tools.calls_of("call_1"), 1);
    assert_eq!(tools.calls_of("call_2"), 1);
    assert_eq!(outcome.state.current_turn, 3);
    assert_eq!(outcome.state.usage.requests, 3);
    assert_eq!(outcome.state.approval_metadata.len(), 2);
    assert_never_sent(&model, &tools, &[APPROVER, REASON]);
}

#[tokio::test]
async fn a_tool_without_approval_runs_immediately_also_next_to_a_deferred_call() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    tools.set_reply(
        "lookup_user",
        ToolReply::Json(json!({"user_id": "u-1", "name": "Ada"})),
    );
    model
        .push(Reply::tool_calls(&[(
            "call_l",
            "lookup_user",
            json!({"user_id": "u-1"}),
        )]))
        .push(Reply::tool_calls(&[
            ("call_d", "delete_user", json!({"user_id": "u-1"})),
            ("call_l2", "lookup_user", json!({"user_id": "u-2"})),
        ]))
        .push(Reply::text("Done."));
    let agent = agent_from(spec(&model, &tools));
    let runner = runner();

    // Turn 1: the lookup runs at once; turn 2: the lookup runs, the delete waits.
    let mut state = halted(
        runner
            .run(&agent, "Look up and delete u-1")
            .await
            .expect("run"),
    );
    assert_eq!(tools.calls_of("call_l"), 1);
    assert_eq!(tools.calls_of("call_l2"), 1, "runs before the halt");
    assert_eq!(tools.calls_of("call_d"), 0);
    assert_eq!(
        tool_result(&model.requests()[1].messages(), "call_l").as_deref(),
        Some(r#"{"user_id":"u-1","name":"Ada"}"#)
    );
    assert_eq!(state.pending_approvals().len(), 1);

    state.approve("call_d", Approval::new()).expect("approve");
    let outcome = runner
        .resume(&agent, roundtrip(&state))
        .await
        .expect("resume");
    assert_eq!(outcome.final_output(), Some("Done."));
    assert_eq!(tools.calls_of("call_l2"), 1, "not sent again on resume");
    assert_eq!(tools.calls_of("call_d"), 1);
    let messages = model.requests()[2].messages();
    assert!(tool_result(&messages, "call_d").is_some());
    assert!(tool_result(&messages, "call_l2").is_some());
}

#[tokio::test]
async fn invalid_arguments_and_unknown_tools_never_reach_a_tool() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::message(json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [
                {"id": "c_type", "type": "function",
                 "function": {"name": "delete_user", "arguments": "{\"user_id\": 5}"}},
                {"id": "c_extra", "type": "function",
                 "function": {"name": "lookup_user", "arguments": "{\"user_id\": \"u-1\", \"x\": 1}"}},
                {"id": "c_json", "type": "function",
                 "function": {"name": "lookup_user", "arguments": "{not json"}},
                {"id": "c_unknown", "type": "function",
                 "function": {"name": "drop_database", "arguments": "{}"}}
            ]
        })))
        .push(Reply::text("Sorry."));
    let agent = agent_from(spec(&model, &tools));

    let outcome = runner().run(&agent, "Do things").await.expect("run");
    assert_eq!(outcome.final_output(), Some("Sorry."));
    assert!(tools.requests().is_empty(), "no invalid call was sent");
    assert!(outcome.state.deferred_tool_requests.approvals.is_empty());
    let messages = model.requests()[1].messages();
    let text = |id: &str| tool_result(&messages, id).unwrap_or_default();
    assert!(
        text("c_type").starts_with("tool error: invalid arguments for `delete_user`"),
        "{}",
        text("c_type")
    );
    assert!(text("c_type").contains("user_id"), "{}", text("c_type"));
    assert!(text("c_extra").starts_with("tool error: invalid arguments for `lookup_user`"));
    assert!(
        text("c_json")
            .starts_with("tool error: the arguments for `lookup_user` are not valid JSON")
    );
    assert!(text("c_unknown").starts_with("tool error: unknown tool `drop_database`"));
    assert!(text("c_unknown").contains("delete_user, lookup_user"));
}

#[tokio::test]
async fn tool_failures_become_error_results_and_the_run_goes_on() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    tools.set_reply("lookup_user", ToolReply::status(500, "database is down"));
    model
        .push(Reply::tool_calls(&[(
            "call_1",
            "lookup_user",
            json!({"user_id": "u-1"}),
        )]))
        .push(Reply::text("The lookup failed."));
    let agent = agent_from(spec(&model, &tools));
    let outcome = runner().run(&agent, "Look up u-1").await.expect("run");
    assert_eq!(outcome.final_output(), Some("The lookup failed."));
    assert_eq!(
        tools.calls_of("call_1"),
        1,
        "a failed tool call is not retried"
    );
    assert_eq!(
        tool_result(&model.requests()[1].messages(), "call_1").as_deref(),
        Some("tool error: HTTP 500: database is down")
    );
}

#[tokio::test]
async fn a_hanging_tool_times_out_into_an_error_result() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    tools.set_reply("lookup_user", ToolReply::Hang);
    model
        .push(Reply::tool_calls(&[(
            "call_1",
            "lookup_user",
            json!({"user_id": "u-1"}),
        )]))
        .push(Reply::text("Timed out."));
    let mut spec = spec(&model, &tools);
    spec["tools"][1]["http"]["timeoutSeconds"] = json!(1);
    let agent = agent_from(spec);
    let outcome = runner().run(&agent, "Look up u-1").await.expect("run");
    assert_eq!(outcome.final_output(), Some("Timed out."));
    let result = tool_result(&model.requests()[1].messages(), "call_1").unwrap_or_default();
    assert_eq!(
        result,
        "tool error: no response from `lookup_user` within 1 seconds"
    );
}

#[tokio::test]
async fn an_unreachable_tool_becomes_an_error_result() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    // A port nobody listens on: bind, note the port, close.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let mut spec = spec(&model, &tools);
    spec["tools"][1]["http"]["url"] = json!(format!("http://127.0.0.1:{port}/lookup"));
    model
        .push(Reply::tool_calls(&[(
            "call_1",
            "lookup_user",
            json!({"user_id": "u-1"}),
        )]))
        .push(Reply::text("Unreachable."));
    let agent = agent_from(spec);
    let outcome = runner().run(&agent, "Look up u-1").await.expect("run");
    assert_eq!(outcome.final_output(), Some("Unreachable."));
    let result = tool_result(&model.requests()[1].messages(), "call_1").unwrap_or_default();
    assert_eq!(result, "tool error: cannot connect to `lookup_user`");
}

#[tokio::test]
async fn model_429_and_5xx_are_retried() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::status(429, "slow down").with_header("retry-after", "0"))
        .push(Reply::status(503, "overloaded"))
        .push(Reply::text("Hello."));
    let agent = agent_from(spec(&model, &tools));
    let outcome = runner()
        .run(&agent, "Hi")
        .await
        .expect("run succeeds after retries");
    assert_eq!(outcome.final_output(), Some("Hello."));
    assert_eq!(model.request_count(), 3);
    assert_eq!(
        outcome.state.usage.requests, 1,
        "usage counts answered requests"
    );
    let bodies: Vec<String> = model.requests().into_iter().map(|r| r.body).collect();
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "every retry sends the same request"
    );
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::status(429, "slow down").with_header("retry-after-ms", "150"))
        .push(Reply::text("Hello."));
    let agent = agent_from(spec(&model, &tools));
    let started = std::time::Instant::now();
    let outcome = runner().run(&agent, "Hi").await.expect("run");
    assert_eq!(outcome.final_output(), Some("Hello."));
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn model_errors_after_retries_and_client_errors_are_clear_and_do_not_leak_the_key() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    for _ in 0..3 {
        model.push(Reply::status(500, "internal failure"));
    }
    let agent = agent_from(spec(&model, &tools));
    let runner = runner();
    let err = runner.run(&agent, "Hi").await.expect_err("fails");
    match &err {
        RunError::Model(ModelError::Status {
            status,
            attempts,
            body,
            ..
        }) => {
            assert_eq!(*status, 500);
            assert_eq!(*attempts, 3, "1 try + maxRetries 2");
            assert!(body.contains("internal failure"));
        }
        other => panic!("unexpected error: {other:?}"),
    }
    assert_eq!(model.request_count(), 3);

    model.push(Reply::status(401, "invalid api key"));
    let err = runner.run(&agent, "Hi").await.expect_err("fails");
    let text = err.to_string();
    assert!(
        text.contains("HTTP 401") && text.contains("invalid api key"),
        "{text}"
    );
    assert!(!text.contains(API_KEY) && !format!("{err:?}").contains(API_KEY));
    assert!(
        !format!("{agent:?}").contains(API_KEY),
        "Debug of the agent hides the key"
    );
    assert_eq!(model.request_count(), 4, "a 401 is not retried");
}

#[tokio::test]
async fn model_garbage_is_a_clear_error() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model.push(Reply::garbage());
    let agent = agent_from(spec(&model, &tools));
    let err = runner().run(&agent, "Hi").await.expect_err("fails");
    assert!(
        matches!(err, RunError::Model(ModelError::InvalidResponse { .. })),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("not JSON") && text.contains("502 Bad Gateway"),
        "{text}"
    );
    assert_eq!(model.request_count(), 1, "an invalid 200 is not retried");

    model.push(Reply::Json(json!({"choices": []})));
    let err = runner().run(&agent, "Hi").await.expect_err("fails");
    assert!(err.to_string().contains("choices[0].message"), "{err}");

    model.push(Reply::message(json!({
        "role": "assistant",
        "tool_calls": [{"type": "function", "function": {"name": "lookup_user", "arguments": "{}"}}]
    })));
    let err = runner().run(&agent, "Hi").await.expect_err("fails");
    assert!(err.to_string().contains("tool_calls[0].id"), "{err}");
}

#[tokio::test]
async fn a_hanging_model_times_out() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model.push(Reply::Hang);
    let mut spec = spec(&model, &tools);
    spec["model"]["timeoutSeconds"] = json!(1);
    spec["model"]["maxRetries"] = json!(0);
    let agent = agent_from(spec);
    let err = runner().run(&agent, "Hi").await.expect_err("times out");
    assert!(
        err.to_string().contains("no response within 1 seconds"),
        "{err}"
    );
}

#[tokio::test]
async fn max_turns_stops_a_run_that_never_answers() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    for turn in 0..3 {
        model.push(Reply::tool_calls(&[(
            &format!("call_{turn}"),
            "lookup_user",
            json!({"user_id": "u-1"}),
        )]));
    }
    let mut spec = spec(&model, &tools);
    spec["maxTurns"] = json!(2);
    let agent = agent_from(spec);
    let mut state = RunState::new("run-max", "ops-agent", "Loop forever");
    let err = runner().step(&agent, &mut state).await.expect_err("limit");
    assert!(
        matches!(err, RunError::MaxTurnsExceeded { max_turns: 2 }),
        "{err:?}"
    );
    assert!(err.to_string().contains("limit of 2 model turns"));
    assert_eq!(model.request_count(), 2);
    assert_eq!(
        state.current_turn, 2,
        "the partial progress stays in the state"
    );
    assert_eq!(tools.requests().len(), 2, "both turns' tool calls ran");
}

#[tokio::test]
async fn a_reused_tool_call_id_stops_the_run_instead_of_reusing_a_decision() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::tool_calls(&[(
            "call_1",
            "delete_user",
            json!({"user_id": "u-1"}),
        )]))
        .push(Reply::tool_calls(&[(
            "call_1",
            "delete_user",
            json!({"user_id": "u-2"}),
        )]));
    let agent = agent_from(spec(&model, &tools));
    let runner = runner();
    let mut state = halted(runner.run(&agent, "Delete").await.expect("run"));
    state.approve("call_1", Approval::new()).expect("approve");
    let err = runner.resume(&agent, state).await.expect_err("reused id");
    assert!(
        matches!(err, RunError::ReusedToolCallId { ref id } if id == "call_1"),
        "{err:?}"
    );
    assert_eq!(tools.calls_of("call_1"), 1, "u-2 was never deleted");
    assert_eq!(tools.requests()[0].json(), json!({"user_id": "u-1"}));
}

#[tokio::test]
async fn resuming_with_another_agent_is_refused() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    let agent = agent_from(spec(&model, &tools));
    let state = RunState::new("run-x", "other-agent", "Hi");
    let err = runner().resume(&agent, state).await.expect_err("mismatch");
    assert!(err.to_string().contains("`other-agent`"), "{err}");
    assert_eq!(model.request_count(), 0);
}

/// Records the calls it sees; skips calls whose id is listed.
#[derive(Default)]
struct RecordingHooks {
    seen: Mutex<Vec<(String, bool)>>,
    skip: Vec<String>,
    fail: bool,
}

impl RunHooks for RecordingHooks {
    fn before_tool_call<'a>(
        &'a self,
        call: ToolCallStart<'a>,
    ) -> BoxFuture<'a, Result<ToolCallGate, HookError>> {
        Box::pin(async move {
            self.seen
                .lock()
                .expect("lock")
                .push((call.tool_call_id.to_owned(), call.requires_approval));
            if self.fail {
                return Err(HookError::new("cannot record the call start"));
            }
            if self.skip.iter().any(|id| id == call.tool_call_id) {
                return Ok(ToolCallGate::Skip {
                    result: "tool error: outcome unknown after a crash; not sent again".to_owned(),
                });
            }
            Ok(ToolCallGate::Send)
        })
    }
}

#[tokio::test]
async fn the_before_tool_call_hook_sees_each_call_before_it_is_sent() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    model
        .push(Reply::tool_calls(&[
            ("call_d", "delete_user", json!({"user_id": "u-1"})),
            ("call_l", "lookup_user", json!({"user_id": "u-1"})),
        ]))
        .push(Reply::text("Done."));
    let agent = agent_from(spec(&model, &tools));
    let hooks = Arc::new(RecordingHooks {
        skip: vec!["call_d".to_owned()],
        ..RecordingHooks::default()
    });
    let runner = runner().with_hooks(hooks.clone());
    let mut state = halted(runner.run(&agent, "Go").await.expect("run"));
    assert_eq!(
        *hooks.seen.lock().expect("lock"),
        [("call_l".to_owned(), false)]
    );
    state.approve("call_d", Approval::new()).expect("approve");
    let outcome = runner.resume(&agent, state).await.expect("resume");
    assert_eq!(outcome.status, RunStatus::Completed);
    assert_eq!(
        *hooks.seen.lock().expect("lock"),
        [("call_l".to_owned(), false), ("call_d".to_owned(), true)]
    );
    assert_eq!(tools.calls_of("call_d"), 0, "the hook skipped it");
    assert_eq!(
        tool_result(&model.requests()[1].messages(), "call_d").as_deref(),
        Some("tool error: outcome unknown after a crash; not sent again")
    );

    // A failing hook stops the run before anything is sent.
    model.push(Reply::tool_calls(&[(
        "call_x",
        "lookup_user",
        json!({"user_id": "u-3"}),
    )]));
    let failing = runner.clone().with_hooks(Arc::new(RecordingHooks {
        fail: true,
        ..RecordingHooks::default()
    }));
    let err = failing.run(&agent, "Go").await.expect_err("hook fails");
    assert!(matches!(err, RunError::Hook { ref tool_call_id, .. } if tool_call_id == "call_x"));
    assert_eq!(tools.calls_of("call_x"), 0);
}

fn scripted_spec(tools: &ToolServer, turns: Json) -> Json {
    json!({
        "name": "ops-agent",
        "instructions": INSTRUCTIONS,
        "model": {"scripted": {"turns": turns}},
        "tools": [
            {"name": "delete_user", "parameters": user_schema(), "requiresApproval": true,
             "http": {"url": tools.url("delete_user")}},
            {"name": "lookup_user", "parameters": user_schema(),
             "http": {"url": tools.url("lookup_user")}}
        ]
    })
}

#[tokio::test]
async fn the_scripted_model_plays_its_turns_deterministically_across_resume() {
    let tools = ToolServer::start().await;
    let agent = agent_from(scripted_spec(
        &tools,
        json!([
            {"toolCalls": [
                {"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}},
                {"id": "call_2", "name": "lookup_user", "arguments": {"user_id": "u-1"}}
            ]},
            {"content": "User u-1 deleted."}
        ]),
    ));
    let runner = runner();
    let mut state = roundtrip(&halted(
        runner.run(&agent, "Delete u-1").await.expect("run"),
    ));
    assert_eq!(tools.calls_of("call_2"), 1);
    // The scripted call's arguments are the JSON string OpenAI uses.
    let assistant = Json::try_from(&state.messages[1]).expect("json");
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        json!(r#"{"user_id":"u-1"}"#)
    );
    state
        .approve(
            "call_1",
            Approval::new().approver_id(APPROVER).reason(REASON),
        )
        .expect("approve");
    let outcome = runner
        .resume(&agent, roundtrip(&state))
        .await
        .expect("resume");
    assert_eq!(outcome.final_output(), Some("User u-1 deleted."));
    assert_eq!(tools.calls_of("call_1"), 1);
    assert_eq!(tools.calls_of("call_2"), 1);
    assert_eq!(outcome.state.usage.requests, 2);
    for request in tools.requests() {
        assert!(!request.body.contains(APPROVER) && !request.body.contains(REASON));
    }
}

#[tokio::test]
async fn a_scripted_model_out_of_turns_is_a_clear_error() {
    let tools = ToolServer::start().await;
    let agent = agent_from(scripted_spec(
        &tools,
        json!([{"toolCalls": [{"id": "call_1", "name": "lookup_user", "arguments": {"user_id": "u-1"}}]}]),
    ));
    let err = runner().run(&agent, "Go").await.expect_err("out of turns");
    assert!(matches!(
        err,
        RunError::Model(ModelError::ScriptExhausted {
            turn: 2,
            available: 1
        })
    ));
    assert!(err.to_string().contains("no turn 2"), "{err}");
}

#[test]
fn invalid_agent_specs_are_refused_with_the_field_named() {
    let url = "http://127.0.0.1:9/x";
    let tool = |name: &str| json!({"name": name, "http": {"url": url}});
    let api = json!({"baseUrl": "http://127.0.0.1:9/v1", "name": "m"});

    let err = agent_error(json!({"name": "a", "model": api, "tools": [tool("t"), tool("t")]}));
    assert!(
        err.to_string().contains("tools[1].name") && err.to_string().contains("duplicate"),
        "{err}"
    );

    let err = agent_error(json!({"name": "a", "model": api, "tools": [
        {"name": "t", "parameters": {"type": 5}, "http": {"url": url}}
    ]}));
    assert!(err.to_string().contains("tools[0].parameters"), "{err}");

    let err = agent_error(json!({"name": "a", "model": {
        "baseUrl": "http://127.0.0.1:9/v1", "name": "m", "scripted": {"turns": []}
    }}));
    assert!(err.to_string().contains("not both"), "{err}");

    let err = agent_error(json!({"name": "a", "model": {}}));
    assert!(err.to_string().contains("model"), "{err}");

    let err = agent_error(json!({"name": "a", "model": {"baseUrl": "http://127.0.0.1:9/v1"}}));
    assert!(err.to_string().contains("model.name"), "{err}");

    let err = agent_error(json!({"name": "a", "model": {"baseUrl": "ftp://x", "name": "m"}}));
    assert!(err.to_string().contains("model.baseUrl"), "{err}");

    let err = agent_error(json!({"name": "a", "model": api, "tools": [
        {"name": "bad name", "http": {"url": url}}
    ]}));
    assert!(err.to_string().contains("tools[0].name"), "{err}");

    let err = agent_error(json!({"name": "a", "model": api, "tools": [
        {"name": "t", "http": {"url": "not a url"}}
    ]}));
    assert!(err.to_string().contains("tools[0].http.url"), "{err}");

    let err = agent_error(json!({"name": "a", "model": api, "tools": [
        {"name": "t", "approvalTimeout": "soon", "http": {"url": url}}
    ]}));
    assert!(
        err.to_string().contains("tools[0].approvalTimeout"),
        "{err}"
    );

    let err = agent_error(json!({"name": "a", "model": {"scripted": {"turns": [
        {"toolCalls": [{"id": "c", "name": "t"}]},
        {"toolCalls": [{"id": "c", "name": "t"}]}
    ]}}}));
    assert!(
        err.to_string().contains("turns[1].toolCalls[0].id"),
        "{err}"
    );

    let err = agent_error(json!({"model": api}));
    assert!(err.to_string().contains("name"), "{err}");

    let err = agent_error(json!({"name": "a", "model": api, "maxTurns": 0}));
    assert!(err.to_string().contains("maxTurns"), "{err}");
}

#[test]
fn the_api_key_env_must_be_set_when_named() {
    let spec: AgentSpec = serde_json::from_value(json!({
        "name": "a",
        "model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "m",
                  "apiKeyEnv": "AGENTRUN_TEST_SURELY_UNSET_VARIABLE"}
    }))
    .expect("spec");
    let agent = Agent::from_spec(&spec).expect("agent");
    let err = agent.with_api_key_from_env().expect_err("unset");
    assert!(
        err.to_string()
            .contains("AGENTRUN_TEST_SURELY_UNSET_VARIABLE"),
        "{err}"
    );
}

#[test]
fn the_example_agent_is_valid() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agent.yaml");
    let agent = Agent::load_file(&path).expect("examples/agent.yaml loads");
    assert_eq!(agent.name(), "ops-agent");
    let delete = agent.tool("delete_user").expect("delete_user");
    assert!(delete.requires_approval());
    assert!(
        agent
            .tool("lookup_user")
            .is_some_and(|t| !t.requires_approval())
    );
}

#[test]
fn agent_files_in_yaml_and_json_load_and_errors_name_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = dir.path().join("agent.yaml");
    std::fs::write(
        &yaml,
        "name: y\nmodel:\n  scripted:\n    turns:\n      - content: hi\n",
    )
    .expect("write");
    assert_eq!(Agent::load_file(&yaml).expect("yaml").name(), "y");
    let json_file = dir.path().join("agent.json");
    std::fs::write(
        &json_file,
        r#"{"name": "j", "model": {"scripted": {"turns": []}}}"#,
    )
    .expect("write");
    assert_eq!(Agent::load_file(&json_file).expect("json").name(), "j");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: b\nmodel: {scripted: {turns: []}}\nunknownField: 1\n",
    )
    .expect("write");
    let err = Agent::load_file(&bad).expect_err("unknown field");
    assert!(matches!(err, AgentError::Parse { .. }));
    assert!(
        err.to_string().contains("bad.yaml") && err.to_string().contains("unknownField"),
        "{err}"
    );
    let err = Agent::load_file(&dir.path().join("missing.yaml")).expect_err("missing");
    assert!(matches!(err, AgentError::Read { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_run_command_halts_writes_the_state_and_resumes() {
    use agentrun::cli::run::{RunArgs, RunCliError, execute};

    let tools = ToolServer::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let agent_path = dir.path().join("agent.json");
    let spec = scripted_spec(
        &tools,
        json!([
            {"toolCalls": [
                {"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}},
                {"id": "call_2", "name": "lookup_user", "arguments": {"user_id": "u-1"}}
            ]},
            {"content": "User u-1 deleted."}
        ]),
    );
    std::fs::write(&agent_path, spec.to_string()).expect("write agent");
    let state_path = dir.path().join("state.json");

    let run = |args: RunArgs| {
        tokio::task::spawn_blocking(move || {
            let mut report = String::new();
            let result = execute(&args, &mut report);
            (report, result)
        })
    };
    let (report, result) = run(RunArgs {
        agent: agent_path.clone(),
        input: Some("Delete user u-1".to_owned()),
        resume: None,
        state_out: Some(state_path.clone()),
    })
    .await
    .expect("join");
    result.expect("run halts cleanly");
    assert!(
        report.contains("→ tool call call_2 lookup_user"),
        "{report}"
    );
    assert!(report.contains("← result call_2"), "{report}");
    assert!(
        report.contains("halted: 1 tool call(s) await approval"),
        "{report}"
    );
    assert!(
        report.contains("agentrun state approve --tool-call-id call_1"),
        "{report}"
    );
    assert!(
        report.contains(r#"call_1 delete_user {"user_id": "u-1"}"#),
        "{report}"
    );

    let mut state = RunState::from_json(&std::fs::read_to_string(&state_path).expect("state file"))
        .expect("state");
    state
        .approve(
            "call_1",
            Approval::new().approver_id(APPROVER).reason(REASON),
        )
        .expect("approve");
    let approved_path = dir.path().join("approved.json");
    std::fs::write(&approved_path, state.to_json()).expect("write approved");

    let (report, result) = run(RunArgs {
        agent: agent_path.clone(),
        input: None,
        resume: Some(approved_path.clone()),
        state_out: None,
    })
    .await
    .expect("join");
    result.expect("resume completes");
    assert!(report.contains("← result call_1"), "{report}");
    assert!(
        report.contains("final output:\nUser u-1 deleted."),
        "{report}"
    );
    assert_eq!(tools.calls_of("call_1"), 1);

    // Bad input files are exit code 2; the message names the file.
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{not json").expect("write");
    let (_, result) = run(RunArgs {
        agent: agent_path.clone(),
        input: None,
        resume: Some(garbage),
        state_out: None,
    })
    .await
    .expect("join");
    let err = result.expect_err("bad state file");
    assert!(matches!(err, RunCliError::BadInput(_)));
    assert!(err.to_string().contains("garbage.json"), "{err}");
    assert_eq!(err.exit_code(), std::process::ExitCode::from(2));
}

#[tokio::test]
async fn the_assistant_message_is_kept_as_written_with_unknown_keys() {
    let model = ModelServer::start().await;
    let tools = ToolServer::start().await;
    let message = r#"{"role": "assistant", "content": "Hello.", "refusal": null, "annotations": [], "x_vendor": {"score": 0.5, "big": 123456789012345678901234567890}}"#;
    model.push(Reply::Raw {
        status: 200,
        body: format!(r#"{{"id": "c", "choices": [{{"index": 0, "message": {message}}}]}}"#),
        headers: vec![("content-type".to_owned(), "application/json".to_owned())],
    });
    let agent = agent_from(spec(&model, &tools));
    let outcome = runner().run(&agent, "Hi").await.expect("run");
    assert_eq!(outcome.final_output(), Some("Hello."));
    assert_eq!(outcome.state.usage.input_tokens, 0, "no usage reported");
    let kept = roundtrip(&outcome.state).messages[1]
        .to_json()
        .expect("json");
    assert_eq!(kept, message);
}
