//! Issue 14, parts 4 and 5, end to end with the real controller, workers, API server and
//! identities: signed CloudEvents to NotificationSinks (every event once per id across a
//! controller kill, the types a sink asks for, a failing sink that blocks no approval and says
//! so, sinks that only admins write) and the audit export of live and deleted runs.
//!
//! The receiver ([`NotificationReceiver`]) accepts a delivery only when its Standard Webhooks
//! signature verifies with the sink's key, as a real receiver would; a test that sees an event
//! therefore saw it signed. Each test's controller keeps its outbox and reads the signing Secret in
//! a second namespace of its own (its "controller namespace"), where the editors have no rights.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use agentrun::controller::ControllerConfig;
use agentrun::crd::{
    AgentRun, AgentRunPhase, ApprovalPhase, NotificationSink, approval_request_name, find_condition,
};
use agentrun::notify::NotifyConfig;
use agentrun::notify::outbox::Outbox;
use agentrun_testkit::cluster::{
    ControlPlane, Identity, TestNamespace, assert_refused, assert_success, stdout,
};
use agentrun_testkit::notification_receiver::NotificationReceiver;
use agentrun_testkit::operator::{start_controller_with, start_operator_with, test_config};
use agentrun_testkit::runs::{agent_yaml, approvers_role, requests_of, run_yaml, wait_for_phase};
use agentrun_testkit::tool_server::ToolServer;
use agentrun_testkit::wait::{eventually, free_port, poll_until};
use base64::Engine;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};

/// The key (in the Secret `hooks`, key `secret`) of this test's sinks: `whsec_<32 random bytes>`.
fn signing_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The W3C trace context of a traced run.
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// One run halting on `delete_user {"user_id": "u-1"}`, then finishing.
fn one_call() -> Value {
    json!({"scripted": {"turns": [
        {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}]},
        {"content": "Done."}
    ]}})
}

/// A namespace for the runs, one for the controller (Secret `hooks` with the sinks' key, the
/// outbox), the roles (alice and bob approve; carol and bob hold `edit`), a tool server.
struct Scene {
    cp: &'static ControlPlane,
    ns: TestNamespace,
    ctl: TestNamespace,
    tools: ToolServer,
    secret: String,
}

