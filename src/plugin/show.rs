//! `kubectl agentrun show RUN`: the conversation so far and the calls waiting for a decision,
//! readable in a terminal. Text written by the model or a tool is made terminal-safe (escape
//! sequences and bidirectional controls are shown, not interpreted), so what a person reads before
//! deciding is what the run holds.

use std::collections::HashMap;

use kube::ResourceExt;
use serde::Serialize;

use super::cli::{OutputFormat, ShowArgs};
use super::text::{indented, one_line};
use super::{PluginError, Session, render_report};
use crate::agent::model::{self, ToolArguments};
use crate::chunk_store;
use crate::crd::{AgentRun, ApprovalRequest};
use crate::state::RunState;
use crate::state::pyjson::{self, Value};

/// A run as `show` presents it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    /// The run's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The Agent it runs.
    pub agent: String,
    /// `status.phase`.
    pub phase: Option<String>,
    /// `status.step`.
    pub step: Option<u32>,
    /// `status.createdBy`: the verified identity of the run's creator.
    pub created_by: Option<String>,
    /// The `Ready` condition as `reason: message`.
    pub status_message: Option<String>,
    /// The user's input.
    pub input: String,
    /// The conversation so far (chat-completions messages, as stored); empty before the first
    /// step finished.
    pub messages: Vec<Value>,
    /// The calls waiting for a decision.
    pub pending: Vec<PendingCall>,
    /// The final answer, once the run succeeded.
    pub final_output: Option<String>,
}

/// A tool call waiting for a decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingCall {
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The tool.
    pub tool_name: String,
    /// The arguments exactly as they will be approved (the ApprovalRequest's, else the state's).
    pub arguments: String,
    /// The ApprovalRequest to decide (absent until the controller created it).
    pub approval_request: Option<String>,
    /// A decision already set on the request that the controller has not applied yet.
    pub decision: Option<String>,
    /// Who set that decision.
    pub approver_id: Option<String>,
    /// What the ApprovalPolicies set for the call: e.g. `2 approvals (policy:prod/big-refunds)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requirement: Option<String>,
    /// The votes cast so far, on a request that needs several approvals.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub votes: Vec<String>,
}

