//! The RunState serialization and approval-audit contract.

use agentrun::state::pyjson::{self, CompactString, Dict, Int, Value};
use agentrun::state::{
    Approval, ApprovalMetadata, DEFAULT_REJECTION_MESSAGE, DecisionError, DeferredToolCall,
    DeferredToolRequests, RejectedTool, Rejection, RunState, StateError, Usage,
};
use chrono::{DateTime, TimeZone, Utc};
use num_bigint::BigInt;
use proptest::prelude::*;

const KEYS: [&str; 11] = [
    "run_id",
    "agent_name",
    "input",
    "messages",
    "deferred_tool_requests",
    "approved_tools",
    "rejected_tools",
    "approval_metadata",
    "current_turn",
    "usage",
    "final_output",
];

fn json(text: &str) -> Value {
    pyjson::loads(text).expect("test JSON")
}

fn ts(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .expect("timestamp")
        .to_utc()
}

/// A state halted on three tool calls, as a runner would leave it.
fn halted() -> RunState {
    let mut state = RunState::new("run-42", "ops-agent", "Delete user u-1");
    state.messages = vec![
        json(r#"{"role": "user", "content": "Delete user u-1"}"#),
        json(
            r#"{"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "delete_user", "arguments": "{\"user_id\": \"u-1\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "send_email", "arguments": "{}"}},
                {"id": "call_3", "type": "function", "function": {"name": "sql", "arguments": "{}"}}],
                "refusal": null, "x_vendor_field": {"kept": [1, 2.5, "é"]}}"#,
        ),
    ];
    state.deferred_tool_requests = DeferredToolRequests {
        calls: vec![json(
            r#"{"tool_call_id": "ext_1", "tool_name": "slow_job", "args": {}}"#,
        )],
        approvals: vec![
            DeferredToolCall {
                tool_call_id: "call_1".into(),
                tool_name: "delete_user".into(),
                args: json(
                    r#"{"user_id": "u-1", "hard": true, "zz": {"b": 1, "a": [2**70]}}"#
                        .replace("2**70", "1180591620717411303424")
                        .as_str(),
                ),
            },
            DeferredToolCall {
                tool_call_id: "call_2".into(),
                tool_name: "send_email".into(),
                args: json(r#"{"to": ["a@example.com"], "subject": "Bye 👋", "weight": 0.1}"#),
            },
            DeferredToolCall {
                tool_call_id: "call_3".into(),
                tool_name: "sql".into(),
                args: Value::from("raw string args"),
            },
        ],
    };
    state.current_turn = 2;
    state.usage = Usage {
        requests: 2,
        input_tokens: 1234,
        output_tokens: 56,
    };
    state
}

