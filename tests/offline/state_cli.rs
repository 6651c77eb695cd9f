//! `agentrun state ...`: stdin to stdout, exit code 2 with one stderr line on bad input.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use agentrun::state::pyjson::{self, Value};
use agentrun::state::{DeferredToolCall, RunState};

fn agentrun(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrun"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn agentrun");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    child.wait_with_output().expect("wait for agentrun")
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(out: &Output) -> String {
    String::from_utf8(out.stderr.clone()).expect("utf-8 stderr")
}

fn halted() -> RunState {
    let mut state = RunState::new("run-7", "ops", "Delete user u-1 and mail them");
    state.messages = vec![
        pyjson::loads(r#"{"role": "user", "content": "Delete user u-1 and mail them"}"#).unwrap(),
        pyjson::loads(
            r#"{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "delete_user", "arguments": "{\"user_id\": \"u-1\"}"}}]}"#,
        )
        .unwrap(),
    ];
    for (id, name) in [("call_1", "delete_user"), ("call_2", "send_email")] {
        state
            .deferred_tool_requests
            .approvals
            .push(DeferredToolCall {
                tool_call_id: id.into(),
                tool_name: name.into(),
                args: pyjson::loads(r#"{"user_id": "u-1", "note": "café"}"#).unwrap(),
            });
    }
    state.current_turn = 1;
    state
}

/// Asserts the failure contract: exit code 2, nothing on stdout, one line on stderr containing
/// `needle`.
fn assert_fails(out: &Output, needle: &str) {
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(out));
    assert!(
        out.stdout.is_empty(),
        "stdout must be empty: {:?}",
        stdout(out)
    );
    let err = stderr(out);
    assert_eq!(err.lines().count(), 1, "one stderr line: {err:?}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
}

#[test]
fn roundtrip_writes_canonical_python_json() {
    // Unknown keys dropped, pretty input normalized, non-ASCII escaped, big ints kept.
    let input = "{\n  \"run_id\": \"r\", \"legacy\": 1,\n  \"messages\": [{\"role\": \"user\", \"content\": \"é\", \"n\": 1180591620717411303424}]\n}\n";
    let out = agentrun(&["state", "roundtrip"], input.as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text, RunState::from_json(input).unwrap().to_json());
    assert!(text.starts_with(
        r#"{"run_id": "r", "agent_name": "", "input": "", "messages": [{"role": "user", "content": "\u00e9", "n": 1180591620717411303424}]"#
    ), "{text}");
    assert!(out.stderr.is_empty());
}

#[test]
fn approve_and_reject_record_decisions() {
    let input = halted().to_json();
    let out = agentrun(
        &[
            "state",
            "approve",
            "--tool-call-id",
            "call_1",
            "--approver-id",
            "alice@example.com",
            "--reason",
            "authorized per change CR-1234",
        ],
        input.as_bytes(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let approved = RunState::from_json(&stdout(&out)).unwrap();
    assert_eq!(approved.approved_tools, ["call_1"]);
    let meta = &approved.approval_metadata["call_1"];
    assert_eq!(meta.approver_id.as_deref(), Some("alice@example.com"));
    assert_eq!(
        meta.reason.as_deref(),
        Some("authorized per change CR-1234")
    );
    assert!((chrono::Utc::now() - meta.timestamp).num_seconds().abs() < 60);

    let out = agentrun(
        &[
            "state",
            "reject",
            "--tool-call-id",
            "call_2",
            "--message",
            "Not authorized",
        ],
        stdout(&out).as_bytes(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let both = RunState::from_json(&stdout(&out)).unwrap();
    assert_eq!(
        both.rejection("call_2").and_then(|r| r.message.as_deref()),
        Some("Not authorized")
    );
    // No approver/reason given: no audit entry for the rejection.
    assert!(!both.approval_metadata.contains_key("call_2"));
    assert!(both.pending_approvals().is_empty());
    assert_eq!(both.deferred_tool_requests, halted().deferred_tool_requests);
}

#[test]
fn invalid_input_or_decision_exits_2_with_one_line() {
    let input = halted().to_json();
    let approve = |id: &str| {
        vec![
            "state".to_owned(),
            "approve".to_owned(),
            "--tool-call-id".to_owned(),
            id.to_owned(),
        ]
    };
    let args = approve("call_9");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_fails(
        &agentrun(&args, input.as_bytes()),
        "tool call `call_9` is not awaiting approval (unknown id)",
    );

    let decided = {
        let mut s = halted();
        s.approve("call_1", agentrun::state::Approval::new())
            .unwrap();
        s.to_json()
    };
    let args = approve("call_1");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_fails(&agentrun(&args, decided.as_bytes()), "(already approved)");
    assert_fails(
        &agentrun(
            &["state", "reject", "--tool-call-id", "call_1"],
            decided.as_bytes(),
        ),
        "(already approved)",
    );
    // A newline in the id must not break the one-line rule.
    assert_fails(
        &agentrun(
            &["state", "reject", "--tool-call-id", "a\nb"],
            input.as_bytes(),
        ),
        "(unknown id)",
    );

    assert_fails(
        &agentrun(
            &["state", "roundtrip"],
            b"{\n\"run_id\": \"a\",\n  \"x\": ]\n}",
        ),
        "runState: invalid JSON at line 3 column 8",
    );
    assert_fails(
        &agentrun(&["state", "show"], br#"{"messages": {"role": "user"}}"#),
        "runState: field `messages`: expected a list, found dict",
    );
    assert_fails(
        &agentrun(&["state", "roundtrip"], b"[1, 2]"),
        "runState: not a JSON object (found list)",
    );
    assert_fails(
        &agentrun(&["state", "roundtrip"], b""),
        "runState: invalid JSON at line 1 column 1",
    );
    assert_fails(
        &agentrun(&["state", "roundtrip"], b"{\"a\": \"\xff\"}"),
        "not valid UTF-8",
    );
}

#[test]
fn show_summarizes_the_state() {
    let mut state = halted();
    state
        .reject(
            "call_2",
            agentrun::state::Rejection::new()
                .approver_id("bob")
                .reason("policy: tier-0")
                .at(chrono::DateTime::from_timestamp(1_796_239_825, 0).unwrap()),
        )
        .unwrap();
    state.usage.requests = 3;
    state.usage.input_tokens = 1200;
    state.usage.output_tokens = 80;
    state.messages.push(Value::from_iter([
        ("role", Value::from("tool")),
        ("tool_call_id", Value::from("call_0")),
        ("content", Value::from("line one\nline two")),
    ]));
    let out = agentrun(&["state", "show"], state.to_json().as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for needle in [
        "run:          run-7",
        "agent:        ops",
        "turn:         1",
        "usage:        3 requests, 1200 input tokens, 80 output tokens",
        "final output: -",
        "pending approvals (1):",
        r#"call_1  delete_user  {"user_id":"u-1","note":"café"}"#,
        "decided calls (1):",
        "call_2  send_email  rejected  message: (default) The tool call was rejected by a human reviewer.  (by bob at 2026-12-02T19:30:25+00:00, reason: policy: tier-0)",
        "last messages (3 of 3):",
        "[user] Delete user u-1 and mail them",
        r#"[assistant] call delete_user({"user_id": "u-1"})"#,
        "[tool call_0] line one\\nline two",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

/// Once the run resumes, its decided calls leave `deferred_tool_requests`; `show` still names
/// their tool, from the assistant message that made the call.
#[test]
fn show_names_the_tool_of_a_call_decided_before_the_run_resumed() {
    let mut state = halted();
    state
        .approve(
            "call_1",
            agentrun::state::Approval::new()
                .approver_id("alice@example.com")
                .reason("authorized per change CR-1234")
                .at(chrono::DateTime::from_timestamp(1_796_239_825, 0).unwrap()),
        )
        .unwrap();
    state.deferred_tool_requests.approvals.clear();
    let out = agentrun(&["state", "show"], state.to_json().as_bytes());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let needle = "call_1  delete_user  approved  (by alice@example.com at 2026-12-02T19:30:25+00:00, reason: authorized per change CR-1234)";
    assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    assert!(
        !text.contains("  ?  "),
        "a decided call without its tool in:\n{text}"
    );
}
