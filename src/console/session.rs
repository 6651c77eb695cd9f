//! Sessions and who the person is.
//!
//! The browser holds only a random session id (tower-sessions: 128 random bits) in a cookie that is
//! `HttpOnly`, `SameSite=Strict`, `Path=/`, and `Secure` whenever the console is served over TLS
//! (directly, or behind a TLS-terminating proxy with `--secure-cookies`; the cookie is then named
//! `__Host-…`, which browsers accept only in that form). Everything else stays on the server, in an
//! in-memory store that evicts each session at its expiry (tower-sessions' moka store): the
//! credential pasted at login, the person's username, the CSRF token. Nothing of it ever goes into
//! a URL, a log line or the browser's storage.
//!
//! A session ends at the first of: its idle timeout (refreshed by each page a person opens, not by
//! the inbox's background updates), its absolute lifetime since login, logout, or a restart of the
//! console. The session id changes at login (no fixation).
//!
//! Two ways to say who one is, both on by default:
//! - **login**: the person pastes a bearer token; it is checked with a SelfSubjectReview and kept
//!   in the session;
//! - **an authenticating proxy** (oauth2-proxy and the like) in front sets `Authorization: Bearer
//!   …` on every request: it is used as is for that request and never stored (the session keeps
//!   its SHA-256, to remember the username without asking the API server each time).

use std::time::Duration;

use axum::http::HeaderMap;
use axum::http::header::AUTHORIZATION;
use kube::Client;
use serde::{Deserialize, Serialize};
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, Session, SessionManagerLayer};
use tower_sessions_moka_store::MokaStore;

use super::access::{ApiAccess, ApiFailure, Credential, timed};
use super::csrf;

/// The session cookie's name over plain HTTP.
pub const COOKIE: &str = "agentrun-console";
/// The session cookie's name under TLS (the `__Host-` prefix: Secure, `Path=/`, no Domain).
pub const SECURE_COOKIE: &str = "__Host-agentrun-console";
/// How many sessions the store holds at most (the least recently used go first).
pub const MAX_SESSIONS: u64 = 10_000;
/// The idle timeout of a session that has not logged in yet (the login form's CSRF token).
pub const ANONYMOUS_IDLE: Duration = Duration::from_secs(15 * 60);

const LOGIN: &str = "login";
const PROXY: &str = "proxy";
const CSRF: &str = "csrf";

/// How sessions behave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionSettings {
    /// A session ends after this long without a page being opened.
    pub idle_timeout: Duration,
    /// A session ends this long after login, whatever happens.
    pub lifetime: Duration,
    /// Mark the cookie `Secure` (served over TLS).
    pub secure: bool,
}

impl SessionSettings {
    /// The cookie's name.
    pub fn cookie_name(&self) -> &'static str {
        if self.secure { SECURE_COOKIE } else { COOKIE }
    }
}

/// The in-memory session store.
pub fn store() -> MokaStore {
    MokaStore::new(Some(MAX_SESSIONS))
}

/// The session middleware: the cookie as described above, the store's records expiring after the
/// anonymous idle timeout until a login sets the person's.
pub fn layer(store: MokaStore, settings: SessionSettings) -> SessionManagerLayer<MokaStore> {
    SessionManagerLayer::new(store)
        .with_name(settings.cookie_name())
        .with_http_only(true)
        .with_same_site(SameSite::Strict)
        .with_secure(settings.secure)
        .with_path("/")
        .with_expiry(Expiry::OnInactivity(to_time(ANONYMOUS_IDLE)))
}

fn to_time(duration: Duration) -> time::Duration {
    time::Duration::try_from(duration).unwrap_or(time::Duration::MAX)
}

/// The server-side record of a login.
#[derive(Clone, Serialize, Deserialize)]
struct Login {
    token: String,
    username: String,
    /// When: milliseconds since the epoch.
    since_ms: i64,
}

/// The server-side record of a proxy's identity: the credential's fingerprint only.
#[derive(Clone, Serialize, Deserialize)]
struct ProxyIdentity {
    fingerprint: String,
    username: String,
}

/// How the person proved who they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A token pasted at login, kept in the session.
    Login,
    /// The `Authorization` header of an authenticating proxy.
    Proxy,
}

/// The person behind a request.
#[derive(Clone, Debug)]
pub struct Person {
    /// Their credential, for this request's API calls.
    pub credential: Credential,
    /// Their username, as the API server authenticated it.
    pub username: String,
    /// How they authenticated.
    pub via: Via,
    /// The session's CSRF token, for the page's forms.
    pub csrf: String,
}

/// Why a request has no person.
#[derive(Debug, thiserror::Error)]
pub enum NoPerson {
    /// Not logged in (or the session ended).
    #[error("not logged in")]
    LoggedOut {
        /// Whether a session ended (idle, lifetime) rather than never existed.
        expired: bool,
    },
    /// An `Authorization` header the console does not forward (not `Bearer`).
    #[error(
        "the Authorization header is not a bearer token; only bearer tokens are forwarded to the API server"
    )]
    UnsupportedAuthorization,
    /// The API server did not accept the credential.
    #[error("{0}")]
    Refused(ApiFailure),
    /// The session store failed.
    #[error("the session store failed: {0}")]
    Store(String),
}

fn store_error(error: tower_sessions::session::Error) -> NoPerson {
    NoPerson::Store(error.to_string())
}

