//! The CRDs against a real API server (kube-apiserver + etcd, started once for this test binary):
//! they install, `kubectl explain` reads their docs, valid objects are accepted, bad ones are
//! refused with a clear message, and the ApprovalRequest's CEL rules keep the request fields
//! immutable and a decision final. Everything here runs as admin; identity checks belong to the
//! admission policies.
//!
//! A test binary of its own, so a control plane of its own: these tests need a cluster WITHOUT the
//! admission policies of `crds/` (admin records decisions in other names here, which the policies
//! refuse), and the policies are cluster-wide, so they cannot share the control plane of
//! `tests/cluster`.

use std::process::Output;
use std::time::{Duration, Instant};

use agentrun::crd::{
    Agent, AgentRef, AgentRun, AgentRunPhase, AgentRunRef, AgentRunSpec, AgentRunStatus, AgentSpec,
    ApprovalPhase, ApprovalRequest, ApprovalRequestSpec, ApprovalRequestStatus, CATEGORY,
    ConditionStatus, Decision, RunStateEncoding, VerifiedIdentity, WorkerOverrides,
    approval_request_name, arguments_digest, new_condition,
};
use agentrun_testkit::cluster::{
    ControlPlane, Identity, TestNamespace, assert_refused, stderr, stdout,
};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};

/// The documented way to approve, exactly.
const APPROVE_PATCH: &str = r#"{"spec":{"decision":"Approved","approverId":"alice@example.com","reason":"authorized per change CR-1234"}}"#;
/// The message of the rule that makes a decision final.
const FINAL: &str = agentrun::crd::approval_request::DECISION_FINAL_MESSAGE;
/// Arguments with an integer no float can hold: they must come back byte for byte.
const ARGUMENTS: &str = r#"{"host": "web-1", "replicas": 12345678901234567890123}"#;

async fn setup(prefix: &str) -> (&'static ControlPlane, TestNamespace, Client) {
    let cp = ControlPlane::shared().await;
    cp.install_crds_only().await;
    let ns = cp.namespace(prefix).await;
    let client = cp.client(Identity::Admin).await;
    (cp, ns, client)
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

/// The words of `text` separated by single spaces.
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[track_caller]
fn assert_ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed:\nstdout: {}\nstderr: {}",
        stdout(out),
        stderr(out)
    );
}

fn kubectl_patch(cp: &ControlPlane, ns: &str, resource: &str, name: &str, patch: &str) -> Output {
    cp.kubectl(
        Identity::Admin,
        &[
            "-n", ns, "patch", resource, name, "--type", "merge", "-p", patch,
        ],
    )
}

fn kubectl_create(cp: &ControlPlane, ns: &str, yaml: &str) -> Output {
    cp.kubectl_with_stdin(
        Identity::Admin,
        &["-n", ns, "create", "-f", "-"],
        Some(yaml),
    )
}

fn request_spec(run: &str, call: &str) -> ApprovalRequestSpec {
    ApprovalRequestSpec {
        agent_run_ref: AgentRunRef {
            name: run.to_owned(),
            uid: "0b6d0a6e-6f0e-4d1b-9a43-3f1f2b0c9d11".to_owned(),
        },
        step: 1,
        tool_call_id: call.to_owned(),
        tool_name: "restart".to_owned(),
        arguments: ARGUMENTS.to_owned(),
        arguments_digest: arguments_digest(ARGUMENTS),
        ..Default::default()
    }
}

/// Creates an ApprovalRequest named as the controller names it; returns its name.
async fn create_request(client: &Client, ns: &str, spec: ApprovalRequestSpec) -> String {
    let name = approval_request_name(&spec.agent_run_ref.name, &spec.tool_call_id);
    let api: Api<ApprovalRequest> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &ApprovalRequest::new(&name, spec))
        .await
        .unwrap_or_else(|e| panic!("create ApprovalRequest {name}: {e}"));
    name
}

async fn get_request(client: &Client, ns: &str, name: &str) -> ApprovalRequest {
    let api: Api<ApprovalRequest> = Api::namespaced(client.clone(), ns);
    api.get(name).await.expect("get ApprovalRequest")
}

async fn set_request_phase(client: &Client, ns: &str, name: &str, phase: ApprovalPhase) {
    let api: Api<ApprovalRequest> = Api::namespaced(client.clone(), ns);
    let status = ApprovalRequestStatus {
        phase: Some(phase),
        ..Default::default()
    };
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await
    .unwrap_or_else(|e| panic!("set status.phase {phase} on {name}: {e}"));
}

