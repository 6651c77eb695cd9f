//! A dev-only stand-in for the kubelet on a cluster without nodes (the local control plane).
//!
//! It watches worker Pods labelled `app.kubernetes.io/managed-by=agentrun`, runs each Pod's container
//! command as a local process with the Pod's environment and a token minted by the TokenRequest API for
//! the Pod's service account (bound to the Pod, as the kubelet does), and writes the Pod's phase, exit
//! code and termination message back. Deleting the Pod kills the process. The controller's code path
//! is exactly the one used in a real cluster; only the kubelet's part is played here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tracing::{info, warn};

pub mod cli;
mod cluster_access;

pub use cluster_access::ClusterAccess;

/// The label selecting the Pods this stand-in runs.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=agentrun";

/// Bytes of a failed process's stderr kept as its termination message (the kubelet keeps 4096).
const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// Errors of the dev kubelet.
#[derive(Debug, thiserror::Error)]
pub enum DevKubeletError {
    /// The Kubernetes API refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The Pod watch failed.
    #[error("watching pods: {0}")]
    Watch(#[from] watcher::Error),
    /// The kubeconfig this process runs with could not be read.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// A local file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The Pod asks for something a local process cannot give.
    #[error("pod {0}: {1}")]
    Unsupported(String, String),
}

/// How the dev kubelet runs Pods.
#[derive(Clone, Debug)]
pub struct DevKubeletConfig {
    /// The `agentrun` binary that stands for the image's `agentrun` command.
    pub agentrun_binary: PathBuf,
    /// Watch only this namespace (all namespaces when `None`).
    pub namespace: Option<String>,
    /// Where Pod folders (kubeconfig, logs) are made.
    pub work_dir: PathBuf,
    /// The API server URL and CA data written into each Pod's kubeconfig.
    pub cluster: ClusterAccess,
    /// How many Pods run at once, like a node's `maxPods` (0: no limit). Further Pods stay Pending
    /// until one finishes.
    pub max_pods: usize,
}

type Running = Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>;

/// Runs the dev kubelet until the watch ends or fails.
pub async fn run(client: Client, config: DevKubeletConfig) -> Result<(), DevKubeletError> {
    let pods: Api<Pod> = match &config.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    std::fs::create_dir_all(&config.work_dir).map_err(|source| DevKubeletError::Io {
        what: format!("creating {}", config.work_dir.display()),
        source,
    })?;
    let running: Running = Arc::default();
    let slots =
        (config.max_pods > 0).then(|| Arc::new(tokio::sync::Semaphore::new(config.max_pods)));
    let config = Arc::new(config);
    let stream =
        watcher(pods, watcher::Config::default().labels(MANAGED_BY_SELECTOR)).default_backoff();
    let mut stream = std::pin::pin!(stream);
    info!(work_dir = %config.work_dir.display(), "dev kubelet watching worker pods");
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            // The watch resumes by itself (with backoff), e.g. across an API server restart.
            Err(error) => {
                warn!(%error, "pod watch failed; retrying");
                continue;
            }
        };
        let (pod, deleted) = match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => (pod, false),
            watcher::Event::Delete(pod) => (pod, true),
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        let Some(uid) = pod.uid() else { continue };
        if deleted || pod.metadata.deletion_timestamp.is_some() {
            if let Some(kill) = running.lock().unwrap().remove(&uid) {
                let _ = kill.send(());
            }
            continue;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        if phase.is_some_and(|p| p != "Pending") || running.lock().unwrap().contains_key(&uid) {
            continue;
        }
        let (kill_tx, kill_rx) = oneshot::channel();
        running.lock().unwrap().insert(uid.clone(), kill_tx);
        let client = client.clone();
        let config = config.clone();
        let running = running.clone();
        let slots = slots.clone();
        tokio::spawn(async move {
            let _slot = match slots {
                Some(slots) => slots.acquire_owned().await.ok(),
                None => None,
            };
            let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            if let Err(error) = run_pod(client.clone(), &config, &pod, kill_rx).await {
                warn!(pod = %name, %error, "dev kubelet could not run the pod");
                let message = error.to_string();
                let _ = with_retries("writing the StartError status", || {
                    write_terminated(&client, &pod, 128, "StartError", &message)
                })
                .await;
            }
            running.lock().unwrap().remove(&uid);
        });
    }
    Ok(())
}

