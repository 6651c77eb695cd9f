//! The console's HTTP routes: pages (`GET`), decisions and logins (`POST`, each checked for its
//! CSRF token first), the inbox's live updates (server-sent events from a watch, as the person),
//! and the embedded assets.
//!
//! | Route | What |
//! |---|---|
//! | `GET /login`, `POST /login`, `POST /logout` | log in with a bearer token, log out |
//! | `GET /?namespaces=a,b` | the inbox |
//! | `GET /inbox/rows?namespaces=a,b` | the inbox's table body alone (for live updates) |
//! | `GET /events?namespaces=a,b` | server-sent `changed` events from a watch of ApprovalRequests |
//! | `GET /requests/{namespace}/{name}` | a request: conversation, arguments, digests, decision forms |
//! | `POST /requests/{namespace}/{name}/approve`, `…/reject` | a decision, as the person |
//! | `GET /runs/{namespace}/{name}/audit` | a run's audit |
//! | `GET /static/console.css`, `/static/console.js` | the embedded assets |
//! | `GET /healthz` | liveness (no session) |

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use tower_sessions::Session;
use tower_sessions_moka_store::MokaStore;

use super::access::{ApiAccess, ApiFailure};
use super::csrf::{self, CsrfRefusal};
use super::data::{self, DecisionForm, Scope};
use super::session::{self, NoPerson, Person, SessionSettings, Via};
use super::views::{self, ErrorPage, Frame, InboxPage, LoginPage};
use crate::crd::{ApprovalRequest, Decision};

/// How often an open live-update stream checks that its session still exists.
pub const LIVENESS_INTERVAL: Duration = Duration::from_secs(10);

/// What every handler needs.
#[derive(Clone)]
pub struct AppState {
    /// The way to the API server.
    pub access: ApiAccess,
    /// The namespaces the inbox looks in when a person may not list all namespaces.
    pub namespaces: Arc<Vec<String>>,
    /// Session timeouts and cookie settings.
    pub sessions: SessionSettings,
    /// The session store (the live updates check their session in it).
    pub store: MokaStore,
}

/// The router of every route above, with `state`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(inbox))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/inbox/rows", get(inbox_rows))
        .route("/events", get(events))
        .route("/requests/{namespace}/{name}", get(request_page))
        .route("/requests/{namespace}/{name}/approve", post(approve))
        .route("/requests/{namespace}/{name}/reject", post(reject))
        .route("/runs/{namespace}/{name}/audit", get(audit))
        .route("/static/console.css", get(css))
        .route("/static/console.js", get(js))
        .route("/healthz", get(|| async { "ok" }))
        .fallback(not_found)
        .with_state(state)
}

/// The HTML of a page with `status`.
fn html<T: Template>(status: StatusCode, page: &T) -> Response {
    match page.render() {
        Ok(body) => (status, Html(body)).into_response(),
        Err(error) => {
            tracing::error!(%error, "cannot render a page");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render the page").into_response()
        }
    }
}

fn frame(title: impl Into<String>, person: Option<&Person>) -> Frame {
    Frame {
        title: title.into(),
        user: person.map(|p| p.username.clone()),
        via_proxy: person.is_some_and(|p| p.via == Via::Proxy),
        csrf: person.map(|p| p.csrf.clone()).unwrap_or_default(),
    }
}

fn error_page(
    status: StatusCode,
    person: Option<&Person>,
    heading: &str,
    message: impl Into<String>,
) -> Response {
    html(
        status,
        &ErrorPage {
            frame: frame(heading, person),
            heading: heading.to_owned(),
            message: message.into(),
        },
    )
}

/// The answer to a request without a person: the login page for pages, 401 for the rest.
fn no_person(error: NoPerson, page: bool) -> Response {
    match error {
        NoPerson::LoggedOut { expired } if page => Redirect::to(if expired {
            "/login?expired=1"
        } else {
            "/login"
        })
        .into_response(),
        NoPerson::LoggedOut { .. } => StatusCode::UNAUTHORIZED.into_response(),
        NoPerson::Store(message) => error_page(
            StatusCode::INTERNAL_SERVER_ERROR,
            None,
            "Session error",
            message,
        ),
        other => error_page(
            StatusCode::UNAUTHORIZED,
            None,
            "Not authenticated",
            other.to_string(),
        ),
    }
}