fn minimal_agent_spec() -> AgentSpec {
    serde_json::from_value(serde_json::json!({
        "instructions": "Keep the web tier healthy.",
        "model": {
            "baseUrl": "http://127.0.0.1:9/v1",
            "name": "gpt-4o-mini",
            "apiKeySecretRef": {"name": "model-key", "key": "token"}
        },
        "tools": [
            {"name": "restart", "requiresApproval": true, "http": {"url": "http://127.0.0.1:9/restart"}},
            {"name": "status", "http": {"url": "http://127.0.0.1:9/status"}}
        ],
        "maxTurns": 8
    }))
    .expect("agent spec")
}

fn run_spec(agent: &str, input: &str) -> AgentRunSpec {
    AgentRunSpec {
        agent_ref: AgentRef {
            name: agent.to_owned(),
        },
        input: input.to_owned(),
        worker: None,
    }
}

#[tokio::test]
async fn crds_are_established_with_their_names() {
    let (cp, _ns, client) = setup("crd-names").await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (name, kind, short, has_status) in [
        ("agents.agentrun.dev", "Agent", "agt", true),
        ("agentruns.agentrun.dev", "AgentRun", "ar", true),
        (
            "approvalrequests.agentrun.dev",
            "ApprovalRequest",
            "apr",
            true,
        ),
    ] {
        let crd = crds.get(name).await.expect("get CRD");
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        for wanted in ["Established", "NamesAccepted"] {
            assert!(
                conditions
                    .iter()
                    .any(|c| c.type_ == wanted && c.status == "True"),
                "{name}: {wanted} is not True: {conditions:?}"
            );
        }
        assert_eq!(crd.spec.names.kind, kind);
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_owned()]));
        assert_eq!(crd.spec.names.categories, Some(vec![CATEGORY.to_owned()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert_eq!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            has_status,
            "{name}: status subresource"
        );
    }

    let out = cp.kubectl(
        Identity::Admin,
        &["api-resources", "--api-group=agentrun.dev", "--no-headers"],
    );
    assert_ok(&out, "kubectl api-resources");
    let listed = stdout(&out);
    for (plural, short) in [
        ("agents", "agt"),
        ("agentruns", "ar"),
        ("approvalrequests", "apr"),
    ] {
        assert!(
            listed
                .lines()
                .any(|l| l.split_whitespace().take(2).eq([plural, short])),
            "{plural} ({short}) missing from:\n{listed}"
        );
    }
}

#[tokio::test]
async fn kubectl_explain_reads_the_field_docs() {
    let (cp, _ns, _client) = setup("crd-explain").await;
    // The API server publishes a new CRD's OpenAPI a moment after it is Established. kubectl
    // wraps the text to the terminal width, so compare with whitespace collapsed.
    let explain = |path: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let out = cp.kubectl(Identity::Admin, &["explain", path]);
            if out.status.success() {
                return words(&stdout(&out));
            }
            assert!(
                Instant::now() < deadline,
                "kubectl explain {path} kept failing: {}",
                stderr(&out)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };

    let spec = explain("agentrun.spec");
    for needle in [
        "What to run: which agent, with what input, and optionally how its worker Pods look.",
        "agentRef\t<Object> -required-",
        "The Agent (in the run's namespace) whose instructions, model and tools the run uses.",
        "input\t<string> -required-",
        "The user's input: the first message of the conversation. Immutable.",
        "worker\t<Object>",
        "Overrides for the worker Pods that run the steps of this run.",
    ] {
        assert!(
            spec.contains(&words(needle)),
            "`{needle}` missing from:\n{spec}"
        );
    }

    let apr = explain("apr.spec");
    for needle in [
        "One tool call waiting for a person's decision.",
        "toolCallId\t<string> -required-",
        "The tool call's id exactly as the model wrote it. Immutable.",
        "Why, for the audit trail (e.g. a change ticket). Never shown to the model.",
        "Rejected only: what the model is told instead of the tool's result.",
    ] {
        assert!(
            apr.contains(&words(needle)),
            "`{needle}` missing from:\n{apr}"
        );
    }
    let decision = explain("apr.spec.decision");
    for needle in ["Approved", "Rejected", "Set once, by a person"] {
        assert!(
            decision.contains(needle),
            "`{needle}` missing from:\n{decision}"
        );
    }

    let out = cp.kubectl(
        Identity::Admin,
        &[
            "explain",
            "agt.spec.approvals",
            "--api-version=agentrun.dev/v1alpha1",
        ],
    );
    assert!(
        !out.status.success(),
        "separation of duties is an admin setting, not an Agent field"
    );
    let status = explain("ar.status.runStateEncoding");
    assert!(status.contains("gzip+base64"), "{status}");
}

