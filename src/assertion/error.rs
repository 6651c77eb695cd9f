//! Why an approval assertion could not be made or was refused.

/// Errors of signing and verifying approval assertions. Every refusal says which check failed,
/// so a tool can log it (never the token itself: it is a bearer credential until it expires).
#[derive(Debug, thiserror::Error)]
pub enum AssertionError {
    /// The request carried no `Agentrun-Approval` header.
    #[error("no approval assertion: the request has no {header} header")]
    Missing {
        /// The header's name.
        header: &'static str,
    },
    /// The token is not a compact JWS with the assertion's claims (bad base64, bad JSON, a claim
    /// missing or of the wrong type).
    #[error("malformed approval assertion: {0}")]
    Malformed(String),
    /// The header names another algorithm than `EdDSA`.
    #[error("approval assertion signed with `{0}`; only EdDSA is accepted")]
    WrongAlgorithm(String),
    /// The header's `typ` is not `agentrun-approval+jwt` (another kind of token).
    #[error("approval assertion has typ {found:?}, not `{expected}`")]
    WrongType {
        /// The `typ` the assertion must have.
        expected: &'static str,
        /// The `typ` it has.
        found: Option<String>,
    },
    /// The header has no `kid`.
    #[error("approval assertion names no key (kid)")]
    MissingKeyId,
    /// The `kid` is not among the published keys (forged, or signed by a key removed since).
    #[error("approval assertion signed by unknown key `{0}`")]
    UnknownKey(String),
    /// The signature does not verify with the published key.
    #[error("approval assertion signature is invalid")]
    BadSignature,
    /// `exp` is past (beyond the leeway).
    #[error("approval assertion expired")]
    Expired,
    /// `nbf` is in the future (beyond the leeway).
    #[error("approval assertion not valid yet")]
    NotYetValid,
    /// `iss` is not `agentrun`.
    #[error("approval assertion has the wrong issuer")]
    WrongIssuer,
    /// `aud` is not the endpoint this tool serves.
    #[error("approval assertion is for another endpoint, not `{expected}`")]
    WrongAudience {
        /// The endpoint the tool serves.
        expected: String,
    },
    /// The `endpoint` claim differs from `aud`.
    #[error("approval assertion's endpoint claim `{endpoint}` differs from its audience `{aud}`")]
    EndpointMismatch {
        /// The `endpoint` claim.
        endpoint: String,
        /// The `aud` claim.
        aud: String,
    },
    /// The SHA-256 of the received body is not the approved arguments' digest.
    #[error(
        "the request body (sha256 {received}) is not the approved arguments (sha256 {approved})"
    )]
    ArgumentsMismatch {
        /// The digest of the body received.
        received: String,
        /// The digest in the assertion.
        approved: String,
    },
    /// A key could not be read (not Ed25519, not PKCS#8, bad PEM, wrong length).
    #[error("invalid Ed25519 key: {0}")]
    InvalidKey(String),
    /// A JWKS document could not be read.
    #[error("invalid JWKS: {0}")]
    InvalidJwks(String),
    /// Signing failed.
    #[error("signing the approval assertion: {0}")]
    Signing(String),
}

impl AssertionError {
    /// A short, stable label of the error for metrics and logs (`bad_signature`, `expired`, ...).
    pub fn label(&self) -> &'static str {
        match self {
            AssertionError::Missing { .. } => "missing",
            AssertionError::Malformed(_) => "malformed",
            AssertionError::WrongAlgorithm(_) => "wrong_algorithm",
            AssertionError::WrongType { .. } => "wrong_type",
            AssertionError::MissingKeyId => "missing_kid",
            AssertionError::UnknownKey(_) => "unknown_key",
            AssertionError::BadSignature => "bad_signature",
            AssertionError::Expired => "expired",
            AssertionError::NotYetValid => "not_yet_valid",
            AssertionError::WrongIssuer => "wrong_issuer",
            AssertionError::WrongAudience { .. } => "wrong_audience",
            AssertionError::EndpointMismatch { .. } => "endpoint_mismatch",
            AssertionError::ArgumentsMismatch { .. } => "arguments_mismatch",
            AssertionError::InvalidKey(_) => "invalid_key",
            AssertionError::InvalidJwks(_) => "invalid_jwks",
            AssertionError::Signing(_) => "signing",
        }
    }
}
