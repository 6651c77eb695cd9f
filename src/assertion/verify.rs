//! The tool's side: checking an assertion against the published keys and the call received.

use std::time::Duration;

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

use super::claims::body_digest;
use super::{AssertionError, Claims, HEADER, ISSUER, Jwks, TOKEN_TYPE, provider};

/// Clock skew tolerated on `exp` and `nbf` unless set otherwise.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);

/// What the call a tool received must match.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    /// The endpoint URL the tool serves (the `aud` the assertion must carry), as written in the
    /// Agent's `http.url` after URL normalisation.
    pub endpoint: &'a str,
    /// The exact bytes of the request body received.
    pub body: &'a [u8],
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
}

impl<'a> Expected<'a> {
    /// A call of `endpoint` with `body`, with the default leeway.
    pub fn new(endpoint: &'a str, body: &'a [u8]) -> Expected<'a> {
        Expected {
            endpoint,
            body,
            leeway: DEFAULT_LEEWAY,
        }
    }
}

/// Verifies the value of the [`HEADER`] header of a received call (`None` when absent); see
/// [`verify`].
pub fn verify_header(
    value: Option<&str>,
    jwks: &Jwks,
    expected: &Expected<'_>,
) -> Result<Claims, AssertionError> {
    match value.map(str::trim) {
        None | Some("") => Err(AssertionError::Missing { header: HEADER }),
        Some(token) => verify(token, jwks, expected),
    }
}

/// Verifies an approval assertion: algorithm `EdDSA` and type `agentrun-approval+jwt`, the
/// signature with the published key its `kid` names, `iss`, `exp` and `nbf` (with the leeway),
/// `aud` equal to the endpoint the tool serves, and the arguments digest equal to the SHA-256 of
/// the body received. Returns the claims (approver, run, call) for the tool's own log.
pub fn verify(token: &str, jwks: &Jwks, expected: &Expected<'_>) -> Result<Claims, AssertionError> {
    provider::install();
    let header = jsonwebtoken::decode_header(token).map_err(|e| match e.kind() {
        ErrorKind::InvalidAlgorithmName => {
            AssertionError::WrongAlgorithm("an unsupported algorithm".into())
        }
        _ => AssertionError::Malformed(e.to_string()),
    })?;
    if header.alg != Algorithm::EdDSA {
        return Err(AssertionError::WrongAlgorithm(format!("{:?}", header.alg)));
    }
    if header.typ.as_deref() != Some(TOKEN_TYPE) {
        return Err(AssertionError::WrongType {
            expected: TOKEN_TYPE,
            found: header.typ,
        });
    }
    let kid = header.kid.ok_or(AssertionError::MissingKeyId)?;
    let jwk = jwks
        .find(&kid)
        .ok_or_else(|| AssertionError::UnknownKey(kid.clone()))?;
    let x = jwk.x.as_deref().unwrap_or_default();
    let key = DecodingKey::from_ed_components(x)
        .map_err(|e| AssertionError::InvalidJwks(format!("key `{kid}`: {e}")))?;
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.leeway = expected.leeway.as_secs();
    validation.validate_exp = true;
    validation.validate_nbf = true;
    validation.validate_aud = true;
    validation.set_audience(&[expected.endpoint]);
    validation.set_issuer(&[ISSUER]);
    validation.set_required_spec_claims(&["exp", "nbf", "aud", "iss"]);
    let claims = jsonwebtoken::decode::<Claims>(token, &key, &validation)
        .map_err(|e| match e.into_kind() {
            ErrorKind::InvalidSignature => AssertionError::BadSignature,
            ErrorKind::ExpiredSignature => AssertionError::Expired,
            ErrorKind::ImmatureSignature => AssertionError::NotYetValid,
            ErrorKind::InvalidIssuer => AssertionError::WrongIssuer,
            ErrorKind::InvalidAudience => AssertionError::WrongAudience {
                expected: expected.endpoint.to_owned(),
            },
            ErrorKind::InvalidAlgorithm => AssertionError::WrongAlgorithm("EdDSA key".into()),
            ErrorKind::InvalidEddsaKey => AssertionError::InvalidJwks(format!("key `{kid}`")),
            other => AssertionError::Malformed(format!("{other:?}")),
        })?
        .claims;
    if claims.endpoint != claims.aud {
        return Err(AssertionError::EndpointMismatch {
            endpoint: claims.endpoint,
            aud: claims.aud,
        });
    }
    let received = body_digest(expected.body);
    if received != claims.arguments_sha256 {
        return Err(AssertionError::ArgumentsMismatch {
            received,
            approved: claims.arguments_sha256,
        });
    }
    Ok(claims)
}