#[tokio::test]
async fn valid_objects_are_accepted_and_read_back() {
    let (cp, ns, client) = setup("crd-valid").await;
    let ns = ns.name.as_str();

    let agents: Api<Agent> = Api::namespaced(client.clone(), ns);
    let agent_spec = minimal_agent_spec();
    agents
        .create(
            &PostParams::default(),
            &Agent::new("ops", agent_spec.clone()),
        )
        .await
        .expect("create Agent");
    assert_eq!(agents.get("ops").await.expect("get Agent").spec, agent_spec);

    let runs: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    let mut spec = run_spec("ops", "Restart web-1, it is unhealthy.");
    spec.worker = Some(WorkerOverrides {
        image: Some("ghcr.io/agentrun-dev/agentrun:dev".to_owned()),
        resources: Some(ResourceRequirements {
            limits: Some([("memory".to_owned(), Quantity("256Mi".to_owned()))].into()),
            ..Default::default()
        }),
        service_account_name: Some("agentrun-worker".to_owned()),
    });
    runs.create(
        &PostParams::default(),
        &AgentRun::new("restart-web", spec.clone()),
    )
    .await
    .expect("create AgentRun");
    let created = runs.get("restart-web").await.expect("get AgentRun");
    assert_eq!(created.spec, spec);
    assert_eq!(created.status, None);

    let state = r#"{"version":1,"messages":[]}"#;
    let status = AgentRunStatus {
        phase: Some(AgentRunPhase::AwaitingApproval),
        conditions: vec![new_condition(
            "Ready",
            ConditionStatus::False,
            "AwaitingApproval",
            "1 tool call waits for a decision",
            created.meta().generation,
            now(),
        )],
        observed_generation: created.meta().generation,
        run_state: Some(state.to_owned()),
        run_state_encoding: Some(RunStateEncoding::Json),
        run_state_bytes: Some(state.len() as u64),
        run_state_digest: Some(arguments_digest(state)),
        step: Some(1),
        final_output: None,
        pending_approvals: Some(1),
        approval_gates: vec!["delete_user".into()],
        worker_pod: Some(agentrun::crd::worker_pod_name("restart-web", 1, 0)),
        started_at: Some(now()),
        tool_calls: vec![],
        run_state_chunks: None,
        completed_at: None,
        retries: Some(0),
        created_by: Some("carol@example.com".to_owned()),
        agent: None,
    };
    runs.patch_status(
        "restart-web",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await
    .expect("patch AgentRun status");
    let mut read = runs
        .get("restart-web")
        .await
        .expect("get AgentRun")
        .status
        .expect("status");
    // Times are stored at second precision: check they are there, then compare the rest exactly.
    assert!(read.started_at.is_some());
    assert_eq!(read.conditions.len(), 1);
    read.started_at = status.started_at.clone();
    read.conditions[0].last_transition_time = status.conditions[0].last_transition_time.clone();
    assert_eq!(read, status);

    let name = create_request(&client, ns, request_spec("restart-web", "call_TX_9")).await;
    assert!(name.starts_with("restart-web-call-tx-9-"), "{name}");
    let request = get_request(&client, ns, &name).await;
    assert_eq!(request.spec, request_spec("restart-web", "call_TX_9"));
    assert_eq!(
        request.spec.arguments, ARGUMENTS,
        "arguments must survive byte for byte"
    );
    assert!(request.spec.digest_matches());

    let requests: Api<ApprovalRequest> = Api::namespaced(client.clone(), ns);
    let request_status = ApprovalRequestStatus {
        phase: Some(ApprovalPhase::Pending),
        expires_at: Some(now()),
        verified_identity: Some(VerifiedIdentity {
            username: "alice@example.com".to_owned(),
            uid: None,
            groups: vec![
                "agentrun:approvers".to_owned(),
                "system:authenticated".to_owned(),
            ],
        }),
        ..Default::default()
    };
    requests
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": request_status })),
        )
        .await
        .expect("patch ApprovalRequest status");
    let status = get_request(&client, ns, &name)
        .await
        .status
        .expect("status");
    assert_eq!(status.phase, Some(ApprovalPhase::Pending));
    assert_eq!(status.verified_identity, request_status.verified_identity);

    // Printer columns.
    let out = cp.kubectl(Identity::Admin, &["-n", ns, "get", "ar", "restart-web"]);
    assert_ok(&out, "kubectl get ar");
    let table = stdout(&out);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "AGENT", "STEP", "PENDING", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..5],
        ["restart-web", "AwaitingApproval", "ops", "1", "1"],
        "{table}"
    );

    let out = kubectl_patch(cp, ns, "apr", &name, APPROVE_PATCH);
    assert_ok(&out, "approve");
    let out = cp.kubectl(Identity::Admin, &["-n", ns, "get", "apr", &name]);
    assert_ok(&out, "kubectl get apr");
    let table = stdout(&out);
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "RUN", "TOOL", "DECISION", "APPROVER", "AGE"],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..5],
        [
            name.as_str(),
            "restart-web",
            "restart",
            "Approved",
            "alice@example.com"
        ],
        "{table}"
    );

    // `agentrun` names the AgentRun resource; the category lists all three kinds.
    let out = cp.kubectl(
        Identity::Admin,
        &["-n", ns, "get", "agentrun", "restart-web", "-o", "name"],
    );
    assert_ok(&out, "kubectl get agentrun NAME");
    assert_eq!(stdout(&out).trim(), "agentrun.agentrun.dev/restart-web");
    let out = cp.kubectl(Identity::Admin, &["-n", ns, "get", CATEGORY, "-o", "name"]);
    assert_ok(&out, "kubectl get by category");
    let names = stdout(&out);
    for kind in [
        "agent.agentrun.dev/ops",
        "agentrun.agentrun.dev/restart-web",
        "approvalrequest.agentrun.dev/",
    ] {
        assert!(names.contains(kind), "{kind} missing from:\n{names}");
    }
    let out = cp.kubectl(Identity::Admin, &["-n", ns, "get", "agt", "ops"]);
    assert_ok(&out, "kubectl get agt");
    let header: Vec<String> = stdout(&out)
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(header, ["NAME", "MODEL", "TOOLS", "AGE"]);
}