impl Scene {
    async fn new(prefix: &str) -> Scene {
        let cp = ControlPlane::shared().await;
        cp.install_crds().await;
        let ns = cp.namespace(prefix).await;
        let ctl = cp.namespace(&format!("{prefix}-ctl")).await;
        let edit = format!(
            r#"apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: editors, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects:
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: carol@example.com}}
- {{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob@example.com}}
"#,
            ns = ns.name
        );
        let approvers = approvers_role(&ns.name, &["agentrun:approvers"]);
        cp.apply(Identity::Admin, &format!("{approvers}---\n{edit}"));
        let secret = signing_secret();
        let out = cp.kubectl(
            Identity::Admin,
            &[
                "create",
                "secret",
                "generic",
                "hooks",
                "-n",
                &ctl.name,
                &format!("--from-literal=secret={secret}"),
            ],
        );
        assert_success(&out, "create the signing Secret");
        Scene {
            cp,
            ns,
            ctl,
            tools: ToolServer::start().await,
            secret,
        }
    }

    fn ns(&self) -> &str {
        &self.ns.name
    }

    /// The controller watching the runs' namespace, with notifications (outbox and key in the
    /// controller namespace, fast retries).
    fn config(&self) -> ControllerConfig {
        ControllerConfig {
            notifications: Some(NotifyConfig {
                min_backoff: Duration::from_millis(200),
                max_backoff: Duration::from_secs(1),
                ..NotifyConfig::new(&self.ctl.name)
            }),
            ..test_config(self.ns())
        }
    }

    /// A sink `name` for this namespace's events of `types` (all when empty), signed with the
    /// Secret `secret`; deleted when the guard drops.
    fn sink(&self, name: &str, url: &str, types: &[&str], secret: &str) -> ClusterObject {
        self.cp.apply(
            Identity::Admin,
            &sink_yaml(name, url, self.ns(), types, secret),
        );
        ClusterObject {
            cp: self.cp,
            kind: "notificationsink",
            name: name.to_owned(),
        }
    }

    /// Creates run `name` of Agent `agent` as carol (retried while the policies settle).
    async fn create_run(&self, name: &str, agent: &str) {
        self.create_run_with(name, agent, json!({})).await;
    }

    /// [`Scene::create_run`] with these annotations.
    async fn create_run_with(&self, name: &str, agent: &str, annotations: Value) {
        let mut run: Value =
            serde_json::from_str(&run_yaml(self.ns(), name, agent, "Delete u-1")).unwrap();
        run["metadata"]["annotations"] = annotations;
        let yaml = run.to_string();
        eventually(Duration::from_secs(60), "create the run", || async {
            let out =
                self.cp
                    .kubectl_with_stdin(Identity::Carol, &["apply", "-f", "-"], Some(&yaml));
            out.status.success().then_some(())
        })
        .await;
    }

    /// Patches the request of `run`'s `call_1` with a decision as `identity`.
    fn decide(&self, identity: Identity, run: &str, decision: &str) -> Output {
        let mut spec =
            json!({"decision": decision, "approverId": identity.username(), "reason": "CR-1234"});
        if decision == "Rejected" {
            spec["message"] = json!("Not today.");
        }
        self.cp.kubectl(
            identity,
            &[
                "patch",
                "apr",
                &approval_request_name(run, "call_1"),
                "-n",
                self.ns(),
                "--type",
                "merge",
                "-p",
                &json!({ "spec": spec }).to_string(),
            ],
        )
    }

    async fn run(&self, name: &str) -> AgentRun {
        Api::<AgentRun>::namespaced(self.cp.client(Identity::Admin).await, self.ns())
            .get(name)
            .await
            .expect("the run")
    }

    /// The ids of the events the runs' and their requests' states imply, of `types` (all when
    /// empty).
    async fn expected_ids(&self, runs: &[&str], types: &[&str]) -> BTreeSet<String> {
        let mut ids = BTreeSet::new();
        for name in runs {
            let run = self.run(name).await;
            let uid = run.uid().unwrap();
            match run.status.as_ref().and_then(|s| s.phase) {
                Some(AgentRunPhase::Succeeded) => {
                    ids.insert(("dev.agentrun.run.succeeded", format!("{uid}:succeeded")));
                }
                Some(AgentRunPhase::Failed) => {
                    ids.insert(("dev.agentrun.run.failed", format!("{uid}:failed")));
                }
                _ => {}
            }
            for request in requests_of(self.cp, self.ns(), name).await {
                let uid = request.uid().unwrap();
                ids.insert((
                    "dev.agentrun.approval.requested",
                    format!("{uid}:requested"),
                ));
                let kind = match request.status.and_then(|s| s.phase) {
                    Some(ApprovalPhase::Approved | ApprovalPhase::Rejected) => "decided",
                    Some(ApprovalPhase::Expired) => "expired",
                    Some(ApprovalPhase::Superseded) => "superseded",
                    _ => continue,
                };
                ids.insert((
                    match kind {
                        "decided" => "dev.agentrun.approval.decided",
                        "expired" => "dev.agentrun.approval.expired",
                        _ => "dev.agentrun.approval.superseded",
                    },
                    format!("{uid}:{kind}"),
                ));
            }
        }
        ids.into_iter()
            .filter(|(t, _)| types.is_empty() || types.contains(t))
            .map(|(_, id)| id)
            .collect()
    }

    /// The outbox the controller keeps for sink `sink`, as persisted.
    async fn outbox(&self, sink: &str) -> Option<Outbox> {
        let config_map =
            Api::<ConfigMap>::namespaced(self.cp.client(Identity::Admin).await, &self.ctl.name)
                .get_opt(agentrun::notify::DEFAULT_OUTBOX_CONFIG_MAP)
                .await
                .expect("read the outbox")?;
        let text = config_map.data?.get(sink)?.clone();
        Some(Outbox::from_json(&text).expect("the outbox parses"))
    }

    async fn sink_object(&self, name: &str) -> NotificationSink {
        Api::<NotificationSink>::all(self.cp.client(Identity::Admin).await)
            .get(name)
            .await
            .expect("the sink")
    }
}

fn sink_yaml(name: &str, url: &str, ns: &str, types: &[&str], secret: &str) -> String {
    serde_json::to_string(&json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "NotificationSink",
        "metadata": {"name": name},
        "spec": {
            "url": url,
            "signingSecretRef": {"name": secret, "key": "secret"},
            "types": types,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            "timeoutSeconds": 5
        }
    }))
    .expect("a NotificationSink manifest")
}

/// A cluster-scoped object of one test, deleted (without waiting) when dropped, unless the test
/// failed (kept for a look, like the test namespaces).
struct ClusterObject {
    cp: &'static ControlPlane,
    kind: &'static str,
    name: String,
}

impl Drop for ClusterObject {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("AGENTRUN_KEEP_NAMESPACES").is_some() {
            return;
        }
        let _ = self.cp.kubectl(
            Identity::Admin,
            &[
                "delete",
                self.kind,
                &self.name,
                "--ignore-not-found",
                "--wait=false",
            ],
        );
    }
}

/// Waits until run `name` has finished (Succeeded or Failed); panics with its status when it
/// does not within 2 minutes.
async fn wait_finished(scene: &Scene, name: &str) -> AgentRun {
    poll_until(
        Duration::from_secs(120),
        Duration::from_millis(200),
        || async {
            let run = scene.run(name).await;
            let finished = run
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .is_some_and(AgentRunPhase::is_terminal);
            if finished {
                ControlFlow::Break(run)
            } else {
                ControlFlow::Continue(run.status)
            }
        },
    )
    .await
    .unwrap_or_else(|status| {
        let mut status = serde_json::to_value(status).unwrap_or_default();
        if let Some(s) = status.as_object_mut() {
            s.remove("runState");
        }
        panic!("run {name} did not finish: {status:#}")
    })
}