/// The session's CSRF token, created when it has none.
pub async fn csrf_token(session: &Session) -> Result<String, NoPerson> {
    if let Some(token) = session.get::<String>(CSRF).await.map_err(store_error)? {
        return Ok(token);
    }
    let token = csrf::new_token();
    session.insert(CSRF, &token).await.map_err(store_error)?;
    Ok(token)
}

/// The session's CSRF token, if it has one (never creates one: for checking a form).
pub async fn expected_csrf(session: &Session) -> Option<String> {
    session.get::<String>(CSRF).await.ok().flatten()
}

/// The username the API server authenticates for `client` (a SelfSubjectReview, as
/// `kubectl auth whoami`).
pub async fn whoami(client: &Client) -> Result<String, ApiFailure> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    use kube::api::{Api, PostParams};
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = timed(
        "find out who you are (SelfSubjectReview)",
        api.create(&PostParams::default(), &SelfSubjectReview::default()),
    )
    .await?;
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ApiFailure {
            action: "find out who you are (SelfSubjectReview)".to_owned(),
            code: None,
            message: "the API server's SelfSubjectReview names no user".to_owned(),
        })
}

/// The credential an authenticating proxy put on the request, if any.
fn proxy_credential(headers: &HeaderMap) -> Option<Result<Credential, NoPerson>> {
    headers
        .get(AUTHORIZATION)
        .map(|value| Credential::from_header(value).ok_or(NoPerson::UnsupportedAuthorization))
}

/// Who is asking: the proxy's credential when there is one, else the session's login. A page view
/// (`touch`) refreshes the session's idle timeout; background requests do not.
pub async fn person(
    session: &Session,
    headers: &HeaderMap,
    access: &ApiAccess,
    settings: &SessionSettings,
    touch: bool,
) -> Result<Person, NoPerson> {
    if let Some(credential) = proxy_credential(headers) {
        let credential = credential?;
        let fingerprint = credential.fingerprint();
        let known = session
            .get::<ProxyIdentity>(PROXY)
            .await
            .map_err(store_error)?
            .filter(|p| p.fingerprint == fingerprint);
        let username = match known {
            Some(identity) => identity.username,
            None => {
                let username = whoami(&access.client(&credential))
                    .await
                    .map_err(NoPerson::Refused)?;
                let identity = ProxyIdentity {
                    fingerprint,
                    username: username.clone(),
                };
                session.insert(PROXY, identity).await.map_err(store_error)?;
                username
            }
        };
        if touch {
            session.set_expiry(Some(Expiry::OnInactivity(to_time(settings.idle_timeout))));
        }
        return Ok(Person {
            credential,
            username,
            via: Via::Proxy,
            csrf: csrf_token(session).await?,
        });
    }
    let Some(login) = session.get::<Login>(LOGIN).await.map_err(store_error)? else {
        return Err(NoPerson::LoggedOut { expired: false });
    };
    let now_ms = chrono::Utc::now().timestamp_millis();
    let lifetime = i64::try_from(settings.lifetime.as_millis()).unwrap_or(i64::MAX);
    let credential = Credential::bearer(&login.token);
    match credential {
        Some(credential) if now_ms.saturating_sub(login.since_ms) < lifetime => {
            if touch {
                session.set_expiry(Some(Expiry::OnInactivity(to_time(settings.idle_timeout))));
            }
            Ok(Person {
                credential,
                username: login.username,
                via: Via::Login,
                csrf: csrf_token(session).await?,
            })
        }
        _ => {
            session.flush().await.map_err(store_error)?;
            Err(NoPerson::LoggedOut { expired: true })
        }
    }
}

/// Logs in with a pasted token: asks the API server who it is; on success starts a new session
/// (a new id and CSRF token) that holds it. Returns the username.
pub async fn log_in(
    session: &Session,
    access: &ApiAccess,
    settings: &SessionSettings,
    token: &str,
) -> Result<String, NoPerson> {
    let credential = Credential::bearer(token).ok_or_else(|| {
        NoPerson::Refused(ApiFailure {
            action: "log in".to_owned(),
            code: None,
            message: "paste a bearer token: one line, no spaces".to_owned(),
        })
    })?;
    let username = whoami(&access.client(&credential))
        .await
        .map_err(NoPerson::Refused)?;
    session.cycle_id().await.map_err(store_error)?;
    session.clear().await;
    session
        .insert(
            LOGIN,
            Login {
                token: credential.token(),
                username: username.clone(),
                since_ms: chrono::Utc::now().timestamp_millis(),
            },
        )
        .await
        .map_err(store_error)?;
    session
        .insert(CSRF, csrf::new_token())
        .await
        .map_err(store_error)?;
    session.set_expiry(Some(Expiry::OnInactivity(to_time(settings.idle_timeout))));
    Ok(username)
}

/// Ends the session: the store forgets it (and the credential), the cookie is removed.
pub async fn log_out(session: &Session) -> Result<(), NoPerson> {
    session.flush().await.map_err(store_error)
}

/// Whether the session with this id still exists in the store (the live updates stop once it
/// does not: logout, expiry).
pub async fn is_live(store: &MokaStore, id: Option<tower_sessions::session::Id>) -> bool {
    use tower_sessions::SessionStore;
    match id {
        Some(id) => matches!(store.load(&id).await, Ok(Some(_))),
        None => false,
    }
}