#[tokio::test]
async fn bad_objects_are_refused_with_clear_messages() {
    let (cp, ns, client) = setup("crd-invalid").await;
    let ns = ns.name.as_str();
    let digest = arguments_digest("{}");
    let request = |extra: &str| {
        format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: ApprovalRequest\nmetadata:\n  name: bad\nspec:\n  agentRunRef: {{name: r, uid: u}}\n  toolCallId: call_1\n  toolName: restart\n  arguments: '{{}}'\n  argumentsDigest: {digest}\n{extra}"
        )
    };
    let run = |name: &str, spec: &str| {
        format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: AgentRun\nmetadata:\n  name: {name}\nspec:\n{spec}"
        )
    };

    let out = kubectl_create(
        cp,
        ns,
        &request("  step: 0\n  decision: Maybe\n  approverId: alice@example.com\n"),
    );
    assert_refused(
        &out,
        "an unknown decision",
        &[
            "spec.decision",
            "Unsupported value: \"Maybe\"",
            "\"Approved\", \"Rejected\"",
        ],
    );

    let out = kubectl_create(cp, ns, &request("  step: zero\n"));
    assert_refused(
        &out,
        "a string step",
        &["spec.step", "must be of type integer"],
    );

    let out = kubectl_create(cp, ns, &request("  step: -1\n"));
    assert_refused(
        &out,
        "a negative step",
        &["spec.step", "greater than or equal to 0"],
    );

    let out = kubectl_create(cp, ns, &request("  step: 0\n  reason: [a, b]\n"));
    assert_refused(
        &out,
        "a list as reason",
        &["spec.reason", "must be of type string"],
    );

    let out = kubectl_create(
        cp,
        ns,
        &request("  step: 0\n").replace(&digest, "not-a-digest"),
    );
    assert_refused(&out, "a malformed digest", &["spec.argumentsDigest"]);

    let long_reason = "r".repeat(4097);
    let out = kubectl_create(
        cp,
        ns,
        &request(&format!(
            "  step: 0\n  decision: Approved\n  approverId: a\n  reason: {long_reason}\n"
        )),
    );
    assert_refused(
        &out,
        "a too long reason",
        &["spec.reason", "Too long", "4096"],
    );

    let out = kubectl_create(
        cp,
        ns,
        &request("  step: 0\n").replace("  toolName: restart\n", ""),
    );
    assert_refused(
        &out,
        "a request without toolName",
        &["spec.toolName: Required value"],
    );

    let long_input = "x".repeat(32769);
    let out = kubectl_create(
        cp,
        ns,
        &run(
            "long",
            &format!("  agentRef: {{name: ops}}\n  input: {long_input}\n"),
        ),
    );
    assert_refused(
        &out,
        "a too long input",
        &["spec.input", "Too long", "32768"],
    );

    let out = kubectl_create(cp, ns, &run("no-agent", "  input: hello\n"));
    assert_refused(
        &out,
        "a run without agentRef",
        &["spec.agentRef: Required value"],
    );

    let out = kubectl_create(
        cp,
        ns,
        &run("no-agent-name", "  agentRef: {}\n  input: hello\n"),
    );
    assert_refused(
        &out,
        "a run without agentRef.name",
        &["spec.agentRef.name: Required value"],
    );

    let out = kubectl_create(
        cp,
        ns,
        &run("wrong-type", "  agentRef: ops\n  input: hello\n"),
    );
    assert_refused(
        &out,
        "agentRef as a string",
        &["spec.agentRef", "must be of type object"],
    );

    let long_name = "r".repeat(64);
    let out = kubectl_create(
        cp,
        ns,
        &run(&long_name, "  agentRef: {name: ops}\n  input: hi\n"),
    );
    assert_refused(&out, "a 64-character run name", &["at most 63 characters"]);

    let out = kubectl_create(
        cp,
        ns,
        "apiVersion: agentrun.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: bad\nspec:\n  model: {name: m}\n  maxTurns: 0\n",
    );
    assert_refused(
        &out,
        "maxTurns 0",
        &["spec.maxTurns", "greater than or equal to 1"],
    );

    // Nothing refused was stored.
    let requests: Api<ApprovalRequest> = Api::namespaced(client.clone(), ns);
    assert!(requests.get_opt("bad").await.expect("get").is_none());
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    assert!(
        runs.list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );

    // A bad status is refused too.
    runs.create(
        &PostParams::default(),
        &AgentRun::new("ok", run_spec("ops", "hi")),
    )
    .await
    .expect("create AgentRun");
    let out = cp.kubectl(
        Identity::Admin,
        &[
            "-n",
            ns,
            "patch",
            "ar",
            "ok",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"phase":"Done"}}"#,
        ],
    );
    assert_refused(
        &out,
        "an unknown phase",
        &["status.phase", "Unsupported value: \"Done\""],
    );
}

