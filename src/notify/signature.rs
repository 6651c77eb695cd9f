//! Signing the requests that deliver events, so that a receiver can tell them from forgeries: the
//! [Standard Webhooks](https://www.standardwebhooks.com/) scheme, HMAC-SHA256 with a shared key.
//!
//! Each request carries three headers:
//!
//! - `webhook-id`: the event's id (the CloudEvents `id`; the same on every attempt);
//! - `webhook-timestamp`: the attempt's time, Unix seconds;
//! - `webhook-signature`: `v1,<base64 of HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`.
//!
//! The signed content binds the body's exact bytes to the event id and the time, so a receiver
//! that checks the signature and the timestamp (a few minutes of tolerance) refuses altered
//! bodies, forged events and old replays; deduplicating by `webhook-id` drops the repeats that
//! at-least-once delivery makes. The key is a Secret's value: `whsec_<base64>` as Standard Webhooks
//! libraries make them (the decoded bytes are the key), or else the value's bytes as they are.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ring::hmac;

/// The header with the event id.
pub const ID_HEADER: &str = "webhook-id";
/// The header with the attempt's Unix time in seconds.
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
/// The header with the signature(s).
pub const SIGNATURE_HEADER: &str = "webhook-signature";
/// The prefix of a key in the Standard Webhooks format.
pub const KEY_PREFIX: &str = "whsec_";
/// The shortest key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 16;
/// How far a request's timestamp may be from the receiver's clock by default, in seconds.
pub const DEFAULT_TOLERANCE_SECONDS: i64 = 300;

/// Why a key is unusable or a request's signature does not verify.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignatureError {
    /// A `whsec_` key whose rest is not base64.
    #[error("the key starts with whsec_ but the rest is not base64")]
    KeyEncoding,
    /// The key is too short.
    #[error("the key has {0} bytes; at least {MIN_KEY_BYTES} are needed")]
    KeyTooShort(usize),
    /// A header is missing.
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    /// The timestamp is not a number of seconds.
    #[error("the webhook-timestamp header is not a Unix time in seconds")]
    BadTimestamp,
    /// The timestamp is too far from now.
    #[error("the request's timestamp is {0} s away from now")]
    Stale(i64),
    /// No signature of the header matches.
    #[error("no signature matches the id, timestamp and body")]
    Mismatch,
}

/// An HMAC-SHA256 key that signs and verifies requests.
#[derive(Clone)]
pub struct SigningKey(hmac::Key);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

impl SigningKey {
    /// The key a Secret's value holds: `whsec_<base64>` (the decoded bytes), or the bytes as
    /// they are. Surrounding whitespace (a trailing newline from `echo`) is ignored.
    pub fn from_secret(value: &[u8]) -> Result<SigningKey, SignatureError> {
        let text = value.trim_ascii();
        let key = match text.strip_prefix(KEY_PREFIX.as_bytes()) {
            Some(encoded) => STANDARD
                .decode(encoded)
                .map_err(|_| SignatureError::KeyEncoding)?,
            None => text.to_vec(),
        };
        if key.len() < MIN_KEY_BYTES {
            return Err(SignatureError::KeyTooShort(key.len()));
        }
        Ok(SigningKey(hmac::Key::new(hmac::HMAC_SHA256, &key)))
    }

