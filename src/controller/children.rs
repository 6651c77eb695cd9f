//! Pure builders of the objects the controller creates for a run: the worker Pod of a step, and
//! the per-run service account with the narrowest rights a worker needs (read its run, the
//! ApprovalRequests and the Secrets its Agent names; patch only its own run's status).

use k8s_openapi::api::core::v1::{
    Capabilities, Container, EnvVar, Pod, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::crd::keys::labels;
use crate::crd::names::{run_label_value, worker_account_name, worker_pod_name};
use crate::crd::{AgentRun, AgentRunPhase, AgentSpec};

/// What the worker Pods are built from.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// The default worker image (an AgentRun may override it).
    pub image: String,
    /// `imagePullPolicy` of the worker container.
    pub image_pull_policy: Option<String>,
    /// Extra environment for the worker (e.g. `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// Which finished runs' worker Pods are deleted.
    pub pod_deletion: WorkerPodDeletion,
}

/// Which finished runs have their worker Pods deleted when they finish. A run's Pods are deleted
/// with the run in any case (they are owned by it); until then each one is an object that every
/// list and watch of Pods carries (the controller's, the kubelets').
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, strum::Display)]
#[strum(serialize_all = "kebab-case")]
pub enum WorkerPodDeletion {
    /// Keep every worker Pod (and its log) until the run is deleted.
    Never,
    /// Delete the worker Pods of a run that succeeded; a failed run keeps them, logs and all.
    #[default]
    Succeeded,
    /// Delete the worker Pods of every finished run, succeeded or failed.
    Finished,
}

impl WorkerPodDeletion {
    /// Whether a run that finished in `phase` has its worker Pods deleted.
    pub fn deletes(self, phase: AgentRunPhase) -> bool {
        match self {
            WorkerPodDeletion::Never => false,
            WorkerPodDeletion::Succeeded => phase == AgentRunPhase::Succeeded,
            WorkerPodDeletion::Finished => phase.is_terminal(),
        }
    }

    /// Whether `run` has finished, in a phase whose worker Pods are deleted.
    pub fn deletes_pods_of(self, run: &AgentRun) -> bool {
        run.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|phase| self.deletes(phase))
    }
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            image: format!(
                "ghcr.io/agentrun-dev/agentrun:{}",
                env!("CARGO_PKG_VERSION")
            ),
            image_pull_policy: None,
            env: vec![],
            pod_deletion: WorkerPodDeletion::default(),
        }
    }
}

fn labels(run: &AgentRun) -> std::collections::BTreeMap<String, String> {
    [
        (
            labels::MANAGED_BY.0.to_owned(),
            labels::MANAGED_BY.1.to_owned(),
        ),
        (labels::RUN.to_owned(), run_label_value(&run.name_any())),
    ]
    .into()
}

fn owned_meta(run: &AgentRun, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: run.namespace(),
        labels: Some(labels(run)),
        owner_references: run.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    }
}

/// The service account a run's workers use: the override, or the per-run account.
pub fn service_account_for(run: &AgentRun) -> String {
    run.spec
        .worker
        .as_ref()
        .and_then(|w| w.service_account_name.clone())
        .unwrap_or_else(|| worker_account_name(&run.name_any()))
}

