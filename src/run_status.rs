//! Reading and writing a RunState in an `AgentRun`'s status: the encoding, size and digest that
//! readers (controller, worker, plugin, audit) check before trusting the state.

use sha2::{Digest, Sha256};

use crate::crd::{AgentRunStatus, RunStateEncoding};
use crate::state::{RunState, StateError};

/// Errors reading the RunState stored in a run's status.
#[derive(Debug, thiserror::Error)]
pub enum StoredStateError {
    /// `status.runStateDigest` does not match `status.runState`.
    #[error(
        "status.runState does not match status.runStateDigest (stored {stored}, computed {computed})"
    )]
    DigestMismatch {
        /// The digest in status.
        stored: String,
        /// The digest of the stored text.
        computed: String,
    },
    /// The encoding is not one this build reads.
    #[error("status.runStateEncoding `{0}` is not supported by this build")]
    UnsupportedEncoding(String),
    /// The RunState itself is malformed.
    #[error("status.runState: {0}")]
    Malformed(#[from] StateError),
}

/// The status fields that hold a serialized RunState.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredState {
    /// The serialized state, as stored in `status.runState`.
    pub run_state: String,
    /// `status.runStateEncoding`.
    pub encoding: RunStateEncoding,
    /// `status.runStateBytes`.
    pub bytes: u64,
    /// `status.runStateDigest`: SHA-256 of `run_state`, lowercase hex.
    pub digest: String,
}

impl StoredState {
    /// Serializes `state` for the status (plain JSON, the form the design note asks for).
    pub fn encode(state: &RunState) -> StoredState {
        let run_state = state.to_json();
        StoredState {
            bytes: run_state.len() as u64,
            digest: sha256_hex(run_state.as_bytes()),
            encoding: RunStateEncoding::Json,
            run_state,
        }
    }

    /// The JSON merge-patch fragment of `status` for these fields.
    pub fn status_fields(&self) -> serde_json::Value {
        serde_json::json!({
            "runState": self.run_state,
            "runStateEncoding": self.encoding,
            "runStateBytes": self.bytes,
            "runStateDigest": self.digest,
        })
    }
}

/// The RunState stored in `status`, checked against its digest; `None` before the first step.
pub fn decode(status: &AgentRunStatus) -> Result<Option<RunState>, StoredStateError> {
    let Some(text) = status.run_state.as_deref() else {
        return Ok(None);
    };
    if let Some(stored) = status.run_state_digest.as_deref() {
        let computed = sha256_hex(text.as_bytes());
        if computed != stored {
            return Err(StoredStateError::DigestMismatch {
                stored: stored.to_owned(),
                computed,
            });
        }
    }
    match status.run_state_encoding.unwrap_or(RunStateEncoding::Json) {
        RunStateEncoding::Json => Ok(Some(RunState::from_json(text)?)),
        other => Err(StoredStateError::UnsupportedEncoding(
            other.as_str().to_owned(),
        )),
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_decode_round_trips_and_checks_the_digest() {
        let state = RunState::new("run-1", "ops", "Delete user u-1");
        let stored = StoredState::encode(&state);
        let mut status = AgentRunStatus {
            run_state: Some(stored.run_state.clone()),
            run_state_digest: Some(stored.digest.clone()),
            run_state_bytes: Some(stored.bytes),
            ..Default::default()
        };
        assert_eq!(decode(&status).unwrap(), Some(state));
        status.run_state = Some(stored.run_state.replace("u-1", "u-2"));
        assert!(matches!(
            decode(&status),
            Err(StoredStateError::DigestMismatch { .. })
        ));
    }

    #[test]
    fn malformed_state_is_a_clear_error() {
        let status = AgentRunStatus {
            run_state: Some("{\"messages\": 3}".into()),
            ..Default::default()
        };
        let err = decode(&status).unwrap_err().to_string();
        assert!(err.contains("messages"), "{err}");
    }
}
