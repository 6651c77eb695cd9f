//! The controller's signing keys: read from a Secret in its own namespace (made with one new key
//! when missing), and the public keys published as a JWKS in a ConfigMap there (and served at
//! [`JWKS_PATH`] by the metrics server).
//!
//! The Secret holds any number of `*.pem` entries (PKCS#8 Ed25519 private keys) and a `current`
//! entry naming the one that signs. Every key is published, so assertions signed by a previous
//! key stay verifiable until the admin removes it (see docs/security.md, "Key rotation"). Keys
//! are read at start: a rotation takes effect when the controller restarts.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use tracing::info;

use crate::assertion::{AssertionError, Claims, Jwks, Signer};
use crate::crd::keys::{field_managers, labels};

/// The default name of the Secret holding the signing keys.
pub const DEFAULT_SECRET: &str = "agentrun-signing-keys";
/// The default name of the ConfigMap publishing the JWKS.
pub const DEFAULT_CONFIG_MAP: &str = "agentrun-approval-keys";
/// The ConfigMap's key holding the JWKS document.
pub const JWKS_KEY: &str = "jwks.json";
/// The Secret's entry naming the `*.pem` entry that signs.
pub const CURRENT_ENTRY: &str = "current";
/// The name of the key the controller generates when the Secret is missing.
pub const FIRST_KEY_ENTRY: &str = "key-1.pem";
/// Where the metrics server serves the JWKS.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";
/// How long an assertion is valid unless configured.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(600);

/// Where the controller keeps and publishes its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SigningConfig {
    /// The controller's own namespace (of the Secret and the ConfigMap).
    pub namespace: String,
    /// The Secret holding the signing keys.
    pub secret_name: String,
    /// The ConfigMap publishing the public keys.
    pub config_map_name: String,
    /// How long each assertion is valid from its issue.
    pub lifetime: Duration,
}

impl SigningConfig {
    /// The default names and lifetime in `namespace`.
    pub fn new(namespace: impl Into<String>) -> SigningConfig {
        SigningConfig {
            namespace: namespace.into(),
            secret_name: DEFAULT_SECRET.into(),
            config_map_name: DEFAULT_CONFIG_MAP.into(),
            lifetime: DEFAULT_LIFETIME,
        }
    }
}

/// Errors loading or publishing the signing keys; the controller does not start with them.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The Secret has no `*.pem` entry.
    #[error("Secret {secret} holds no *.pem signing key")]
    NoKeys {
        /// The Secret.
        secret: String,
    },
    /// `current` is missing while there are several keys, or names no `*.pem` entry.
    #[error("Secret {secret}: {problem}")]
    Current {
        /// The Secret.
        secret: String,
        /// What is wrong.
        problem: String,
    },
    /// An entry is not an Ed25519 PKCS#8 PEM key.
    #[error("Secret {secret} entry {entry}: {source}")]
    Key {
        /// The Secret.
        secret: String,
        /// The entry.
        entry: String,
        /// Why.
        #[source]
        source: AssertionError,
    },
    /// A new key could not be made.
    #[error("generating a signing key: {0}")]
    Generate(#[source] AssertionError),
}

/// What a running controller issues assertions with: the current key, the published JWKS and
/// the assertions' lifetime.
#[derive(Debug)]
pub struct Issuer {
    signer: Signer,
    jwks: Jwks,
    lifetime: Duration,
}

impl Issuer {
    /// An issuer signing with `signer`, publishing `jwks` (which must hold `signer`'s key).
    pub fn new(signer: Signer, jwks: Jwks, lifetime: Duration) -> Issuer {
        Issuer {
            signer,
            jwks,
            lifetime,
        }
    }

    /// The key that signs.
    pub fn signer(&self) -> &Signer {
        &self.signer
    }

    /// Every published public key.
    pub fn jwks(&self) -> &Jwks {
        &self.jwks
    }

    /// How long each assertion is valid.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// Signs `claims` as valid from `now` for the lifetime.
    pub fn issue(
        &self,
        claims: Claims,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<String, AssertionError> {
        self.signer.sign(&claims.valid_from(now, self.lifetime))
    }
}

/// Reads the signing keys from the Secret (creating it with one new key when it does not exist;
/// a replica that loses the race to create it reads the winner's), publishes the JWKS in the
/// ConfigMap, and returns the issuer.
pub async fn load_or_create(
    client: &Client,
    config: &SigningConfig,
) -> Result<Issuer, SigningError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let secret = match secrets.get_opt(&config.secret_name).await? {
        Some(secret) => secret,
        None => create_secret(&secrets, config).await?,
    };
    let data = secret.data.unwrap_or_default();
    let (signer, jwks) = keys_from_secret_data(&config.secret_name, &data)?;
    publish_jwks(client, config, &jwks).await?;
    info!(
        kid = signer.kid(),
        published = jwks.keys.len(),
        secret = %config.secret_name,
        config_map = %config.config_map_name,
        "approval assertions are signed"
    );
    Ok(Issuer::new(signer, jwks, config.lifetime))
}

