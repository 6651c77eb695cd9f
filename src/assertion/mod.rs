//! Signed approval assertions: what a tool receives, with each approved call, to check on its own
//! that a person approved exactly this call.
//!
//! When the controller applies an approval it issues a short-lived JWS (EdDSA over Ed25519,
//! compact serialization, header `typ: agentrun-approval+jwt`, `kid` = RFC 7638 thumbprint)
//! whose [`Claims`] name the run, the call, the tool endpoint (`aud`), the SHA-256 of the exact
//! request body, the verified approver and the decision time. The worker sends it in the
//! [`HEADER`] header. The public keys are published as a [`Jwks`] (a ConfigMap and the
//! controller's `/.well-known/jwks.json`); [`verify`] is the reference check a tool makes.
//!
//! ```
//! use agentrun::assertion::{ApproverKind, Claims, Expected, Jwks, Signer, body_digest, verify};
//!
//! let signer = Signer::generate().unwrap();
//! let body = br#"{"user_id": "u-1"}"#;
//! let endpoint = "https://tools.example.com/delete_user";
//! let claims = Claims {
//!     iss: String::new(), aud: endpoint.into(), iat: 0, nbf: 0, exp: 0,
//!     jti: "7d9f...".into(), namespace: "ops".into(), run: "r1".into(),
//!     run_uid: "0b6c...".into(), step: 0, approval_request: "r1-call-1".into(),
//!     tool_call_id: "call_1".into(), tool: "delete_user".into(), endpoint: endpoint.into(),
//!     arguments_sha256: body_digest(body), original_arguments_sha256: None,
//!     tool_definition_sha256: String::new(),
//!     approver: "alice@example.com".into(), approver_kind: ApproverKind::Verified,
//!     applied_by: None, gitops_commit: None, decided_at: chrono::Utc::now(),
//! }
//! .valid_from(chrono::Utc::now(), std::time::Duration::from_secs(600));
//! let token = signer.sign(&claims).unwrap();
//!
//! let jwks = Jwks::new([signer.jwk()]);
//! let verified = verify(&token, &jwks, &Expected::new(endpoint, body)).unwrap();
//! assert_eq!(verified.approver, "alice@example.com");
//! assert!(verify(&token, &jwks, &Expected::new(endpoint, br#"{"user_id": "u-666"}"#)).is_err());
//! ```

mod claims;
mod error;
mod jwks;
mod provider;
mod signer;
#[cfg(test)]
mod tests;
mod verify;

pub use claims::{ApproverKind, Claims, body_digest};
pub use error::AssertionError;
pub use jwks::{Jwk, Jwks};
pub use signer::{Signer, thumbprint};
pub use verify::{DEFAULT_LEEWAY, Expected, verify, verify_header};

/// The HTTP header that carries the assertion on an approved tool call.
pub const HEADER: &str = "Agentrun-Approval";

/// The `iss` of every assertion.
pub const ISSUER: &str = "agentrun";

/// The JWS header's `typ`: only tokens of this type are approval assertions.
pub const TOKEN_TYPE: &str = "agentrun-approval+jwt";