/// Every id was delivered with one and the same body each time, a well-formed CloudEvent about
/// this namespace; returns the events by id.
fn events_by_id(receiver: &NotificationReceiver, ns: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (id, bodies) in receiver.bodies() {
        let distinct: BTreeSet<&String> = bodies.iter().collect();
        assert_eq!(
            distinct.len(),
            1,
            "{id} was delivered {} times with different bodies: {distinct:#?}",
            bodies.len()
        );
        let event: Value = serde_json::from_str(&bodies[0]).expect("a JSON body");
        assert_eq!(event["specversion"], "1.0", "{event}");
        assert_eq!(event["id"], id.as_str(), "the webhook-id is the event id");
        assert_eq!(event["datacontenttype"], "application/json");
        assert!(
            event["source"]
                .as_str()
                .unwrap()
                .starts_with(&format!("/apis/agentrun.dev/v1alpha1/namespaces/{ns}/")),
            "{event}"
        );
        assert!(
            event["subject"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{ns}/")),
            "{event}"
        );
        assert!(event["time"].is_string(), "{event}");
        out.insert(id, event);
    }
    out
}

/// The events of `type_` whose subject is `subject`.
fn find<'a>(events: &'a BTreeMap<String, Value>, type_: &str, subject: &str) -> &'a Value {
    events
        .values()
        .find(|e| e["type"] == type_ && e["subject"] == subject)
        .unwrap_or_else(|| panic!("no {type_} event about {subject} in {events:#?}"))
}

