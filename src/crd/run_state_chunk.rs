//! The `RunStateChunk` custom resource: one piece of a RunState too large for its run's status
//! (`runStateEncoding: gzip+base64+chunks`). A resource of its own, so that a run's worker needs no
//! rights on the namespace's ConfigMaps; named after the state's digest and immutable, so a new
//! state never overwrites the chunks of the state the status still references.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// The most characters of one chunk.
pub const MAX_CHUNK_LENGTH: usize = 921_600;

/// A piece of an offloaded RunState.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "agentrun.dev",
    version = "v1alpha1",
    kind = "RunStateChunk",
    namespaced,
    category = "agentrun-all",
    derive = "PartialEq",
    derive = "Default",
    label("app.kubernetes.io/part-of", "agentrun"),
    doc = "One piece of an AgentRun's RunState too large for the run's status, owned by the run. The run's status.runStateDigest covers the joined pieces. Immutable."
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("a RunStateChunk is immutable"))]
#[serde(rename_all = "camelCase")]
pub struct RunStateChunkSpec {
    /// The run's name.
    #[schemars(length(min = 1, max = 253))]
    pub run: String,
    /// The SHA-256 (lowercase hex) of the joined stored text this chunk is part of.
    #[schemars(length(equal = 64), regex(pattern = r"^[0-9a-f]{64}$"))]
    pub digest: String,
    /// The chunk's position, from 0.
    pub index: u32,
    /// The chunk's text (base64).
    #[schemars(length(max = MAX_CHUNK_LENGTH))]
    pub data: String,
}