/// The worker Pod of `step` (attempt `attempt`) of `run`.
pub fn worker_pod(run: &AgentRun, step: u32, attempt: u32, settings: &WorkerSettings) -> Pod {
    let name = worker_pod_name(&run.name_any(), step, attempt);
    let mut meta = owned_meta(run, name);
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(labels::STEP.to_owned(), step.to_string());
    let overrides = run.spec.worker.clone().unwrap_or_default();
    let image = overrides
        .image
        .clone()
        .unwrap_or_else(|| settings.image.clone());
    let resources = overrides
        .resources
        .clone()
        .unwrap_or_else(|| ResourceRequirements {
            requests: Some(
                [
                    ("cpu".to_owned(), Quantity("50m".into())),
                    ("memory".to_owned(), Quantity("64Mi".into())),
                ]
                .into(),
            ),
            limits: Some([("memory".to_owned(), Quantity("512Mi".into()))].into()),
            ..Default::default()
        });
    let mut env: Vec<EnvVar> = settings
        .env
        .iter()
        .map(|(k, v)| EnvVar {
            name: k.clone(),
            value: Some(v.clone()),
            ..Default::default()
        })
        .collect();
    // One trace per run: every worker Pod's spans are children of the run's root span.
    env.push(EnvVar {
        name: crate::telemetry::TRACEPARENT_ENV.into(),
        value: Some(crate::telemetry::run_traceparent(
            &run.uid().unwrap_or_default(),
        )),
        ..Default::default()
    });
    env.push(EnvVar {
        name: "AGENTRUN_WORKER_POD".into(),
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                field_path: "metadata.name".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    Pod {
        metadata: meta,
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            service_account_name: Some(service_account_for(run)),
            automount_service_account_token: Some(true),
            enable_service_links: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(65532),
                run_as_group: Some(65532),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers: vec![Container {
                name: "worker".into(),
                image: Some(image),
                image_pull_policy: settings.image_pull_policy.clone(),
                command: Some(vec!["agentrun".into()]),
                args: Some(vec![
                    "worker".into(),
                    "--namespace".into(),
                    run.namespace().unwrap_or_default(),
                    "--run".into(),
                    run.name_any(),
                    "--step".into(),
                    step.to_string(),
                ]),
                env: Some(env),
                resources: Some(resources),
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                security_context: Some(SecurityContext {
                    allow_privilege_escalation: Some(false),
                    read_only_root_filesystem: Some(true),
                    run_as_non_root: Some(true),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Default::default()
                    }),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "RuntimeDefault".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

/// The per-run worker identity: a ServiceAccount, a Role granting exactly what the worker needs
/// for this run, and the RoleBinding between them.
pub fn worker_identity(run: &AgentRun, agent: &AgentSpec) -> (ServiceAccount, Role, RoleBinding) {
    let name = worker_account_name(&run.name_any());
    let account = ServiceAccount {
        metadata: owned_meta(run, name.clone()),
        automount_service_account_token: Some(false),
        ..Default::default()
    };
    let mut rules = vec![
        PolicyRule {
            api_groups: Some(vec![crate::crd::GROUP.into()]),
            resources: Some(vec!["agentruns".into()]),
            resource_names: Some(vec![run.name_any()]),
            verbs: vec!["get".into()],
            ..Default::default()
        },
        PolicyRule {
            api_groups: Some(vec![crate::crd::GROUP.into()]),
            resources: Some(vec!["agentruns/status".into()]),
            resource_names: Some(vec![run.name_any()]),
            verbs: vec!["get".into(), "patch".into()],
            ..Default::default()
        },
        // Before it sends an approved call, the worker checks it against its ApprovalRequest
        // (named after the run and the call id, which the Role cannot know in advance).
        PolicyRule {
            api_groups: Some(vec![crate::crd::GROUP.into()]),
            resources: Some(vec!["approvalrequests".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        },
    ];
    // States too large for the status are offloaded to RunStateChunks named after their digest,
    // so the worker creates and reads them (names cannot be known when this Role is made). No
    // rights on ConfigMaps or any other resource of the namespace.
    rules.push(PolicyRule {
        api_groups: Some(vec![crate::crd::GROUP.into()]),
        resources: Some(vec!["runstatechunks".into()]),
        verbs: vec!["get".into(), "create".into()],
        ..Default::default()
    });
    // Exactly the Secrets the Agent names: the model's API key and its MCP servers' headers.
    let mut secrets: Vec<String> = agent
        .model
        .api_key_secret_ref
        .iter()
        .map(|s| s.name.clone())
        .chain(
            agent
                .mcp_servers
                .iter()
                .flat_map(|server| server.headers.iter())
                .map(|h| h.secret_key_ref.name.clone()),
        )
        .collect();
    secrets.sort();
    secrets.dedup();
    if !secrets.is_empty() {
        rules.push(PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(secrets),
            verbs: vec!["get".into()],
            ..Default::default()
        });
    }
    let role = Role {
        metadata: owned_meta(run, name.clone()),
        rules: Some(rules),
    };
    let binding = RoleBinding {
        metadata: owned_meta(run, name.clone()),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name,
            namespace: run.namespace(),
            ..Default::default()
        }]),
    };
    (account, role, binding)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::WorkerOverrides;

    fn run() -> AgentRun {
        AgentRun::test().in_namespace("team")
    }

    #[test]
    fn the_worker_pod_is_restricted_and_owned_by_its_run() {
        let pod = worker_pod(&run(), 2, 0, &WorkerSettings::default());
        assert_eq!(pod.metadata.name.as_deref(), Some("r1-step-2"));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("AgentRun", "uid-1", Some(true))
        );
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["app.kubernetes.io/managed-by"], "agentrun");
        assert_eq!(labels[labels::RUN], "r1");
        assert_eq!(labels[labels::STEP], "2");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.service_account_name.as_deref(), Some("r1-worker"));
        let c = &spec.containers[0];
        assert_eq!(
            c.args.as_ref().unwrap(),
            &[
                "worker",
                "--namespace",
                "team",
                "--run",
                "r1",
                "--step",
                "2"
            ]
        );
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_ref().unwrap(),
            &["ALL"]
        );
        assert_eq!(spec.security_context.unwrap().run_as_non_root, Some(true));
    }

    #[test]
    fn retries_get_their_own_pod_name() {
        let pod = worker_pod(&run(), 0, 2, &WorkerSettings::default());
        assert_eq!(pod.metadata.name.as_deref(), Some("r1-step-0-r2"));
    }

    #[test]
    fn overrides_replace_image_and_service_account() {
        let mut r = run();
        r.spec.worker = Some(WorkerOverrides {
            image: Some("example.com/agentrun:dev".into()),
            resources: None,
            service_account_name: Some("custom".into()),
        });
        let pod = worker_pod(&r, 0, 0, &WorkerSettings::default());
        let spec = pod.spec.unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("custom"));
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("example.com/agentrun:dev")
        );
    }

    #[test]
    fn the_worker_role_names_exactly_its_run_and_secret() {
        let agent: crate::crd::Agent = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": "ops", "namespace": "team"},
            "spec": {"model": {"baseUrl": "http://m", "name": "x", "apiKeySecretRef": {"name": "openai", "key": "token"}}}
        }))
        .unwrap();
        let (_, role, binding) = worker_identity(&run(), &agent.spec);
        let rules = role.rules.unwrap();
        let names: Vec<_> = rules.iter().map(|r| r.resource_names.clone()).collect();
        assert_eq!(
            names,
            [
                Some(vec!["r1".to_string()]),
                Some(vec!["r1".into()]),
                None,
                None,
                Some(vec!["openai".into()])
            ]
        );
        // Unnamed: approval requests, read only; offloaded state chunks (not ConfigMaps), created
        // and read, never listed.
        assert_eq!(rules[2].verbs, ["get"]);
        assert_eq!(rules[3].verbs, ["get", "create"]);
        assert_eq!(
            rules[3].resources.as_deref(),
            Some(&["runstatechunks".to_owned()][..])
        );
        assert!(rules.iter().all(|r| {
            let resources = r.resources.clone().unwrap_or_default();
            !resources.contains(&"configmaps".to_owned()) && !resources.contains(&"*".to_owned())
        }));
        assert!(rules.iter().all(|r| !r.verbs.contains(&"*".to_string())));
        assert_eq!(binding.subjects.unwrap()[0].name, "r1-worker");
    }

    #[test]
    fn the_worker_reads_exactly_the_secrets_of_its_mcp_headers() {
        let spec: AgentSpec = serde_json::from_value(serde_json::json!({
            "model": {"baseUrl": "http://m", "name": "x", "apiKeySecretRef": {"name": "openai", "key": "token"}},
            "mcpServers": [
                {"name": "a", "url": "http://a/mcp", "headers": [
                    {"name": "Authorization", "secretKeyRef": {"name": "a-token", "key": "t"}},
                    {"name": "X-Tenant", "secretKeyRef": {"name": "openai", "key": "tenant"}}]},
                {"name": "b", "url": "http://b/mcp"}
            ]
        }))
        .unwrap();
        let (_, role, _) = worker_identity(&run(), &spec);
        let rules = role.rules.unwrap();
        let secrets: Vec<_> = rules
            .iter()
            .filter(|r| r.resources.as_deref() == Some(&["secrets".to_owned()][..]))
            .collect();
        assert_eq!(secrets.len(), 1);
        assert_eq!(
            secrets[0].resource_names.as_deref(),
            Some(&["a-token".to_owned(), "openai".to_owned()][..])
        );
        assert_eq!(secrets[0].verbs, ["get"]);
    }

    #[test]
    fn each_worker_pod_carries_its_runs_trace_context() {
        let pod = worker_pod(&run(), 1, 0, &WorkerSettings::default());
        let env = pod.spec.unwrap().containers[0].env.clone().unwrap();
        let traceparent = env.iter().find(|e| e.name == "TRACEPARENT").unwrap();
        assert_eq!(
            traceparent.value.as_deref(),
            Some(crate::telemetry::run_traceparent("uid-1").as_str())
        );
    }
}