/// Every event is delivered, signed, once per id (the same bytes on every attempt), across a
/// controller killed with undelivered events in its outbox while the receiver was down; a decision
/// made while no controller ran is announced by the next one; a controller started afterwards
/// mints nothing again. The approval never waited for a notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_reaches_a_verifying_receiver_once_per_id_across_a_controller_kill() {
    let scene = Scene::new("notify-kill").await;
    let (cp, ns) = (scene.cp, scene.ns());
    let receiver = NotificationReceiver::start(&scene.secret).await;
    let sink = format!("{ns}-hooks");
    let _sink = scene.sink(&sink, &receiver.url(), &[], "hooks");
    let mut operator = start_operator_with(cp, &scene.ns, scene.config()).await;
    cp.apply(
        Identity::Admin,
        &agent_yaml(ns, "ops", one_call(), &scene.tools),
    );
    // r1 is traced (W3C trace context in its annotations): the events about it carry it.
    scene
        .create_run_with("r1", "ops", json!({"traceparent": TRACEPARENT}))
        .await;
    // r2's annotations (carol writes them) hold no well-formed trace context: none is sent.
    scene
        .create_run_with(
            "r2",
            "ops",
            json!({"traceparent": "00-<script>-00f067aa0ba902b7-01", "tracestate": "x=y"}),
        )
        .await;
    for run in ["r1", "r2"] {
        wait_for_phase(cp, ns, run, AgentRunPhase::AwaitingApproval).await;
    }
    let requested = scene
        .expected_ids(&["r1", "r2"], &["dev.agentrun.approval.requested"])
        .await;
    assert_eq!(requested.len(), 2);
    eventually(
        Duration::from_secs(30),
        "both requests announced",
        || async { requested.is_subset(&receiver.ids()).then_some(()) },
    )
    .await;

    // The receiver goes down; alice approves r1, which goes on regardless.
    receiver.set_failing(true);
    assert_success(
        &scene.decide(Identity::Alice, "r1", "Approved"),
        "alice approves r1",
    );
    wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    let r1 = scene
        .expected_ids(
            &["r1"],
            &[
                "dev.agentrun.approval.decided",
                "dev.agentrun.run.succeeded",
            ],
        )
        .await;
    assert_eq!(r1.len(), 2);
    // The controller is killed with both of r1's new events persisted in its outbox, undelivered.
    eventually(
        Duration::from_secs(30),
        "r1's events in the outbox, undelivered, and the requests' deliveries remembered",
        || async {
            let outbox = scene.outbox(&sink).await?;
            let pending: BTreeSet<String> = outbox.pending.iter().map(|p| p.id.clone()).collect();
            let remembered = requested.iter().all(|id| outbox.delivered.contains_key(id));
            (receiver.answered_503() > 0 && r1.is_subset(&pending) && remembered).then_some(())
        },
    )
    .await;
    operator.controller.abort();

    // bob rejects r2 while no controller runs; the receiver comes back; a new controller starts.
    assert_success(
        &scene.decide(Identity::Bob, "r2", "Rejected"),
        "bob rejects r2",
    );
    receiver.set_failing(false);
    let restarted_at = std::time::Instant::now();
    operator.controller = start_controller_with(cp, scene.config()).await;
    wait_for_phase(cp, ns, "r2", AgentRunPhase::Succeeded).await;
    let expected = scene.expected_ids(&["r1", "r2"], &[]).await;
    assert_eq!(expected.len(), 6, "{expected:?}");
    eventually(Duration::from_secs(60), "every event delivered", || async {
        (receiver.ids() == expected).then_some(())
    })
    .await;
    let all_at = restarted_at.elapsed();
    let from_outbox = r1
        .iter()
        .filter_map(|id| receiver.first_received(id))
        .max()
        .unwrap();
    let since_restart = |at: std::time::SystemTime| {
        let restarted = std::time::SystemTime::now() - restarted_at.elapsed();
        at.duration_since(restarted).unwrap_or_default().as_millis()
    };
    eprintln!(
        "MEASURED controller restart -> r1's 2 outbox events received: {} ms; -> all 6 events \
         (r2's decision and outcome, which include running r2's next step): {} ms",
        since_restart(from_outbox),
        all_at.as_millis()
    );
    let events = events_by_id(&receiver, ns);
    let r1_request = format!("{ns}/{}", approval_request_name("r1", "call_1"));
    let r2_request = format!("{ns}/{}", approval_request_name("r2", "call_1"));
    let requested = find(&events, "dev.agentrun.approval.requested", &r1_request);
    assert_eq!(requested["data"]["toolName"], "delete_user");
    assert_eq!(requested["data"]["run"]["name"], "r1");
    assert_eq!(requested["data"]["runCreator"], "carol@example.com");
    assert!(
        requested["data"].get("arguments").is_none(),
        "only the digest"
    );
    let approved = find(&events, "dev.agentrun.approval.decided", &r1_request);
    let r1_done = find(&events, "dev.agentrun.run.succeeded", &format!("{ns}/r1"));
    for traced in [requested, approved, r1_done] {
        assert_eq!(traced["traceparent"], TRACEPARENT, "{traced}");
    }
    assert_eq!(approved["data"]["decision"], "Approved");
    assert_eq!(approved["data"]["approverId"], "alice@example.com");
    assert_eq!(
        approved["data"]["verifiedIdentity"]["username"],
        "alice@example.com"
    );
    let rejected = find(&events, "dev.agentrun.approval.decided", &r2_request);
    assert_eq!(rejected["data"]["decision"], "Rejected");
    assert_eq!(rejected["data"]["approverId"], "bob@example.com");
    assert_eq!(rejected["data"]["message"], "Not today.");
    let done = find(&events, "dev.agentrun.run.succeeded", &format!("{ns}/r2"));
    assert_eq!(done["data"]["phase"], "Succeeded");
    for untraced in [rejected, done] {
        assert!(
            untraced.get("traceparent").is_none() && untraced.get("tracestate").is_none(),
            "r2's malformed trace context was passed on: {untraced}"
        );
    }
    assert_eq!(
        scene.tools.calls_of("call_1"),
        1,
        "only r1's approved call ran"
    );

    // Delivered and remembered: a controller started now mints nothing again.
    eventually(
        Duration::from_secs(30),
        "the deliveries persisted",
        || async {
            let outbox = scene.outbox(&sink).await?;
            (outbox.pending.is_empty()
                && expected.iter().all(|id| outbox.delivered.contains_key(id)))
            .then_some(())
        },
    )
    .await;
    let delivered = receiver.deliveries().len();
    operator.controller.abort();
    operator.controller = start_controller_with(cp, scene.config()).await;
    // Long enough for the new controller to list both runs and their requests and to send.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        receiver.deliveries().len(),
        delivered,
        "a restart re-sent delivered events"
    );

    // The receiver's check is what accepted them: a body signed with another key is refused.
    let (id, body) = receiver.bodies().into_iter().next().unwrap();
    let forger = agentrun::notify::SigningKey::from_secret(signing_secret().as_bytes()).unwrap();
    let now = chrono::Utc::now().timestamp();
    let answer = reqwest::Client::new()
        .post(receiver.url())
        .header("content-type", agentrun::notify::sender::CONTENT_TYPE)
        .header("webhook-id", &id)
        .header("webhook-timestamp", now.to_string())
        .header(
            "webhook-signature",
            forger.sign(&id, now, body[0].as_bytes()),
        )
        .body(body[0].clone())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 401);
    assert_eq!(receiver.refused(), 1, "only the forgery was refused");
    assert_eq!(receiver.deliveries().len(), delivered);
}

