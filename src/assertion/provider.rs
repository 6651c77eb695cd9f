//! The `jsonwebtoken` crypto provider backed by `ring` (already linked through rustls), for
//! EdDSA (Ed25519) only: `jsonwebtoken` does the JOSE work (header, base64url, claim
//! validation), `ring` the signatures. Any other algorithm is refused.

use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{ErrorKind, Result, new_error};
use jsonwebtoken::jwk::{EllipticCurve, ThumbprintHash};
use jsonwebtoken::signature;
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, EncodingKey};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use sha2::Digest;

/// The provider: EdDSA through `ring`.
static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory,
    verifier_factory,
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(unsupported()),
        rsa_pub_components_from_public_key: |_| Err(unsupported()),
        ec_pub_components_from_private_key: |_, _| Err(unsupported()),
        ed_pub_components_from_private_key,
        compute_digest,
    },
};

/// Installs the provider as the process default of `jsonwebtoken`, unless one is installed
/// already (an application's own choice, which then must support EdDSA; both built-in ones do).
pub(super) fn install() {
    if CryptoProvider::try_get_default().is_none() {
        let _ = PROVIDER.install_default();
    }
}

fn unsupported() -> jsonwebtoken::errors::Error {
    new_error(ErrorKind::UnsupportedAlgorithm)
}

fn signer_factory(algorithm: &Algorithm, key: &EncodingKey) -> Result<Box<dyn JwtSigner>> {
    if *algorithm != Algorithm::EdDSA || key.family() != AlgorithmFamily::Ed {
        return Err(new_error(ErrorKind::InvalidAlgorithm));
    }
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(key.as_bytes())
        .map_err(|_| new_error(ErrorKind::InvalidEddsaKey))?;
    Ok(Box::new(RingSigner(pair)))
}

fn verifier_factory(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    if *algorithm != Algorithm::EdDSA || key.family() != AlgorithmFamily::Ed {
        return Err(new_error(ErrorKind::InvalidAlgorithm));
    }
    let public = key.try_get_as_bytes()?;
    if public.len() != 32 {
        return Err(new_error(ErrorKind::InvalidEddsaKey));
    }
    Ok(Box::new(RingVerifier(public.to_vec())))
}

fn ed_pub_components_from_private_key(der: &[u8], curve: &EllipticCurve) -> Result<Vec<u8>> {
    if *curve != EllipticCurve::Ed25519 {
        return Err(unsupported());
    }
    let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der)
        .map_err(|_| new_error(ErrorKind::InvalidEddsaKey))?;
    Ok(pair.public_key().as_ref().to_vec())
}

fn compute_digest(data: &[u8], hash: ThumbprintHash) -> Result<Vec<u8>> {
    Ok(match hash {
        ThumbprintHash::SHA256 => sha2::Sha256::digest(data).to_vec(),
        ThumbprintHash::SHA384 => sha2::Sha384::digest(data).to_vec(),
        ThumbprintHash::SHA512 => sha2::Sha512::digest(data).to_vec(),
        _ => return Err(unsupported()),
    })
}

struct RingSigner(Ed25519KeyPair);

impl signature::Signer<Vec<u8>> for RingSigner {
    fn try_sign(&self, message: &[u8]) -> std::result::Result<Vec<u8>, signature::Error> {
        Ok(self.0.sign(message).as_ref().to_vec())
    }
}

impl JwtSigner for RingSigner {
    fn algorithm(&self) -> Algorithm {
        Algorithm::EdDSA
    }
}

struct RingVerifier(Vec<u8>);

impl signature::Verifier<Vec<u8>> for RingVerifier {
    fn verify(
        &self,
        message: &[u8],
        signature: &Vec<u8>,
    ) -> std::result::Result<(), signature::Error> {
        UnparsedPublicKey::new(&ED25519, &self.0)
            .verify(message, signature)
            .map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        Algorithm::EdDSA
    }
}
