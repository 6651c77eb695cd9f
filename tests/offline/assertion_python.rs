//! The Python verification example of docs/security.md (`examples/verify-approval.py`, PyJWT)
//! against assertions and a JWKS made by `agentrun::assertion`: it accepts the real one and
//! refuses tampered, forged, expired and misdirected ones. PyJWT is installed into a venv in the
//! system temp dir (kept between runs); the test fails, saying so, if it cannot be installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use agentrun::assertion::{ApproverKind, Claims, Jwks, Signer, body_digest};
use chrono::Utc;

const ENDPOINT: &str = "https://tools.example.com/delete_user";
const BODY: &str = r#"{"user_id": "u-1"}"#;
const PYJWT: &str = "PyJWT[crypto]>=2.10,<3";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A Python with PyJWT: a venv in the temp dir, made (and PyJWT installed) on first use.
fn python() -> PathBuf {
    let venv = std::env::temp_dir().join("agentrun-pyjwt-venv");
    let python = venv.join("bin").join("python");
    let ready = |python: &Path| {
        Command::new(python)
            .args(["-c", "import jwt, cryptography"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if ready(&python) {
        return python;
    }
    let made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .output()
        .expect("python3 must be installed to run the Python verification example");
    assert!(
        made.status.success(),
        "cannot make a venv at {}: {}",
        venv.display(),
        String::from_utf8_lossy(&made.stderr)
    );
    let installed = Command::new(venv.join("bin").join("pip"))
        .args(["install", "--quiet", PYJWT])
        .output()
        .expect("run pip");
    assert!(
        installed.status.success() && ready(&python),
        "cannot install {PYJWT} into {} (the package registry must be reachable): {}",
        venv.display(),
        String::from_utf8_lossy(&installed.stderr)
    );
    python
}

fn claims() -> Claims {
    Claims {
        iss: String::new(),
        aud: ENDPOINT.into(),
        iat: 0,
        nbf: 0,
        exp: 0,
        jti: "6f1d3c1e-5b1a-4c53-9d0e-2f8a4b7c9e10".into(),
        namespace: "ops".into(),
        run: "r1".into(),
        run_uid: "0b6c1d2e-4a5b-4c6d-8e9f-0a1b2c3d4e5f".into(),
        step: 0,
        approval_request: "r1-call-1".into(),
        tool_call_id: "call_1".into(),
        tool: "delete_user".into(),
        endpoint: ENDPOINT.into(),
        arguments_sha256: body_digest(BODY.as_bytes()),
        original_arguments_sha256: None,
        tool_definition_sha256: String::new(),
        approver: "alice@example.com".into(),
        approver_kind: ApproverKind::Verified,
        applied_by: None,
        gitops_commit: None,
        decided_at: Utc::now(),
    }
    .valid_from(Utc::now(), Duration::from_secs(300))
}

struct Example {
    python: PathBuf,
    dir: tempfile::TempDir,
    jwks: PathBuf,
}

impl Example {
    fn new(jwks: &Jwks) -> Example {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwks.json");
        std::fs::write(&path, jwks.to_json()).unwrap();
        Example {
            python: python(),
            dir,
            jwks: path,
        }
    }

    /// Runs the example: `Ok(claims)` when it accepts, `Err(why)` when it refuses.
    #[allow(clippy::unwrap_in_result)]
    fn verify(&self, token: &str, endpoint: &str, body: &str) -> Result<serde_json::Value, String> {
        let body_file = self.dir.path().join("body");
        std::fs::write(&body_file, body).unwrap();
        let out = Command::new(&self.python)
            .arg(repo().join("examples/verify-approval.py"))
            .arg(&self.jwks)
            .arg(endpoint)
            .arg(token)
            .arg(&body_file)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        match out.status.code() {
            Some(0) => Ok(serde_json::from_str(&stdout).unwrap()),
            Some(1) => Err(stdout),
            _ => panic!(
                "the example crashed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
}

#[test]
fn the_python_example_accepts_the_real_assertion_and_refuses_the_rest() {
    let old = Signer::generate().unwrap();
    let signer = Signer::generate().unwrap();
    let example = Example::new(&Jwks::new([signer.jwk(), old.jwk()]));
    let token = signer.sign(&claims()).unwrap();

    let accepted = example.verify(&token, ENDPOINT, BODY).unwrap();
    assert_eq!(accepted["approver"], "alice@example.com");
    assert_eq!(accepted["approver_kind"], "verified");
    assert_eq!(accepted["tool_call_id"], "call_1");
    // A previous key still published (rotation).
    example
        .verify(&old.sign(&claims()).unwrap(), ENDPOINT, BODY)
        .unwrap();

    let refused = |token: &str, endpoint: &str, body: &str| {
        example
            .verify(token, endpoint, body)
            .expect_err("must be refused")
    };
    let why = refused(&token, ENDPOINT, r#"{"user_id": "u-666"}"#);
    assert!(why.contains("not the approved arguments"), "{why}");
    let why = refused(&token, "https://tools.example.com/lookup_user", BODY);
    assert!(why.contains("InvalidAudienceError"), "{why}");
    let attacker = Signer::generate().unwrap();
    let why = refused(&attacker.sign(&claims()).unwrap(), ENDPOINT, BODY);
    assert!(why.contains("KeyError"), "an unknown key: {why}");
    // Claims swapped under the real signature.
    let (header, rest) = token.split_once('.').unwrap();
    let (_, signature) = rest.split_once('.').unwrap();
    let forged_claims = Claims {
        approver: "mallory@example.com".into(),
        ..claims()
    };
    let forged_payload = attacker.sign(&forged_claims).unwrap();
    let forged_payload = forged_payload.split('.').nth(1).unwrap();
    let why = refused(
        &format!("{header}.{forged_payload}.{signature}"),
        ENDPOINT,
        BODY,
    );
    assert!(why.contains("InvalidSignatureError"), "{why}");
    let expired = claims().valid_from(
        Utc::now() - chrono::Duration::seconds(400),
        Duration::from_secs(300),
    );
    let why = refused(&signer.sign(&expired).unwrap(), ENDPOINT, BODY);
    assert!(why.contains("ExpiredSignatureError"), "{why}");
}

#[test]
fn the_docs_show_the_example_verbatim() {
    let example = std::fs::read_to_string(repo().join("examples/verify-approval.py")).unwrap();
    let start = example.find("def verify_approval").unwrap();
    let end = example.find("# --- end ---").unwrap();
    let function = example[start..end].trim_end();
    let docs = std::fs::read_to_string(repo().join("docs/security.md")).unwrap();
    assert!(
        docs.contains(function),
        "docs/security.md must show examples/verify-approval.py's verify_approval as is:\n{function}"
    );
}