/// A sink gets exactly the types it asks for: here an expired request, a superseded one (made at
/// a step the run has left: an admin moved the run on), and the runs' outcomes (a run failing for
/// good among them), but no `requested` or `decided` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_supersession_and_failure_reach_a_sink_that_asks_for_them() {
    let scene = Scene::new("notify-types").await;
    let (cp, ns) = (scene.cp, scene.ns());
    let receiver = NotificationReceiver::start(&scene.secret).await;
    let types = [
        "dev.agentrun.approval.expired",
        "dev.agentrun.approval.superseded",
        "dev.agentrun.run.succeeded",
        "dev.agentrun.run.failed",
    ];
    let _sink = scene.sink(&format!("{ns}-outcomes"), &receiver.url(), &types, "hooks");
    let _operator = start_operator_with(cp, &scene.ns, scene.config()).await;
    // `timed`: its delete_user expires after 2 s. `looping`: one model turn at most, and its model
    // wants two (a lookup, then an answer): each worker fails, then the run.
    let mut timed: Value =
        serde_json::from_str(&agent_yaml(ns, "timed", one_call(), &scene.tools)).unwrap();
    timed["spec"]["tools"][0]["approvalTimeout"] = json!("2s");
    let mut looping: Value = serde_json::from_str(&agent_yaml(
        ns,
        "looping",
        json!({"scripted": {"turns": [
            {"toolCalls": [{"id": "call_look", "name": "lookup_user", "arguments": {"user_id": "u-1"}}]},
            {"content": "Done."}
        ]}}),
        &scene.tools,
    ))
    .unwrap();
    looping["spec"]["maxTurns"] = json!(1);
    cp.apply(Identity::Admin, &timed.to_string());
    cp.apply(Identity::Admin, &looping.to_string());
    cp.apply(
        Identity::Admin,
        &agent_yaml(ns, "ops", one_call(), &scene.tools),
    );
    scene.create_run("r3", "timed").await;
    scene.create_run("r4", "ops").await;
    scene.create_run("r5", "looping").await;

    // r4: moved on to the next step while its call waits (as only a controller identity may):
    // the request, made at step 0, no longer matches the run: superseded, it can no longer be
    // decided.
    wait_for_phase(cp, ns, "r4", AgentRunPhase::AwaitingApproval).await;
    let moved_at = std::time::SystemTime::now();
    assert_success(
        &cp.kubectl(
            Identity::Admin,
            &[
                "patch",
                "agentrun",
                "r4",
                "-n",
                ns,
                "--subresource=status",
                "--type",
                "merge",
                "-p",
                r#"{"status": {"step": 1}}"#,
            ],
        ),
        "move r4 to step 1",
    );
    for run in ["r3", "r4", "r5"] {
        wait_finished(&scene, run).await;
    }
    assert_eq!(
        scene.run("r5").await.status.unwrap().phase,
        Some(AgentRunPhase::Failed)
    );
    let expected = scene.expected_ids(&["r3", "r4", "r5"], &types).await;
    let all = scene.expected_ids(&["r3", "r4", "r5"], &[]).await;
    assert!(
        expected.iter().any(|id| id.ends_with(":expired"))
            && expected.iter().any(|id| id.ends_with(":superseded"))
            && expected.iter().any(|id| id.ends_with(":failed")),
        "{expected:?}"
    );
    eventually(
        Duration::from_secs(60),
        "the outcomes delivered",
        || async { (receiver.ids() == expected).then_some(()) },
    )
    .await;
    // Given time to send more, nothing else comes: not the types the sink did not ask for.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(receiver.ids(), expected);
    assert!(all.len() > expected.len());
    let events = events_by_id(&receiver, ns);
    let failed = find(&events, "dev.agentrun.run.failed", &format!("{ns}/r5"));
    let r5 = scene.run("r5").await.status.unwrap();
    let why = find_condition(&r5.conditions, "Ready").unwrap();
    assert_eq!(failed["data"]["phase"], "Failed");
    assert_eq!(failed["data"]["reason"], why.reason.as_str(), "{failed}");
    assert_eq!(failed["data"]["message"], why.message.as_str(), "{failed}");
    let expired = find(
        &events,
        "dev.agentrun.approval.expired",
        &format!("{ns}/{}", approval_request_name("r3", "call_1")),
    );
    assert_eq!(expired["data"]["phase"], "Expired");
    assert!(expired["data"].get("approverId").is_none());
    let superseded = find(
        &events,
        "dev.agentrun.approval.superseded",
        &format!("{ns}/{}", approval_request_name("r4", "call_1")),
    );
    assert_eq!(superseded["data"]["phase"], "Superseded");
    // Measured, not asserted: from the status write that supersedes the request to the signed
    // event's receipt (the controller observes, records, mints, persists the outbox, sends).
    let received = receiver
        .first_received(superseded["id"].as_str().unwrap())
        .unwrap();
    eprintln!(
        "MEASURED notification latency (status patch -> superseded event received): {} ms",
        received
            .duration_since(moved_at)
            .unwrap_or_default()
            .as_millis()
    );
    assert!(superseded["data"]["decidedAt"].is_string());
    assert_refused(
        &scene.decide(Identity::Alice, "r4", "Approved"),
        "deciding a superseded request",
        &["can no longer be decided"],
    );
    assert_eq!(scene.tools.calls_of("call_1"), 0, "no gated call ran");
}

