//! The `AgentRun` custom resource: one run of an agent, from its input to its final output,
//! including every halt for approval. Its status holds the serialized `RunState`.

use std::str::FromStr;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::CrdError;

/// The longest `spec.input` the API server accepts, in characters.
pub const MAX_INPUT_LENGTH: usize = 32768;
/// The longest `status.runState` the API server accepts, in characters. Larger states must be
/// stored compressed (`runStateEncoding: gzip+base64`); objects are limited to about 1.5 MiB.
pub const MAX_RUN_STATE_LENGTH: usize = 1_572_864;
/// The longest `status.finalOutput` the API server accepts, in characters.
pub const MAX_FINAL_OUTPUT_LENGTH: usize = 262_144;

/// What to run: which agent, with what input, and optionally how its worker Pods look.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "agentrun.dev",
    version = "v1alpha1",
    kind = "AgentRun",
    namespaced,
    shortname = "ar",
    category = "agentrun-all",
    status = "AgentRunStatus",
    derive = "PartialEq",
    derive = "Default",
    label("app.kubernetes.io/part-of", "agentrun"),
    doc = "One run of an agent: it starts from spec.input, halts whenever a tool call needs a person's approval (see ApprovalRequest) and resumes in a new worker Pod once every pending call is decided.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Where the run is in its lifecycle"
    ),
    printcolumn(
        name = "Agent",
        type_ = "string",
        json_path = ".spec.agentRef.name",
        description = "The Agent this run runs"
    ),
    printcolumn(
        name = "Step",
        type_ = "integer",
        json_path = ".status.step",
        description = "The current step (one worker Pod per step)"
    ),
    printcolumn(
        name = "Pending",
        type_ = "integer",
        json_path = ".status.pendingApprovals",
        description = "Approval requests waiting for a decision"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 63").message(
        "an AgentRun name must be at most 63 characters: it is used as a label value on its worker Pods and ApprovalRequests"
    )
)]
#[x_kube(
    validation = Rule::new("has(self.worker) == has(oldSelf.worker)")
        .message("worker is immutable")
        .field_path(".worker"),
)]
#[serde(rename_all = "camelCase")]
pub struct AgentRunSpec {
    /// The Agent (in the run's namespace) whose instructions, model and tools the run uses.
    /// Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("agentRef is immutable"))]
    pub agent_ref: AgentRef,
    /// The user's input: the first message of the conversation. Immutable.
    #[schemars(length(max = MAX_INPUT_LENGTH))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("input is immutable"))]
    pub input: String,
    /// Overrides for the worker Pods that run the steps of this run. Immutable: the run keeps
    /// the image and service account it started with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("worker is immutable"))]
    pub worker: Option<WorkerOverrides>,
}

/// A reference to an Agent in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRef {
    /// The Agent's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Overrides for the worker Pods of a run; unset fields use the controller's defaults.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerOverrides {
    /// The container image that runs `agentrun worker`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,
    /// CPU and memory requests and limits of the worker container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// The service account the worker Pods run as; it needs to read the Agent, its Secret and
    /// this AgentRun, and to patch this AgentRun's status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: Option<String>,
}

/// The observed state of a run, written by the controller and the run's worker Pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRunStatus {
    /// Where the run is: Pending, Running, AwaitingApproval, Succeeded, Failed or Cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<AgentRunPhase>,
    /// The latest observations of the run's state, one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::conditions::conditions_schema")]
    pub conditions: Vec<Condition>,
    /// The metadata.generation the controller last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub observed_generation: Option<i64>,
    /// The run's serialized RunState (the conversation, pending tool calls and audit entries),
    /// encoded as runStateEncoding says. Absent before the first step finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_RUN_STATE_LENGTH))]
    pub run_state: Option<String>,
    /// How runState is encoded: `json` (the default), `gzip+base64` for large states, or
    /// `gzip+base64+chunks` when even that is offloaded to RunStateChunks owned by the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_state_encoding: Option<RunStateEncoding>,
    /// The size of runState in bytes, as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_state_bytes: Option<u64>,
    /// The SHA-256 (lowercase hex) of runState as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub run_state_digest: Option<String>,
    /// The current step: 0 for the first worker Pod, one more after each halt is resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// The agent's final answer, once the run has Succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FINAL_OUTPUT_LENGTH))]
    pub final_output: Option<String>,
    /// How many ApprovalRequests of the current halt are waiting for a decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_approvals: Option<u32>,
    /// The name of the worker Pod of the current step (once the run succeeded, the last one, which
    /// the controller then deletes unless `--delete-worker-pods` keeps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub worker_pod: Option<String>,
    /// When the first worker Pod was started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the run reached Succeeded, Failed or Cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// How many times the current step's worker has been retried after a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// The verified identity (username) of the run's creator, recorded by the controller or an
    /// admission policy; used to keep creators from approving their own runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub created_by: Option<String>,
    /// The tool names (with `*` globs) the ApprovalPolicies selecting the run's namespace have
    /// rules for, written by the controller when it starts a step: the worker halts on their
    /// calls (as on those its Agent requires approval for) so that the controller evaluates them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096), inner(length(max = 128)))]
    pub approval_gates: Vec<String>,
    /// Tool calls a worker started (recorded before each call is sent), for at-most-once
    /// execution: after a crash the next worker does not silently call them again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub tool_calls: Vec<ToolCallRecord>,
    /// The Agent this run is bound to: recorded when the run starts and used by every step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<std::sync::Arc<super::AgentSnapshot>>,
    /// When the RunState is offloaded (encoding `gzip+base64+chunks`), how many RunStateChunks
    /// `<run>-state-<digest prefix>-<i>` hold it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_state_chunks: Option<u32>,
}

