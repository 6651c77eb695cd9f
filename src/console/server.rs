//! The console's web server: the listener (plain HTTP, or HTTPS with `--tls-cert`/`--tls-key`),
//! the session middleware, the security headers on every response, and a log line per request
//! (method, path, status: never a header, a query value or a body).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use super::ConsoleError;
use super::access::ApiAccess;
use super::routes::{AppState, router};
use super::session::{self, SessionSettings};

/// The Content-Security-Policy of every response: nothing but the console's own script, style
/// and connections; no inline script or style, no plugins, no framing, forms only to itself.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// How long a TLS handshake may take.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open connections (live updates) get to finish after a shutdown was asked for.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A certificate chain and its key (PEM files) to serve HTTPS with.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Everything the console is started with.
#[derive(Clone, Debug)]
pub struct ConsoleConfig {
    /// The address to listen on.
    pub listen: SocketAddr,
    /// The API server (its URL and CA; any credential in it is dropped).
    pub api: kube::Config,
    /// The namespaces the inbox looks in for people who may not list all namespaces.
    pub namespaces: Vec<String>,
    /// Serve HTTPS with these.
    pub tls: Option<TlsFiles>,
    /// Mark the session cookie `Secure` although the console serves plain HTTP (TLS terminates in
    /// a proxy in front). Always on with [`ConsoleConfig::tls`].
    pub secure_cookies: bool,
    /// A session ends after this long without a page being opened.
    pub idle_timeout: Duration,
    /// A session ends this long after login.
    pub lifetime: Duration,
}

/// A bound console, ready to serve.
pub struct Console {
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    app: Router,
}

impl Console {
    /// Binds the listen address and prepares the routes.
    pub async fn bind(config: ConsoleConfig) -> Result<Console, ConsoleError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let tls = config.tls.as_ref().map(acceptor).transpose()?;
        let listen = config.listen;
        let app = app(config, tls.is_some())?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ConsoleError::Bind {
                address: listen,
                source,
            })?;
        Ok(Console { listener, tls, app })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, ConsoleError> {
        self.listener.local_addr().map_err(ConsoleError::Serve)
    }

    /// Serves until `shutdown` is cancelled (then gives open connections [`SHUTDOWN_GRACE`]).
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), ConsoleError> {
        let app = self.app.into_make_service();
        let graceful = shutdown.clone();
        let served = async move {
            match self.tls {
                None => {
                    axum::serve(self.listener, app)
                        .with_graceful_shutdown(graceful.cancelled_owned())
                        .await
                }
                Some(acceptor) => {
                    axum::serve(TlsListener::new(self.listener, acceptor), app)
                        .with_graceful_shutdown(graceful.cancelled_owned())
                        .await
                }
            }
        };
        tokio::select! {
            result = served => result.map_err(ConsoleError::Serve),
            () = async {
                shutdown.cancelled().await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => Ok(()),
        }
    }
}

/// The console's routes behind its session middleware and security headers; `tls`: it serves
/// HTTPS itself (the cookie is then `Secure`, as with `secure_cookies`).
pub fn app(config: ConsoleConfig, tls: bool) -> Result<Router, ConsoleError> {
    let secure = config.secure_cookies || tls;
    let settings = SessionSettings {
        idle_timeout: config.idle_timeout,
        lifetime: config.lifetime,
        secure,
    };
    let store = session::store();
    let state = AppState {
        access: ApiAccess::new(config.api)?,
        namespaces: Arc::new(config.namespaces),
        sessions: settings,
        store: store.clone(),
    };
    Ok(router(state)
        .layer(session::layer(store, settings))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            respond(request, next, secure)
        })))
}

/// Sets the security headers on every response and logs the request.
async fn respond(request: Request, next: Next, hsts: bool) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    let mut set = |name: HeaderName, value: &'static str| {
        headers.insert(name, HeaderValue::from_static(value));
    };
    set(header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY);
    set(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(header::X_FRAME_OPTIONS, "DENY");
    set(header::REFERRER_POLICY, "no-referrer");
    set(
        HeaderName::from_static("cross-origin-opener-policy"),
        "same-origin",
    );
    set(
        HeaderName::from_static("cross-origin-resource-policy"),
        "same-origin",
    );
    if hsts {
        set(header::STRICT_TRANSPORT_SECURITY, "max-age=31536000");
    }
    if !path.starts_with("/static/") {
        set(header::CACHE_CONTROL, "no-store");
    }
    tracing::debug!(%method, %path, status = response.status().as_u16(), "request");
    response
}

fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, ConsoleError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let tls_error = |what: &PathBuf, message: String| ConsoleError::Tls {
        path: what.clone(),
        message,
    };
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| tls_error(&files.cert, e.to_string()))?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| tls_error(&files.key, e.to_string()))?;
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| tls_error(&files.cert, e.to_string()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts TCP connections and hands over those whose TLS handshake completed in time (the
/// handshakes run concurrently, so a slow client holds up nobody else).
struct TlsListener {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    fn new(listener: TcpListener, acceptor: TlsAcceptor) -> TlsListener {
        let local = listener.local_addr();
        let (sender, connections) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = sender.send((stream, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, %peer, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener {
            connections,
            local,
            accepting,
        }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.connections.recv().await {
            Some(connection) => connection,
            // The accepting task ended (never while this listener lives): wait for shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(address) => Ok(*address),
            Err(error) => Err(std::io::Error::new(error.kind(), error.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Method, StatusCode};
    use tower::ServiceExt;

    fn config(secure_cookies: bool) -> ConsoleConfig {
        ConsoleConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            // Never reached: nothing below needs the API server.
            api: kube::Config::new("https://127.0.0.1:9".parse().unwrap()),
            namespaces: Vec::new(),
            tls: None,
            secure_cookies,
            idle_timeout: Duration::from_secs(60),
            lifetime: Duration::from_secs(600),
        }
    }

    async fn call(app: &Router, method: Method, path: &str) -> Response {
        let request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("reason=forged"))
            .unwrap();
        app.clone().oneshot(request).await.unwrap()
    }

    fn header_of<'a>(response: &'a Response, name: &str) -> &'a str {
        response
            .headers()
            .get(name)
            .map_or("", |v| v.to_str().unwrap())
    }

    #[tokio::test]
    async fn over_tls_the_cookie_is_secure_host_only_http_only_and_strict() {
        for (tls, secure_cookies) in [(true, false), (false, true)] {
            let app = app(config(secure_cookies), tls).unwrap();
            let login = call(&app, Method::GET, "/login").await;
            assert_eq!(login.status(), StatusCode::OK);
            let cookie = header_of(&login, "set-cookie");
            assert!(cookie.starts_with("__Host-agentrun-console="), "{cookie}");
            for attribute in ["; Secure", "; HttpOnly", "; SameSite=Strict", "; Path=/"] {
                assert!(cookie.contains(attribute), "{attribute} in {cookie}");
            }
            assert!(!cookie.contains("Domain"), "{cookie}");
            assert_eq!(
                header_of(&login, "strict-transport-security"),
                "max-age=31536000"
            );
        }
        let app = app(config(false), false).unwrap();
        let login = call(&app, Method::GET, "/login").await;
        let cookie = header_of(&login, "set-cookie");
        assert!(cookie.starts_with("agentrun-console="), "{cookie}");
        assert!(!cookie.contains("Secure"), "{cookie}");
        assert!(login.headers().get("strict-transport-security").is_none());
    }

    #[tokio::test]
    async fn every_response_has_the_security_headers_and_the_assets_are_embedded() {
        let app = app(config(false), false).unwrap();
        for (method, path, status) in [
            (Method::GET, "/login", StatusCode::OK),
            (Method::GET, "/", StatusCode::SEE_OTHER),
            (Method::GET, "/nowhere", StatusCode::NOT_FOUND),
            (
                Method::POST,
                "/requests/ns/r/approve",
                StatusCode::FORBIDDEN,
            ),
            (Method::GET, "/static/console.js", StatusCode::OK),
            (Method::GET, "/healthz", StatusCode::OK),
        ] {
            let response = call(&app, method.clone(), path).await;
            assert_eq!(response.status(), status, "{method} {path}");
            assert_eq!(
                header_of(&response, "content-security-policy"),
                CONTENT_SECURITY_POLICY,
                "{path}"
            );
            assert_eq!(header_of(&response, "x-frame-options"), "DENY");
            assert_eq!(header_of(&response, "x-content-type-options"), "nosniff");
            assert_eq!(header_of(&response, "referrer-policy"), "no-referrer");
            if !path.starts_with("/static/") {
                assert_eq!(header_of(&response, "cache-control"), "no-store", "{path}");
            }
        }
        let script = call(&app, Method::GET, "/static/console.js").await;
        assert_eq!(
            header_of(&script, "content-type"),
            "text/javascript; charset=utf-8"
        );
        let body = axum::body::to_bytes(script.into_body(), 1 << 20)
            .await
            .unwrap();
        assert_eq!(body, super::super::assets::JS.as_bytes());
    }
}