/// The value of the first sample of `series` (name and labels as rendered) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|rest| rest.trim().parse().ok())
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("scrape the metrics")
        .text()
        .await
        .unwrap()
}

fn ready(sink: &NotificationSink) -> Option<(String, String, String)> {
    let c = find_condition(&sink.status.as_ref()?.conditions, "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// A sink nobody answers, one whose key is missing, and one whose receiver redirects elsewhere
/// (not followed): the approval goes through and the run finishes all the same; each sink's
/// condition says why, the metrics count the failures and
/// what waits. Once a receiver answers, everything waiting is delivered and the condition recovers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_sink_shows_a_condition_and_a_metric_and_never_blocks_an_approval() {
    let scene = Scene::new("notify-fail").await;
    let (cp, ns) = (scene.cp, scene.ns());
    let down_addr = free_port().unwrap();
    let down = format!("{ns}-down");
    let keyless = format!("{ns}-keyless");
    let _down = scene.sink(&down, &format!("http://{down_addr}/events"), &[], "hooks");
    let _keyless = scene.sink(
        &keyless,
        &format!("http://{}/events", free_port().unwrap()),
        &[],
        "no-such-secret",
    );
    // A receiver that answers with a redirect elsewhere: the controller does not follow it (the
    // events go only where the admin said), and says so.
    let redirecting = format!("{ns}-redirecting");
    let diverter = NotificationReceiver::start(&scene.secret).await;
    let elsewhere = NotificationReceiver::start(&scene.secret).await;
    diverter.redirect_to(Some(elsewhere.url()));
    let _redirecting = scene.sink(&redirecting, &diverter.url(), &[], "hooks");
    let metrics = free_port().unwrap();
    let mut config = scene.config();
    config.metrics_addr = Some(metrics);
    let _operator = start_operator_with(cp, &scene.ns, config).await;
    cp.apply(
        Identity::Admin,
        &agent_yaml(ns, "ops", one_call(), &scene.tools),
    );
    scene.create_run("r1", "ops").await;
    wait_for_phase(cp, ns, "r1", AgentRunPhase::AwaitingApproval).await;
    assert_success(
        &scene.decide(Identity::Alice, "r1", "Approved"),
        "alice approves",
    );
    wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    assert_eq!(scene.tools.calls_of("call_1"), 1, "the approved call ran");

    let (status, reason, message) = eventually(
        Duration::from_secs(30),
        "the down sink's condition",
        || async { ready(&scene.sink_object(&down).await).filter(|(s, _, _)| s == "False") },
    )
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "DeliveryFailing")
    );
    assert!(message.contains("the request failed"), "{message}");
    let (_, reason, message) = eventually(
        Duration::from_secs(30),
        "the keyless sink's condition",
        || async { ready(&scene.sink_object(&keyless).await).filter(|(s, _, _)| s == "False") },
    )
    .await;
    assert_eq!(reason, "SecretUnavailable");
    assert!(message.contains("no-such-secret not found"), "{message}");
    let printed = stdout(&cp.kubectl(Identity::Admin, &["get", "nsink", &down]));
    assert!(printed.contains("DeliveryFailing"), "{printed}");
    let (_, reason, message) = eventually(
        Duration::from_secs(30),
        "the redirecting sink's condition",
        || async { ready(&scene.sink_object(&redirecting).await).filter(|(s, _, _)| s == "False") },
    )
    .await;
    assert_eq!(reason, "DeliveryFailing");
    assert!(message.contains("307"), "{message}");
    assert!(diverter.redirected() > 0);
    assert!(diverter.deliveries().is_empty());
    assert!(
        elsewhere.deliveries().is_empty() && elsewhere.refused() == 0,
        "a redirect was followed"
    );

    let expected = scene.expected_ids(&["r1"], &[]).await;
    assert_eq!(expected.len(), 3);
    let text = eventually(Duration::from_secs(30), "the metrics", || async {
        let text = scrape(metrics).await;
        (sample(
            &text,
            &format!("agentrun_notifications_pending{{sink=\"{down}\"}}"),
        ) == Some(3.0))
        .then_some(text)
    })
    .await;
    assert_eq!(
        sample(
            &text,
            &format!("agentrun_notification_sink_failing{{sink=\"{down}\"}}")
        ),
        Some(1.0)
    );
    assert!(
        sample(
            &text,
            &format!("agentrun_notification_delivery_failures_total{{sink=\"{down}\"}}")
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!("agentrun_notification_sink_failing{{sink=\"{keyless}\"}}")
        ),
        Some(1.0)
    );

    // A receiver comes up where the sink points: what waited is delivered, and the sink recovers.
    let receiver = NotificationReceiver::start_at(&scene.secret, down_addr).await;
    let up_at = std::time::Instant::now();
    eventually(
        Duration::from_secs(60),
        "the waiting events delivered",
        || async { (receiver.ids() == expected).then_some(()) },
    )
    .await;
    eprintln!(
        "MEASURED redelivery after the receiver came up (3 waiting events, backoff 200 ms..1 s): {} ms",
        up_at.elapsed().as_millis()
    );
    events_by_id(&receiver, ns);
    let (status, reason, _) = eventually(Duration::from_secs(30), "the sink recovered", || async {
        ready(&scene.sink_object(&down).await).filter(|(s, _, _)| s == "True")
    })
    .await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Delivered"));
    let text = eventually(Duration::from_secs(30), "the metrics after", || async {
        let text = scrape(metrics).await;
        (sample(
            &text,
            &format!("agentrun_notifications_pending{{sink=\"{down}\"}}"),
        ) == Some(0.0))
        .then_some(text)
    })
    .await;
    assert_eq!(
        sample(
            &text,
            &format!("agentrun_notifications_delivered_total{{sink=\"{down}\"}}")
        ),
        Some(3.0)
    );
    assert_eq!(
        sample(
            &text,
            &format!("agentrun_notification_sink_failing{{sink=\"{down}\"}}")
        ),
        Some(0.0)
    );
}

