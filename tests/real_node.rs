//! The chart for real: `helm install` of `charts/agentrun` with the image `scripts/image` built,
//! onto a real node of the local control plane (`scripts/local-cluster run --node`: containerd with
//! runc, a kubelet and kube-scheduler), and the approval flow with the controller and the workers
//! as real containers. The controller Pod becomes Ready and takes its Lease, `/metrics` is scraped
//! through the Pod (`kubectl port-forward`), the worker Pods run in a namespace enforcing Pod
//! Security "restricted" as user 65532 with no capabilities (read off the running process), `kubectl
//! logs` shows a worker's log, alice approves, the run succeeds and the tool receives its call
//! exactly once; `helm upgrade` rolls the controller over to a new Pod and `helm uninstall` leaves
//! nothing behind. Finally the node stops and the host is as it was before (its settings, iptables,
//! links, mounts, cgroups and processes: `scripts/local-cluster host-state`).
//!
//! Nothing is skipped: when something the node needs is missing (root, Debian's containerd, runc,
//! CNI plugins, iptables, the kubelet build, the image archive of `scripts/image`), the control
//! plane fails to start and the test fails with the script's list of what is missing.
//!
//! The tool server listens on the node's own address (the bridge's), which the containers reach;
//! nothing here sends traffic anywhere but to loopback and the node's addresses.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentrun_testkit::cluster::{ControlPlane, Identity, assert_success, repo_root};
use agentrun_testkit::tool_server::{ToolReply, ToolServer};
use serde_json::{Value, json};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn read_env(path: &std::path::Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The folder where the node keeps its lock, journal and host-state snapshots.
fn node_cache() -> PathBuf {
    let cache = match std::env::var_os("AGENTRUN_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache")
            })
            .join("agentrun"),
    };
    cache.join("node")
}

/// kubectl as admin, asserting success; its standard output.
fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    let out = cp.kubectl(Identity::Admin, args);
    assert_success(&out, &format!("kubectl {}", args.join(" ")));
    text(&out.stdout)
}

fn kubectl_json(cp: &ControlPlane, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(cp, &all)).expect("kubectl -o json")
}

fn helm(cp: &ControlPlane, args: &[&str]) -> String {
    let out = cp.helm(args);
    assert_success(&out, &format!("helm {}", args.join(" ")));
    text(&out.stdout)
}

