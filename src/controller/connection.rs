//! The controller's connection to the API server: HTTP/2, so that every request and watch in
//! flight is a stream on one TLS connection, as client-go does.
//!
//! kube's default client offers HTTP/1.1 only, which opens one connection (with its own TLS and
//! HTTP buffers) per request in flight: hundreds while the controller drains a burst of
//! approvals. The client built here keeps kube's middleware — the base URI, retries of 429/503/504,
//! the credentials (re-read when they rotate) and impersonation headers — over a hyper client that
//! offers `h2` in ALPN and falls back to HTTP/1.1 when the server declines it.

use std::time::Duration;

use hyper_rustls::{FixedServerNameResolver, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// A ping goes out when the connection has been silent this long (client-go: 30 s), so that a
/// dead connection is noticed even while only watches are open.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// An unanswered ping closes the connection after this long (client-go: 15 s); the requests
/// and watches that follow open a new one.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(15);

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    /// Neither the in-cluster service account nor a kubeconfig could be read.
    #[error("cannot read the Kubernetes client configuration: {0}")]
    Config(#[from] kube::config::InferConfigError),
    /// The TLS settings or the credentials in the configuration are unusable.
    #[error("cannot set up the connection to the API server: {0}")]
    Client(#[from] kube::Error),
    /// The configured TLS server name is not a DNS name or an IP address.
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
}

/// A client from the in-cluster service account or the kubeconfig, as `Client::try_default`
/// finds them, that speaks HTTP/2.
pub async fn infer_client() -> Result<Client, ConnectionError> {
    client(Config::infer().await?)
}

/// A client for `config` that speaks HTTP/2 when the API server accepts it.
pub fn client(config: Config) -> Result<Client, ConnectionError> {
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_connect_timeout(config.connect_timeout);
    let tls = HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => tls.with_server_name_resolver(FixedServerNameResolver::new(
            name.clone()
                .try_into()
                .map_err(|_| ConnectionError::ServerName(name.clone()))?,
        )),
        None => tls,
    };
    let http: HttpClient<_, Body> = HttpClient::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(tls.enable_all_versions().wrap_connector(tcp));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_name_that_is_not_a_host_name_is_refused_with_its_value() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.tls_server_name = Some("not a host name".into());
        let Err(error) = client(config) else {
            panic!("a client with an invalid TLS server name");
        };
        assert_eq!(
            error.to_string(),
            "invalid TLS server name \"not a host name\""
        );
    }
}
