//! The HTTP client of the senders and the text of their errors.

use std::time::Duration;

/// How much of a refusing answer's body is read (the rest is not).
pub const ANSWER_EXCERPT_BYTES: usize = 512;

/// The client the senders share: no redirects (a redirected POST would go where the admin did not
/// say), a connect timeout, the agentrun user agent. Per-request timeouts come from the sinks.
pub fn build_client() -> Result<reqwest::Client, reqwest::Error> {
    // reqwest is built without a bundled crypto provider: install ring as the process default (an
    // error only means one is installed already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!(
            "agentrun-notifications/",
            env!("CARGO_PKG_VERSION")
        ))
        .build()
}

/// The first [`ANSWER_EXCERPT_BYTES`] of an answer's body as one short line.
pub async fn answer_excerpt(mut answer: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < ANSWER_EXCERPT_BYTES {
        match answer.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(ANSWER_EXCERPT_BYTES);
    let text = String::from_utf8_lossy(&body);
    let line: String = text
        .trim()
        .chars()
        .take(200)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.is_empty() {
        "(empty body)".to_owned()
    } else {
        line
    }
}

/// An error and its sources on one line (`a: b: c`).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
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