/// Sinks are written by cluster admins only: carol (namespace `edit`), carol acting as one of the
/// namespace's ServiceAccounts, and alice (an approver) can neither create one nor change,
/// relabel, delete or write the status of one; no role grants it; the signing key is out of
/// their reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_editor_can_neither_create_nor_change_a_sink() {
    let scene = Scene::new("notify-rbac").await;
    let (cp, ns) = (scene.cp, scene.ns());
    let name = format!("{ns}-hooks");
    let yaml = sink_yaml(&name, "http://127.0.0.1:9/events", ns, &[], "hooks");
    let as_default = format!("--as=system:serviceaccount:{ns}:default");
    for (identity, extra) in [
        (Identity::Carol, None),
        (Identity::Carol, Some(as_default.as_str())),
        (Identity::Alice, None),
    ] {
        let mut args = vec!["create", "-f", "-"];
        args.extend(extra);
        let out = cp.kubectl_with_stdin(identity, &args, Some(&yaml));
        assert_refused(&out, "creating a sink", &["forbidden"]);
    }
    let _sink = scene.sink(&name, "http://127.0.0.1:9/events", &[], "hooks");
    let redirect = json!({"spec": {"url": "http://attacker.example/"}}).to_string();
    let status = json!({"status": {"conditions": []}}).to_string();
    for args in [
        vec!["patch", "nsink", &name, "--type", "merge", "-p", &redirect],
        vec!["label", "nsink", &name, "x=y"],
        vec!["delete", "nsink", &name],
        vec![
            "patch",
            "nsink",
            &name,
            "--subresource=status",
            "--type",
            "merge",
            "-p",
            &status,
        ],
    ] {
        for identity in [Identity::Carol, Identity::Alice] {
            let out = cp.kubectl(identity, &args);
            assert_refused(&out, &format!("{args:?} as {identity:?}"), &["forbidden"]);
        }
        let mut impersonated = args.clone();
        impersonated.push(&as_default);
        let out = cp.kubectl(Identity::Carol, &impersonated);
        assert_refused(
            &out,
            &format!("{args:?} as a ServiceAccount"),
            &["forbidden"],
        );
    }
    for identity in [Identity::Carol, Identity::Alice, Identity::Bob] {
        for verb in ["create", "update", "patch", "delete"] {
            let out = cp.kubectl(
                identity,
                &["auth", "can-i", verb, "notificationsinks.agentrun.dev"],
            );
            assert_eq!(stdout(&out).trim(), "no", "{identity:?} may {verb} sinks");
        }
    }
    let out = cp.kubectl(
        Identity::Carol,
        &["get", "secret", "hooks", "-n", &scene.ctl.name],
    );
    assert_refused(&out, "carol reading the signing key", &["forbidden"]);
    let sink = scene.sink_object(&name).await;
    assert_eq!(sink.spec.url, "http://127.0.0.1:9/events", "unchanged");
}

fn plugin(kubeconfig: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-agentrun"))
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", std::env::temp_dir())
        .args(args)
        .output()
        .expect("run kubectl-agentrun")
}

