//! The RunStates too large for an `AgentRun`'s status, offloaded to ConfigMaps owned by the run
//! (`runStateEncoding: gzip+base64+chunks`), and reading a stored state in any form.
//!
//! Chunks are named after the state's digest ([`chunk_name`]), so a new state never overwrites
//! the chunks of the state the status still references; [`prune`] removes the others.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Resource, ResourceExt};

use crate::crd::keys::labels;
use crate::crd::names::{chunk_name, is_chunk_of, run_label_value};
use crate::crd::stored_state::{self, CHUNK_KEY, StoredState, StoredStateError};
use crate::crd::{AgentRun, RunStateEncoding};
use crate::state::RunState;

/// Writes the chunks of `stored` (if any) to ConfigMaps owned by `run`; call before the status
/// patch that references them.
pub async fn write(
    client: &kube::Client,
    run: &AgentRun,
    stored: &StoredState,
) -> Result<(), StoredStateError> {
    if stored.chunks.is_empty() {
        return Ok(());
    }
    let ns = run.namespace().unwrap_or_default();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for (i, chunk) in stored.chunks.iter().enumerate() {
        let map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(chunk_name(&run.name_any(), &stored.digest, i)),
                namespace: Some(ns.clone()),
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
            data: Some([(CHUNK_KEY.to_owned(), chunk.clone())].into()),
            immutable: Some(true),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &map).await {
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
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &run.namespace().unwrap_or_default());
    let mut text = String::new();
    for i in 0..count {
        let name = chunk_name(&run.name_any(), &digest, i);
        let map = api
            .get_opt(&name)
            .await?
            .ok_or_else(|| StoredStateError::Chunk {
                name: name.clone(),
                message: "not found".into(),
            })?;
        let chunk = map
            .data
            .and_then(|mut d| d.remove(CHUNK_KEY))
            .ok_or_else(|| StoredStateError::Chunk {
                name: name.clone(),
                message: format!("has no key {CHUNK_KEY}"),
            })?;
        text.push_str(&chunk);
    }
    stored_state::decode_text(&text, RunStateEncoding::GzipBase64, Some(&digest)).map(Some)
}

/// Deletes the chunk ConfigMaps of `run` that do not belong to `keep_digest` (best effort; the
/// garbage collector removes the rest with the run).
pub async fn prune(client: &kube::Client, run: &AgentRun, keep_digest: &str) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &run.namespace().unwrap_or_default());
    let selector = format!("{}={}", labels::STATE_OF, run_label_value(&run.name_any()));
    let Ok(list) = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await
    else {
        return;
    };
    for map in list {
        let name = map.name_any();
        if !is_chunk_of(&name, keep_digest) {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
}
