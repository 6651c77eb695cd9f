//! The assertion module against forgeries: every check of [`verify`] refuses what it must.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::Utc;
use jsonwebtoken::{Algorithm, Header};

use super::*;

const ENDPOINT: &str = "http://127.0.0.1:8080/delete_user";
const BODY: &[u8] = br#"{"user_id": "u-1"}"#;

fn claims() -> Claims {
    Claims {
        iss: String::new(),
        aud: ENDPOINT.into(),
        iat: 0,
        nbf: 0,
        exp: 0,
        jti: "3f1c2a4e-0000-4000-8000-000000000001".into(),
        namespace: "ops".into(),
        run: "r1".into(),
        run_uid: "0b6c1d2e-0000-4000-8000-000000000002".into(),
        step: 0,
        approval_request: "r1-call-1".into(),
        tool_call_id: "call_1".into(),
        tool: "delete_user".into(),
        endpoint: ENDPOINT.into(),
        arguments_sha256: body_digest(BODY),
        original_arguments_sha256: None,
        tool_definition_sha256: String::new(),
        approver: "alice@example.com".into(),
        approver_kind: ApproverKind::Verified,
        applied_by: None,
        gitops_commit: None,
        decided_at: Utc::now(),
    }
    .valid_from(Utc::now(), Duration::from_secs(600))
}

fn expected() -> Expected<'static> {
    Expected::new(ENDPOINT, BODY)
}

/// Replaces the payload of `token` with `payload`, keeping its header and signature.
fn with_payload(token: &str, payload: &serde_json::Value) -> String {
    let parts: Vec<&str> = token.split('.').collect();
    let encoded = URL_SAFE_NO_PAD.encode(serde_json::to_vec(payload).unwrap());
    format!("{}.{}.{}", parts[0], encoded, parts[2])
}

fn payload_of(token: &str) -> serde_json::Value {
    let part = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

fn header_of(token: &str) -> serde_json::Value {
    let part = token.split('.').next().unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).unwrap()).unwrap()
}

#[test]
fn round_trip_returns_the_claims_and_the_header_is_as_documented() {
    let signer = Signer::generate().unwrap();
    let jwks = Jwks::new([signer.jwk()]);
    let claims = claims();
    let token = signer.sign(&claims).unwrap();
    assert_eq!(verify(&token, &jwks, &expected()).unwrap(), claims);
    assert_eq!(
        header_of(&token),
        serde_json::json!({"typ": TOKEN_TYPE, "alg": "EdDSA", "kid": signer.kid()})
    );
    let payload = payload_of(&token);
    for name in [
        "iss",
        "aud",
        "iat",
        "nbf",
        "exp",
        "jti",
        "namespace",
        "run",
        "run_uid",
        "step",
        "approval_request",
        "tool_call_id",
        "tool",
        "endpoint",
        "arguments_sha256",
        "tool_definition_sha256",
        "approver",
        "approver_kind",
        "decided_at",
    ] {
        assert!(
            payload.get(name).is_some(),
            "claim {name} missing: {payload}"
        );
    }
    assert_eq!(payload["iss"], "agentrun");
    assert_eq!(payload["approver_kind"], "verified");
    assert_eq!(payload["exp"].as_u64(), Some(claims.iat + 600));
    assert!(payload.get("applied_by").is_none());
}

#[test]
fn gitops_claims_name_who_applied_them_and_the_commit() {
    let signer = Signer::generate().unwrap();
    let mut claims = claims();
    claims.approver_kind = ApproverKind::Gitops;
    claims.applied_by = Some("system:serviceaccount:flux:applier".into());
    claims.gitops_commit = Some("4b825dc642cb6eb9a060e54bf8d69288fbee4904".into());
    let token = signer.sign(&claims).unwrap();
    let payload = payload_of(&token);
    assert_eq!(payload["approver_kind"], "gitops");
    assert_eq!(payload["applied_by"], "system:serviceaccount:flux:applier");
    let verified = verify(&token, &Jwks::new([signer.jwk()]), &expected()).unwrap();
    assert_eq!(verified.approver_kind, ApproverKind::Gitops);
}