    /// The `webhook-signature` value for this id, timestamp and body.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let tag = hmac::sign(&self.0, &signed_content(id, timestamp, body));
        format!("v1,{}", STANDARD.encode(tag.as_ref()))
    }

    /// Checks a request's headers against its body: the timestamp within `tolerance_seconds` of
    /// `now` (Unix seconds) and one of the space-separated `v1,` signatures matching (compared
    /// in constant time).
    pub fn verify(
        &self,
        id: Option<&str>,
        timestamp: Option<&str>,
        signatures: Option<&str>,
        body: &[u8],
        now: i64,
        tolerance_seconds: i64,
    ) -> Result<(), SignatureError> {
        let id = id.ok_or(SignatureError::MissingHeader(ID_HEADER))?;
        let timestamp = timestamp.ok_or(SignatureError::MissingHeader(TIMESTAMP_HEADER))?;
        let signatures = signatures.ok_or(SignatureError::MissingHeader(SIGNATURE_HEADER))?;
        let timestamp: i64 = timestamp
            .trim()
            .parse()
            .map_err(|_| SignatureError::BadTimestamp)?;
        let skew = now.saturating_sub(timestamp);
        if skew.abs() > tolerance_seconds {
            return Err(SignatureError::Stale(skew));
        }
        let content = signed_content(id, timestamp, body);
        let matches = signatures
            .split_whitespace()
            .filter_map(|s| s.strip_prefix("v1,"))
            .filter_map(|s| STANDARD.decode(s).ok())
            .any(|tag| hmac::verify(&self.0, &content, &tag).is_ok());
        if matches {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }
}

/// `<id>.<timestamp>.<body>`, what the signature covers.
fn signed_content(id: &str, timestamp: i64, body: &[u8]) -> Vec<u8> {
    let mut content = format!("{id}.{timestamp}.").into_bytes();
    content.extend_from_slice(body);
    content
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test vector of the Standard Webhooks specification.
    const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const TIMESTAMP: i64 = 1_614_265_330;
    const BODY: &str = r#"{"test": 2432232314}"#;
    const SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn signs_the_standard_webhooks_test_vector() {
        let key = SigningKey::from_secret(KEY.as_bytes()).unwrap();
        assert_eq!(key.sign(ID, TIMESTAMP, BODY.as_bytes()), SIGNATURE);
        let verify = |id: &str, ts: &str, sig: &str, body: &str, now: i64| {
            key.verify(Some(id), Some(ts), Some(sig), body.as_bytes(), now, 300)
        };
        let ts = TIMESTAMP.to_string();
        assert_eq!(verify(ID, &ts, SIGNATURE, BODY, TIMESTAMP + 10), Ok(()));
        assert_eq!(
            verify(
                ID,
                &ts,
                &format!("v1,bm90IGl0 {SIGNATURE}"),
                BODY,
                TIMESTAMP
            ),
            Ok(()),
            "any of several signatures (key rotation)"
        );
        assert_eq!(
            verify(ID, &ts, SIGNATURE, r#"{"test": 2432232315}"#, TIMESTAMP),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify("msg_other", &ts, SIGNATURE, BODY, TIMESTAMP),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(ID, &ts, SIGNATURE, BODY, TIMESTAMP + 301),
            Err(SignatureError::Stale(301))
        );
        assert_eq!(
            verify(ID, "yesterday", SIGNATURE, BODY, TIMESTAMP),
            Err(SignatureError::BadTimestamp)
        );
        assert_eq!(
            key.verify(
                None,
                Some(&ts),
                Some(SIGNATURE),
                BODY.as_bytes(),
                TIMESTAMP,
                300
            ),
            Err(SignatureError::MissingHeader(ID_HEADER))
        );
        let other = SigningKey::from_secret(b"another key of enough bytes").unwrap();
        assert_eq!(
            other.verify(
                Some(ID),
                Some(&ts),
                Some(SIGNATURE),
                BODY.as_bytes(),
                TIMESTAMP,
                300
            ),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn keys_are_whsec_base64_or_raw_and_long_enough() {
        assert!(SigningKey::from_secret(b"  a raw key of 24 bytes..\n").is_ok());
        assert_eq!(
            SigningKey::from_secret(b"short").unwrap_err(),
            SignatureError::KeyTooShort(5)
        );
        assert_eq!(
            SigningKey::from_secret(b"whsec_!!!").unwrap_err(),
            SignatureError::KeyEncoding
        );
        assert_eq!(
            SigningKey::from_secret(b"whsec_c2hvcnQ=").unwrap_err(),
            SignatureError::KeyTooShort(5)
        );
    }
}