/// Builds the view of `run` from its decoded state (`None` before the first step finished) and
/// its ApprovalRequests.
pub fn view(run: &AgentRun, state: Option<&RunState>, requests: &[ApprovalRequest]) -> RunView {
    let status = run.status.clone().unwrap_or_default();
    let by_call: HashMap<&str, &ApprovalRequest> = requests
        .iter()
        .map(|r| (r.spec.tool_call_id.as_str(), r))
        .collect();
    let pending = state
        .map(|state| {
            state
                .pending_approvals()
                .into_iter()
                .map(|call| {
                    let request = by_call.get(call.tool_call_id.as_str());
                    PendingCall {
                        tool_call_id: call.tool_call_id.clone(),
                        tool_name: call.tool_name.clone(),
                        arguments: request
                            .map_or_else(|| call.arguments_json(), |r| r.spec.arguments.clone()),
                        approval_request: request.map(|r| r.name_any()),
                        decision: request.and_then(|r| r.spec.decision).map(|d| d.to_string()),
                        approver_id: request.and_then(|r| r.spec.approver_id.clone()),
                        requirement: request.and_then(|r| requirement(&r.spec)),
                        votes: request
                            .map(|r| {
                                r.spec
                                    .votes
                                    .iter()
                                    .map(|(who, v)| format!("{who}: {}", v.decision))
                                    .collect()
                            })
                            .unwrap_or_default(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let status_message = status
        .conditions
        .iter()
        .find(|c| c.type_ == crate::crd::ConditionType::Ready.as_ref())
        .map(|c| format!("{}: {}", c.reason, c.message));
    RunView {
        name: run.name_any(),
        namespace: run.namespace().unwrap_or_default(),
        agent: run.spec.agent_ref.name.clone(),
        phase: status.phase.map(|p| p.to_string()),
        step: status.step,
        created_by: status.created_by.clone(),
        status_message,
        input: state.map_or_else(|| run.spec.input.clone(), |s| s.input.clone()),
        messages: state.map(|s| s.messages.clone()).unwrap_or_default(),
        pending,
        final_output: state
            .and_then(|s| s.final_output.clone())
            .or(status.final_output),
    }
}

/// What a request's policy sets, in words (`None` when no policy applies).
fn requirement(spec: &crate::crd::ApprovalRequestSpec) -> Option<String> {
    let policy = spec.policy.as_ref()?;
    let what = match policy.action {
        crate::crd::PolicyAction::Require => {
            let mut what = format!("{} approval(s)", spec.approvals_needed());
            if let Some(approvers) = &spec.approvers {
                let who: Vec<&str> = approvers
                    .groups
                    .iter()
                    .map(|g| g.as_str())
                    .chain(approvers.users.iter().map(String::as_str))
                    .collect();
                what.push_str(&format!(" from {}", who.join(", ")));
            }
            what
        }
        action => action.to_string(),
    };
    Some(format!("{what} ({})", policy.approver_id()))
}

/// The arguments of a call as the model wrote them, on one line.
fn arguments_text(arguments: &ToolArguments) -> String {
    match arguments {
        ToolArguments::Text(text) => one_line(text),
        ToolArguments::Value(value) => {
            one_line(&pyjson::dumps(value).unwrap_or_else(|e| format!("<unprintable: {e}>")))
        }
    }
}

/// The view as text for a terminal.
pub fn render_text(view: &RunView) -> String {
    let mut out = String::new();
    let field = |out: &mut String, name: &str, value: &str| {
        out.push_str(&format!("{name:<12}{}\n", one_line(value)));
    };
    field(&mut out, "Run:", &view.name);
    field(&mut out, "Namespace:", &view.namespace);
    field(&mut out, "Agent:", &view.agent);
    let phase = view.phase.as_deref().unwrap_or("(not started)");
    match view.step {
        Some(step) => field(&mut out, "Phase:", &format!("{phase} (step {step})")),
        None => field(&mut out, "Phase:", phase),
    }
    if let Some(creator) = &view.created_by {
        field(&mut out, "Created by:", creator);
    }
    if let Some(message) = &view.status_message {
        field(&mut out, "Status:", message);
    }
    out.push('\n');

    let pending_names: HashMap<&str, Option<&str>> = view
        .pending
        .iter()
        .map(|p| (p.tool_call_id.as_str(), p.approval_request.as_deref()))
        .collect();
    if view.messages.is_empty() {
        out.push_str("Conversation: none yet (the first step has not finished)\n");
        out.push_str("Input:\n");
        out.push_str(&indented(&view.input, "    "));
    } else {
        out.push_str(&format!(
            "Conversation ({} messages):\n",
            view.messages.len()
        ));
        let mut tool_names: HashMap<String, String> = HashMap::new();
        for (i, message) in view.messages.iter().enumerate() {
            out.push('\n');
            let number = i + 1;
            let Some(role) = model::role(message) else {
                let raw = pyjson::dumps(message).unwrap_or_default();
                out.push_str(&format!("#{number} (not a chat message)\n"));
                out.push_str(&indented(&raw, "    "));
                continue;
            };
            let content = model::content_text(message);
            match role {
                "assistant" => {
                    out.push_str(&format!("#{number} assistant\n"));
                    let calls = model::tool_calls(message);
                    if !content.is_empty() || matches!(&calls, Ok(c) if c.is_empty()) {
                        out.push_str(&indented(&content, "    "));
                    }
                    match calls {
                        Ok(calls) => {
                            for call in calls {
                                let note = match pending_names.get(call.id.as_str()) {
                                    Some(Some(apr)) => format!("   [awaiting approval: {apr}]"),
                                    Some(None) => "   [awaiting approval]".to_owned(),
                                    None => String::new(),
                                };
                                out.push_str(&format!(
                                    "    -> tool call {} {}({}){}\n",
                                    one_line(&call.id),
                                    one_line(&call.name),
                                    arguments_text(&call.arguments),
                                    one_line(&note),
                                ));
                                tool_names.insert(call.id, call.name);
                            }
                        }
                        Err(problem) => {
                            out.push_str(&format!(
                                "    (unreadable tool calls: {})\n",
                                one_line(&problem)
                            ));
                        }
                    }
                }
                "tool" => {
                    let id = message
                        .get("tool_call_id")
                        .and_then(Value::as_str)
                        .unwrap_or("?");
                    let tool = tool_names.get(id).map_or("", String::as_str);
                    out.push_str(&format!(
                        "#{number} tool result of {} {}\n",
                        one_line(id),
                        one_line(tool)
                    ));
                    out.push_str(&indented(&content, "    "));
                }
                other => {
                    out.push_str(&format!("#{number} {}\n", one_line(other)));
                    out.push_str(&indented(&content, "    "));
                }
            }
        }
    }

    out.push('\n');
    if view.pending.is_empty() {
        out.push_str("Pending tool calls: none\n");
    } else {
        out.push_str(&format!("Pending tool calls ({}):\n", view.pending.len()));
        for call in &view.pending {
            out.push_str(&format!(
                "  {}  {}\n",
                one_line(&call.tool_call_id),
                one_line(&call.tool_name)
            ));
            out.push_str(&format!(
                "    arguments:        {}\n",
                one_line(&call.arguments)
            ));
            match &call.approval_request {
                Some(name) => {
                    out.push_str(&format!("    approval request: {name}\n"));
                    if let Some(requirement) = &call.requirement {
                        out.push_str(&format!(
                            "    policy:           {}\n",
                            one_line(requirement)
                        ));
                    }
                    if !call.votes.is_empty() {
                        out.push_str(&format!(
                            "    votes:            {}\n",
                            one_line(&call.votes.join(", "))
                        ));
                    }
                    match &call.decision {
                        Some(decision) => out.push_str(&format!(
                            "    decision:         {decision} by {} (not yet applied by the controller)\n",
                            one_line(call.approver_id.as_deref().unwrap_or("unknown"))
                        )),
                        None => {
                            let ns = &view.namespace;
                            out.push_str(&format!(
                                "    decide with:      kubectl agentrun approve {name} -n {ns} --reason \"<why>\"\n"
                            ));
                            out.push_str(&format!(
                                "                      kubectl agentrun reject {name} -n {ns} --message \"<told to the model>\" --reason \"<why>\"\n"
                            ));
                        }
                    }
                }
                None => out.push_str("    approval request: (not created yet)\n"),
            }
        }
    }
    if let Some(output) = &view.final_output {
        out.push_str("\nFinal output:\n");
        out.push_str(&indented(output, "    "));
    }
    out
}

/// Runs `show`.
pub async fn show(session: &Session, args: &ShowArgs) -> Result<String, PluginError> {
    let run = session.run(&args.run).await?;
    let state = chunk_store::load(&session.client, &run)
        .await
        .map_err(|source| PluginError::RunState {
            run: args.run.clone(),
            source,
        })?;
    let requests = session.requests_of(&run).await?;
    let view = view(&run, state.as_ref(), &requests);
    if let Some(out) = render_report(&view, args.output, "the run") {
        return out;
    }
    debug_assert!(args.output == OutputFormat::Table);
    Ok(render_text(&view))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AgentRef, AgentRunSpec, AgentRunStatus, ApprovalRequestSpec, Decision};
    use crate::state::DeferredToolCall;

    fn state() -> RunState {
        let mut state = RunState::new("r1", "ops", "Delete user u-1");
        state.messages = vec![
            Value::from(serde_json::json!({"role": "user", "content": "Delete user u-1"})),
            Value::from(
                serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup_user", "arguments": "{\"user_id\":\"u-1\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "delete_user", "arguments": "{\"user_id\":\"u-1\"}"}}
                ]}),
            ),
            Value::from(
                serde_json::json!({"role": "tool", "tool_call_id": "call_1", "content": "found\n\u{1b}[2Jhidden"}),
            ),
        ];
        state
            .deferred_tool_requests
            .approvals
            .push(DeferredToolCall {
                tool_call_id: "call_2".into(),
                tool_name: "delete_user".into(),
                args: Value::from(serde_json::json!({"user_id": "u-1"})),
            });
        state
    }

    fn run() -> AgentRun {
        let mut run = AgentRun::new(
            "r1",
            AgentRunSpec {
                agent_ref: AgentRef { name: "ops".into() },
                input: "Delete user u-1".into(),
                worker: None,
            },
        );
        run.metadata.namespace = Some("team".into());
        run.status = Some(AgentRunStatus {
            phase: Some(crate::crd::AgentRunPhase::AwaitingApproval),
            step: Some(0),
            ..Default::default()
        });
        run
    }

    fn request(decision: Option<Decision>) -> ApprovalRequest {
        let mut r = ApprovalRequest::new(
            "r1-call-2",
            ApprovalRequestSpec {
                tool_call_id: "call_2".into(),
                tool_name: "delete_user".into(),
                arguments: r#"{"user_id": "u-1"}"#.into(),
                decision,
                approver_id: decision.map(|_| "alice@example.com".to_owned()),
                ..Default::default()
            },
        );
        r.spec.agent_run_ref.name = "r1".into();
        r
    }

    #[test]
    fn the_conversation_and_the_pending_call_are_shown() {
        let state = state();
        let view = view(&run(), Some(&state), &[request(None)]);
        assert_eq!(view.pending.len(), 1);
        assert_eq!(
            view.pending[0].approval_request.as_deref(),
            Some("r1-call-2")
        );
        let text = render_text(&view);
        assert!(
            text.contains("Phase:      AwaitingApproval (step 0)"),
            "{text}"
        );
        assert!(text.contains("#1 user\n    Delete user u-1\n"), "{text}");
        assert!(
            text.contains("    -> tool call call_1 lookup_user({\"user_id\":\"u-1\"})\n"),
            "{text}"
        );
        assert!(
            text.contains("-> tool call call_2 delete_user({\"user_id\":\"u-1\"})   [awaiting approval: r1-call-2]"),
            "{text}"
        );
        assert!(
            text.contains(
                "#3 tool result of call_1 lookup_user\n    found\n    \\u{1b}[2Jhidden\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("Pending tool calls (1):\n  call_2  delete_user\n"),
            "{text}"
        );
        assert!(
            text.contains("    arguments:        {\"user_id\": \"u-1\"}\n"),
            "{text}"
        );
        assert!(
            text.contains("kubectl agentrun approve r1-call-2 -n team --reason"),
            "{text}"
        );
        assert!(
            !text.contains('\u{1b}'),
            "escape sequences must not reach the terminal"
        );
    }

    #[test]
    fn a_decision_not_yet_applied_is_shown_as_such() {
        let state = state();
        let view = view(&run(), Some(&state), &[request(Some(Decision::Approved))]);
        let text = render_text(&view);
        assert!(
            text.contains("decision:         Approved by alice@example.com (not yet applied by the controller)"),
            "{text}"
        );
    }

    #[test]
    fn a_run_without_state_shows_its_input() {
        let view = view(&run(), None, &[]);
        let text = render_text(&view);
        assert!(text.contains("Conversation: none yet"), "{text}");
        assert!(text.contains("Input:\n    Delete user u-1\n"), "{text}");
        assert!(text.contains("Pending tool calls: none"), "{text}");
    }

    #[test]
    fn the_json_view_keeps_messages_as_stored() {
        let state = state();
        let view = view(&run(), Some(&state), &[]);
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["messages"][1]["tool_calls"][1]["id"], "call_2");
        assert_eq!(
            json["pending"][0]["approvalRequest"],
            serde_json::Value::Null
        );
        assert_eq!(json["pending"][0]["arguments"], r#"{"user_id": "u-1"}"#);
    }
}
