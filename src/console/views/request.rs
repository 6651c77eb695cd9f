//! The request page: the call, its arguments and digests, why it needs approval (the
//! ApprovalPolicy rule or the Agent's setting), quorum progress, the decision once made, and the
//! conversation that led to the call.

use askama::Template;
use chrono::{DateTime, Utc};
use kube::ResourceExt;

use super::{Frame, audit_href, pretty, pretty_text, time_left};
use crate::agent::model::{self, ToolArguments};
use crate::console::data::RequestData;
use crate::crd::keys::annotations::DECIDED_BY;
use crate::crd::{
    AgentRun, ApprovalPhase, ApprovalRequest, ApprovalRequestSpec, Decision, arguments_digest,
};
use crate::plugin::show::RunView;
use crate::plugin::text::rfc3339;
use crate::state::pyjson::Value;
use crate::time::try_from_k8s as to_utc;

/// A tool call inside a message.
#[derive(Clone, Debug)]
pub struct CallView {
    /// The model's id of the call.
    pub id: String,
    /// The tool.
    pub name: String,
    /// Its arguments, pretty-printed.
    pub arguments: String,
    /// True for the call this request is about.
    pub current: bool,
}

/// One message of the conversation.
#[derive(Clone, Debug)]
pub struct MessageView {
    /// 1-based position.
    pub number: usize,
    /// `user`, `assistant`, `tool`, `system`, `developer` or `other` (a CSS class: never the
    /// message's own text).
    pub role: String,
    /// A heading, e.g. `tool result of call_1 (lookup_user)`.
    pub heading: String,
    /// The message's text.
    pub text: String,
    /// The tool calls of an assistant message.
    pub calls: Vec<CallView>,
}

/// A decision already made.
#[derive(Clone, Debug)]
pub struct DecisionView {
    /// Approved or Rejected.
    pub decision: String,
    /// The approverId written.
    pub approver_id: String,
    /// The reason (audit only).
    pub reason: Option<String>,
    /// What the model is told (rejections).
    pub message: Option<String>,
    /// Who the API server's admission stamp says decided.
    pub stamped_by: Option<String>,
    /// The controller's verified identity.
    pub verified: Option<String>,
    /// A GitOps origin.
    pub gitops: Option<String>,
    /// When the controller saw the decision.
    pub decided_at: Option<String>,
}

/// The request page.
#[derive(Template)]
#[template(path = "request.html")]
pub struct RequestPage {
    /// The frame.
    pub frame: Frame,
    /// The request's namespace.
    pub namespace: String,
    /// The request's name.
    pub name: String,
    /// Its uid (the decision forms send it back as a precondition).
    pub uid: String,
    /// The run.
    pub run: String,
    /// The run's audit page.
    pub audit_href: String,
    /// The tool.
    pub tool: String,
    /// The model's id of the call.
    pub tool_call_id: String,
    /// The run step that halted.
    pub step: u32,
    /// The arguments pretty-printed (numbers and strings exactly as stored).
    pub arguments_pretty: String,
    /// The arguments exactly as stored (what the digest is of).
    pub arguments_exact: String,
    /// Their SHA-256.
    pub arguments_digest: String,
    /// False when the digest is not the SHA-256 of the arguments (never expected).
    pub digest_ok: bool,
    /// The endpoint the call goes to.
    pub endpoint: String,
    /// The digest of the tool's definition.
    pub definition_digest: String,
    /// Why approval is needed (the ApprovalPolicy rule, else the Agent's setting).
    pub rule: String,
    /// Quorum progress (`1 of 2 approvals`), when the request needs several approvals.
    pub quorum: Option<String>,
    /// The votes cast so far, when it does.
    pub votes: Vec<VoteView>,
    /// Whether the approver may approve edited arguments (a request one person decides).
    pub can_edit: bool,
    /// Who created the run.
    pub requester: String,
    /// When the request was created.
    pub created: String,
    /// Its phase.
    pub phase: String,
    /// When it expires.
    pub expires: String,
    /// Time left.
    pub time_left: String,
    /// The decision, once made.
    pub decision: Option<DecisionView>,
    /// True while a decision can be made.
    pub decidable: bool,
    /// The conversation.
    pub conversation: Vec<MessageView>,
    /// The run's input (shown when there is no conversation yet).
    pub input: String,
    /// Why the run could not be read.
    pub run_note: Option<String>,
    /// The API server's refusal of the last decision.
    pub error: Option<String>,
    /// A notice (e.g. the decision was recorded).
    pub notice: Option<String>,
    /// The reason typed before a refusal.
    pub reason: String,
    /// The message typed before a refusal.
    pub message: String,
    /// The edited arguments typed before a refusal.
    pub edited_arguments: String,
}

