//! Signed approval assertions end to end: the controller (with signing on) against the real
//! control plane, a worker sending the approved call with its assertion, and a tool server that
//! refuses calls without a valid one — attacked with a missing, a forged and a replayed-elsewhere
//! assertion. Also: the keys' Secret, the JWKS ConfigMap and the HTTP endpoint.

use std::time::Duration;

use agentrun::assertion::{self, ApproverKind, Claims, Expected, HEADER, Jwks, Signer};
use agentrun::controller::SigningConfig;
use agentrun::controller::signing::{self, CURRENT_ENTRY, FIRST_KEY_ENTRY, JWKS_KEY};
use agentrun::crd::{AgentRun, AgentRunPhase, ApprovalRequest};
use agentrun_testkit::cluster::{ControlPlane, Identity, assert_success};
use agentrun_testkit::operator::{start_operator_with, test_config};
use agentrun_testkit::tool_server::ToolServer;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

/// alice and bob decide; the GitOps identity applies decisions from a repository.
fn grant_deciders(cp: &ControlPlane, ns: &str) {
    let yaml = format!(
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: deciders, namespace: {ns}}}
rules:
- apiGroups: [agentrun.dev]
  resources: [approvalrequests]
  verbs: [get, list, watch, patch]
- apiGroups: [agentrun.dev]
  resources: [agentruns]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: deciders, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: deciders}}
subjects: [{{kind: Group, name: "agentrun:approvers"}}, {{kind: Group, name: "agentrun:gitops"}}]
"#
    );
    assert_success(
        &cp.kubectl_with_stdin(Identity::Admin, &["apply", "-f", "-"], Some(&yaml)),
        "grant deciders",
    );
}

fn apply(cp: &ControlPlane, value: serde_json::Value) {
    assert_success(
        &cp.kubectl_with_stdin(
            Identity::Admin,
            &["apply", "-f", "-"],
            Some(&value.to_string()),
        ),
        "kubectl apply",
    );
}

fn agent(ns: &str, name: &str, call_id: &str, user: &str, tools: &ToolServer) -> serde_json::Value {
    json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "instructions": "You are an operations agent.",
            "model": {"scripted": {"turns": [
                {"toolCalls": [{"id": call_id, "name": "delete_user", "arguments": {"user_id": user}}]},
                {"content": "Done."}
            ]}},
            "tools": [
                {"name": "delete_user", "description": "Delete a user", "requiresApproval": true,
                 "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}},
                 "http": {"url": tools.url("/delete_user"), "timeoutSeconds": 10}}
            ]
        }
    })
}

fn run(ns: &str, name: &str, agent: &str) -> serde_json::Value {
    json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"agentRef": {"name": agent}, "input": "Delete the user"}
    })
}