fn csrf_refused(refusal: CsrfRefusal) -> Response {
    tracing::warn!(%refusal, "state-changing request refused (CSRF)");
    error_page(StatusCode::FORBIDDEN, None, "Refused", refusal.to_string())
}

/// Who is asking, for a page (refreshes the session's idle timeout) or not.
async fn who(
    state: &AppState,
    session: &Session,
    headers: &HeaderMap,
    page: bool,
) -> Result<Person, Response> {
    session::person(session, headers, &state.access, &state.sessions, page)
        .await
        .map_err(|e| no_person(e, page))
}

#[derive(Debug, Default, Deserialize)]
struct LoginQuery {
    #[serde(default)]
    expired: Option<String>,
}

async fn login_page(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Query(query): Query<LoginQuery>,
) -> Response {
    if headers.contains_key(header::AUTHORIZATION)
        || session::person(&session, &headers, &state.access, &state.sessions, false)
            .await
            .is_ok()
    {
        return Redirect::to("/").into_response();
    }
    let csrf = match session::csrf_token(&session).await {
        Ok(token) => token,
        Err(e) => return no_person(e, true),
    };
    html(
        StatusCode::OK,
        &LoginPage {
            frame: Frame {
                title: "Log in".to_owned(),
                csrf,
                ..Frame::default()
            },
            error: None,
            notice: query
                .expired
                .map(|_| "Your session has expired: log in again.".to_owned()),
        },
    )
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    token: String,
}

async fn login(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let expected = session::expected_csrf(&session).await;
    if let Err(refusal) = csrf::check(&headers, expected.as_deref(), form.csrf.as_deref()) {
        return csrf_refused(refusal);
    }
    match session::log_in(&session, &state.access, &state.sessions, &form.token).await {
        Ok(username) => {
            tracing::info!(user = %username, "logged in");
            Redirect::to("/").into_response()
        }
        Err(NoPerson::Refused(failure)) => {
            tracing::info!(code = ?failure.code, "login refused by the API server");
            html(
                StatusCode::UNAUTHORIZED,
                &LoginPage {
                    frame: Frame {
                        title: "Log in".to_owned(),
                        csrf: expected.unwrap_or_default(),
                        ..Frame::default()
                    },
                    error: Some(format!(
                        "The API server did not accept the token: {}",
                        failure.message
                    )),
                    notice: None,
                },
            )
        }
        Err(other) => no_person(other, true),
    }
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: Option<String>,
}

async fn logout(session: Session, headers: HeaderMap, Form(form): Form<CsrfForm>) -> Response {
    let expected = session::expected_csrf(&session).await;
    if let Err(refusal) = csrf::check(&headers, expected.as_deref(), form.csrf.as_deref()) {
        return csrf_refused(refusal);
    }
    match session::log_out(&session).await {
        Ok(()) => Redirect::to("/login").into_response(),
        Err(e) => no_person(e, true),
    }
}

#[derive(Debug, Default, Deserialize)]
struct NamespacesQuery {
    #[serde(default)]
    namespaces: Option<String>,
}

impl NamespacesQuery {
    /// The namespaces named in the query (comma or space separated), only valid names.
    fn names(&self) -> Vec<String> {
        self.namespaces
            .as_deref()
            .unwrap_or_default()
            .split([',', ' '])
            .map(str::trim)
            .filter(|n| is_dns_label(n))
            .map(str::to_owned)
            .collect()
    }

    /// The query string to repeat in the live-update URLs.
    fn suffix(&self) -> String {
        let names = self.names();
        if names.is_empty() {
            String::new()
        } else {
            format!("?namespaces={}", names.join(","))
        }
    }
}