#[tokio::test]
async fn request_fields_are_immutable() {
    let (cp, ns, client) = setup("crd-immutable").await;
    let ns = ns.name.as_str();
    let name = create_request(&client, ns, request_spec("run-a", "call_1")).await;
    let original = get_request(&client, ns, &name).await.spec;

    let other_args = r#"{"host":"web-2"}"#;
    let other_digest = arguments_digest(other_args);
    for (patch, field) in [
        (
            r#"{"spec":{"toolCallId":"call_2"}}"#.to_owned(),
            "toolCallId",
        ),
        (r#"{"spec":{"toolName":"delete"}}"#.to_owned(), "toolName"),
        (r#"{"spec":{"step":2}}"#.to_owned(), "step"),
        (
            r#"{"spec":{"agentRunRef":{"uid":"another-uid"}}}"#.to_owned(),
            "agentRunRef",
        ),
        (
            r#"{"spec":{"agentRunRef":{"name":"run-b"}}}"#.to_owned(),
            "agentRunRef",
        ),
        (
            serde_json::json!({"spec": {"arguments": other_args}}).to_string(),
            "arguments",
        ),
        (
            serde_json::json!({"spec": {"argumentsDigest": other_digest}}).to_string(),
            "argumentsDigest",
        ),
        (
            r#"{"spec":{"runCreator":"carol@example.com"}}"#.to_owned(),
            "runCreator",
        ),
    ] {
        let out = kubectl_patch(cp, ns, "apr", &name, &patch);
        let message = format!("{field} is immutable");
        assert_refused(&out, &format!("patch {patch}"), &[&message]);
    }
    // Both changed together, consistently, is still a change of the call.
    let out = kubectl_patch(
        cp,
        ns,
        "apr",
        &name,
        &serde_json::json!({"spec": {"arguments": other_args, "argumentsDigest": other_digest}})
            .to_string(),
    );
    assert_refused(
        &out,
        "new arguments with their digest",
        &["arguments is immutable", "argumentsDigest is immutable"],
    );
    assert_eq!(get_request(&client, ns, &name).await.spec, original);

    // runCreator, set at creation, can neither change nor go away.
    let mut spec = request_spec("run-a", "call_2");
    spec.run_creator = Some("carol@example.com".to_owned());
    let name = create_request(&client, ns, spec.clone()).await;
    for patch in [
        r#"{"spec":{"runCreator":"alice@example.com"}}"#,
        r#"{"spec":{"runCreator":null}}"#,
    ] {
        let out = kubectl_patch(cp, ns, "apr", &name, patch);
        assert_refused(&out, patch, &["runCreator is immutable"]);
    }
    assert_eq!(get_request(&client, ns, &name).await.spec, spec);

    // Through the typed client the refusal is a 422 with the same message.
    let api: Api<ApprovalRequest> = Api::namespaced(client.clone(), ns);
    let err = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"toolName": "delete"}})),
        )
        .await
        .expect_err("changing toolName must be refused");
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 422, "{status:?}");
            assert!(
                status.message.contains("toolName is immutable"),
                "{status:?}"
            );
        }
        other => panic!("unexpected error: {other}"),
    }
}