/// Polls `check` every 300 ms until it gives a value; panics after `secs` with `what` and the
/// namespace's Events and Pods.
fn wait_for<T>(
    cp: &ControlPlane,
    namespace: &str,
    secs: u64,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(value) = check() {
            return value;
        }
        if Instant::now() > deadline {
            let pods = cp.kubectl(
                Identity::Admin,
                &["get", "pods", "-o", "wide", "-n", namespace],
            );
            let events = cp.kubectl(Identity::Admin, &["get", "events", "-n", namespace]);
            panic!(
                "{what}: not within {secs}s\npods:\n{}\nevents:\n{}",
                text(&pods.stdout),
                text(&events.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn controller_pods(cp: &ControlPlane, namespace: &str) -> Vec<Value> {
    kubectl_json(
        cp,
        &[
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            "app.kubernetes.io/component=controller",
        ],
    )["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// What the kernel says about a container's main process: its `/proc/<pid>/status` fields, the
/// options of its root mount and its memory cgroup's limit.
struct ProcessFacts {
    status: BTreeMap<String, String>,
    root_mount_options: String,
    memory_limit: Option<u64>,
}

/// The running container `container_id` (`containerd://…`) of the node, read from `/proc`.
fn process_facts(node: &BTreeMap<String, String>, container_id: &str) -> ProcessFacts {
    let id = container_id
        .strip_prefix("containerd://")
        .unwrap_or_else(|| panic!("not a containerd container: {container_id}"));
    let out = Command::new("ctr")
        .args(["--address", &node["CONTAINERD_ADDRESS"], "-n", "k8s.io"])
        .args(["tasks", "ls"])
        .output()
        .expect("run ctr");
    assert_success(&out, "ctr tasks ls");
    let pid = text(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut fields = l.split_whitespace();
            (fields.next() == Some(id)).then(|| fields.next().unwrap_or_default().to_owned())
        })
        .unwrap_or_else(|| panic!("no containerd task {id}:\n{}", text(&out.stdout)));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("the container's /proc status")
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| {
            (
                k.to_owned(),
                v.split_whitespace().collect::<Vec<_>>().join(" "),
            )
        })
        .collect();
    let mountinfo =
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("the container's mounts");
    let root_mount_options = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .and_then(|l| l.split_whitespace().nth(5))
        .unwrap_or_default()
        .to_owned();
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let memory_limit = cgroup
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
        })
        .and_then(|file| std::fs::read_to_string(file).ok())
        .and_then(|v| v.trim().parse().ok());
    ProcessFacts {
        status,
        root_mount_options,
        memory_limit,
    }
}

/// The restricted profile, as the kernel enforces it on a container's process.
fn assert_restricted_process(what: &str, facts: &ProcessFacts, memory_limit: u64) {
    let field = |name: &str| facts.status.get(name).map(String::as_str).unwrap_or("");
    assert_eq!(field("Uid"), "65532 65532 65532 65532", "{what}: uid");
    assert_eq!(field("Gid"), "65532 65532 65532 65532", "{what}: gid");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(field(caps), "0000000000000000", "{what}: {caps}");
    }
    assert_eq!(field("NoNewPrivs"), "1", "{what}: no privilege escalation");
    assert_eq!(
        field("Seccomp"),
        "2",
        "{what}: a seccomp filter (RuntimeDefault)"
    );
    assert!(
        facts.root_mount_options.split(',').any(|o| o == "ro"),
        "{what}: the root filesystem is not read-only ({})",
        facts.root_mount_options
    );
    assert_eq!(
        facts.memory_limit,
        Some(memory_limit),
        "{what}: memory limit"
    );
}

/// `kubectl port-forward` to a Pod's port; the local port, and the child to kill.
fn port_forward(cp: &ControlPlane, namespace: &str, pod: &str, port: u16) -> (u16, ChildGuard) {
    let mut child = Command::new(cp.bin_dir().join("kubectl"))
        .env("KUBECONFIG", cp.kubeconfig(Identity::Admin))
        .args([
            "port-forward",
            "-n",
            namespace,
            &format!("pod/{pod}"),
            "--address",
            "127.0.0.1",
            &format!(":{port}"),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl port-forward");
    let stdout = child.stdout.take().expect("port-forward output");
    let guard = ChildGuard(child);
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    reader
        .read_line(&mut line)
        .expect("read port-forward output");
    // kubectl prints a line per connection: keep reading, or it dies of a broken pipe.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    // "Forwarding from 127.0.0.1:PORT -> 8080"
    let local = line
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("kubectl port-forward said: {line:?}"));
    (local, guard)
}

/// GETs /healthz, /readyz and /metrics of the controller Pod through `kubectl port-forward`;
/// the metrics.
async fn scrape(cp: &ControlPlane, namespace: &str, pod: &str) -> String {
    let (port, _forward) = port_forward(cp, namespace, pod, 8080);
    let http = reqwest::Client::new();
    let mut metrics = String::new();
    for path in ["/healthz", "/readyz", "/metrics"] {
        let response = http
            .get(format!("http://127.0.0.1:{port}{path}"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path} through the Pod: {e}"));
        assert!(
            response.status().is_success(),
            "GET {path}: {}",
            response.status()
        );
        metrics = response.text().await.expect("a body");
    }
    metrics
}

/// Kills a child process when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The newest modification time of the files under `dir`.
fn newest_mtime(dir: &std::path::Path) -> std::time::SystemTime {
    let mut newest = std::time::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let entry = entry.expect("a folder entry");
        let meta = entry.metadata().expect("metadata");
        let time = if meta.is_dir() {
            newest_mtime(&entry.path())
        } else {
            meta.modified().expect("mtime")
        };
        newest = newest.max(time);
    }
    newest
}

/// The image archive `scripts/image` wrote, which the node imports: it must be newer than the
/// sources, or the test would run yesterday's binaries.
fn check_image_is_current() {
    let root = repo_root();
    let archive = root.join(format!(
        "target/image/agentrun-{}.oci.tar",
        env!("CARGO_PKG_VERSION")
    ));
    let built = std::fs::metadata(&archive)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "no image archive at {} ({e}): run scripts/image",
                archive.display()
            )
        });
    let mut sources = newest_mtime(&root.join("src"));
    for file in ["Cargo.toml", "Cargo.lock"] {
        sources = sources.max(
            std::fs::metadata(root.join(file))
                .and_then(|m| m.modified())
                .expect("mtime"),
        );
    }
    assert!(
        built >= sources,
        "{} is older than the sources (src/, Cargo.toml, Cargo.lock): run scripts/image",
        archive.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_the_approval_flow_on_a_real_node() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    check_image_is_current();
    let started = Instant::now();
    let cp = ControlPlane::start_with_node();
    let node = read_env(&cp.dir().join("node.env"));
    eprintln!(
        "control plane and node up in {:.1}s (the node: {}s)",
        started.elapsed().as_secs_f64(),
        node["NODE_START_SECONDS"]
    );
    let node_ip: std::net::IpAddr = node["NODE_IP"].parse().expect("the node's address");

    // The run's namespace and the release's both enforce Pod Security "restricted".
    let system = "agentrun-system";
    let runs = "team-a";
    for ns in [system, runs] {
        kubectl(&cp, &["create", "namespace", ns]);
        kubectl(
            &cp,
            &[
                "label",
                "namespace",
                ns,
                "pod-security.kubernetes.io/enforce=restricted",
                "pod-security.kubernetes.io/enforce-version=latest",
            ],
        );
    }
    wait_for(&cp, runs, 60, "the default service account", || {
        cp.kubectl(
            Identity::Admin,
            &["get", "serviceaccount", "default", "-n", runs],
        )
        .status
        .success()
        .then_some(())
    });

    // helm install with the chart's defaults: the image is the one scripts/image built (the
    // chart's default name and tag), imported on the node.
    let chart = repo_root().join("charts/agentrun");
    let chart = chart.to_str().expect("UTF-8 path");
    let release = "agentrun";
    let approvers = [
        "--set",
        "approvers.users[0]=alice@example.com",
        "--set",
        "approvers.namespaces[0]=team-a",
    ];
    let mut install = vec!["install", release, chart, "--namespace", system];
    install.extend(approvers);
    helm(&cp, &install);

    let controller = wait_for(&cp, system, 180, "the controller Pod Ready", || {
        controller_pods(&cp, system).into_iter().find(ready)
    });
    let controller_pod = controller["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(controller["spec"]["nodeName"], "agentrun-node");
    let image = controller["status"]["containerStatuses"][0]["image"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(image, "ghcr.io/agentrun-dev/agentrun:0.1.0");

    // It holds the chart's Lease (its identity is the Pod's name).
    wait_for(&cp, system, 60, "the controller's Lease", || {
        let lease = cp.kubectl(
            Identity::Admin,
            &[
                "get",
                "lease",
                "agentrun-controller",
                "-n",
                system,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        );
        (text(&lease.stdout) == controller_pod).then_some(())
    });

    // The controller container, as the kernel runs it: the chart's security context.
    let facts = process_facts(
        &node,
        controller["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .expect("a container ID"),
    );
    assert_restricted_process("the controller", &facts, 256 << 20);

    // /metrics through the Pod (kubectl port-forward: API server, kubelet, containerd, the Pod's
    // own loopback), with the probes' paths.
    let metrics = scrape(&cp, system, &controller_pod).await;
    assert!(
        metrics.contains("# TYPE agentrun_reconcile_duration_seconds histogram"),
        "{metrics}"
    );

    // The tool, on the node's address; its reply waits 5 s so the worker's process can be
    // inspected while it runs.
    let tools = ToolServer::start_on(node_ip).await;
    tools.set_reply(
        "/delete_user",
        ToolReply::Delay(Duration::from_secs(5), Box::new(ToolReply::Echo)),
    );
    let agent = json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "ops", "namespace": runs},
        "spec": {
            "instructions": "You are an operations agent.",
            "model": {"scripted": {"turns": [
                {"toolCalls": [{"id": "call_1", "name": "delete_user", "arguments": {"user_id": "u-7"}}]},
                {"content": "User u-7 deleted."}
            ]}},
            "maxTurns": 5,
            "tools": [{"name": "delete_user", "description": "Delete a user", "requiresApproval": true,
                       "parameters": {"type": "object", "properties": {"user_id": {"type": "string"}}},
                       "http": {"url": tools.url("/delete_user"), "timeoutSeconds": 30}}]
        }
    });
    let run = json!({
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "r1", "namespace": runs},
        "spec": {"agentRef": {"name": "ops"}, "input": "Delete user u-7"}
    });
    for object in [&agent, &run] {
        let out = cp.kubectl_with_stdin(
            Identity::Admin,
            &["apply", "-f", "-"],
            Some(&object.to_string()),
        );
        assert_success(&out, "apply the Agent and the run");
    }

    let phase = |cp: &ControlPlane| {
        text(
            &cp.kubectl(
                Identity::Admin,
                &[
                    "get",
                    "agentrun",
                    "r1",
                    "-n",
                    runs,
                    "-o",
                    "jsonpath={.status.phase}",
                ],
            )
            .stdout,
        )
    };
    wait_for(&cp, runs, 180, "the run halts for approval", || {
        let now = phase(&cp);
        assert_ne!(now, "Failed", "the run failed");
        (now == "AwaitingApproval").then_some(())
    });
    assert!(tools.requests().is_empty(), "nothing runs before approval");

    // The first worker ran as a real container, and its log is there.
    let step0 = kubectl_json(&cp, &["get", "pod", "r1-step-0", "-n", runs]);
    assert_eq!(step0["spec"]["nodeName"], "agentrun-node");
    assert_eq!(step0["status"]["phase"], "Succeeded");
    assert_eq!(
        step0["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        0
    );
    let worker_sc = &step0["spec"]["containers"][0]["securityContext"];
    assert_eq!(worker_sc["readOnlyRootFilesystem"], true);
    assert_eq!(worker_sc["allowPrivilegeEscalation"], false);
    assert_eq!(worker_sc["capabilities"]["drop"], json!(["ALL"]));
    let logs = kubectl(&cp, &["logs", "-n", runs, "r1-step-0"]);
    assert!(logs.contains("running step"), "kubectl logs: {logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes in the log: {logs:?}"
    );

    // alice approves with kubectl patch.
    let request = kubectl(
        &cp,
        &[
            "get",
            "apr",
            "-n",
            runs,
            "-l",
            "agentrun.dev/run=r1",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ],
    );
    let decision = json!({"spec": {"decision": "Approved", "approverId": "alice@example.com", "reason": "ticket OPS-42"}});
    let out = cp.kubectl(
        Identity::Alice,
        &[
            "patch",
            "apr",
            &request,
            "-n",
            runs,
            "--type",
            "merge",
            "-p",
            &decision.to_string(),
        ],
    );
    assert_success(&out, "alice approves with kubectl patch");

    // While the tool holds the call, the worker of step 1 is a running process: the restricted
    // profile as the kernel applies it.
    wait_for(&cp, runs, 180, "the tool call of step 1", || {
        (!tools.requests().is_empty()).then_some(())
    });
    let step1 = kubectl_json(&cp, &["get", "pod", "r1-step-1", "-n", runs]);
    let facts = process_facts(
        &node,
        step1["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .expect("the worker's container ID"),
    );
    assert_restricted_process("the worker", &facts, 512 << 20);

    wait_for(&cp, runs, 120, "the run succeeds", || {
        let now = phase(&cp);
        assert_ne!(now, "Failed", "the run failed");
        (now == "Succeeded").then_some(())
    });
    let done = kubectl_json(&cp, &["get", "agentrun", "r1", "-n", runs]);
    assert_eq!(done["status"]["finalOutput"], "User u-7 deleted.");
    assert_eq!(tools.calls_of("call_1"), 1, "the tool ran exactly once");
    assert_eq!(tools.requests().len(), 1);
    let metrics = scrape(&cp, system, &controller_pod).await;
    assert!(
        metrics.contains("agentrun_reconciles_total{result=\"ok\"}"),
        "{metrics}"
    );

    // helm upgrade: the controller rolls over to a new Pod, which takes the Lease.
    let mut upgrade = vec!["upgrade", release, chart, "--namespace", system];
    upgrade.extend(approvers);
    upgrade.extend(["--set", "controller.logLevel=debug"]);
    helm(&cp, &upgrade);
    let upgraded = wait_for(&cp, system, 180, "the upgraded controller Pod", || {
        let pods = controller_pods(&cp, system);
        let new = pods
            .iter()
            .find(|p| p["metadata"]["name"] != controller_pod.as_str() && ready(p))?;
        (pods.len() == 1).then(|| new["metadata"]["name"].as_str().unwrap().to_owned())
    });
    wait_for(&cp, system, 60, "the new controller's Lease", || {
        let lease = cp.kubectl(
            Identity::Admin,
            &[
                "get",
                "lease",
                "agentrun-controller",
                "-n",
                system,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        );
        (text(&lease.stdout) == upgraded).then_some(())
    });

    // helm uninstall: nothing of the release is left, its Pods included. (The Lease and the
    // approval-assertion signing keys are the controller's own objects, not the chart's: the
    // Lease stays, expiring 15 s after the last renewal; the keys stay so that a reinstall signs
    // with keys the tools already trust. See docs/real-node.md.)
    helm(&cp, &["uninstall", release, "--namespace", system]);
    let mut last_left = String::new();
    let kinds = "deployments,replicasets,pods,services,serviceaccounts,roles,rolebindings,\
                 networkpolicies,poddisruptionbudgets,secrets";
    wait_for(
        &cp,
        system,
        120,
        "nothing left in the release namespace",
        || {
            let left = kubectl(&cp, &["get", kinds, "-n", system, "-o", "name"]);
            let left: Vec<&str> = left
                .lines()
                .filter(|l| *l != "serviceaccount/default" && *l != "secret/agentrun-signing-keys")
                .collect();
            let now = left.join(", ");
            if now != last_left {
                eprintln!("left in the release namespace: [{now}]");
                last_left = now;
            }
            left.is_empty().then_some(())
        },
    );
    let cluster_wide = kubectl(
        &cp,
        &[
            "get",
            "clusterroles,clusterrolebindings,mutatingadmissionpolicies,\
             mutatingadmissionpolicybindings,validatingadmissionpolicies,\
             validatingadmissionpolicybindings",
            "-l",
            "app.kubernetes.io/instance=agentrun",
            "-o",
            "name",
        ],
    );
    assert_eq!(cluster_wide.trim(), "", "cluster-scoped objects left");
    // On the node, no container runs any more (the workers' Pods completed, the controller's are
    // gone with the release).
    wait_for(&cp, system, 60, "no container running on the node", || {
        let out = Command::new("ctr")
            .args(["--address", &node["CONTAINERD_ADDRESS"], "-n", "k8s.io"])
            .args(["tasks", "ls"])
            .output()
            .ok()?;
        (!text(&out.stdout).contains("RUNNING")).then_some(())
    });

    // The node stops and the host is as it was (the supervisor snapshots it under the node's lock
    // before changing anything and after restoring).
    let dir = cp.dir().to_owned();
    cp.stop();
    let cache = node_cache();
    let before =
        std::fs::read_to_string(cache.join("host-state.before")).expect("host-state.before");
    let after = std::fs::read_to_string(cache.join("host-state.after"))
        .expect("host-state.after: the node did not restore the host");
    let header = format!("# cluster {}", dir.display());
    assert_eq!(before.lines().next(), Some(header.as_str()));
    assert_eq!(after.lines().next(), Some(header.as_str()));
    assert!(
        before == after,
        "the host differs after the node stopped:\n--- before\n{before}\n--- after\n{after}"
    );
    assert!(before.contains("## nft ruleset") && before.contains("## mounts"));
    eprintln!("whole test: {:.1}s", started.elapsed().as_secs_f64());
}
