//! Small HTTP helpers shared by the model providers and the HTTP tools.

use std::time::Duration;

/// Builds the HTTP client used for model and tool requests. Redirects are not followed (a
/// redirected POST would silently change meaning); per-request timeouts are set by the callers.
pub(crate) fn build_client() -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a bundled crypto provider: install ring as the process default.
    // An error only means some provider is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("agentrun/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Reads at most `limit` bytes of a response body; the flag tells whether more was left unread.
pub(crate) async fn read_body_limited(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// A short, single-line excerpt of a body for error messages.
pub(crate) fn excerpt(body: &[u8]) -> String {
    const MAX_CHARS: usize = 200;
    let text = String::from_utf8_lossy(body);
    let mut out = String::new();
    for (count, c) in text.trim().chars().enumerate() {
        if count == MAX_CHARS {
            out.push('…');
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    if out.is_empty() {
        out.push_str("(empty body)");
    }
    out
}

/// An error and its sources on one line (`a: b: c`), for messages that must stay readable.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(err) = source {
        let text = err.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = err.source();
    }
    out
}
