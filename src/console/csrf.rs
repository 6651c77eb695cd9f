//! Cross-site request forgery protection: the synchronizer-token pattern.
//!
//! Each session holds a random token (256 bits, server-side, see [`super::session`]). Every page
//! with a form puts it in a hidden `csrf` field; every state-changing request (`POST`: login,
//! logout, approve, reject) must send it back, compared in constant time, or it is refused with
//! 403 before anything else happens. The session cookie's `SameSite=Strict` already keeps other
//! sites' forms from carrying the session; the token also covers an authenticating proxy in front
//! (whose own cookie may not be `Strict`) and browsers that ignore `SameSite`. As a third layer, a
//! request the browser marks `Sec-Fetch-Site: cross-site` is refused outright.

use axum::http::HeaderMap;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use subtle::ConstantTimeEq;

/// The form field that carries the token.
pub const FIELD: &str = "csrf";

/// A new random token: 32 bytes from the thread-local CSPRNG (seeded by the OS), base64url.
pub fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Why a state-changing request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CsrfRefusal {
    /// The request has no token, or not the session's.
    #[error(
        "the form's security token is missing or does not match your session: reload the page and try again"
    )]
    BadToken,
    /// The browser says the request comes from another site.
    #[error("the request comes from another site")]
    CrossSite,
}

/// Checks a state-changing request: the browser does not mark it cross-site, and `given` (the
/// form's token) is the session's `expected` token.
pub fn check(
    headers: &HeaderMap,
    expected: Option<&str>,
    given: Option<&str>,
) -> Result<(), CsrfRefusal> {
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"))
    {
        return Err(CsrfRefusal::CrossSite);
    }
    match (expected, given) {
        (Some(expected), Some(given))
            if !expected.is_empty() && bool::from(expected.as_bytes().ct_eq(given.as_bytes())) =>
        {
            Ok(())
        }
        _ => Err(CsrfRefusal::BadToken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn only_the_sessions_token_from_the_same_site_passes() {
        let token = new_token();
        assert_eq!(token.len(), 43);
        assert_ne!(token, new_token());
        let mut headers = HeaderMap::new();
        assert_eq!(check(&headers, Some(&token), Some(&token)), Ok(()));
        assert_eq!(
            check(&headers, Some(&token), None),
            Err(CsrfRefusal::BadToken)
        );
        assert_eq!(
            check(&headers, Some(&token), Some("x")),
            Err(CsrfRefusal::BadToken)
        );
        assert_eq!(check(&headers, None, Some("")), Err(CsrfRefusal::BadToken));
        assert_eq!(
            check(&headers, Some(""), Some("")),
            Err(CsrfRefusal::BadToken)
        );
        headers.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert_eq!(check(&headers, Some(&token), Some(&token)), Ok(()));
        headers.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert_eq!(
            check(&headers, Some(&token), Some(&token)),
            Err(CsrfRefusal::CrossSite)
        );
    }
}
