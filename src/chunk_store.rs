//! The RunStates too large for an `AgentRun`'s status, offloaded to RunStateChunks owned by the
//! run (`runStateEncoding: gzip+base64+chunks`), and reading a stored state in any form.
//!
//! Chunks are named after the state's digest ([`chunk_name`]), so a new state never overwrites
//! the chunks of the state the status still references; [`prune`] removes the others.

use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};

use crate::crd::keys::labels;
use crate::crd::names::{chunk_name, is_chunk_of, run_label_value};
use crate::crd::stored_state::{self, StoredState, StoredStateError};
use crate::crd::{AgentRun, RunStateChunk, RunStateChunkSpec, RunStateEncoding};
use crate::state::RunState;

fn chunks(client: &kube::Client, run: &AgentRun) -> Api<RunStateChunk> {
    Api::namespaced(client.clone(), &run.namespace().unwrap_or_default())
}

/// Writes the chunks of `stored` (if any), owned by `run`; call before the status patch that
/// references them.
pub async fn write(
    client: &kube::Client,
    run: &AgentRun,
    stored: &StoredState,
) -> Result<(), StoredStateError> {
    let api = chunks(client, run);
    for (i, data) in stored.chunks.iter().enumerate() {
        let chunk = RunStateChunk {
            metadata: ObjectMeta {
                name: Some(chunk_name(&run.name_any(), &stored.digest, i)),
                namespace: run.namespace(),
                labels: Some(
                    [(
                        labels::STATE_OF.to_owned(),
                        run_label_value(&run.name_any()),
                    )]
                    .into(),
                ),
                owner_references: run.controller_owner_ref(&()).map(|o| vec![o]),
                ..Default::default()
            },
            spec: RunStateChunkSpec {
                run: run.name_any(),
                digest: stored.digest.clone(),
                index: i as u32,
                data: data.clone(),
            },
        };
        match api.create(&PostParams::default(), &chunk).await {
            Ok(_) => {}
            // Content-addressed: an existing chunk of this digest already holds this text.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// The RunState of a run in any stored form, reading offloaded chunks through the API; `None`
/// before the first step.
pub async fn load(
    client: &kube::Client,
    run: &AgentRun,
) -> Result<Option<RunState>, StoredStateError> {
    let status = run.status.clone().unwrap_or_default();
    if status.run_state_encoding != Some(RunStateEncoding::GzipBase64Chunks) {
        return stored_state::decode(&status);
    }
    let digest = status.run_state_digest.clone().unwrap_or_default();
    let count = status.run_state_chunks.unwrap_or(0) as usize;
    let api = chunks(client, run);
    let mut text = String::new();
    for i in 0..count {
        let name = chunk_name(&run.name_any(), &digest, i);
        let chunk = api
            .get_opt(&name)
            .await?
            .ok_or_else(|| StoredStateError::Chunk {
                name: name.clone(),
                message: "not found".into(),
            })?;
        if chunk.spec.index as usize != i {
            return Err(StoredStateError::Chunk {
                name,
                message: format!("holds piece {}, not {i}", chunk.spec.index),
            });
        }
        text.push_str(&chunk.spec.data);
    }
    stored_state::decode_text(&text, RunStateEncoding::GzipBase64, Some(&digest)).map(Some)
}

/// Deletes the chunks of `run` that do not belong to `keep_digest` (best effort; the garbage
/// collector removes the rest with the run).
pub async fn prune(client: &kube::Client, run: &AgentRun, keep_digest: &str) {
    let api = chunks(client, run);
    let selector = format!("{}={}", labels::STATE_OF, run_label_value(&run.name_any()));
    let Ok(list) = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
    else {
        return;
    };
    for chunk in list {
        let name = chunk.name_any();
        if !is_chunk_of(&name, keep_digest) {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
}
