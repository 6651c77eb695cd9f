//! Builders of the resources for unit tests: `AgentRun::test().in_phase(Some(Running)).at_step(2)`.

use super::{
    Agent, AgentRef, AgentRun, AgentRunPhase, AgentRunRef, AgentRunSpec, AgentRunStatus, AgentSpec,
    ApprovalRequest, ApprovalRequestSpec, ApprovalRequestStatus, Decision, approval_request_name,
    arguments_digest,
};
use crate::state::{DeferredToolCall, DeferredToolRequests, RunState, pyjson};

impl AgentRun {
    /// Run `r1` in namespace `ns` (uid `uid-1`) of Agent `ops` on "Delete user u-1", no status.
    pub fn test() -> AgentRun {
        let mut run = AgentRun::new(
            "r1",
            AgentRunSpec {
                agent_ref: AgentRef { name: "ops".into() },
                input: "Delete user u-1".into(),
                worker: None,
            },
        );
        run.metadata.namespace = Some("ns".into());
        run.metadata.uid = Some("uid-1".into());
        run
    }

    /// In this namespace.
    pub fn in_namespace(mut self, ns: &str) -> AgentRun {
        self.metadata.namespace = Some(ns.into());
        self
    }

    /// With this uid.
    pub fn with_uid(mut self, uid: &str) -> AgentRun {
        self.metadata.uid = Some(uid.into());
        self
    }

    /// With this resourceVersion.
    pub fn with_resource_version(mut self, rv: &str) -> AgentRun {
        self.metadata.resource_version = Some(rv.into());
        self
    }

    /// With this `status.phase` (a status is added).
    pub fn in_phase(mut self, phase: Option<AgentRunPhase>) -> AgentRun {
        self.status_mut().phase = phase;
        self
    }

    /// With this `status.step`.
    pub fn at_step(mut self, step: u32) -> AgentRun {
        self.status_mut().step = Some(step);
        self
    }

    /// With this `status.retries`.
    pub fn with_retries(mut self, retries: u32) -> AgentRun {
        self.status_mut().retries = Some(retries);
        self
    }

    /// With this `status.pendingApprovals`.
    pub fn with_pending(mut self, pending: u32) -> AgentRun {
        self.status_mut().pending_approvals = Some(pending);
        self
    }

    fn status_mut(&mut self) -> &mut AgentRunStatus {
        self.status.get_or_insert_with(Default::default)
    }
}

impl Agent {
    /// Agent `ops` in namespace `ns` (generation 1) with one tool, `delete_user`, that needs
    /// approval.
    pub fn test() -> Agent {
        let spec: AgentSpec = serde_yaml_ng::from_str(
            r#"
instructions: Help.
model: {name: m, baseUrl: "http://127.0.0.1:1/v1"}
tools:
  - {name: delete_user, description: d, requiresApproval: true, http: {url: "http://127.0.0.1:2/d"}}
"#,
        )
        .expect("the fixture spec parses");
        let mut agent = Agent::new("ops", spec);
        agent.metadata.namespace = Some("ns".into());
        agent.metadata.generation = Some(1);
        agent
    }
}

/// The state of run `r1` (uid `uid-1`) halted on one call the model made, `call_1` of
/// `delete_user` with `{"user_id": "u-1"}`.
pub fn halted_state() -> RunState {
    let mut state = RunState::new("uid-1", "ops", "Delete user u-1");
    state.messages = vec![
        pyjson::Value::from(serde_json::json!({"role": "user", "content": "Delete user u-1"})),
        pyjson::Value::from(serde_json::json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "delete_user", "arguments": "{\"user_id\": \"u-1\"}"}}]
        })),
    ];
    state.deferred_tool_requests = DeferredToolRequests {
        calls: vec![],
        approvals: vec![DeferredToolCall {
            tool_call_id: "call_1".into(),
            tool_name: "delete_user".into(),
            args: pyjson::loads(r#"{"user_id": "u-1"}"#).expect("valid JSON"),
        }],
    };
    state
}

impl ApprovalRequest {
    /// The request of run `r1` (uid `uid-1`) at step 0 for the state's first pending call, with
    /// `decision` by alice@example.com for CR-1234 (stamped by the admission policy), status
    /// Pending.
    pub fn test_for(state: &RunState, decision: Option<Decision>) -> ApprovalRequest {
        let call = &state.deferred_tool_requests.approvals[0];
        let arguments = call.arguments_json();
        let agent = Agent::test();
        let tool = &agent.spec.tools[0];
        let mut request = ApprovalRequest::new(
            &approval_request_name("r1", &call.tool_call_id),
            ApprovalRequestSpec {
                agent_run_ref: AgentRunRef {
                    name: "r1".into(),
                    uid: "uid-1".into(),
                },
                step: 0,
                tool_call_id: call.tool_call_id.clone(),
                tool_name: call.tool_name.clone(),
                arguments_digest: arguments_digest(&arguments),
                arguments,
                tool_endpoint: Some(tool.endpoint().to_owned()),
                tool_definition_digest: Some(tool.definition_digest()),
                decision,
                approver_id: decision.map(|_| "alice@example.com".into()),
                reason: decision.map(|_| "CR-1234".into()),
                ..Default::default()
            },
        );
        request.metadata.namespace = Some("ns".into());
        if decision.is_some() {
            request.metadata.annotations = Some(
                [(
                    super::keys::annotations::DECIDED_BY.to_owned(),
                    r#"{"username":"alice@example.com","uid":"","groups":["agentrun:approvers"]}"#
                        .to_owned(),
                )]
                .into(),
            );
        }
        request.status = Some(ApprovalRequestStatus::default());
        request
    }
}