#[test]
fn a_tampered_payload_or_signature_is_refused() {
    let signer = Signer::generate().unwrap();
    let jwks = Jwks::new([signer.jwk()]);
    let token = signer.sign(&claims()).unwrap();
    // The arguments swapped for others, their digest with them.
    let other_body = br#"{"user_id": "u-666"}"#;
    let mut payload = payload_of(&token);
    payload["arguments_sha256"] = body_digest(other_body).into();
    let forged = with_payload(&token, &payload);
    let err = verify(&forged, &jwks, &Expected::new(ENDPOINT, other_body)).unwrap_err();
    assert!(matches!(err, AssertionError::BadSignature), "{err:?}");
    // Another approver.
    let mut payload = payload_of(&token);
    payload["approver"] = "mallory@example.com".into();
    let err = verify(&with_payload(&token, &payload), &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::BadSignature), "{err:?}");
    // A flipped bit of the signature.
    let mut bytes = URL_SAFE_NO_PAD
        .decode(token.rsplit('.').next().unwrap())
        .unwrap();
    bytes[10] ^= 1;
    let (message, _) = token.rsplit_once('.').unwrap();
    let flipped = format!("{message}.{}", URL_SAFE_NO_PAD.encode(bytes));
    let err = verify(&flipped, &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::BadSignature), "{err:?}");
    // Not a JWS at all.
    for junk in ["", "a.b", "not a token", "a.b.c"] {
        let err = verify(junk, &jwks, &expected()).unwrap_err();
        assert!(
            matches!(err, AssertionError::Malformed(_)),
            "{junk}: {err:?}"
        );
    }
}

#[test]
fn a_token_signed_by_another_key_is_refused_whatever_kid_it_names() {
    let signer = Signer::generate().unwrap();
    let attacker = Signer::generate().unwrap();
    let jwks = Jwks::new([signer.jwk()]);
    let own_kid = attacker.sign(&claims()).unwrap();
    let err = verify(&own_kid, &jwks, &expected()).unwrap_err();
    assert!(
        matches!(&err, AssertionError::UnknownKey(k) if k == attacker.kid()),
        "{err:?}"
    );
    let mut header = Header::new(Algorithm::EdDSA);
    header.typ = Some(TOKEN_TYPE.into());
    header.kid = Some(signer.kid().to_owned());
    let borrowed_kid = attacker.sign_with(&header, &claims()).unwrap();
    let err = verify(&borrowed_kid, &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::BadSignature), "{err:?}");
    header.kid = None;
    let no_kid = signer.sign_with(&header, &claims()).unwrap();
    let err = verify(&no_kid, &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::MissingKeyId), "{err:?}");
}

#[test]
fn other_algorithms_and_token_types_are_refused() {
    let signer = Signer::generate().unwrap();
    let jwks = Jwks::new([signer.jwk()]);
    let token = signer.sign(&claims()).unwrap();
    let (_, rest) = token.split_once('.').unwrap();
    let (payload, _) = rest.split_once('.').unwrap();
    // alg "none" without a signature.
    let none = URL_SAFE_NO_PAD.encode(format!(
        r#"{{"alg":"none","typ":"{TOKEN_TYPE}","kid":"{}"}}"#,
        signer.kid()
    ));
    let err = verify(&format!("{none}.{payload}."), &jwks, &expected()).unwrap_err();
    // jsonwebtoken knows no algorithm "none": the header does not even parse.
    assert!(
        matches!(
            err,
            AssertionError::WrongAlgorithm(_) | AssertionError::Malformed(_)
        ),
        "alg none: {err:?}"
    );
    // HS256 keyed with the public key (algorithm confusion).
    let hs = URL_SAFE_NO_PAD.encode(format!(
        r#"{{"alg":"HS256","typ":"{TOKEN_TYPE}","kid":"{}"}}"#,
        signer.kid()
    ));
    let err = verify(&format!("{hs}.{payload}.AAAA"), &jwks, &expected()).unwrap_err();
    assert!(
        matches!(err, AssertionError::WrongAlgorithm(_)),
        "HS256: {err:?}"
    );
    // A valid EdDSA JWT of another type (say, some other service's token from the same key).
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(signer.kid().to_owned());
    let jwt = signer.sign_with(&header, &claims()).unwrap();
    let err = verify(&jwt, &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::WrongType { .. }), "{err:?}");
}