/// One vote on a request that needs several approvals.
#[derive(Clone, Debug)]
pub struct VoteView {
    /// The voter's username (the key the admission policy let only them add).
    pub voter: String,
    /// Approved or Rejected.
    pub decision: String,
    /// Their reason.
    pub reason: String,
}

fn arguments(arguments: &ToolArguments) -> String {
    match arguments {
        ToolArguments::Text(text) => pretty_text(text),
        ToolArguments::Value(value) => pretty(value),
    }
}

/// The conversation of `view`, the call `current` marked.
pub fn conversation(view: &RunView, current: &str) -> Vec<MessageView> {
    let mut tool_names = std::collections::HashMap::new();
    view.messages
        .iter()
        .enumerate()
        .map(|(i, message)| {
            let number = i + 1;
            let text = model::content_text(message);
            match model::role(message) {
                Some("assistant") => {
                    let calls = model::tool_calls(message).unwrap_or_default();
                    let calls: Vec<CallView> = calls
                        .into_iter()
                        .map(|call| {
                            tool_names.insert(call.id.clone(), call.name.clone());
                            CallView {
                                current: call.id == current,
                                arguments: arguments(&call.arguments),
                                id: call.id,
                                name: call.name,
                            }
                        })
                        .collect();
                    MessageView {
                        number,
                        role: "assistant".to_owned(),
                        heading: "the model".to_owned(),
                        text,
                        calls,
                    }
                }
                Some("tool") => {
                    let id = message
                        .get("tool_call_id")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_owned();
                    let tool = tool_names.get(&id).cloned().unwrap_or_default();
                    MessageView {
                        number,
                        role: "tool".to_owned(),
                        heading: format!("result of {tool} ({id})"),
                        text,
                        calls: Vec::new(),
                    }
                }
                Some(role) => MessageView {
                    number,
                    role: if matches!(role, "user" | "system" | "developer") {
                        role.to_owned()
                    } else {
                        "other".to_owned()
                    },
                    heading: role.to_owned(),
                    text,
                    calls: Vec::new(),
                },
                None => MessageView {
                    number,
                    role: "other".to_owned(),
                    heading: "not a chat message".to_owned(),
                    text: pretty(message),
                    calls: Vec::new(),
                },
            }
        })
        .collect()
}

/// The ApprovalPolicy rule that decided the call or asked for people, when one applies.
fn policy_rule(spec: &ApprovalRequestSpec) -> Option<String> {
    let policy = spec.policy.as_ref()?;
    let mut text = match (&policy.name, &policy.rule) {
        (Some(name), Some(rule)) => {
            format!("ApprovalPolicy {name}, rule {rule}: {}", policy.action)
        }
        (Some(name), None) => format!("ApprovalPolicy {name}: {}", policy.action),
        (None, _) => return None,
    };
    if spec.is_quorum() {
        text.push_str(&format!(", {} distinct approvals", spec.approvals_needed()));
    }
    if let Some(approvers) = &spec.approvers {
        let who: Vec<String> = approvers
            .groups
            .iter()
            .map(|g| format!("group {g}"))
            .chain(approvers.users.iter().cloned())
            .collect();
        if !who.is_empty() {
            text.push_str(&format!(", approvers: {}", who.join(", ")));
        }
    }
    if let Some(note) = &policy.note {
        text.push_str(&format!(" ({note})"));
    }
    Some(text)
}

/// Why the call needs approval: the tool's rule in the Agent the run is bound to.
fn rule(run: Option<&AgentRun>, tool: &str) -> String {
    let Some(agent) = run
        .and_then(|r| r.status.as_ref())
        .and_then(|s| s.agent.as_ref())
    else {
        return "the run's Agent is not readable here".to_owned();
    };
    let generation = agent
        .generation
        .map(|g| format!(" (generation {g})"))
        .unwrap_or_default();
    match agent
        .spec
        .as_ref()
        .and_then(|s| s.tools.iter().find(|t| t.name == tool))
    {
        Some(spec) => {
            let timeout = spec
                .approval_timeout
                .as_deref()
                .map(|t| format!(", approvalTimeout: {t}"))
                .unwrap_or_default();
            format!(
                "tool {tool} of Agent {}{generation}: requiresApproval: {}{timeout}",
                agent.name, spec.requires_approval
            )
        }
        None => format!(
            "Agent {}{generation} (its tool definitions are not in the run's record)",
            agent.name
        ),
    }
}