/// One tool call a worker sent (or was about to send).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallRecord {
    /// The tool call id, also the `Idempotency-Key` header.
    #[schemars(length(max = 256))]
    pub tool_call_id: String,
    /// The tool's name.
    #[schemars(length(max = 64))]
    pub tool_name: String,
    /// The step whose worker started it.
    pub step: u32,
    /// When the worker recorded the start, just before sending.
    pub started_at: Time,
    /// How many times the call was sent again with the same Idempotency-Key after a worker
    /// stopped before recording its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resent: Option<u32>,
    /// `Unknown` when the tool is not idempotent and a worker stopped after sending it: the call
    /// was not sent again and the model was told its outcome is unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub outcome: Option<String>,
}

/// Where a run is in its lifecycle.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[schemars(transform = super::field_docs_only)]
pub enum AgentRunPhase {
    /// Accepted; no worker Pod has started yet.
    #[default]
    Pending,
    /// A worker Pod is running a step.
    Running,
    /// Halted until every pending ApprovalRequest is decided.
    AwaitingApproval,
    /// Finished with a final output.
    Succeeded,
    /// Failed; a condition says why.
    Failed,
    /// Stopped before it finished.
    Cancelled,
}

impl AgentRun {
    /// Whether the run finished for good (its phase is [terminal](AgentRunPhase::is_terminal)).
    pub fn is_finished(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(AgentRunPhase::is_terminal)
    }
}

impl AgentRunPhase {
    /// The phase as written in `status.phase`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// True for Succeeded, Failed and Cancelled: the run will not change any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            AgentRunPhase::Succeeded | AgentRunPhase::Failed | AgentRunPhase::Cancelled
        )
    }
}

impl FromStr for AgentRunPhase {
    type Err = CrdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        super::parse_value("AgentRun status.phase", s)
    }
}

/// How `status.runState` is encoded.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[schemars(transform = super::field_docs_only)]
pub enum RunStateEncoding {
    /// The RunState's JSON text as is.
    #[default]
    #[serde(rename = "json")]
    #[strum(serialize = "json")]
    Json,
    /// The JSON text gzip-compressed, then base64-encoded (states above 256 KiB).
    #[serde(rename = "gzip+base64")]
    #[strum(serialize = "gzip+base64")]
    GzipBase64,
    /// gzip then base64, too large for the status: split over RunStateChunks owned by the run
    /// (`status.runStateChunks` of them); `runStateDigest` covers the joined text.
    #[serde(rename = "gzip+base64+chunks")]
    #[strum(serialize = "gzip+base64+chunks")]
    GzipBase64Chunks,
}

impl RunStateEncoding {
    /// The encoding as written in `status.runStateEncoding`.
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl FromStr for RunStateEncoding {
    type Err = CrdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        super::parse_value("AgentRun status.runStateEncoding", s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_through_display_serde_and_from_str() {
        for &phase in <AgentRunPhase as strum::VariantArray>::VARIANTS {
            let text = phase.to_string();
            assert_eq!(
                serde_json::to_value(phase).unwrap(),
                serde_json::json!(text)
            );
            assert_eq!(text.parse::<AgentRunPhase>().unwrap(), phase);
        }
        let err = "Done".parse::<AgentRunPhase>().unwrap_err().to_string();
        assert!(
            err.contains("status.phase") && err.contains("Done"),
            "{err}"
        );
        assert!(AgentRunPhase::Failed.is_terminal());
        assert!(!AgentRunPhase::AwaitingApproval.is_terminal());
    }

    #[test]
    fn encodings_round_trip() {
        for enc in [RunStateEncoding::Json, RunStateEncoding::GzipBase64] {
            let text = enc.to_string();
            assert_eq!(serde_json::to_value(enc).unwrap(), serde_json::json!(text));
            assert_eq!(text.parse::<RunStateEncoding>().unwrap(), enc);
        }
        assert!("gzip".parse::<RunStateEncoding>().is_err());
    }

    #[test]
    fn empty_status_serializes_to_an_empty_object() {
        let status = AgentRunStatus::default();
        assert_eq!(
            serde_json::to_value(&status).unwrap(),
            serde_json::json!({})
        );
    }

    #[test]
    fn a_run_reads_from_yaml() {
        let run: AgentRun = serde_yaml_ng::from_str(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata: {name: r1}\nspec:\n  agentRef: {name: ops}\n  input: restart the web tier\n  worker:\n    resources: {limits: {memory: 256Mi}}\n",
        )
        .unwrap();
        assert_eq!(run.spec.agent_ref.name, "ops");
        let limits = run.spec.worker.unwrap().resources.unwrap().limits.unwrap();
        assert_eq!(limits["memory"].0, "256Mi");
    }
}
