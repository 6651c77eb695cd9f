//! The condition types, condition reasons and Event reasons agentrun writes, each defined once.
//! Their strings are part of the API: scripts and alerts match on them.

use strum::{AsRefStr, Display, EnumString, IntoStaticStr};

/// A condition type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, AsRefStr, Display, EnumString, IntoStaticStr)]
pub enum ConditionType {
    /// The summary of a run (False with the phase's reason until it Succeeded) or of an Agent
    /// (whether runs can use it).
    Ready,
    /// A tool call's outcome is unknown (a stopped worker may have sent a non-idempotent call).
    ToolOutcomeUnknown,
    /// Whether an ApprovalRequest's decision was verified (False when it was refused).
    Verified,
    /// Whether every MCP server of an Agent answered its last `tools/list`.
    ToolsDiscovered,
    /// An approved call was not sent: its MCP server changed the tool's definition since the
    /// run started (the call was superseded).
    ToolDefinitionChanged,
}

/// The reason of a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, AsRefStr, Display, EnumString, IntoStaticStr)]
pub enum Reason {
    /// A worker Pod runs a step.
    Running,
    /// The run waits for decisions on its ApprovalRequests.
    AwaitingApproval,
    /// The run finished.
    Succeeded,
    /// A step's worker failed more often than retries allow.
    WorkerFailed,
    /// The run's stored state cannot be read or is inconsistent.
    InvalidRunState,
    /// A worker exited successfully but its state neither finished nor awaits approval.
    NoResult,
    /// The run's Agent does not exist.
    AgentNotFound,
    /// A call whose outcome is unknown was not sent again.
    NotResent,
    /// An Agent's spec can be run.
    Valid,
    /// An Agent's spec cannot be run.
    InvalidSpec,
    /// The RunState's copy of the decisions, or a call's arguments, differ from the
    /// ApprovalRequests: nothing was sent.
    TamperedState,
    /// A decision was not applied: nothing verifies who made it.
    UnverifiedDecision,
    /// A decision was not applied: the approver may not decide this run.
    SeparationOfDuties,
    /// A decision was not applied: the ApprovalPolicy rule restricts who may decide the call, and
    /// the approver is not among them.
    NotAnApprover,
    /// An ApprovalPolicy's rules all compiled.
    Compiled,
    /// An ApprovalPolicy has a rule whose tools or condition do not compile.
    CompileError,
    /// Every MCP server of an Agent listed its tools.
    Discovered,
    /// Some MCP server of an Agent could not be listed.
    DiscoveryFailed,
    /// An MCP server defines a tool otherwise than when the run started: calls of it are not
    /// sent.
    DefinitionChanged,
}

/// The reason of an Event the controller publishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, AsRefStr, Display, EnumString, IntoStaticStr)]
pub enum EventReason {
    /// A worker Pod was started for a step (not for a resume: its decisions announce it).
    WorkerStarted,
    /// A tool call awaits a decision.
    ApprovalRequested,
    /// A person approved a call.
    Approved,
    /// A person rejected a call.
    Rejected,
    /// Nobody decided a call in time.
    Expired,
    /// A decision was refused because its request no longer matched the call.
    Superseded,
    /// The run finished.
    Succeeded,
    /// The run failed for good.
    Failed,
    /// The run's Agent does not exist.
    AgentNotFound,
    /// A call's outcome is unknown and it was not sent again.
    ToolOutcomeUnknown,
    /// The RunState or a call differs from what was approved: the run failed.
    TamperedState,
    /// A decision was not applied (unverified, against separation of duties, or by someone the
    /// policy does not allow).
    DecisionRefused,
    /// An ApprovalPolicy decided a call (Allow or Deny) without a person.
    PolicyDecided,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_their_variant_names() {
        assert_eq!(Reason::AwaitingApproval.as_ref(), "AwaitingApproval");
        assert_eq!(
            "AgentNotFound".parse::<Reason>().unwrap(),
            Reason::AgentNotFound
        );
        assert_eq!(EventReason::WorkerStarted.to_string(), "WorkerStarted");
        assert_eq!(
            ConditionType::ToolOutcomeUnknown.as_ref(),
            "ToolOutcomeUnknown"
        );
    }
}