async fn create_secret(
    secrets: &Api<Secret>,
    config: &SigningConfig,
) -> Result<Secret, SigningError> {
    let signer = Signer::generate().map_err(SigningError::Generate)?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(config.secret_name.clone()),
            namespace: Some(config.namespace.clone()),
            labels: Some(part_of()),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([
            (
                FIRST_KEY_ENTRY.to_owned(),
                ByteString(signer.to_pem().into_bytes()),
            ),
            (
                CURRENT_ENTRY.to_owned(),
                ByteString(FIRST_KEY_ENTRY.as_bytes().to_vec()),
            ),
        ])),
        ..Default::default()
    };
    let params = PostParams {
        field_manager: Some(field_managers::CONTROLLER.into()),
        ..Default::default()
    };
    match secrets.create(&params, &secret).await {
        Ok(created) => {
            info!(secret = %created.name_any(), kid = signer.kid(), "created the signing key Secret");
            Ok(created)
        }
        // Another replica created it first: use its key.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(secrets.get(&config.secret_name).await?),
        Err(e) => Err(e.into()),
    }
}

async fn publish_jwks(
    client: &Client,
    config: &SigningConfig,
    jwks: &Jwks,
) -> Result<(), SigningError> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &config.namespace);
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(config.config_map_name.clone()),
            namespace: Some(config.namespace.clone()),
            labels: Some(part_of()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(JWKS_KEY.to_owned(), jwks.to_json())])),
        ..Default::default()
    };
    config_maps
        .patch(
            &config.config_map_name,
            &PatchParams::apply(field_managers::CONTROLLER).force(),
            &Patch::Apply(&config_map),
        )
        .await?;
    Ok(())
}

fn part_of() -> BTreeMap<String, String> {
    BTreeMap::from([(labels::PART_OF.0.to_owned(), labels::PART_OF.1.to_owned())])
}

/// The signing key and the JWKS of a Secret's data: every `*.pem` entry is a key (all must
/// parse), `current` names the one that signs (optional when there is one key). The JWKS lists
/// the current key first, then the others by entry name.
pub fn keys_from_secret_data(
    secret: &str,
    data: &BTreeMap<String, ByteString>,
) -> Result<(Signer, Jwks), SigningError> {
    let mut keys = Vec::new();
    for (entry, bytes) in data.iter().filter(|(name, _)| name.ends_with(".pem")) {
        let key_error = |source| SigningError::Key {
            secret: secret.to_owned(),
            entry: entry.clone(),
            source,
        };
        let text = std::str::from_utf8(&bytes.0)
            .map_err(|_| key_error(AssertionError::InvalidKey("not UTF-8 PEM text".into())))?;
        keys.push((entry.clone(), Signer::from_pem(text).map_err(key_error)?));
    }
    if keys.is_empty() {
        return Err(SigningError::NoKeys {
            secret: secret.to_owned(),
        });
    }
    let current = match data.get(CURRENT_ENTRY) {
        Some(name) => String::from_utf8_lossy(&name.0).trim().to_owned(),
        None if keys.len() == 1 => keys[0].0.clone(),
        None => {
            return Err(SigningError::Current {
                secret: secret.to_owned(),
                problem: format!(
                    "it holds {} keys and no `{CURRENT_ENTRY}` entry naming the one that signs",
                    keys.len()
                ),
            });
        }
    };
    let position = keys
        .iter()
        .position(|(entry, _)| *entry == current)
        .ok_or_else(|| SigningError::Current {
            secret: secret.to_owned(),
            problem: format!("`{CURRENT_ENTRY}` names `{current}`, which is not a *.pem entry"),
        })?;
    let (_, signer) = keys.remove(position);
    let jwks = Jwks::new(
        std::iter::once(signer.jwk()).chain(
            keys.iter()
                .map(|(_, k)| k.jwk())
                .filter(|k| k.kid.as_deref() != Some(signer.kid())),
        ),
    );
    Ok((signer, jwks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(text: &str) -> ByteString {
        ByteString(text.as_bytes().to_vec())
    }

    #[test]
    fn the_current_key_signs_and_every_key_is_published() {
        let old = Signer::generate().unwrap();
        let new = Signer::generate().unwrap();
        let mut data = BTreeMap::from([
            ("key-1.pem".to_owned(), entry(&old.to_pem())),
            ("key-2.pem".to_owned(), entry(&new.to_pem())),
            (CURRENT_ENTRY.to_owned(), entry("key-2.pem\n")),
        ]);
        let (signer, jwks) = keys_from_secret_data("s", &data).unwrap();
        assert_eq!(signer.kid(), new.kid());
        let kids: Vec<_> = jwks.keys.iter().filter_map(|k| k.kid.clone()).collect();
        assert_eq!(kids, [new.kid(), old.kid()]);

        data.insert(CURRENT_ENTRY.to_owned(), entry("key-3.pem"));
        assert!(matches!(
            keys_from_secret_data("s", &data),
            Err(SigningError::Current { .. })
        ));
        data.remove(CURRENT_ENTRY);
        assert!(matches!(
            keys_from_secret_data("s", &data),
            Err(SigningError::Current { .. })
        ));
        data.remove("key-2.pem");
        let (signer, jwks) = keys_from_secret_data("s", &data).unwrap();
        assert_eq!(signer.kid(), old.kid());
        assert_eq!(jwks.keys.len(), 1);
    }

    #[test]
    fn a_broken_or_missing_key_stops_the_start() {
        let data = BTreeMap::from([("key-1.pem".to_owned(), entry("not a key"))]);
        let err = keys_from_secret_data("s", &data).unwrap_err();
        assert!(
            matches!(&err, SigningError::Key { entry, .. } if entry == "key-1.pem"),
            "{err}"
        );
        let data = BTreeMap::from([(CURRENT_ENTRY.to_owned(), entry("key-1.pem"))]);
        assert!(matches!(
            keys_from_secret_data("s", &data),
            Err(SigningError::NoKeys { .. })
        ));
    }
}