async fn wait_for_phase(cp: &ControlPlane, ns: &str, name: &str, phase: AgentRunPhase) -> AgentRun {
    let api: Api<AgentRun> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let current = api.get(name).await.expect("get run");
        let status = current.status.clone().unwrap_or_default();
        if status.phase == Some(phase) {
            return current;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "run {name} did not reach {phase:?}: {}",
            serde_json::to_string_pretty(&status).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn request_of(cp: &ControlPlane, ns: &str, run: &str) -> ApprovalRequest {
    let api: Api<ApprovalRequest> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    let list = api
        .list(&ListParams::default().labels(&format!("agentrun.dev/run={run}")))
        .await
        .unwrap()
        .items;
    assert_eq!(list.len(), 1, "one request for {run}");
    list.into_iter().next().unwrap()
}

fn decide(
    cp: &ControlPlane,
    identity: Identity,
    ns: &str,
    request: &str,
    patch: serde_json::Value,
) {
    assert_success(
        &cp.kubectl(
            identity,
            &[
                "patch",
                "apr",
                request,
                "-n",
                ns,
                "--type",
                "merge",
                "-p",
                &patch.to_string(),
            ],
        ),
        "kubectl patch apr",
    );
}

/// A free port on 127.0.0.1 for the controller's HTTP server.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until the controller has published its JWKS in the ConfigMap.
async fn published_jwks(cp: &ControlPlane, ns: &str) -> String {
    let api: Api<ConfigMap> = Api::namespaced(cp.client(Identity::Admin).await, ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(text) = api
            .get_opt(signing::DEFAULT_CONFIG_MAP)
            .await
            .unwrap()
            .and_then(|cm| cm.data)
            .and_then(|d| d.get(JWKS_KEY).cloned())
        {
            return text;
        }
        assert!(tokio::time::Instant::now() < deadline, "no JWKS ConfigMap");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks `claims` name the call of `request`, sent with `body` to `endpoint`.
fn assert_names_the_call(claims: &Claims, request: &ApprovalRequest, body: &str, endpoint: &str) {
    assert_eq!(claims.iss, "agentrun");
    assert_eq!(claims.aud, endpoint);
    assert_eq!(claims.endpoint, endpoint);
    assert_eq!(
        claims.arguments_sha256,
        assertion::body_digest(body.as_bytes())
    );
    assert_eq!(claims.arguments_sha256, request.spec.arguments_digest);
    assert_eq!(claims.run, request.spec.agent_run_ref.name);
    assert_eq!(claims.run_uid, request.spec.agent_run_ref.uid);
    assert_eq!(claims.tool_call_id, request.spec.tool_call_id);
    assert_eq!(claims.tool, "delete_user");
    assert_eq!(claims.approval_request, request.name_any());
    assert_eq!(claims.jti, request.uid().unwrap());
    assert_eq!(claims.namespace, request.namespace().unwrap());
    assert!(
        claims.exp > claims.iat && claims.exp - claims.iat == 300,
        "{claims:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approved_calls_carry_a_verifiable_assertion_and_forgeries_are_refused() {
    let cp = ControlPlane::shared().await;
    let ns = cp.namespace("e2e-assert").await;
    let port = free_port();
    let mut config = test_config(&ns.name);
    config.metrics_addr = Some(([127, 0, 0, 1], port).into());
    config.signing = Some(SigningConfig {
        lifetime: Duration::from_secs(300),
        ..SigningConfig::new(&ns.name)
    });
    let _operator = start_operator_with(cp, &ns, config).await;
    grant_deciders(cp, &ns.name);

    // The keys: a Secret made with one key, its public key in the ConfigMap and over HTTP.
    let jwks_text = published_jwks(cp, &ns.name).await;
    let jwks = Jwks::from_json(&jwks_text).unwrap();
    assert_eq!(jwks.keys.len(), 1);
    let secrets: Api<Secret> = Api::namespaced(cp.client(Identity::Admin).await, &ns.name);
    let secret = secrets.get(signing::DEFAULT_SECRET).await.unwrap();
    let data = secret.data.unwrap();
    assert_eq!(data[CURRENT_ENTRY].0, FIRST_KEY_ENTRY.as_bytes());
    let key = Signer::from_pem(std::str::from_utf8(&data[FIRST_KEY_ENTRY].0).unwrap()).unwrap();
    assert_eq!(jwks.keys[0].kid.as_deref(), Some(key.kid()));
    assert!(
        !jwks_text.contains("\"d\""),
        "the JWKS holds no private key"
    );
    let served = reqwest::get(format!("http://127.0.0.1:{port}/.well-known/jwks.json"))
        .await
        .unwrap();
    assert_eq!(served.status(), 200);
    assert_eq!(served.headers()["content-type"], "application/jwk-set+json");
    assert_eq!(
        Jwks::from_json(&served.text().await.unwrap()).unwrap(),
        jwks
    );

    // The tool refuses calls without a valid assertion.
    let tools = ToolServer::start().await;
    tools.require_assertions("/delete_user", jwks.clone());
    tools.require_assertions("/lookup_user", jwks.clone());
    let endpoint = tools.url("/delete_user");

    // alice approves: the call arrives with an assertion naming her, the body and the endpoint.
    apply(cp, agent(&ns.name, "ops", "call_A1", "u-1", &tools));
    apply(cp, run(&ns.name, "r1", "ops"));
    wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::AwaitingApproval).await;
    let request = request_of(cp, &ns.name, "r1").await;
    assert!(tools.requests().is_empty() && tools.refused().is_empty());
    decide(
        cp,
        Identity::Alice,
        &ns.name,
        &request.name_any(),
        json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "CR-1"}}),
    );
    let done = wait_for_phase(cp, &ns.name, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(done.status.unwrap().final_output.as_deref(), Some("Done."));
    assert!(tools.refused().is_empty(), "{:?}", tools.refused());
    let calls = tools.requests_to("/delete_user");
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.body, r#"{"user_id": "u-1"}"#);
    let token = call
        .header(HEADER)
        .expect("the assertion header")
        .to_owned();
    let claims = assertion::verify(
        &token,
        &jwks,
        &Expected::new(&endpoint, call.body.as_bytes()),
    )
    .unwrap();
    let request = request_of(cp, &ns.name, "r1").await;
    assert_names_the_call(&claims, &request, &call.body, &endpoint);
    assert_eq!(claims.approver, "alice@example.com");
    assert_eq!(claims.approver_kind, ApproverKind::Verified);
    assert_eq!(
        (claims.applied_by.clone(), claims.gitops_commit.clone()),
        (None, None)
    );
    assert_eq!(
        request.status.as_ref().unwrap().assertion.as_deref(),
        Some(token.as_str()),
        "the worker sent the assertion the controller stored"
    );

    // Attacks: straight to the tool, as a namespace editor who read the request could.
    let client = reqwest::Client::new();
    let send = |path: &str, body: &str, assertion: Option<&str>| {
        let mut post = client
            .post(tools.url(path))
            .header("content-type", "application/json")
            .header("Idempotency-Key", "call_A1")
            .body(body.to_owned());
        if let Some(assertion) = assertion {
            post = post.header(HEADER, assertion);
        }
        async move { post.send().await.unwrap().status().as_u16() }
    };
    // 1. No assertion.
    assert_eq!(
        send("/delete_user", r#"{"user_id": "u-1"}"#, None).await,
        401
    );
    // 2. A forged one: all the right claims, signed with another key under the real kid.
    let attacker = Signer::generate().unwrap();
    let forged = forge(&attacker, key.kid(), &claims);
    assert_eq!(
        send("/delete_user", r#"{"user_id": "u-1"}"#, Some(&forged)).await,
        401
    );
    // 3. The real one with other arguments.
    assert_eq!(
        send("/delete_user", r#"{"user_id": "u-666"}"#, Some(&token)).await,
        401
    );
    // 4. The real one at another endpoint.
    assert_eq!(
        send("/lookup_user", r#"{"user_id": "u-1"}"#, Some(&token)).await,
        401
    );
    let reasons: Vec<&str> = tools.refused().iter().map(|r| r.reason).collect();
    assert_eq!(
        reasons,
        [
            "missing",
            "bad_signature",
            "arguments_mismatch",
            "wrong_audience"
        ]
    );
    assert_eq!(tools.requests().len(), 1, "no refused call ran");

    // A GitOps decision is asserted as such: the approver it claims, who applied it, the commit.
    apply(cp, agent(&ns.name, "ops2", "call_G1", "u-2", &tools));
    apply(cp, run(&ns.name, "r2", "ops2"));
    wait_for_phase(cp, &ns.name, "r2", AgentRunPhase::AwaitingApproval).await;
    let request = request_of(cp, &ns.name, "r2").await;
    let commit = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
    decide(
        cp,
        Identity::Gitops,
        &ns.name,
        &request.name_any(),
        json!({
            "metadata": {"annotations": {"agentrun.dev/gitops-commit": commit}},
            "spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "merged PR 12"}
        }),
    );
    wait_for_phase(cp, &ns.name, "r2", AgentRunPhase::Succeeded).await;
    let (path, claims) = tools.verified().pop().unwrap();
    assert_eq!(path, "/delete_user");
    let request = request_of(cp, &ns.name, "r2").await;
    assert_names_the_call(&claims, &request, r#"{"user_id": "u-2"}"#, &endpoint);
    assert_eq!(claims.approver, "alice@example.com");
    assert_eq!(claims.approver_kind, ApproverKind::Gitops);
    assert_eq!(claims.applied_by.as_deref(), Some("gitops"));
    assert_eq!(claims.gitops_commit.as_deref(), Some(commit));
    assert_eq!(tools.requests_to("/delete_user").len(), 2);
}

/// `claims` signed by `signer` under the header the controller writes, naming `kid`.
fn forge(signer: &Signer, kid: &str, claims: &Claims) -> String {
    // Signed properly by the attacker's key, then given the real key's id.
    let own = signer.sign(claims).unwrap();
    let (header, rest) = own.split_once('.').unwrap();
    let header = String::from_utf8(base64_decode(header)).unwrap();
    let header = header.replace(signer.kid(), kid);
    format!("{}.{rest}", base64_encode(header.as_bytes()))
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .unwrap()
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_racing_to_create_the_keys_end_up_with_one() {
    let cp = ControlPlane::shared().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ns = cp.namespace("e2e-keys").await;
    let client = cp.client(Identity::Admin).await;
    let config = SigningConfig {
        secret_name: "race-keys".into(),
        config_map_name: "race-jwks".into(),
        ..SigningConfig::new(&ns.name)
    };
    let (a, b) = tokio::join!(
        signing::load_or_create(&client, &config),
        signing::load_or_create(&client, &config)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.signer().kid(), b.signer().kid());
    // A restart reads the same key.
    let again = signing::load_or_create(&client, &config).await.unwrap();
    assert_eq!(again.signer().kid(), a.signer().kid());

    // Rotation: the admin adds a key and makes it current; both stay published.
    let new = Signer::generate().unwrap();
    let patch = json!({"stringData": {"key-2.pem": new.to_pem(), CURRENT_ENTRY: "key-2.pem"}});
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets
        .patch(
            "race-keys",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let rotated = signing::load_or_create(&client, &config).await.unwrap();
    assert_eq!(rotated.signer().kid(), new.kid());
    let kids: Vec<_> = rotated
        .jwks()
        .keys
        .iter()
        .filter_map(|k| k.kid.clone())
        .collect();
    assert_eq!(kids, [new.kid(), a.signer().kid()]);
    let config_maps: Api<ConfigMap> = Api::namespaced(client, &ns.name);
    let published = config_maps.get("race-jwks").await.unwrap().data.unwrap()[JWKS_KEY].clone();
    assert_eq!(Jwks::from_json(&published).unwrap(), *rotated.jwks());
}