fn decision(request: &ApprovalRequest) -> Option<DecisionView> {
    let spec = &request.spec;
    let decision = spec.decision?;
    let status = request.status.as_ref();
    let stamped_by =
        request.annotations().get(DECIDED_BY).map(|stamp| {
            match serde_json::from_str::<serde_json::Value>(stamp) {
                Ok(value) => value["username"]
                    .as_str()
                    .map_or_else(|| stamp.clone(), str::to_owned),
                Err(_) => stamp.clone(),
            }
        });
    Some(DecisionView {
        decision: decision.to_string(),
        approver_id: spec.approver_id.clone().unwrap_or_default(),
        reason: spec.reason.clone(),
        message: spec.message.clone(),
        stamped_by,
        verified: status
            .and_then(|s| s.verified_identity.as_ref())
            .map(|v| v.username.clone()),
        gitops: status.and_then(|s| s.gitops.as_ref()).map(|g| {
            format!(
                "claimed via GitOps commit {}, applied by {}",
                g.commit, g.applied_by.username
            )
        }),
        decided_at: status
            .and_then(|s| s.decided_at.as_ref())
            .and_then(to_utc)
            .as_ref()
            .map(rfc3339),
    })
}

/// The request page of `data`.
pub fn request_page(frame: Frame, data: &RequestData, now: DateTime<Utc>) -> RequestPage {
    let request = &data.request;
    let spec = &request.spec;
    let namespace = request.namespace().unwrap_or_default();
    let status = request.status.as_ref();
    let phase = status.and_then(|s| s.phase);
    let expires = status.and_then(|s| s.expires_at.as_ref()).and_then(to_utc);
    let decided = decision(request);
    let run = data.run.as_ref().ok();
    RequestPage {
        frame,
        audit_href: audit_href(&namespace, &spec.agent_run_ref.name),
        namespace,
        name: request.name_any(),
        uid: request.uid().unwrap_or_default(),
        run: spec.agent_run_ref.name.clone(),
        tool: spec.tool_name.clone(),
        tool_call_id: spec.tool_call_id.clone(),
        step: spec.step,
        arguments_pretty: pretty_text(&spec.arguments),
        arguments_exact: spec.arguments.clone(),
        arguments_digest: spec.arguments_digest.clone(),
        digest_ok: arguments_digest(&spec.arguments) == spec.arguments_digest,
        endpoint: spec
            .tool_endpoint
            .clone()
            .unwrap_or_else(|| "(not recorded)".to_owned()),
        definition_digest: spec
            .tool_definition_digest
            .clone()
            .unwrap_or_else(|| "(not recorded)".to_owned()),
        rule: policy_rule(spec).unwrap_or_else(|| rule(run, &spec.tool_name)),
        quorum: spec.is_quorum().then(|| {
            let approved = spec
                .votes
                .values()
                .filter(|v| v.decision == Decision::Approved)
                .count();
            format!("{approved} of {} approvals", spec.approvals_needed())
        }),
        votes: spec
            .votes
            .iter()
            .map(|(voter, vote)| VoteView {
                voter: voter.clone(),
                decision: vote.decision.to_string(),
                reason: vote.reason.clone().unwrap_or_default(),
            })
            .collect(),
        can_edit: !spec.is_quorum(),
        requester: spec
            .run_creator
            .clone()
            .or_else(|| run.and_then(|r| r.status.as_ref()?.created_by.clone()))
            .unwrap_or_else(|| "-".to_owned()),
        created: request
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(to_utc)
            .as_ref()
            .map(rfc3339)
            .unwrap_or_default(),
        phase: phase.unwrap_or_default().to_string(),
        expires: expires
            .as_ref()
            .map(rfc3339)
            .unwrap_or_else(|| "never".to_owned()),
        time_left: time_left(expires, now),
        decidable: decided.is_none()
            && spec.policy_decision().is_none()
            && !phase.is_some_and(ApprovalPhase::is_final)
            && expires.is_none_or(|e| e > now),
        decision: decided,
        conversation: data
            .view
            .as_ref()
            .map(|v| conversation(v, &spec.tool_call_id))
            .unwrap_or_default(),
        input: data
            .view
            .as_ref()
            .map(|v| v.input.clone())
            .unwrap_or_default(),
        run_note: data.run.as_ref().err().cloned(),
        error: None,
        notice: None,
        reason: String::new(),
        message: String::new(),
        edited_arguments: String::new(),
    }
}
