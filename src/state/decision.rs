//! Decisions on deferred tool calls: [`Approval`] and [`Rejection`], and how
//! [`RunState`] records them.

use chrono::{DateTime, Utc};

use super::timestamp::truncate_to_micros;
use super::{ApprovalMetadata, DeferredToolCall, RejectedTool, RunState};

/// An approval decision: `Approval::new().approver_id("alice").reason("CR-1234").at(ts)`.
///
/// Audit metadata is recorded only when `approver_id` or `reason` is set.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Approval {
    /// Who approved (audit only).
    pub approver_id: Option<String>,
    /// Why (audit only, never shown to the model).
    pub reason: Option<String>,
    /// When; `None`: now.
    pub timestamp: Option<DateTime<Utc>>,
}

/// A rejection decision: `Rejection::new().message("not allowed").approver_id("bob").reason("policy")`.
///
/// `message` is what the model is told; `approver_id` and `reason` are audit only and are recorded
/// only when one of them is set.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Rejection {
    /// Shown to the model (`None`: the runner uses [`DEFAULT_REJECTION_MESSAGE`](super::DEFAULT_REJECTION_MESSAGE)).
    pub message: Option<String>,
    /// Who rejected (audit only).
    pub approver_id: Option<String>,
    /// Why (audit only, never shown to the model).
    pub reason: Option<String>,
    /// When; `None`: now.
    pub timestamp: Option<DateTime<Utc>>,
}

impl Approval {
    /// An approval with no audit metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets who approved.
    pub fn approver_id(mut self, approver_id: impl Into<String>) -> Self {
        self.approver_id = Some(approver_id.into());
        self
    }

    /// Sets the audit reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets the decision time (default: now).
    pub fn at(mut self, timestamp: DateTime<Utc>) -> Self {
        self.timestamp = Some(timestamp);
        self
    }
}

impl Rejection {
    /// A rejection with no message and no audit metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the message shown to the model.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Sets who rejected.
    pub fn approver_id(mut self, approver_id: impl Into<String>) -> Self {
        self.approver_id = Some(approver_id.into());
        self
    }

    /// Sets the audit reason.
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Sets the decision time (default: now).
    pub fn at(mut self, timestamp: DateTime<Utc>) -> Self {
        self.timestamp = Some(timestamp);
        self
    }
}

/// Why a decision ([`RunState::approve`] / [`RunState::reject`]) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    /// No deferred approval has this id.
    #[error("tool call `{0}` is not awaiting approval (unknown id)")]
    Unknown(String),
    /// The call was already approved.
    #[error("tool call `{0}` is not awaiting approval (already approved)")]
    AlreadyApproved(String),
    /// The call was already rejected.
    #[error("tool call `{0}` is not awaiting approval (already rejected)")]
    AlreadyRejected(String),
}

impl RunState {
    /// Approves a pending call. Records audit metadata only when `approver_id` or `reason` is given.
    /// `deferred_tool_requests` is left as is.
    pub fn approve(&mut self, tool_call_id: &str, decision: Approval) -> Result<(), DecisionError> {
        self.check_pending(tool_call_id)?;
        self.approved_tools.push(tool_call_id.to_owned());
        self.record(
            tool_call_id,
            decision.approver_id,
            decision.reason,
            decision.timestamp,
        );
        Ok(())
    }

    /// Rejects a pending call, storing its message as given. Records audit metadata only when
    /// `approver_id` or `reason` is given. `deferred_tool_requests` is left as is.
    pub fn reject(&mut self, tool_call_id: &str, decision: Rejection) -> Result<(), DecisionError> {
        self.check_pending(tool_call_id)?;
        self.rejected_tools.push(RejectedTool {
            tool_call_id: tool_call_id.to_owned(),
            message: decision.message,
        });
        self.record(
            tool_call_id,
            decision.approver_id,
            decision.reason,
            decision.timestamp,
        );
        Ok(())
    }

    /// Deferred approvals that are neither approved nor rejected, in order.
    pub fn pending_approvals(&self) -> Vec<&DeferredToolCall> {
        self.deferred_tool_requests
            .approvals
            .iter()
            .filter(|call| {
                !self.is_approved(&call.tool_call_id)
                    && self.rejection(&call.tool_call_id).is_none()
            })
            .collect()
    }

    /// `true` when the call was approved.
    pub fn is_approved(&self, id: &str) -> bool {
        self.approved_tools.iter().any(|a| a == id)
    }

    /// The rejection of the call, if it was rejected.
    pub fn rejection(&self, id: &str) -> Option<&RejectedTool> {
        self.rejected_tools.iter().find(|r| r.tool_call_id == id)
    }

    fn check_pending(&self, id: &str) -> Result<(), DecisionError> {
        if self.is_approved(id) {
            Err(DecisionError::AlreadyApproved(id.to_owned()))
        } else if self.rejection(id).is_some() {
            Err(DecisionError::AlreadyRejected(id.to_owned()))
        } else if !self
            .deferred_tool_requests
            .approvals
            .iter()
            .any(|call| call.tool_call_id == id)
        {
            Err(DecisionError::Unknown(id.to_owned()))
        } else {
            Ok(())
        }
    }

    fn record(
        &mut self,
        id: &str,
        approver_id: Option<String>,
        reason: Option<String>,
        timestamp: Option<DateTime<Utc>>,
    ) {
        if approver_id.is_none() && reason.is_none() {
            return;
        }
        let timestamp = truncate_to_micros(timestamp.unwrap_or_else(Utc::now));
        self.approval_metadata.insert(
            id.to_owned(),
            ApprovalMetadata {
                approver_id,
                reason,
                timestamp,
            },
        );
    }
}