#[test]
fn expired_and_not_yet_valid_assertions_are_refused_beyond_the_leeway() {
    let signer = Signer::generate().unwrap();
    let jwks = Jwks::new([signer.jwk()]);
    let now = Utc::now();
    let expired = claims().valid_from(
        now - chrono::Duration::seconds(700),
        Duration::from_secs(600),
    );
    let err = verify(&signer.sign(&expired).unwrap(), &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::Expired), "{err:?}");
    // Within the leeway it still passes.
    let just = claims().valid_from(
        now - chrono::Duration::seconds(610),
        Duration::from_secs(600),
    );
    verify(&signer.sign(&just).unwrap(), &jwks, &expected()).unwrap();
    let future = claims().valid_from(
        now + chrono::Duration::seconds(300),
        Duration::from_secs(600),
    );
    let err = verify(&signer.sign(&future).unwrap(), &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::NotYetValid), "{err:?}");
    // A time claim of the wrong type is not read as absent (CVE-2026-25537).
    let mut payload = serde_json::to_value(future).unwrap();
    payload["nbf"] = payload["nbf"].to_string().into();
    let mut header = Header::new(Algorithm::EdDSA);
    header.typ = Some(TOKEN_TYPE.into());
    header.kid = Some(signer.kid().to_owned());
    let token = signer.sign_with(&header, &payload).unwrap();
    let err = verify(&token, &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::Malformed(_)), "{err:?}");
    // And a missing one is refused.
    let mut payload = serde_json::to_value(claims()).unwrap();
    payload.as_object_mut().unwrap().remove("exp");
    let token = signer.sign_with(&header, &payload).unwrap();
    let err = verify(&token, &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::Malformed(_)), "{err:?}");
}

#[test]
fn another_endpoint_issuer_or_body_is_refused() {
    let signer = Signer::generate().unwrap();
    let jwks = Jwks::new([signer.jwk()]);
    let token = signer.sign(&claims()).unwrap();
    let err = verify(
        &token,
        &jwks,
        &Expected::new("http://127.0.0.1:8080/lookup_user", BODY),
    )
    .unwrap_err();
    assert!(
        matches!(err, AssertionError::WrongAudience { .. }),
        "{err:?}"
    );
    let err = verify(
        &token,
        &jwks,
        &Expected::new(ENDPOINT, br#"{"user_id":"u-1"}"#),
    )
    .unwrap_err();
    assert!(
        matches!(err, AssertionError::ArgumentsMismatch { .. }),
        "one space less is another body: {err:?}"
    );
    let mut other = claims();
    other.iss = "someone-else".into();
    let mut header = Header::new(Algorithm::EdDSA);
    header.typ = Some(TOKEN_TYPE.into());
    header.kid = Some(signer.kid().to_owned());
    let token = signer.sign_with(&header, &other).unwrap();
    let err = verify(&token, &jwks, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::WrongIssuer), "{err:?}");
    let mut other = claims();
    other.endpoint = "http://127.0.0.1:8080/lookup_user".into();
    let err = verify(&signer.sign(&other).unwrap(), &jwks, &expected()).unwrap_err();
    assert!(
        matches!(err, AssertionError::EndpointMismatch { .. }),
        "{err:?}"
    );
}

#[test]
fn rotation_keeps_old_assertions_valid_while_their_key_is_published() {
    let old = Signer::generate().unwrap();
    let new = Signer::generate().unwrap();
    let issued_by_old = old.sign(&claims()).unwrap();
    let issued_by_new = new.sign(&claims()).unwrap();
    let both = Jwks::new([new.jwk(), old.jwk()]);
    verify(&issued_by_old, &both, &expected()).unwrap();
    verify(&issued_by_new, &both, &expected()).unwrap();
    let only_new = Jwks::new([new.jwk()]);
    verify(&issued_by_new, &only_new, &expected()).unwrap();
    let err = verify(&issued_by_old, &only_new, &expected()).unwrap_err();
    assert!(matches!(err, AssertionError::UnknownKey(_)), "{err:?}");
}

