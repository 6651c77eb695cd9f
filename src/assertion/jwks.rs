//! The published public keys: a JWKS document (RFC 7517) of Ed25519 keys (RFC 8037).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::AssertionError;

/// One public key of a JWKS. Members other than these are ignored when reading.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    /// Key type: `OKP` for Ed25519.
    pub kty: String,
    /// Curve: `Ed25519`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crv: Option<String>,
    /// The public key, base64url without padding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub x: Option<String>,
    /// The key id (the RFC 7638 thumbprint for keys agentrun made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
    /// The algorithm: `EdDSA`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
    /// The use: `sig`.
    #[serde(rename = "use", default, skip_serializing_if = "Option::is_none")]
    pub use_: Option<String>,
}

impl Jwk {
    /// The JWK of an Ed25519 public key.
    pub fn ed25519(public: &[u8; 32], kid: &str) -> Jwk {
        Jwk {
            kty: "OKP".into(),
            crv: Some("Ed25519".into()),
            x: Some(URL_SAFE_NO_PAD.encode(public)),
            kid: Some(kid.to_owned()),
            alg: Some("EdDSA".into()),
            use_: Some("sig".into()),
        }
    }

    /// Whether this key may verify an assertion: an Ed25519 signing key (`alg` and `use`, when
    /// present, say so too).
    pub fn is_ed25519_signing_key(&self) -> bool {
        self.kty == "OKP"
            && self.crv.as_deref() == Some("Ed25519")
            && self.x.is_some()
            && self.alg.as_deref().is_none_or(|a| a == "EdDSA")
            && self.use_.as_deref().is_none_or(|u| u == "sig")
    }
}

/// A JWKS document: `{"keys": [...]}`. The controller publishes every key whose assertions may
/// still be valid; the first is the one that signs now.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwks {
    /// The keys.
    pub keys: Vec<Jwk>,
}

impl Jwks {
    /// A JWKS of these keys, in order.
    pub fn new(keys: impl IntoIterator<Item = Jwk>) -> Jwks {
        Jwks {
            keys: keys.into_iter().collect(),
        }
    }

    /// Reads a JWKS document.
    pub fn from_json(text: &str) -> Result<Jwks, AssertionError> {
        serde_json::from_str(text).map_err(|e| AssertionError::InvalidJwks(e.to_string()))
    }

    /// The document as JSON (pretty, as published in the ConfigMap and over HTTP).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|_| r#"{"keys":[]}"#.to_owned())
    }

    /// The Ed25519 signing key with this `kid`, if published.
    pub fn find(&self, kid: &str) -> Option<&Jwk> {
        self.keys
            .iter()
            .find(|k| k.kid.as_deref() == Some(kid) && k.is_ed25519_signing_key())
    }
}