#[test]
fn json_round_trip() {
    let mut state = halted();
    state
        .approve(
            "call_1",
            Approval::new()
                .approver_id("alice@example.com")
                .reason("authorized per change CR-1234")
                .at(ts("2026-12-02T19:30:25.123456Z")),
        )
        .unwrap();
    state
        .reject(
            "call_2",
            Rejection::new()
                .message("Not authorized for this resource")
                .approver_id("bob@example.com")
                .reason("policy violation: tier-0 write")
                .at(ts("2026-12-02T19:31:00Z")),
        )
        .unwrap();
    let text = state.to_json();
    let back = RunState::from_json(&text).unwrap();
    assert_eq!(back, state);
    assert_eq!(back.to_json(), text);
    assert!(text.contains(
        r#""approval_metadata": {"call_1": {"approver_id": "alice@example.com", "reason": "authorized per change CR-1234", "timestamp": "2026-12-02T19:30:25.123456+00:00"}, "call_2": {"approver_id": "bob@example.com", "reason": "policy violation: tier-0 write", "timestamp": "2026-12-02T19:31:00+00:00"}}"#
    ), "{text}");
    assert!(
        text.contains(r#""subject": "Bye \ud83d\udc4b""#),
        "ensure_ascii: {text}"
    );
    assert!(text.contains(r#""x_vendor_field": {"kept": [1, 2.5, "\u00e9"]}"#));
    assert!(text.contains("1180591620717411303424"));
}

#[test]
fn fresh_state_has_exact_python_shape() {
    let state = RunState::new("r", "a", "hi");
    assert_eq!(
        state.to_json(),
        r#"{"run_id": "r", "agent_name": "a", "input": "hi", "messages": [], "deferred_tool_requests": {"calls": [], "approvals": []}, "approved_tools": [], "rejected_tools": [], "approval_metadata": {}, "current_turn": 0, "usage": {"requests": 0, "input_tokens": 0, "output_tokens": 0}, "final_output": null}"#
    );
}

#[test]
fn no_version_key_is_emitted() {
    let dict = halted().to_dict();
    assert_eq!(
        dict.keys().map(CompactString::as_str).collect::<Vec<_>>(),
        KEYS
    );
    // A payload carrying a version (or any other stamp) loads, and the stamp is not written back.
    let mut payload = halted().to_dict();
    payload.insert("version", Value::from(7));
    payload.insert("schema", Value::from("v2"));
    let text = pyjson::dumps(&Value::Dict(payload)).unwrap();
    let loaded = RunState::from_json(&text).unwrap();
    assert_eq!(loaded, halted());
    let out = loaded.to_json();
    assert!(!out.contains("version") && !out.contains("schema"), "{out}");
}

#[test]
fn tolerant_load_of_older_payloads() {
    // An early payload: later-added fields (approval_metadata, usage, final_output, current_turn)
    // missing, unknown keys present at the top level and inside nested objects.
    let text = r#"{
        "run_id": "old-1", "agent_name": "old-agent", "input": "hello",
        "messages": [{"role": "user", "content": "hello", "name": "u"}],
        "deferred_tool_requests": {"calls": [], "approvals": [
            {"tool_call_id": "c1", "tool_name": "t", "args": {"a": 1}, "legacy_flag": true}],
            "old_mode": "x"},
        "approved_tools": ["c1"],
        "rejected_tools": [{"tool_call_id": "c2", "message": "no", "legacy": 1}],
        "retired_field": [1, 2, 3],
        "usage": {"requests": 1, "total_tokens": 99}
    }"#;
    let state = RunState::from_json(text).unwrap();
    assert_eq!(state.run_id, "old-1");
    assert_eq!(state.current_turn, 0);
    assert_eq!(state.final_output, None);
    assert!(state.approval_metadata.is_empty());
    assert_eq!(
        state.usage,
        Usage {
            requests: 1,
            input_tokens: 0,
            output_tokens: 0
        }
    );
    assert!(state.is_approved("c1"));
    assert_eq!(
        state.rejection("c2").and_then(|r| r.message.as_deref()),
        Some("no")
    );
    assert_eq!(state.messages[0].get("name"), Some(&Value::from("u")));
    let out = state.to_json();
    for gone in [
        "retired_field",
        "legacy_flag",
        "old_mode",
        "total_tokens",
        "\"legacy\"",
    ] {
        assert!(!out.contains(gone), "{gone} written back: {out}");
    }
    // The empty object loads as the default state.
    assert_eq!(RunState::from_json("{}").unwrap(), RunState::default());
    // Missing args default to an empty dict.
    let s = RunState::from_json(
        r#"{"deferred_tool_requests": {"approvals": [{"tool_call_id": "c", "tool_name": "t"}]}}"#,
    )
    .unwrap();
    assert_eq!(
        s.deferred_tool_requests.approvals[0].args,
        Value::Dict(Dict::default())
    );
}

#[test]
fn null_for_non_nullable_fields_means_default() {
    let text = r#"{"run_id": null, "agent_name": "a", "input": null, "messages": null,
        "deferred_tool_requests": {"calls": null, "approvals": null}, "approved_tools": null,
        "rejected_tools": null, "approval_metadata": null, "current_turn": null,
        "usage": {"requests": null, "input_tokens": 3, "output_tokens": null}, "final_output": null}"#;
    let state = RunState::from_json(text).unwrap();
    let mut want = RunState::new("", "a", "");
    want.usage.input_tokens = 3;
    assert_eq!(state, want);
    // `args: null` is a value like any other and is kept.
    let s = RunState::from_json(
        r#"{"deferred_tool_requests": {"approvals": [{"tool_call_id": "c", "tool_name": "t", "args": null}]}}"#,
    )
    .unwrap();
    assert_eq!(s.deferred_tool_requests.approvals[0].args, Value::Null);
}

#[test]
fn audit_metadata_is_separate_from_resumption() {
    let mut state = halted();
    let before_deferred = state.deferred_tool_requests.clone();
    // No approver_id and no reason: no metadata entry.
    state.approve("call_1", Approval::new()).unwrap();
    assert!(state.approval_metadata.is_empty());
    // Only a timestamp is not enough either.
    state
        .reject("call_3", Rejection::new().at(ts("2026-01-01T00:00:00Z")))
        .unwrap();
    assert!(state.approval_metadata.is_empty());
    // A reason alone records an entry (timestamp = now, UTC, microseconds).
    let t0 = Utc::now();
    state
        .reject(
            "call_2",
            Rejection::new().reason("policy violation: tier-0 write"),
        )
        .unwrap();
    let entry = &state.approval_metadata["call_2"];
    assert_eq!(entry.approver_id, None);
    assert_eq!(
        entry.reason.as_deref(),
        Some("policy violation: tier-0 write")
    );
    assert!(entry.timestamp >= t0 - chrono::Duration::microseconds(1));
    assert_eq!(entry.timestamp.timestamp_subsec_nanos() % 1000, 0);
    // The message is stored as given: none here (the runner supplies the default when telling the
    // model), and the audit reason never becomes the message.
    assert_eq!(state.rejection("call_2").unwrap().message, None);
    assert_eq!(state.rejection("call_3").unwrap().message, None);
    assert!(!state.to_json().contains(DEFAULT_REJECTION_MESSAGE));
    // Decisions leave the deferred requests untouched.
    assert_eq!(state.deferred_tool_requests, before_deferred);
    assert_eq!(state.approved_tools, ["call_1"]);
    assert_eq!(
        state.rejected_tools,
        [
            RejectedTool {
                tool_call_id: "call_3".into(),
                message: None
            },
            RejectedTool {
                tool_call_id: "call_2".into(),
                message: None
            }
        ]
    );
    assert!(state.pending_approvals().is_empty());

    // Resumption never depends on the audit dict: dropping it from the payload, or adding stray
    // entries, changes none of the resumption lists.
    let mut payload = state.to_dict();
    payload.insert("approval_metadata", Value::Dict(Dict::default()));
    let without = RunState::from_dict(&Value::Dict(payload.clone())).unwrap();
    let stray = json(
        r#"{"call_9": {"approver_id": "eve", "reason": null, "timestamp": "2026-12-02T19:30:25"}}"#,
    );
    payload.insert("approval_metadata", stray);
    let with_stray = RunState::from_dict(&Value::Dict(payload)).unwrap();
    for s in [&without, &with_stray] {
        assert_eq!(s.approved_tools, state.approved_tools);
        assert_eq!(s.rejected_tools, state.rejected_tools);
        assert_eq!(s.deferred_tool_requests, state.deferred_tool_requests);
        assert_eq!(s.pending_approvals(), state.pending_approvals());
    }
    assert!(with_stray.approval_metadata.contains_key("call_9"));
    assert!(!with_stray.is_approved("call_9"));
}

#[test]
fn pending_approvals_lists_undecided_calls_in_order() {
    let mut state = halted();
    let ids = |s: &RunState| {
        s.pending_approvals()
            .iter()
            .map(|c| c.tool_call_id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&state), ["call_1", "call_2", "call_3"]);
    state
        .reject("call_2", Rejection::new().message("no"))
        .unwrap();
    assert_eq!(ids(&state), ["call_1", "call_3"]);
    state
        .approve("call_3", Approval::new().approver_id("a"))
        .unwrap();
    assert_eq!(ids(&state), ["call_1"]);
    assert!(state.is_approved("call_3") && !state.is_approved("call_2"));
    assert_eq!(
        state.rejection("call_2"),
        Some(&RejectedTool {
            tool_call_id: "call_2".into(),
            message: Some("no".into())
        })
    );
}

#[test]
fn to_dict_from_dict_round_trip() {
    let mut state = halted();
    state
        .approve(
            "call_2",
            Approval::new()
                .approver_id("alice")
                .at(ts("2026-12-02T19:30:25.000001Z")),
        )
        .unwrap();
    state.final_output = Some("done ✓".into());
    let dict = state.to_dict();
    assert_eq!(
        RunState::from_dict(&Value::Dict(dict.clone())).unwrap(),
        state
    );
    assert_eq!(pyjson::dumps(&Value::Dict(dict)).unwrap(), state.to_json());
    assert_eq!(
        state.to_dict()["approval_metadata"]["call_2"]["timestamp"],
        Value::from("2026-12-02T19:30:25.000001+00:00")
    );
}

#[test]
fn wrong_types_name_the_field() {
    let cases = [
        (
            r#"{"messages": "hi"}"#,
            "runState: field `messages`: expected a list, found str",
        ),
        (
            r#"{"run_id": 5}"#,
            "runState: field `run_id`: expected a str, found int",
        ),
        (
            r#"{"final_output": ["x"]}"#,
            "runState: field `final_output`: expected a str, found list",
        ),
        (
            r#"{"current_turn": "3"}"#,
            "runState: field `current_turn`: expected an int, found str",
        ),
        (
            r#"{"current_turn": 3.0}"#,
            "runState: field `current_turn`: expected an int, found float",
        ),
        (
            r#"{"current_turn": true}"#,
            "runState: field `current_turn`: expected an int, found bool",
        ),
        (
            r#"{"current_turn": -1}"#,
            "runState: field `current_turn`: expected a non-negative int, found -1",
        ),
        (
            r#"{"current_turn": 18446744073709551616}"#,
            "runState: field `current_turn`: 18446744073709551616 is too large (the maximum is 18446744073709551615)",
        ),
        (
            r#"{"usage": []}"#,
            "runState: field `usage`: expected a dict, found list",
        ),
        (
            r#"{"usage": {"input_tokens": "many"}}"#,
            "runState: field `usage.input_tokens`: expected an int, found str",
        ),
        (
            r#"{"deferred_tool_requests": 1}"#,
            "runState: field `deferred_tool_requests`: expected a dict, found int",
        ),
        (
            r#"{"deferred_tool_requests": {"calls": {}}}"#,
            "runState: field `deferred_tool_requests.calls`: expected a list, found dict",
        ),
        (
            r#"{"deferred_tool_requests": {"approvals": [{"tool_call_id": "a", "tool_name": 7}]}}"#,
            "runState: field `deferred_tool_requests.approvals[0].tool_name`: expected a str, found int",
        ),
        (
            r#"{"deferred_tool_requests": {"approvals": [{"tool_call_id": "a", "tool_name": "t"}, "x"]}}"#,
            "runState: field `deferred_tool_requests.approvals[1]`: expected a dict, found str",
        ),
        (
            r#"{"deferred_tool_requests": {"approvals": [{"tool_name": "t"}]}}"#,
            "runState: field `deferred_tool_requests.approvals[0].tool_call_id`: missing (required)",
        ),
        (
            r#"{"approved_tools": ["a", null]}"#,
            "runState: field `approved_tools[1]`: expected a str, found null",
        ),
        (
            r#"{"rejected_tools": [{"tool_call_id": "a", "message": 1}]}"#,
            "runState: field `rejected_tools[0].message`: expected a str, found int",
        ),
        (
            r#"{"rejected_tools": [{"message": "m"}]}"#,
            "runState: field `rejected_tools[0].tool_call_id`: missing (required)",
        ),
        (
            r#"{"approval_metadata": []}"#,
            "runState: field `approval_metadata`: expected a dict, found list",
        ),
        (
            r#"{"approval_metadata": {"c\n1": {"approver_id": 1, "timestamp": "2026-01-01T00:00:00"}}}"#,
            "runState: field `approval_metadata[\"c\\n1\"].approver_id`: expected a str, found int",
        ),
        (
            r#"{"approval_metadata": {"c1": {"approver_id": "a"}}}"#,
            "runState: field `approval_metadata[\"c1\"].timestamp`: missing (required)",
        ),
        (
            r#"{"approval_metadata": {"c1": {"timestamp": "yesterday"}}}"#,
            "runState: field `approval_metadata[\"c1\"].timestamp`: invalid timestamp \"yesterday\": expected an ISO 8601 date-time such as 2026-12-02T19:30:25.123456+00:00",
        ),
        ("[]", "runState: not a JSON object (found list)"),
        ("\"state\"", "runState: not a JSON object (found str)"),
        ("null", "runState: not a JSON object (found null)"),
        (
            "{\n  \"run_id\": \"a\",\n  \"input\" \"b\"\n}",
            "runState: invalid JSON at line 3 column 11: Expecting ':' delimiter",
        ),
        (
            "{\"a\": NaN}",
            "runState: invalid JSON at line 1 column 7: `NaN` is not valid JSON (non-finite numbers are rejected)",
        ),
    ];
    for (payload, want) in cases {
        let err = RunState::from_json(payload).expect_err(payload);
        let text = err.to_string();
        assert!(
            text.starts_with(want),
            "payload {payload}\n got: {text}\nwant: {want}"
        );
        assert!(!text.contains('\n'), "one line: {text:?}");
    }
    assert!(matches!(
        RunState::from_dict(&Value::from(3)),
        Err(StateError::NotAnObject { found: "int" })
    ));
}

#[test]
fn decisions_on_unknown_or_decided_calls_fail_and_change_nothing() {
    let mut state = halted();
    state.approve("call_1", Approval::new()).unwrap();
    state.reject("call_2", Rejection::new()).unwrap();
    let before = state.clone();
    let cases: [(Result<(), DecisionError>, &str); 6] = [
        (
            state.approve("call_9", Approval::new().approver_id("a")),
            "tool call `call_9` is not awaiting approval (unknown id)",
        ),
        (
            state.reject("call_9", Rejection::new()),
            "tool call `call_9` is not awaiting approval (unknown id)",
        ),
        (
            state.approve("call_1", Approval::new().reason("again")),
            "tool call `call_1` is not awaiting approval (already approved)",
        ),
        (
            state.reject("call_1", Rejection::new().reason("flip")),
            "tool call `call_1` is not awaiting approval (already approved)",
        ),
        (
            state.approve("call_2", Approval::new().approver_id("x")),
            "tool call `call_2` is not awaiting approval (already rejected)",
        ),
        (
            state.approve("ext_1", Approval::new()),
            "tool call `ext_1` is not awaiting approval (unknown id)",
        ),
    ];
    for (result, want) in cases {
        assert_eq!(result.unwrap_err().to_string(), want);
    }
    assert_eq!(state, before, "failed decisions must not change the state");
}

#[test]
fn timestamps_are_python_isoformat_utc() {
    let meta = |stamp: &str| {
        let text = format!(
            r#"{{"approval_metadata": {{"c": {{"approver_id": "a", "reason": null, "timestamp": "{stamp}"}}}}}}"#
        );
        let state = RunState::from_json(&text).unwrap_or_else(|e| panic!("{stamp}: {e}"));
        let written = state.to_dict()["approval_metadata"]["c"]["timestamp"]
            .as_str()
            .unwrap()
            .to_owned();
        (state.approval_metadata["c"].timestamp, written)
    };
    let cases = [
        // Naive timestamps from older payloads are taken as UTC.
        ("2026-12-02T19:30:25", "2026-12-02T19:30:25+00:00"),
        ("2026-12-02T19:30:25.5", "2026-12-02T19:30:25.500000+00:00"),
        (
            "2026-12-02 19:30:25.123456",
            "2026-12-02T19:30:25.123456+00:00",
        ),
        ("2026-12-02T19:30", "2026-12-02T19:30:00+00:00"),
        // Any offset is converted to UTC; `Z` is accepted.
        ("2026-12-02T19:30:25Z", "2026-12-02T19:30:25+00:00"),
        (
            "2026-12-03T01:00:25.000001+05:30",
            "2026-12-02T19:30:25.000001+00:00",
        ),
        ("2026-12-02T14:30:25-05:00", "2026-12-02T19:30:25+00:00"),
        ("2026-12-02T19:30:25+0000", "2026-12-02T19:30:25+00:00"),
        // Sub-microsecond digits are truncated.
        (
            "2026-12-02T19:30:25.123456789+00:00",
            "2026-12-02T19:30:25.123456+00:00",
        ),
        (
            "2026-12-02T19:30:25.000000999Z",
            "2026-12-02T19:30:25+00:00",
        ),
    ];
    for (input, want) in cases {
        let (parsed, written) = meta(input);
        assert_eq!(written, want, "{input}");
        assert_eq!(parsed, ts(want), "{input}");
    }
    // Decisions truncate to microseconds too, so a round trip is exact.
    let mut state = halted();
    state
        .approve(
            "call_1",
            Approval::new()
                .approver_id("a")
                .at(Utc.timestamp_opt(1_800_000_000, 123_456_789).unwrap()),
        )
        .unwrap();
    assert_eq!(
        state.approval_metadata["call_1"],
        ApprovalMetadata {
            approver_id: Some("a".into()),
            reason: None,
            timestamp: Utc.timestamp_opt(1_800_000_000, 123_456_000).unwrap()
        }
    );
    assert_eq!(RunState::from_json(&state.to_json()).unwrap(), state);
    for bad in [
        "2026-13-02T00:00:00",
        "2026-12-02",
        "12/02/2026",
        "2026-12-02T19:30:60Z",
        "",
    ] {
        let text = format!(r#"{{"approval_metadata": {{"c": {{"timestamp": "{bad}"}}}}}}"#);
        let err = RunState::from_json(&text).unwrap_err().to_string();
        assert!(
            err.starts_with("runState: field `approval_metadata[\"c\"].timestamp`: "),
            "{bad}: {err}"
        );
    }
}

#[test]
fn to_json_never_fails_but_try_to_json_reports_unwritable_values() {
    let mut state = RunState::new("r", "a", "i");
    state.messages.push(Value::Float(f64::NAN));
    state.messages.push(Value::Float(f64::NEG_INFINITY));
    // What CPython's json.dumps writes for such a dict.
    assert!(state.to_json().contains(r#""messages": [NaN, -Infinity]"#));
    assert!(matches!(
        state.try_to_json(),
        Err(StateError::Json(pyjson::JsonError::NonFiniteFloat { .. }))
    ));
}

// ------------------------------------------------------------------------------------------------
// Property tests
// ------------------------------------------------------------------------------------------------

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (any::<bool>(), prop::collection::vec(any::<u32>(), 1..8)).prop_map(|(neg, digits)| {
            let sign = if neg {
                num_bigint::Sign::Minus
            } else {
                num_bigint::Sign::Plus
            };
            Value::Int(Int::from(BigInt::new(sign, digits)))
        }),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::Float),
        prop_oneof![
            Just(0.1),
            Just(1e16),
            Just(1e-5),
            Just(-0.0),
            Just(5e-324),
            Just(f64::MAX)
        ]
        .prop_map(Value::Float),
        any::<String>().prop_map(Value::Str),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::List),
            prop::collection::vec((any::<String>(), inner), 0..6)
                .prop_map(|entries| Value::Dict(entries.into_iter().collect())),
        ]
    })
}