/// A valid namespace name (RFC 1123 label).
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// The configured namespaces and the query's.
fn namespaces(state: &AppState, query: &NamespacesQuery) -> Vec<String> {
    let mut names: Vec<String> = state.namespaces.iter().cloned().collect();
    for name in query.names() {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// The person's inbox: the pending requests of the namespaces they may read.
async fn read_inbox(
    state: &AppState,
    person: &Person,
    query: &NamespacesQuery,
) -> Result<data::Inbox, ApiFailure> {
    let client = state.access.client(&person.credential);
    let scope = data::scope(&client, &namespaces(state, query)).await?;
    data::inbox(&client, &scope).await
}

async fn inbox(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Query(query): Query<NamespacesQuery>,
) -> Response {
    let person = match who(&state, &session, &headers, true).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let inbox = match read_inbox(&state, &person, &query).await {
        Ok(inbox) => inbox,
        Err(failure) => {
            return error_page(
                StatusCode::BAD_GATEWAY,
                Some(&person),
                "Cannot read the inbox",
                failure.to_string(),
            );
        }
    };
    let table = views::rows(&inbox.rows, chrono::Utc::now());
    let suffix = query.suffix();
    html(
        StatusCode::OK,
        &InboxPage {
            frame: frame("Inbox", Some(&person)),
            rows: table.rows,
            quorum: table.quorum,
            scope: inbox.scope,
            unreadable: inbox.unreadable,
            namespaces: query.names().join(", "),
            rows_url: format!("/inbox/rows{suffix}"),
            events_url: format!("/events{suffix}"),
        },
    )
}

async fn inbox_rows(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Query(query): Query<NamespacesQuery>,
) -> Response {
    let person = match who(&state, &session, &headers, false).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    match read_inbox(&state, &person, &query).await {
        Ok(inbox) => html(
            StatusCode::OK,
            &views::rows(&inbox.rows, chrono::Utc::now()),
        ),
        Err(failure) => (StatusCode::BAD_GATEWAY, failure.to_string()).into_response(),
    }
}

/// Server-sent events for the inbox: a `changed` event whenever an ApprovalRequest the person may
/// watch changes (a watch as the person, in the namespaces their inbox reads). The stream ends
/// when the session ends (checked every [`LIVENESS_INTERVAL`]) or after the idle timeout; the
/// browser then reconnects, which checks the session again.
async fn events(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Query(query): Query<NamespacesQuery>,
) -> Response {
    let person = match who(&state, &session, &headers, false).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let client = state.access.client(&person.credential);
    let apis: Vec<Api<ApprovalRequest>> =
        match data::scope(&client, &namespaces(&state, &query)).await {
            Ok(Scope::AllNamespaces) => vec![Api::all(client)],
            Ok(Scope::Namespaces(names)) => {
                let readable = match data::inbox(&client, &Scope::Namespaces(names.clone())).await {
                    Ok(inbox) => inbox.unreadable,
                    Err(failure) => {
                        return (StatusCode::BAD_GATEWAY, failure.to_string()).into_response();
                    }
                };
                names
                    .iter()
                    .filter(|n| !readable.iter().any(|(u, _)| u == *n))
                    .map(|n| Api::namespaced(client.clone(), n))
                    .collect()
            }
            Err(failure) => return (StatusCode::BAD_GATEWAY, failure.to_string()).into_response(),
        };
    let watches = apis.into_iter().map(|api| {
        watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed()
    });
    let changes = futures::stream::select_all(watches).filter_map(|event| async move {
        match event {
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone) => {
                // A non-empty data line: browsers drop events without data (HTML's SSE rules).
                Some(Ok::<Event, Infallible>(
                    Event::default().event("changed").data("changed"),
                ))
            }
            _ => None,
        }
    });
    let first = futures::stream::once(async {
        Ok::<Event, Infallible>(
            Event::default()
                .retry(Duration::from_secs(5))
                .comment("live"),
        )
    });
    let store = state.store.clone();
    let id = session.id();
    let idle = state.sessions.idle_timeout;
    let ended = async move {
        let deadline = tokio::time::Instant::now() + idle;
        loop {
            tokio::time::sleep(LIVENESS_INTERVAL).await;
            if !session::is_live(&store, id).await || tokio::time::Instant::now() >= deadline {
                return;
            }
        }
    };
    let stream = first.chain(changes).take_until(ended);
    sse(stream)
}

fn sse<S>(stream: S) -> Response
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

#[derive(Debug, Default, Deserialize)]
struct RequestQuery {
    #[serde(default)]
    decided: Option<String>,
}

async fn request_page(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
    Query(query): Query<RequestQuery>,
) -> Response {
    let person = match who(&state, &session, &headers, true).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let client = state.access.client(&person.credential);
    match data::request(&client, &namespace, &name).await {
        Ok(found) => {
            let mut page = views::request_page(
                frame(format!("{name} · {namespace}"), Some(&person)),
                &found,
                chrono::Utc::now(),
            );
            page.notice = match query.decided.as_deref() {
                Some("Approved") => Some(
                    "Your approval was recorded; the run resumes once the controller applies it."
                        .to_owned(),
                ),
                Some("Rejected") => {
                    Some("Your rejection was recorded; the model is told your message.".to_owned())
                }
                _ => None,
            };
            html(StatusCode::OK, &page)
        }
        Err(failure) => error_page(
            StatusCode::from_u16(failure.code.unwrap_or(502)).unwrap_or(StatusCode::BAD_GATEWAY),
            Some(&person),
            "Cannot show the request",
            failure.to_string(),
        ),
    }
}

#[derive(Deserialize)]
struct DecideForm {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    uid: String,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    edited_arguments: Option<String>,
}

async fn approve(
    state: State<AppState>,
    session: Session,
    headers: HeaderMap,
    path: Path<(String, String)>,
    Form(form): Form<DecideForm>,
) -> Response {
    decide(state, session, headers, path, form, Decision::Approved).await
}

async fn reject(
    state: State<AppState>,
    session: Session,
    headers: HeaderMap,
    path: Path<(String, String)>,
    Form(form): Form<DecideForm>,
) -> Response {
    decide(state, session, headers, path, form, Decision::Rejected).await
}

/// Writes a decision as the person; a refusal re-renders the request with the API server's
/// message (and what the person typed).
async fn decide(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
    form: DecideForm,
    decision: Decision,
) -> Response {
    let expected = session::expected_csrf(&session).await;
    if let Err(refusal) = csrf::check(&headers, expected.as_deref(), form.csrf.as_deref()) {
        return csrf_refused(refusal);
    }
    let person = match who(&state, &session, &headers, true).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let client = state.access.client(&person.credential);
    let decision_form = DecisionForm {
        decision,
        reason: form.reason.clone(),
        message: match decision {
            Decision::Approved => None,
            Decision::Rejected => Some(form.message.clone().unwrap_or_default()),
        },
        edited_arguments: match decision {
            Decision::Approved => form
                .edited_arguments
                .clone()
                .filter(|e| !e.trim().is_empty()),
            Decision::Rejected => None,
        },
        uid: form.uid.clone(),
        arguments_digest: form.digest.clone(),
    };
    let refusal = match data::decide(&client, &namespace, &name, &person.username, &decision_form)
        .await
    {
        Ok(_) => {
            tracing::info!(%namespace, request = %name, user = %person.username, %decision, "decision written");
            return Redirect::to(&format!(
                "{}?decided={decision}",
                views::request_href(&namespace, &name)
            ))
            .into_response();
        }
        Err(failure) => failure,
    };
    tracing::info!(%namespace, request = %name, user = %person.username, %decision, code = ?refusal.code, "decision refused");
    let status = StatusCode::from_u16(refusal.code.unwrap_or(502))
        .ok()
        .filter(|s| s.is_client_error() || s.is_server_error())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    match data::request(&client, &namespace, &name).await {
        Ok(found) => {
            let mut page = views::request_page(
                frame(format!("{name} · {namespace}"), Some(&person)),
                &found,
                chrono::Utc::now(),
            );
            page.error = Some(refusal.message);
            page.reason = form.reason;
            page.message = form.message.unwrap_or_default();
            page.edited_arguments = form.edited_arguments.unwrap_or_default();
            html(status, &page)
        }
        Err(_) => error_page(
            status,
            Some(&person),
            "The API server refused",
            refusal.message,
        ),
    }
}

async fn audit(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let person = match who(&state, &session, &headers, true).await {
        Ok(p) => p,
        Err(response) => return response,
    };
    let client = state.access.client(&person.credential);
    match data::audit(&client, &namespace, &name).await {
        Ok(report) => html(
            StatusCode::OK,
            &views::audit_page(frame(format!("Audit of {name}"), Some(&person)), &report),
        ),
        Err(message) => error_page(
            StatusCode::BAD_GATEWAY,
            Some(&person),
            "Cannot audit the run",
            message,
        ),
    }
}

async fn not_found() -> Response {
    error_page(
        StatusCode::NOT_FOUND,
        None,
        "Not found",
        "There is no such page.",
    )
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", super::assets::CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", super::assets::JS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_valid_namespace_names_are_taken_from_the_query() {
        let query = NamespacesQuery {
            namespaces: Some("team-a, Team-B,,x y,-bad,<script>,ok-1".into()),
        };
        assert_eq!(query.names(), ["team-a", "x", "y", "ok-1"]);
        assert_eq!(query.suffix(), "?namespaces=team-a,x,y,ok-1");
        assert_eq!(NamespacesQuery::default().suffix(), "");
    }
}