#[tokio::test]
async fn a_decision_is_set_once_with_its_approver_and_is_final() {
    let (cp, ns, client) = setup("crd-decision").await;
    let ns = ns.name.as_str();
    let name = create_request(&client, ns, request_spec("run-a", "call_1")).await;

    for (patch, what, needle) in [
        (
            r#"{"spec":{"decision":"Approved"}}"#,
            "a decision without approverId",
            "approverId is required with decision",
        ),
        (
            r#"{"spec":{"decision":"Approved","approverId":"alice@example.com","message":"go ahead"}}"#,
            "a message with Approved",
            "message is only allowed with decision Rejected",
        ),
        (
            r#"{"spec":{"reason":"looks fine"}}"#,
            "a reason without a decision",
            "approverId, reason and message can only be set together with decision",
        ),
        (
            r#"{"spec":{"approverId":"alice@example.com"}}"#,
            "an approver without a decision",
            "approverId, reason and message can only be set together with decision",
        ),
        (
            r#"{"spec":{"decision":"Approved","approverId":""}}"#,
            "an empty approverId",
            "spec.approverId",
        ),
    ] {
        let out = kubectl_patch(cp, ns, "apr", &name, patch);
        assert_refused(&out, what, &[needle]);
    }
    let pending = get_request(&client, ns, &name).await.spec;
    assert_eq!(pending.decision, None);
    assert_eq!(pending.approver_id, None);

    // The documented approval, exactly.
    let out = cp.kubectl(
        Identity::Admin,
        &[
            "-n",
            ns,
            "patch",
            "apr",
            &name,
            "--type",
            "merge",
            "-p",
            APPROVE_PATCH,
        ],
    );
    assert_ok(&out, "the documented approve patch");
    let decided = get_request(&client, ns, &name).await.spec;
    assert_eq!(decided.decision, Some(Decision::Approved));
    assert_eq!(decided.approver_id.as_deref(), Some("alice@example.com"));
    assert_eq!(
        decided.reason.as_deref(),
        Some("authorized per change CR-1234")
    );
    assert_eq!(decided.message, None);

    // Repeating the same decision changes nothing and is not an error.
    let out = kubectl_patch(cp, ns, "apr", &name, APPROVE_PATCH);
    assert_ok(&out, "repeating the approval");

    for (patch, what) in [
        (
            r#"{"spec":{"decision":"Rejected"}}"#,
            "changing the decision",
        ),
        (r#"{"spec":{"decision":null}}"#, "removing the decision"),
        (
            r#"{"spec":{"approverId":"bob@example.com"}}"#,
            "changing approverId",
        ),
        (r#"{"spec":{"approverId":null}}"#, "removing approverId"),
        (r#"{"spec":{"reason":"another reason"}}"#, "changing reason"),
        (r#"{"spec":{"reason":null}}"#, "removing reason"),
        (r#"{"spec":{"message":"late message"}}"#, "adding a message"),
    ] {
        let out = kubectl_patch(cp, ns, "apr", &name, patch);
        assert_refused(&out, what, &[FINAL]);
    }
    assert_eq!(get_request(&client, ns, &name).await.spec, decided);

    // A decision without a reason is final too: a reason cannot be added afterwards.
    let name = create_request(&client, ns, request_spec("run-a", "call_2")).await;
    let out = kubectl_patch(
        cp,
        ns,
        "apr",
        &name,
        r#"{"spec":{"decision":"Approved","approverId":"bob@example.com"}}"#,
    );
    assert_ok(&out, "approve without a reason");
    let out = kubectl_patch(cp, ns, "apr", &name, r#"{"spec":{"reason":"added later"}}"#);
    assert_refused(&out, "adding a reason after the decision", &[FINAL]);
}

#[tokio::test]
async fn a_rejection_carries_its_message_and_is_final() {
    let (cp, ns, client) = setup("crd-reject").await;
    let ns = ns.name.as_str();
    let name = create_request(&client, ns, request_spec("run-a", "call_1")).await;
    let out = kubectl_patch(
        cp,
        ns,
        "apr",
        &name,
        r#"{"spec":{"decision":"Rejected","approverId":"bob@example.com","reason":"change freeze","message":"Do not restart during the freeze; report the status instead."}}"#,
    );
    assert_ok(&out, "reject with a message");
    let spec = get_request(&client, ns, &name).await.spec;
    assert_eq!(spec.decision, Some(Decision::Rejected));
    assert_eq!(
        spec.message.as_deref(),
        Some("Do not restart during the freeze; report the status instead.")
    );
    for (patch, what) in [
        (r#"{"spec":{"message":"changed"}}"#, "changing the message"),
        (r#"{"spec":{"message":null}}"#, "removing the message"),
        (
            r#"{"spec":{"decision":"Approved","message":null}}"#,
            "turning it into an approval",
        ),
    ] {
        let out = kubectl_patch(cp, ns, "apr", &name, patch);
        assert_refused(&out, what, &[FINAL]);
    }
    assert_eq!(get_request(&client, ns, &name).await.spec, spec);
}

#[tokio::test]
async fn server_side_apply_sets_a_decision_once() {
    let (cp, ns, client) = setup("crd-apply").await;
    let ns = ns.name.as_str();
    let name = create_request(&client, ns, request_spec("run-a", "call_1")).await;
    let manifest = |reason: &str| {
        format!(
            "apiVersion: agentrun.dev/v1alpha1\nkind: ApprovalRequest\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  decision: Approved\n  approverId: alice@example.com\n  reason: {reason}\n"
        )
    };
    let apply = |yaml: &str| {
        cp.kubectl_with_stdin(
            Identity::Admin,
            &[
                "apply",
                "--server-side",
                "--field-manager=gitops",
                "-f",
                "-",
            ],
            Some(yaml),
        )
    };
    assert_ok(
        &apply(&manifest("approved in PR 42")),
        "server-side apply of a decision",
    );
    assert_ok(
        &apply(&manifest("approved in PR 42")),
        "re-applying the same decision",
    );
    let spec = get_request(&client, ns, &name).await.spec;
    assert_eq!(spec.reason.as_deref(), Some("approved in PR 42"));
    assert_eq!(spec.tool_call_id, "call_1", "request fields are kept");
    let out = apply(&manifest("approved in PR 43"));
    assert_refused(&out, "re-applying with another reason", &[FINAL]);
}

#[tokio::test]
async fn expired_and_superseded_requests_cannot_be_decided() {
    let (cp, ns, client) = setup("crd-expired").await;
    let ns = ns.name.as_str();
    for (call, phase) in [
        ("call_1", ApprovalPhase::Expired),
        ("call_2", ApprovalPhase::Superseded),
    ] {
        let name = create_request(&client, ns, request_spec("run-a", call)).await;
        set_request_phase(&client, ns, &name, phase).await;
        let out = kubectl_patch(cp, ns, "apr", &name, APPROVE_PATCH);
        assert_refused(
            &out,
            &format!("deciding a {phase} request"),
            &["this request is Expired or Superseded: it can no longer be decided"],
        );
        assert_eq!(get_request(&client, ns, &name).await.spec.decision, None);
    }

    // A decided request can still be marked Superseded by the controller.
    let name = create_request(&client, ns, request_spec("run-a", "call_3")).await;
    assert_ok(
        &kubectl_patch(cp, ns, "apr", &name, APPROVE_PATCH),
        "approve",
    );
    set_request_phase(&client, ns, &name, ApprovalPhase::Superseded).await;
    let request = get_request(&client, ns, &name).await;
    assert_eq!(
        request.status.and_then(|s| s.phase),
        Some(ApprovalPhase::Superseded)
    );
    assert_eq!(request.spec.decision, Some(Decision::Approved));
}

/// A run keeps its Agent, its input and its worker overrides (image, resources, service account):
/// issue 12 found that a run's worker image and service account could be swapped after an
/// approval halt.
#[tokio::test]
async fn agent_run_input_agent_and_worker_overrides_are_immutable() {
    let (cp, ns, client) = setup("crd-run").await;
    let ns = ns.name.as_str();
    let runs: Api<AgentRun> = Api::namespaced(client.clone(), ns);
    runs.create(
        &PostParams::default(),
        &AgentRun::new("r1", run_spec("ops", "hello")),
    )
    .await
    .expect("create AgentRun");
    let out = kubectl_patch(cp, ns, "ar", "r1", r#"{"spec":{"input":"something else"}}"#);
    assert_refused(&out, "changing input", &["input is immutable"]);
    let out = kubectl_patch(
        cp,
        ns,
        "ar",
        "r1",
        r#"{"spec":{"agentRef":{"name":"other"}}}"#,
    );
    assert_refused(&out, "changing agentRef", &["agentRef is immutable"]);
    let out = kubectl_patch(
        cp,
        ns,
        "ar",
        "r1",
        r#"{"spec":{"worker":{"serviceAccountName":"runner"}}}"#,
    );
    assert_refused(&out, "adding worker overrides", &["worker is immutable"]);
    let mut spec = run_spec("ops", "hello");
    spec.worker = Some(WorkerOverrides {
        service_account_name: Some("runner".to_owned()),
        ..Default::default()
    });
    runs.create(&PostParams::default(), &AgentRun::new("r2", spec))
        .await
        .expect("create an AgentRun with worker overrides");
    for patch in [
        r#"{"spec":{"worker":{"serviceAccountName":"default"}}}"#,
        r#"{"spec":{"worker":{"image":"other:1"}}}"#,
        r#"{"spec":{"worker":null}}"#,
    ] {
        let out = kubectl_patch(cp, ns, "ar", "r2", patch);
        assert_refused(&out, patch, &["worker is immutable"]);
    }
    let run = runs.get("r1").await.expect("get AgentRun");
    assert_eq!(run.spec.input, "hello");
    assert_eq!(run.spec.worker, None);
    let run = runs.get("r2").await.expect("get AgentRun");
    assert_eq!(
        run.spec
            .worker
            .and_then(|w| w.service_account_name)
            .as_deref(),
        Some("runner")
    );
}

/// Attack 5 of issue 12: a cluster without the admission policies. Nothing stamps who decided, so
/// anyone who may patch a request could claim any name: the controller applies no decision
/// (condition `UnverifiedDecision`), and the tool receives nothing. An admin who knowingly runs so
/// (`--allow-unverified-decisions`) gets decisions applied as claimed, never as verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_admission_policies_no_decision_is_applied() {
    use agentrun::crd::{AgentRunPhase, ConditionType, approval_request_name, find_condition};
    use agentrun_testkit::operator::{start_controller_with, start_dev_kubelet, test_config};
    use agentrun_testkit::runs::{agent_yaml, run_yaml, wait_for_phase};
    use agentrun_testkit::tool_server::ToolServer;
    use agentrun_testkit::wait::eventually;

    let (cp, strict, client) = setup("crd-fail-closed").await;
    let claims = cp.namespace("crd-claims-allowed").await;
    let tools = ToolServer::start().await;
    let model = serde_json::json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}});
    let mut allowing = test_config(&claims.name);
    allowing.policy.decisions.allow_unverified_decisions = true;
    let _controllers = [
        start_controller_with(cp, test_config(&strict.name)).await,
        start_controller_with(cp, allowing).await,
    ];
    let _kubelets = [
        start_dev_kubelet(cp, &strict.name).await,
        start_dev_kubelet(cp, &claims.name).await,
    ];
    let request = approval_request_name("r1", "call_1");
    // bob, with no stamp to contradict him, claims alice approved.
    let claim = serde_json::json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "CR-1234"}});
    for ns in [&strict.name, &claims.name] {
        cp.apply(
            Identity::Admin,
            &agent_yaml(ns, "ops", model.clone(), &tools),
        );
        cp.apply(Identity::Admin, &run_yaml(ns, "r1", "ops", "Delete u-1"));
        wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
        let out = cp.kubectl(
            Identity::Admin,
            &[
                "patch",
                "apr",
                &request,
                "-n",
                ns,
                "--type",
                "merge",
                "-p",
                &claim.to_string(),
            ],
        );
        assert_ok(&out, "the claimed decision");
    }

    let runs: Api<AgentRun> = Api::namespaced(client.clone(), &strict.name);
    let refused = eventually(Duration::from_secs(60), "the refusal", || async {
        let run = runs.get("r1").await.ok()?;
        let ready = find_condition(&run.status.as_ref()?.conditions, ConditionType::Ready)?;
        (ready.reason == "UnverifiedDecision").then(|| ready.message.clone())
    })
    .await;
    assert!(refused.contains("not installed"), "{refused}");
    let requests: Api<ApprovalRequest> = Api::namespaced(client.clone(), &strict.name);
    let status = requests.get(&request).await.unwrap().status.unwrap();
    assert_eq!(status.phase, Some(ApprovalPhase::Pending), "not applied");
    assert_eq!(status.verified_identity, None);

    let done = wait_for_phase(cp, &claims.name, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(done.status.unwrap().phase, Some(AgentRunPhase::Succeeded));
    let requests: Api<ApprovalRequest> = Api::namespaced(client, &claims.name);
    let status = requests.get(&request).await.unwrap().status.unwrap();
    assert_eq!(status.phase, Some(ApprovalPhase::Approved));
    assert_eq!(status.verified_identity, None, "claimed, never verified");
    assert_eq!(
        tools.calls_of("call_1"),
        1,
        "only the admin's claims-allowed namespace ran it"
    );
}