fn json_lines(out: &Output) -> Vec<Value> {
    stdout(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `kubectl agentrun audit --all-namespaces -o jsonl`: one line per decision and per execution,
/// from the ApprovalRecords for a run that was deleted (r1, approved by alice) and from the live
/// objects for one that was not (r2, a lookup that needed no approval, then bob's rejection). A
/// ServiceAccount bound to `view` and `agentrun-auditor` exports the namespace alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_export_has_a_line_per_decision_and_execution_of_live_and_deleted_runs() {
    let scene = Scene::new("audit-export").await;
    let (cp, ns) = (scene.cp, scene.ns());
    let _operator = start_operator_with(cp, &scene.ns, test_config(ns)).await;
    let script = json!({"scripted": {"turns": [
        {"toolCalls": [
            {"id": "call_look", "name": "lookup_user", "arguments": {"user_id": "u-1"}},
            {"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-1"}}
        ]},
        {"content": "Done."}
    ]}});
    cp.apply(
        Identity::Admin,
        &agent_yaml(ns, "ops", script, &scene.tools),
    );
    for run in ["r1", "r2"] {
        scene.create_run(run, "ops").await;
        wait_for_phase(cp, ns, run, AgentRunPhase::AwaitingApproval).await;
    }
    assert_success(
        &scene.decide(Identity::Alice, "r1", "Approved"),
        "alice approves r1",
    );
    assert_success(
        &scene.decide(Identity::Bob, "r2", "Rejected"),
        "bob rejects r2",
    );
    let r1 = wait_for_phase(cp, ns, "r1", AgentRunPhase::Succeeded).await;
    let r2 = wait_for_phase(cp, ns, "r2", AgentRunPhase::Succeeded).await;
    assert_success(
        &cp.kubectl(
            Identity::Carol,
            &[
                "delete",
                "agentrun",
                "r1",
                "-n",
                ns,
                "--wait=true",
                "--timeout=60s",
            ],
        ),
        "carol deletes r1",
    );
    eventually(Duration::from_secs(60), "r1's request gone", || async {
        requests_of(cp, ns, "r1").await.is_empty().then_some(())
    })
    .await;

    let out = plugin(
        &cp.kubeconfig(Identity::Admin),
        &["audit", "--all-namespaces", "-o", "jsonl"],
    );
    assert_success(&out, "audit --all-namespaces -o jsonl");
    let lines: Vec<Value> = json_lines(&out)
        .into_iter()
        .filter(|l| l["namespace"] == ns)
        .collect();
    let summary: Vec<(String, String, String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["run"].as_str().unwrap().to_owned(),
                l["kind"].as_str().unwrap().to_owned(),
                l["toolCallId"].as_str().unwrap().to_owned(),
                l["decision"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let row = |run: &str, kind: &str, call: &str, decision: &str| {
        (
            run.to_owned(),
            kind.to_owned(),
            call.to_owned(),
            decision.to_owned(),
        )
    };
    assert_eq!(
        summary,
        vec![
            row("r1", "decision", "call_1", "Approved"),
            row("r1", "execution", "call_1", "Approved"),
            row("r2", "execution", "call_look", "NotRequired"),
            row("r2", "decision", "call_1", "Rejected"),
        ],
        "{lines:#?}"
    );
    let approved = &lines[0];
    assert_eq!(approved["runDeleted"], true);
    assert_eq!(approved["runUid"], r1.uid().unwrap().as_str());
    assert_eq!(approved["approverId"], "alice@example.com");
    assert_eq!(approved["verifiedIdentity"], "alice@example.com");
    assert_eq!(approved["reason"], "CR-1234");
    assert!(approved["decidedAt"].is_string());
    let rejected = &lines[3];
    assert!(rejected.get("runDeleted").is_none());
    assert_eq!(rejected["runUid"], r2.uid().unwrap().as_str());
    assert_eq!(rejected["verifiedIdentity"], "bob@example.com");
    assert_eq!(rejected["message"], "Not today.");

    // A ServiceAccount with `view` in the namespace and the auditor ClusterRole: the same lines.
    cp.apply(
        Identity::Admin,
        &format!(
            r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: auditor, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: auditor-view, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}}
subjects: [{{kind: ServiceAccount, name: auditor, namespace: {ns}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {ns}-auditor}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agentrun-auditor}}
subjects: [{{kind: ServiceAccount, name: auditor, namespace: {ns}}}]
"#
        ),
    );
    let _binding = ClusterObject {
        cp,
        kind: "clusterrolebinding",
        name: format!("{ns}-auditor"),
    };
    let token = cp.service_account_token(ns, "auditor").await;
    let kubeconfig = cp.write_token_kubeconfig(&format!("{ns}-auditor"), &token);
    let out = eventually(Duration::from_secs(30), "the auditor's export", || async {
        let out = plugin(&kubeconfig, &["audit", "-n", ns, "-o", "jsonl"]);
        out.status.success().then_some(out)
    })
    .await;
    assert_eq!(json_lines(&out), lines);
    let table = stdout(&plugin(&kubeconfig, &["audit", "-n", ns]));
    assert!(table.contains("r1 (deleted)"), "{table}");
    // Without the auditor role the export refuses rather than leaving the deleted runs out.
    let out = plugin(
        &cp.kubeconfig(Identity::Carol),
        &["audit", "-n", ns, "-o", "jsonl"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("agentrun-auditor"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