/// Retries an API call the way a kubelet's status manager does, so that an API server restart does
/// not leave a Pod without its status (a Pod left Pending gets no new watch event to retry it).
/// Gives up when the Pod is gone (404) or after two minutes.
async fn with_retries<T, F, Fut>(what: &str, call: F) -> Result<T, DevKubeletError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, DevKubeletError>>,
{
    use backon::{ExponentialBuilder, Retryable};
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    let backoff = ExponentialBuilder::new()
        .with_min_delay(std::time::Duration::from_millis(200))
        .with_max_delay(std::time::Duration::from_secs(5))
        .with_factor(2.0)
        .without_max_times();
    call.retry(backoff)
        .when(|e| !matches!(e, DevKubeletError::Kube(kube::Error::Api(s)) if s.code == 404))
        .adjust(|_, delay| delay.filter(|_| tokio::time::Instant::now() < deadline))
        .notify(|error, _| warn!(%error, "{what} failed; retrying"))
        .await
}

async fn run_pod(
    client: Client,
    config: &DevKubeletConfig,
    pod: &Pod,
    kill: oneshot::Receiver<()>,
) -> Result<(), DevKubeletError> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let spec = pod.spec.clone().unwrap_or_default();
    let container = spec
        .containers
        .first()
        .cloned()
        .ok_or_else(|| DevKubeletError::Unsupported(name.clone(), "no container".into()))?;
    let dir = config
        .work_dir
        .join(format!("{ns}_{name}_{}", pod.uid().unwrap_or_default()));
    std::fs::create_dir_all(&dir).map_err(|source| DevKubeletError::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;

    let account = spec
        .service_account_name
        .clone()
        .unwrap_or_else(|| "default".into());
    let token = with_retries("minting a token", || mint_token(&client, pod, &account)).await?;
    let kubeconfig = write_kubeconfig(&dir, &config.cluster, &account, &token)?;
    let mut command = command_for(config, &name, &container)?;
    for (key, value) in env_for(pod, &container)? {
        command.env(key, value);
    }
    command
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", &dir)
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|source| DevKubeletError::Io {
        what: format!("starting {:?}", container.command),
        source,
    })?;
    info!(pod = %format!("{ns}/{name}"), pid = child.id(), "started worker process");
    with_retries("writing the Running status", || write_running(&client, pod)).await?;

    let mut stderr = child.stderr.take().expect("stderr is piped");
    let log_path = dir.join("stderr.log");
    let collect = tokio::spawn(async move {
        let mut all = Vec::new();
        let _ = stderr.read_to_end(&mut all).await;
        let _ = tokio::fs::write(&log_path, &all).await;
        all
    });
    let status = tokio::select! {
        status = child.wait() => status.map_err(|source| DevKubeletError::Io { what: "waiting for the worker".into(), source })?,
        _ = kill => {
            let _ = child.kill().await;
            info!(pod = %format!("{ns}/{name}"), "pod deleted: worker process killed");
            return Ok(());
        }
    };
    let stderr = collect.await.unwrap_or_default();
    eprint!("{}", String::from_utf8_lossy(&stderr));
    let code = status.code().unwrap_or(137);
    let message = if code == 0 {
        String::new()
    } else {
        termination_message(&stderr)
    };
    let reason = if code == 0 { "Completed" } else { "Error" };
    with_retries("writing the terminated status", || {
        write_terminated(&client, pod, code, reason, &message)
    })
    .await?;
    info!(pod = %format!("{ns}/{name}"), exit_code = code, "worker process exited");
    Ok(())
}

/// The tail of stderr, as `terminationMessagePolicy: FallbackToLogsOnError` keeps it.
fn termination_message(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let trimmed = text.trim_end();
    let mut start = trimmed.len().saturating_sub(TERMINATION_MESSAGE_LIMIT);
    while !trimmed.is_char_boundary(start) {
        start += 1;
    }
    trimmed[start..].to_string()
}

fn command_for(
    config: &DevKubeletConfig,
    pod: &str,
    container: &Container,
) -> Result<tokio::process::Command, DevKubeletError> {
    let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
    argv.extend(container.args.clone().unwrap_or_default());
    let Some(program) = argv.first() else {
        return Err(DevKubeletError::Unsupported(
            pod.into(),
            "container has no command".into(),
        ));
    };
    let program = if Path::new(program)
        .file_name()
        .is_some_and(|f| f == "agentrun")
    {
        config.agentrun_binary.clone()
    } else {
        return Err(DevKubeletError::Unsupported(
            pod.into(),
            format!("the dev kubelet only runs the agentrun command, not {program}"),
        ));
    };
    let mut command = tokio::process::Command::new(program);
    command.args(&argv[1..]);
    Ok(command)
}

