//! Reaching the API server **as the person**: every request the console sends carries the
//! credential of the person who asked for the page (the bearer token pasted at login, or the
//! `Authorization` header an authenticating proxy set), never one of the console's own. RBAC and
//! the admission policies therefore decide exactly as they do for kubectl, and the API server's
//! audit log and the decision stamp name the person.
//!
//! One HTTP connection pool (TLS to the API server, its CA) is shared by everyone; the credential
//! is set on each request, so nothing of one person's identity stays on a connection (bearer tokens
//! are per request in Kubernetes). The API server's URL and CA come from a kubeconfig (whose user
//! credentials are dropped) or, in a Pod, from the standard service environment and a mounted CA.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderValue, Request};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::{Body, ConfigExt};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::ServiceBuilder;

use super::ConsoleError;

/// How long the console waits to connect to the API server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one API request (other than a watch) may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The CA a Pod gets from the `kube-root-ca.crt` ConfigMap (the chart mounts it here; the
/// console's own ServiceAccount token is not mounted).
pub const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// Where the API server is and how to trust it; never who to be.
#[derive(Clone, Debug)]
pub enum ApiServer {
    /// The cluster of a kubeconfig's context (its user credentials are ignored).
    Kubeconfig {
        /// The kubeconfig file (`None`: `$KUBECONFIG`, else `~/.kube/config`).
        path: Option<PathBuf>,
        /// The context (default: the current context).
        context: Option<String>,
    },
    /// `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT` with the CA in `ca_file`.
    InCluster {
        /// The CA bundle (PEM) of the API server.
        ca_file: PathBuf,
    },
}

impl ApiServer {
    /// The client configuration of the API server, with every credential removed.
    pub async fn config(&self) -> Result<Config, ConsoleError> {
        let mut config =
            match self {
                ApiServer::Kubeconfig { path, context } => {
                    let options = KubeConfigOptions {
                        context: context.clone(),
                        ..Default::default()
                    };
                    match path {
                        Some(path) => {
                            let kubeconfig =
                                Kubeconfig::read_from(path).map_err(|e| ConsoleError::Api {
                                    message: format!(
                                        "cannot read the kubeconfig {}: {e}",
                                        path.display()
                                    ),
                                })?;
                            Config::from_custom_kubeconfig(kubeconfig, &options)
                                .await
                                .map_err(|e| ConsoleError::Api {
                                    message: format!(
                                        "cannot use the kubeconfig {}: {e}",
                                        path.display()
                                    ),
                                })?
                        }
                        None => Config::from_kubeconfig(&options).await.map_err(|e| {
                            ConsoleError::Api {
                                message: format!("cannot use the kubeconfig: {e}"),
                            }
                        })?,
                    }
                }
                ApiServer::InCluster { ca_file } => in_cluster(ca_file)?,
            };
        // The console acts only with the credentials of the people who use it.
        config.auth_info = AuthInfo::default();
        config.headers.clear();
        Ok(config)
    }
}

fn in_cluster(ca_file: &Path) -> Result<Config, ConsoleError> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST").map_err(|_| ConsoleError::Api {
        message: "no --kubeconfig and KUBERNETES_SERVICE_HOST is not set (not in a Pod)".into(),
    })?;
    let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".to_owned());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let url = format!("https://{host}:{port}")
        .parse()
        .map_err(|e| ConsoleError::Api {
            message: format!("the API server address {host}:{port} is not a URL: {e}"),
        })?;
    let pem_text = std::fs::read(ca_file).map_err(|e| ConsoleError::Api {
        message: format!("cannot read the API server's CA {}: {e}", ca_file.display()),
    })?;
    let certificates = pem::parse_many(&pem_text).map_err(|e| ConsoleError::Api {
        message: format!("{} is not PEM: {e}", ca_file.display()),
    })?;
    let mut config = Config::new(url);
    config.root_cert = Some(
        certificates
            .into_iter()
            .map(|c| c.contents().to_vec())
            .collect(),
    );
    config.default_namespace = "default".to_owned();
    Ok(config)
}

/// A person's credential, exactly as the API server takes it in the `Authorization` header.
///
/// Its `Debug` never shows the value.
#[derive(Clone)]
pub struct Credential(HeaderValue);

impl Credential {
    /// A bearer token (pasted at login). `None` when it cannot be a header value (line breaks,
    /// control characters) or is empty.
    pub fn bearer(token: &str) -> Option<Credential> {
        let token = token.trim();
        if token.is_empty() || token.chars().any(char::is_whitespace) {
            return None;
        }
        Self::header(&format!("Bearer {token}"))
    }