#[test]
fn a_missing_header_is_refused() {
    let jwks = Jwks::new([Signer::generate().unwrap().jwk()]);
    for value in [None, Some(""), Some("  ")] {
        let err = verify_header(value, &jwks, &expected()).unwrap_err();
        assert!(matches!(err, AssertionError::Missing { .. }), "{err:?}");
        assert_eq!(err.label(), "missing");
    }
}

/// RFC 8037 appendix A: the Ed25519 key, its thumbprint, and the signature of its example JWS.
#[test]
fn rfc8037_known_answers() {
    let seed = URL_SAFE_NO_PAD
        .decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A")
        .unwrap();
    let signer = Signer::from_seed(&seed).unwrap();
    let jwk = signer.jwk();
    assert_eq!(
        jwk.x.as_deref(),
        Some("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
    );
    assert_eq!(signer.kid(), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k");
    let message = "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc";
    let signature =
        "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg";
    provider::install();
    let der = pem::parse(signer.to_pem()).unwrap().into_contents();
    let signed = jsonwebtoken::crypto::sign(
        message.as_bytes(),
        &jsonwebtoken::EncodingKey::from_ed_der(&der),
        Algorithm::EdDSA,
    )
    .unwrap();
    assert_eq!(signed, signature);
    let key = jsonwebtoken::DecodingKey::from_ed_components(jwk.x.as_deref().unwrap()).unwrap();
    assert!(
        jsonwebtoken::crypto::verify(signature, message.as_bytes(), &key, Algorithm::EdDSA)
            .unwrap()
    );
    assert!(
        !jsonwebtoken::crypto::verify(signature, b"another message", &key, Algorithm::EdDSA)
            .unwrap()
    );
}

#[test]
fn keys_round_trip_through_pem_and_the_jwks_has_the_published_shape() {
    let signer = Signer::generate().unwrap();
    let pem_text = signer.to_pem();
    assert!(
        pem_text.starts_with("-----BEGIN PRIVATE KEY-----"),
        "{pem_text}"
    );
    let again = Signer::from_pem(&pem_text).unwrap();
    assert_eq!(again.kid(), signer.kid());
    assert!(matches!(
        Signer::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
        Err(AssertionError::InvalidKey(_))
    ));
    assert!(matches!(
        Signer::from_seed(&[0; 31]),
        Err(AssertionError::InvalidKey(_))
    ));
    let jwks = Jwks::new([signer.jwk()]);
    let json: serde_json::Value = serde_json::from_str(&jwks.to_json()).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"keys": [{
            "kty": "OKP", "crv": "Ed25519", "x": signer.jwk().x, "kid": signer.kid(),
            "alg": "EdDSA", "use": "sig"
        }]})
    );
    assert_eq!(Jwks::from_json(&jwks.to_json()).unwrap(), jwks);
    assert!(Jwks::from_json("{}").is_err());
    // Keys of other types or uses are never used to verify.
    let mut enc = signer.jwk();
    enc.use_ = Some("enc".into());
    assert!(Jwks::new([enc]).find(signer.kid()).is_none());
}

/// A key written by `openssl genpkey -algorithm ed25519` (PKCS#8 v1), as the rotation procedure
/// in docs/security.md makes them, with its public key from `openssl pkey -pubout`.
#[test]
fn openssl_generated_keys_are_read() {
    let pem = "-----BEGIN PRIVATE KEY-----\n\
               MC4CAQAwBQYDK2VwBCIEIPGrbksVHYRsYhCtMdSCnU10flnQmwGfjt4PZ33EEuGE\n\
               -----END PRIVATE KEY-----\n";
    let signer = Signer::from_pem(pem).unwrap();
    assert_eq!(
        signer.jwk().x.as_deref(),
        Some("ZFGx3Vmbo9rOxCWN5xUH8KVcR7YFuTLgf950HZ4Js44")
    );
    let token = signer.sign(&claims()).unwrap();
    verify(&token, &Jwks::new([signer.jwk()]), &expected()).unwrap();
}
