//! The codec of a RunState stored in an `AgentRun`'s status: the encoding, size and digest that
//! readers (controller, worker, plugin, audit) check before trusting the state. Pure: reading and
//! writing offloaded chunks through the API is the chunk store's.
//!
//! Small states are stored as plain JSON, as the design asks. Above [`COMPRESS_ABOVE`] bytes the
//! JSON is gzip-compressed and base64-encoded (`runStateEncoding: gzip+base64`); when even that is
//! larger than [`INLINE_LIMIT`], it is split over RunStateChunks owned by the run
//! (`gzip+base64+chunks`, `runStateChunks` of them) named after the digest, so a new state never
//! overwrites the chunks of the state still referenced by the status. `runStateDigest` always
//! covers the stored text (joined, for chunks).

use std::io::{Read, Write};

use base64::Engine;
use sha2::{Digest, Sha256};

use super::status_patch::AgentRunStatusPatch;
use super::{AgentRunStatus, RunStateEncoding};
use crate::state::{RunState, StateError};

/// States whose JSON is larger than this are stored compressed.
pub const COMPRESS_ABOVE: usize = 256 * 1024;
/// Compressed states larger than this are offloaded to RunStateChunks.
pub const INLINE_LIMIT: usize = 1024 * 1024;
/// The size of one offloaded chunk (a RunStateChunk holds at most this much).
pub const CHUNK_SIZE: usize = 900 * 1024;
/// The largest decompressed state accepted (a guard against decompression bombs).
pub const MAX_STATE_BYTES: u64 = 256 * 1024 * 1024;

/// Errors reading or writing the RunState stored for a run.
#[derive(Debug, thiserror::Error)]
pub enum StoredStateError {
    /// `status.runStateDigest` does not match the stored text.
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
    /// The stored text is not valid for its encoding.
    #[error("status.runState is not valid {encoding}: {message}")]
    BadEncoding {
        /// The encoding.
        encoding: &'static str,
        /// What is wrong.
        message: String,
    },
    /// Offloaded chunks are missing or unreadable.
    #[error("the RunState chunk {name}: {message}")]
    Chunk {
        /// The RunStateChunk.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Reading the chunks needs the API and this reader has none.
    #[error("the RunState is offloaded to RunStateChunks; read it with an API client")]
    NeedsClient,
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The RunState itself is malformed.
    #[error("status.runState: {0}")]
    Malformed(#[from] StateError),
}

/// A RunState encoded for storage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredState {
    /// The text for `status.runState` (`None` when offloaded to chunks).
    pub run_state: Option<String>,
    /// The chunks to store in RunStateChunks (empty unless offloaded).
    pub chunks: Vec<String>,
    /// `status.runStateEncoding`.
    pub encoding: RunStateEncoding,
    /// `status.runStateBytes`: the size of the stored text.
    pub bytes: u64,
    /// `status.runStateDigest`: SHA-256 of the stored text, lowercase hex.
    pub digest: String,
}

impl StoredState {
    /// Serializes `state`: plain JSON when small, compressed above [`COMPRESS_ABOVE`], chunked
    /// above [`INLINE_LIMIT`].
    pub fn encode(state: &RunState) -> StoredState {
        Self::encode_with(state, COMPRESS_ABOVE, INLINE_LIMIT)
    }

    /// [`StoredState::encode`] with explicit thresholds (for tests).
    pub fn encode_with(
        state: &RunState,
        compress_above: usize,
        inline_limit: usize,
    ) -> StoredState {
        let json = state.to_json();
        if json.len() <= compress_above {
            return StoredState {
                bytes: json.len() as u64,
                digest: sha256_hex(json.as_bytes()),
                encoding: RunStateEncoding::Json,
                run_state: Some(json),
                chunks: vec![],
            };
        }
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder
            .write_all(json.as_bytes())
            .and_then(|()| encoder.flush())
            .expect("writing to memory does not fail");
        let compressed = encoder.finish().expect("writing to memory does not fail");
        let text = base64::engine::general_purpose::STANDARD.encode(compressed);
        let digest = sha256_hex(text.as_bytes());
        let bytes = text.len() as u64;
        if text.len() <= inline_limit {
            return StoredState {
                run_state: Some(text),
                chunks: vec![],
                encoding: RunStateEncoding::GzipBase64,
                bytes,
                digest,
            };
        }
        // base64 is ASCII, so byte offsets are char boundaries.
        let chunks = text
            .as_bytes()
            .chunks(CHUNK_SIZE)
            .map(|c| String::from_utf8(c.to_vec()).expect("base64 is ASCII"))
            .collect();
        StoredState {
            run_state: None,
            chunks,
            encoding: RunStateEncoding::GzipBase64Chunks,
            bytes,
            digest,
        }
    }