fn env_for(pod: &Pod, container: &Container) -> Result<Vec<(String, String)>, DevKubeletError> {
    let mut out = Vec::new();
    for var in container.env.clone().unwrap_or_default() {
        let value = match (var.value, var.value_from) {
            (Some(value), _) => value,
            (None, Some(source)) => match source.field_ref.map(|f| f.field_path) {
                Some(path) if path == "metadata.namespace" => pod.namespace().unwrap_or_default(),
                Some(path) if path == "metadata.name" => pod.name_any(),
                Some(path) if path == "metadata.uid" => pod.uid().unwrap_or_default(),
                Some(path) if path == "spec.serviceAccountName" => pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.service_account_name.clone())
                    .unwrap_or_default(),
                other => {
                    return Err(DevKubeletError::Unsupported(
                        pod.name_any(),
                        format!("env {}: unsupported source {other:?}", var.name),
                    ));
                }
            },
            (None, None) => String::new(),
        };
        out.push((var.name, value));
    }
    Ok(out)
}

async fn mint_token(client: &Client, pod: &Pod, account: &str) -> Result<String, DevKubeletError> {
    let accounts: Api<ServiceAccount> =
        Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![]),
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.uid(),
            }),
        }),
        ..Default::default()
    };
    let response = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await?;
    Ok(response.status.and_then(|s| s.token).unwrap_or_default())
}

fn write_kubeconfig(
    dir: &Path,
    cluster: &ClusterAccess,
    account: &str,
    token: &str,
) -> Result<PathBuf, DevKubeletError> {
    let path = dir.join("kubeconfig");
    cluster
        .write_token_kubeconfig(&path, account, token)
        .map_err(|source| DevKubeletError::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
    Ok(path)
}

fn container_name(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_else(|| "worker".into())
}

async fn write_running(client: &Client, pod: &Pod) -> Result<(), DevKubeletError> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let patch = json!({
        "status": {
            "phase": "Running",
            "startTime": now,
            "containerStatuses": [{
                "name": container_name(pod),
                "image": pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default(),
                "imageID": "",
                "ready": true,
                "restartCount": 0,
                "started": true,
                "state": {"running": {"startedAt": now}},
            }],
        }
    });
    status_patch(client, pod, patch).await
}

async fn write_terminated(
    client: &Client,
    pod: &Pod,
    exit_code: i32,
    reason: &str,
    message: &str,
) -> Result<(), DevKubeletError> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let phase = if exit_code == 0 {
        "Succeeded"
    } else {
        "Failed"
    };
    let patch = json!({
        "status": {
            "phase": phase,
            "containerStatuses": [{
                "name": container_name(pod),
                "image": pod.spec.as_ref().and_then(|s| s.containers.first()).and_then(|c| c.image.clone()).unwrap_or_default(),
                "imageID": "",
                "ready": false,
                "restartCount": 0,
                "started": false,
                "state": {"terminated": {
                    "exitCode": exit_code,
                    "reason": reason,
                    "message": message,
                    "finishedAt": now,
                }},
            }],
        }
    });
    status_patch(client, pod, patch).await
}

async fn status_patch(
    client: &Client,
    pod: &Pod,
    patch: serde_json::Value,
) -> Result<(), DevKubeletError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    match pods
        .patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        // The Pod was deleted meanwhile: nothing left to report on.
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_message_keeps_the_tail() {
        let long = "x".repeat(5000) + "\nerror: the end\n";
        let message = termination_message(long.as_bytes());
        assert_eq!(message.len(), TERMINATION_MESSAGE_LIMIT);
        assert!(message.ends_with("error: the end"));
        assert_eq!(termination_message(b"short\n"), "short");
    }

    #[test]
    fn only_the_agentrun_command_runs() {
        let config = DevKubeletConfig {
            agentrun_binary: PathBuf::from("/opt/agentrun"),
            namespace: None,
            work_dir: PathBuf::from("/tmp"),
            cluster: ClusterAccess {
                server: "https://127.0.0.1:1".into(),
                certificate_authority_data: None,
            },
            max_pods: 0,
        };
        let ok = Container {
            name: "worker".into(),
            command: Some(vec!["/usr/local/bin/agentrun".into(), "worker".into()]),
            args: Some(vec!["--step".into(), "0".into()]),
            ..Default::default()
        };
        let cmd = command_for(&config, "p", &ok).unwrap();
        assert_eq!(cmd.as_std().get_program(), "/opt/agentrun");
        let args: Vec<_> = cmd.as_std().get_args().collect();
        assert_eq!(args, ["worker", "--step", "0"]);
        let other = Container {
            command: Some(vec!["sh".into()]),
            ..ok
        };
        assert!(command_for(&config, "p", &other).is_err());
    }
}