    /// An `Authorization` header value as a proxy sent it: only the `Bearer` scheme is accepted
    /// (a browser sends `Basic` on its own for URLs with user info; that is never forwarded).
    pub fn from_header(value: &HeaderValue) -> Option<Credential> {
        let text = value.to_str().ok()?;
        let (scheme, token) = text.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        Self::bearer(token)
    }

    fn header(text: &str) -> Option<Credential> {
        let mut value = HeaderValue::from_str(text).ok()?;
        value.set_sensitive(true);
        Some(Credential(value))
    }

    /// The SHA-256 (hex) of the credential: what a session keeps to recognise a proxy's
    /// credential without storing it.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }

    /// The token alone (kept in the server-side session store after a login).
    pub fn token(&self) -> String {
        let text = self.0.to_str().unwrap_or_default();
        text.split_once(' ')
            .map(|(_, token)| token.to_owned())
            .unwrap_or_default()
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(<redacted>)")
    }
}

type MakeClient = dyn Fn(HeaderValue) -> Client + Send + Sync;

/// The console's way to the API server: clients that act as one person each.
#[derive(Clone)]
pub struct ApiAccess {
    make: Arc<MakeClient>,
    url: String,
}

impl std::fmt::Debug for ApiAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiAccess").field("url", &self.url).finish()
    }
}

impl ApiAccess {
    /// Connects to the API server `config` names (its credentials, if any, are ignored).
    pub fn new(mut config: Config) -> Result<ApiAccess, ConsoleError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        config.auth_info = AuthInfo::default();
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let https = config
            .rustls_https_connector_with_connector(connector)
            .map_err(|e| ConsoleError::Api {
                message: format!("cannot set up TLS to the API server: {e}"),
            })?;
        let http: HttpClient<_, Body> = HttpClient::builder(TokioExecutor::new()).build(https);
        let base_uri = config.base_uri_layer();
        let namespace = config.default_namespace.clone();
        let make = move |authorization: HeaderValue| {
            let service = ServiceBuilder::new()
                .layer(base_uri.clone())
                .map_request(move |mut request: Request<Body>| {
                    request
                        .headers_mut()
                        .insert(AUTHORIZATION, authorization.clone());
                    request
                })
                .service(http.clone());
            Client::new(service, namespace.clone())
        };
        Ok(ApiAccess {
            make: Arc::new(make),
            url: config.cluster_url.to_string(),
        })
    }

    /// The API server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client that acts as the holder of `credential`.
    pub fn client(&self, credential: &Credential) -> Client {
        (self.make)(credential.0.clone())
    }
}

/// An API request that failed: what the console tried and the API server's own message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cannot {action}: {message}")]
pub struct ApiFailure {
    /// What was attempted, e.g. `approve approvalrequest r1-call-1`.
    pub action: String,
    /// The HTTP status code the API server answered with (none when it was not reached).
    pub code: Option<u16>,
    /// The API server's message (or why it was not reached).
    pub message: String,
}

impl ApiFailure {
    /// The failure of `action` with `error`.
    pub fn new(action: impl Into<String>, error: &kube::Error) -> ApiFailure {
        ApiFailure {
            action: action.into(),
            code: match error {
                kube::Error::Api(status) => Some(status.code),
                _ => None,
            },
            message: crate::plugin::api_message(error),
        }
    }

    /// A request that took longer than [`REQUEST_TIMEOUT`].
    pub fn timeout(action: impl Into<String>) -> ApiFailure {
        ApiFailure {
            action: action.into(),
            code: None,
            message: format!(
                "the API server did not answer within {} s",
                REQUEST_TIMEOUT.as_secs()
            ),
        }
    }

    /// True when the API server refused for lack of rights (HTTP 403).
    pub fn is_forbidden(&self) -> bool {
        self.code == Some(403)
    }
}

/// Runs one API request of `action` with [`REQUEST_TIMEOUT`].
pub async fn timed<T>(
    action: &str,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ApiFailure> {
    match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(ApiFailure::new(action, &error)),
        Err(_) => Err(ApiFailure::timeout(action)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_bearer_tokens_only_and_never_printed() {
        let token = Credential::bearer("  abc.def  ").unwrap();
        assert_eq!(token.token(), "abc.def");
        assert_eq!(format!("{token:?}"), "Credential(<redacted>)");
        assert!(Credential::bearer("").is_none());
        assert!(Credential::bearer("a b").is_none());
        assert!(Credential::bearer("a\r\nX-Injected: 1").is_none());
        let header = HeaderValue::from_static("Bearer xyz");
        assert_eq!(Credential::from_header(&header).unwrap().token(), "xyz");
        let basic = HeaderValue::from_static("Basic YWxpY2U6cHc=");
        assert!(Credential::from_header(&basic).is_none());
        assert_ne!(
            Credential::bearer("a").unwrap().fingerprint(),
            Credential::bearer("b").unwrap().fingerprint()
        );
    }
}