    /// The status patch storing this state (`runState` removed when the new one is offloaded,
    /// `runStateChunks` removed when it is not).
    pub fn status_patch(&self) -> AgentRunStatusPatch {
        AgentRunStatusPatch {
            run_state: Some(self.run_state.clone()),
            run_state_encoding: Some(self.encoding),
            run_state_bytes: Some(self.bytes),
            run_state_digest: Some(self.digest.clone()),
            run_state_chunks: Some((!self.chunks.is_empty()).then_some(self.chunks.len() as u32)),
            ..Default::default()
        }
    }
}

/// The RunState stored in `status`, checked against its digest; `None` before the first step.
/// Offloaded states are read through the chunk store.
pub fn decode(status: &AgentRunStatus) -> Result<Option<RunState>, StoredStateError> {
    match status.run_state_encoding.unwrap_or_default() {
        RunStateEncoding::GzipBase64Chunks => Err(StoredStateError::NeedsClient),
        encoding => match status.run_state.as_deref() {
            None => Ok(None),
            Some(text) => decode_text(text, encoding, status.run_state_digest.as_deref()).map(Some),
        },
    }
}

/// Decodes the stored `text` (for chunks: joined) and checks it against `digest`.
pub fn decode_text(
    text: &str,
    encoding: RunStateEncoding,
    digest: Option<&str>,
) -> Result<RunState, StoredStateError> {
    if let Some(stored) = digest {
        let computed = sha256_hex(text.as_bytes());
        if computed != stored {
            return Err(StoredStateError::DigestMismatch {
                stored: stored.to_owned(),
                computed,
            });
        }
    }
    match encoding {
        RunStateEncoding::Json => Ok(RunState::from_json(text)?),
        RunStateEncoding::GzipBase64 | RunStateEncoding::GzipBase64Chunks => {
            let bad = |message: String| StoredStateError::BadEncoding {
                encoding: "gzip+base64",
                message,
            };
            let compressed = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| bad(format!("base64: {e}")))?;
            let mut json = String::new();
            flate2::read::GzDecoder::new(compressed.as_slice())
                .take(MAX_STATE_BYTES + 1)
                .read_to_string(&mut json)
                .map_err(|e| bad(format!("gzip: {e}")))?;
            if json.len() as u64 > MAX_STATE_BYTES {
                return Err(bad(format!(
                    "decompresses to more than {MAX_STATE_BYTES} bytes"
                )));
            }
            Ok(RunState::from_json(&json)?)
        }
    }
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(stored: &StoredState) -> AgentRunStatus {
        AgentRunStatus {
            run_state: stored.run_state.clone(),
            run_state_encoding: Some(stored.encoding),
            run_state_digest: Some(stored.digest.clone()),
            run_state_bytes: Some(stored.bytes),
            ..Default::default()
        }
    }

    fn big_state(bytes: usize) -> RunState {
        let mut state = RunState::new("run-1", "ops", "summarize");
        let mut seed = 7u64;
        let mut text = String::new();
        while text.len() < bytes {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            text.push_str(&format!("{:x} ", seed >> 20));
        }
        state.final_output = Some(text);
        state
    }

    #[test]
    fn small_states_stay_plain_json() {
        let state = RunState::new("run-1", "ops", "Delete user u-1");
        let stored = StoredState::encode(&state);
        assert_eq!(stored.encoding, RunStateEncoding::Json);
        assert_eq!(stored.run_state.as_deref(), Some(state.to_json().as_str()));
        assert_eq!(decode(&status_of(&stored)).unwrap(), Some(state));
    }

    #[test]
    fn large_states_are_compressed_and_read_back() {
        let state = big_state(400 * 1024);
        let stored = StoredState::encode(&state);
        assert_eq!(stored.encoding, RunStateEncoding::GzipBase64);
        assert!(stored.bytes < 400 * 1024);
        assert_eq!(decode(&status_of(&stored)).unwrap(), Some(state));
    }

    #[test]
    fn states_beyond_compression_are_chunked() {
        let state = big_state(5 * 1024 * 1024);
        let stored = StoredState::encode(&state);
        assert_eq!(stored.encoding, RunStateEncoding::GzipBase64Chunks);
        assert!(stored.run_state.is_none());
        assert!(stored.chunks.len() >= 2);
        assert!(stored.chunks.iter().all(|c| c.len() <= CHUNK_SIZE));
        assert!(matches!(
            decode(&status_of(&stored)),
            Err(StoredStateError::NeedsClient)
        ));
        let joined: String = stored.chunks.concat();
        assert_eq!(
            decode_text(
                &joined,
                RunStateEncoding::GzipBase64Chunks,
                Some(&stored.digest)
            )
            .unwrap(),
            state
        );
    }

    #[test]
    fn tampering_and_bad_encodings_are_clear_errors() {
        let state = RunState::new("run-1", "ops", "Delete user u-1");
        let stored = StoredState::encode(&state);
        let mut status = status_of(&stored);
        status.run_state = Some(stored.run_state.clone().unwrap().replace("u-1", "u-2"));
        assert!(matches!(
            decode(&status),
            Err(StoredStateError::DigestMismatch { .. })
        ));

        let garbage = "not base64 at all!";
        let status = AgentRunStatus {
            run_state: Some(garbage.into()),
            run_state_encoding: Some(RunStateEncoding::GzipBase64),
            ..Default::default()
        };
        let err = decode(&status).unwrap_err().to_string();
        assert!(err.contains("gzip+base64"), "{err}");
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
