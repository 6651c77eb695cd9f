//! The controller's side: an Ed25519 signing key and the compact JWS it makes of [`Claims`].

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};
use sha2::{Digest, Sha256};

use super::jwks::Jwk;
use super::{AssertionError, Claims, TOKEN_TYPE, provider};

/// The DER prefix of a PKCS#8 v1 document holding an Ed25519 seed (RFC 8410): the 32 seed bytes
/// follow it.
const PKCS8_ED25519_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The PEM label of a PKCS#8 private key.
const PEM_TAG: &str = "PRIVATE KEY";

/// An Ed25519 key that signs approval assertions. Its `kid` is the RFC 7638 thumbprint of its
/// public JWK, so the same key always has the same id.
pub struct Signer {
    pkcs8: Vec<u8>,
    public: [u8; 32],
    kid: String,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// A new random key.
    pub fn generate() -> Result<Signer, AssertionError> {
        let document = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| AssertionError::InvalidKey("cannot generate a key".into()))?;
        Signer::from_pkcs8_der(document.as_ref())
    }

    /// A key from a PKCS#8 DER document (v1 as written by `openssl genpkey -algorithm ed25519`, or
    /// v2 with the public key).
    pub fn from_pkcs8_der(der: &[u8]) -> Result<Signer, AssertionError> {
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
            .map_err(|e| AssertionError::InvalidKey(format!("not an Ed25519 PKCS#8 key: {e}")))?;
        let public: [u8; 32] = pair
            .public_key()
            .as_ref()
            .try_into()
            .map_err(|_| AssertionError::InvalidKey("public key is not 32 bytes".into()))?;
        Ok(Signer {
            pkcs8: der.to_vec(),
            kid: thumbprint(&public),
            public,
        })
    }

    /// A key from a PEM `PRIVATE KEY` (PKCS#8) block.
    pub fn from_pem(pem_text: &str) -> Result<Signer, AssertionError> {
        let block = pem::parse(pem_text)
            .map_err(|e| AssertionError::InvalidKey(format!("not PEM: {e}")))?;
        if block.tag() != PEM_TAG {
            return Err(AssertionError::InvalidKey(format!(
                "PEM block is `{}`, not `{PEM_TAG}` (PKCS#8)",
                block.tag()
            )));
        }
        Signer::from_pkcs8_der(block.contents())
    }

    /// A key from its raw 32-byte seed (the JWK `d` of RFC 8037).
    pub fn from_seed(seed: &[u8]) -> Result<Signer, AssertionError> {
        if seed.len() != 32 {
            return Err(AssertionError::InvalidKey(format!(
                "a raw Ed25519 key is 32 bytes, not {}",
                seed.len()
            )));
        }
        let mut der = PKCS8_ED25519_PREFIX.to_vec();
        der.extend_from_slice(seed);
        Signer::from_pkcs8_der(&der)
    }

    /// The key as a PEM `PRIVATE KEY` block (what the controller stores in its Secret).
    pub fn to_pem(&self) -> String {
        pem::encode(&pem::Pem::new(PEM_TAG, self.pkcs8.clone()))
    }

    /// The key id: the RFC 7638 JWK thumbprint (SHA-256, base64url).
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The public key as a JWK (what the JWKS publishes).
    pub fn jwk(&self) -> Jwk {
        Jwk::ed25519(&self.public, &self.kid)
    }

    /// Signs `claims` into a compact JWS with header `{"alg":"EdDSA","typ":"agentrun-approval+jwt",
    /// "kid":…}`.
    pub fn sign(&self, claims: &Claims) -> Result<String, AssertionError> {
        let mut header = Header::new(Algorithm::EdDSA);
        header.typ = Some(TOKEN_TYPE.to_owned());
        header.kid = Some(self.kid.clone());
        self.sign_with(&header, claims)
    }

    /// Signs any payload under any header (tests forge tokens with it).
    pub(super) fn sign_with(
        &self,
        header: &Header,
        payload: &impl serde::Serialize,
    ) -> Result<String, AssertionError> {
        provider::install();
        jsonwebtoken::encode(header, payload, &EncodingKey::from_ed_der(&self.pkcs8))
            .map_err(|e| AssertionError::Signing(e.to_string()))
    }
}

/// The RFC 7638 thumbprint of an Ed25519 public key: base64url(SHA-256 of the JWK's required
/// members, in lexicographic order, without whitespace).
pub fn thumbprint(public: &[u8; 32]) -> String {
    let canonical = format!(
        r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(public)
    );
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}