fn timestamp() -> impl Strategy<Value = DateTime<Utc>> {
    // Python's datetime range (years 1..=9999), microsecond precision.
    (-62_135_596_800i64..253_402_300_799i64, 0u32..1_000_000)
        .prop_map(|(secs, micros)| DateTime::from_timestamp(secs, micros * 1000).unwrap())
}

fn run_state() -> impl Strategy<Value = RunState> {
    let calls = prop::collection::vec(
        (any::<String>(), any::<String>(), value()).prop_map(|(tool_call_id, tool_name, args)| {
            DeferredToolCall {
                tool_call_id,
                tool_name,
                args,
            }
        }),
        0..4,
    );
    let metadata = prop::collection::vec(
        (
            any::<String>(),
            any::<Option<String>>(),
            any::<Option<String>>(),
            timestamp(),
        ),
        0..4,
    );
    (
        (any::<String>(), any::<String>(), any::<String>()),
        prop::collection::vec(value(), 0..5),
        (prop::collection::vec(value(), 0..3), calls),
        prop::collection::vec(any::<String>(), 0..4),
        prop::collection::vec((any::<String>(), any::<Option<String>>()), 0..4),
        metadata,
        any::<u64>(),
        any::<(u64, u64, u64)>(),
        any::<Option<String>>(),
    )
        .prop_map(
            |(
                (run_id, agent_name, input),
                messages,
                (calls, approvals),
                approved_tools,
                rejected,
                metadata,
                current_turn,
                (requests, input_tokens, output_tokens),
                final_output,
            )| RunState {
                run_id,
                agent_name,
                input,
                messages,
                deferred_tool_requests: DeferredToolRequests { calls, approvals },
                approved_tools,
                rejected_tools: rejected
                    .into_iter()
                    .map(|(tool_call_id, message)| RejectedTool {
                        tool_call_id,
                        message,
                    })
                    .collect(),
                approval_metadata: metadata
                    .into_iter()
                    .map(|(id, approver_id, reason, timestamp)| {
                        (
                            id,
                            ApprovalMetadata {
                                approver_id,
                                reason,
                                timestamp,
                            },
                        )
                    })
                    .collect(),
                current_turn,
                usage: Usage {
                    requests,
                    input_tokens,
                    output_tokens,
                },
                final_output,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn from_json_of_to_json_is_identity(state in run_state()) {
        let text = state.to_json();
        prop_assert!(text.is_ascii());
        let back = RunState::from_json(&text);
        prop_assert_eq!(back.as_ref(), Ok(&state));
        prop_assert_eq!(back.unwrap().to_json(), text.clone());
        prop_assert_eq!(state.try_to_json(), Ok(text.clone()));
        prop_assert_eq!(pyjson::dumps(&Value::Dict(state.to_dict())), Ok(text));
        prop_assert_eq!(RunState::from_dict(&Value::Dict(state.to_dict())), Ok(state));
    }

    #[test]
    fn pyjson_round_trips_values(v in value()) {
        let text = pyjson::dumps(&v).unwrap();
        prop_assert_eq!(pyjson::loads(&text), Ok(v));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = RunState::from_json(&text);
        let _ = pyjson::loads(&text);
    }

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        let _ = RunState::from_json(&text);
    }

    #[test]
    fn json_shaped_noise_never_panics(
        text in r#"[\[\]{}",:0-9eE+\-.\\ntrufalsNIiy \u{e9}\u{1F600}]{0,64}"#
    ) {
        if let Err(e) = RunState::from_json(&text) {
            prop_assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn mutated_payloads_never_panic(
        state in run_state(),
        cuts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = state.to_json().into_bytes();
        for (at, byte) in cuts {
            let i = at.index(bytes.len());
            match byte % 3 {
                0 => bytes.truncate(i),
                1 => bytes[i] = byte & 0x7f,
                _ => { bytes.remove(i); }
            }
            if bytes.is_empty() { break; }
        }
        let text = String::from_utf8_lossy(&bytes);
        let _ = RunState::from_json(&text);
    }
}
