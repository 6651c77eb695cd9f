//! [`CachedPod`]: a worker Pod as the controller's cache keeps it. The watch decodes only what a
//! reconcile reads (see [`decide::pod_outcome`](super::decide::pod_outcome)): the Pod's metadata,
//! its phase and message, and how its containers ended. Neither the spec nor the rest of the
//! status is decoded (a `Pod` of `k8s-openapi` is 2.4 KiB before any of its fields), and the cache
//! keeps less still ([`KeptPod`]: its owners, whether it is being deleted, how it ended), so a
//! finished step's Pod costs about two hundred bytes however many of them the runs keep.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};

use super::owned::{Keep, owner_uids};

/// A worker Pod: its metadata and how it ended (a `v1` `Pod` read through the Pods' API).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct CachedPod {
    /// The Pod's metadata (the cache drops its managed fields, annotations and labels).
    pub metadata: ObjectMeta,
    /// What the Pod's status says of how it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<CachedPodStatus>,
}

/// The part of a Pod's status a reconcile reads.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why the Pod is in this phase, when the kubelet says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Each container's name and, once it ended, how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<CachedContainerStatus>>,
}

/// A container's name and, once it ended, how.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct CachedContainerStatus {
    /// The container's name.
    #[serde(default)]
    pub name: String,
    /// Its state, of which only `terminated` is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<CachedContainerState>,
}

/// A container's state, when it has terminated.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct CachedContainerState {
    /// How the container ended: exit code, message, when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<ContainerStateTerminated>,
}

impl Resource for CachedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl CachedPod {
    /// Drops what the watch decoded but a reconcile does not read: managed fields, annotations,
    /// labels (a run's Pods are found by their owner reference), the containers of a Pod that
    /// succeeded (only its phase counts), and of a terminated container all but its exit code,
    /// message and end.
    pub fn strip(&mut self) {
        self.metadata.managed_fields = None;
        self.metadata.annotations = None;
        self.metadata.labels = None;
        let Some(status) = self.status.as_mut() else {
            return;
        };
        if status.phase.as_deref() == Some("Succeeded") {
            status.container_statuses = None;
        }
        let terminated = status.container_statuses.iter_mut().flatten();
        for t in terminated.filter_map(|c| c.state.as_mut()?.terminated.as_mut()) {
            t.container_id = None;
            t.reason = None;
            t.started_at = None;
            t.signal = None;
        }
    }
}

/// What [`Owned`](super::owned::Owned) keeps of a worker Pod: a reconcile finds its run's Pods by
/// owner and reads of each its name (the cache's key), whether it is being deleted and how it
/// ended.
#[derive(Debug)]
pub struct KeptPod {
    owners: Box<[Box<str>]>,
    deletion_timestamp: Option<Time>,
    status: Option<CachedPodStatus>,
}

impl Keep for CachedPod {
    type Kept = KeptPod;

    fn keep(&self) -> KeptPod {
        KeptPod {
            owners: owner_uids(self).map(Box::from).collect(),
            deletion_timestamp: self.metadata.deletion_timestamp.clone(),
            status: self.status.clone(),
        }
    }

    fn owner_uids(kept: &KeptPod) -> impl Iterator<Item = &str> {
        kept.owners.iter().map(|uid| &**uid)
    }

    /// The Pod with the metadata a reconcile reads: its name, namespace and deletion timestamp.
    fn restore(kept: &KeptPod, namespace: Option<&str>, name: &str) -> CachedPod {
        CachedPod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: namespace.map(Into::into),
                deletion_timestamp: kept.deletion_timestamp.clone(),
                ..Default::default()
            },
            status: kept.status.clone(),
        }
    }
}

impl From<Pod> for CachedPod {
    fn from(pod: Pod) -> Self {
        CachedPod {
            metadata: pod.metadata,
            status: pod.status.map(|status| CachedPodStatus {
                phase: status.phase,
                message: status.message,
                container_statuses: status.container_statuses.map(|statuses| {
                    statuses
                        .into_iter()
                        .map(|c| CachedContainerStatus {
                            name: c.name,
                            state: c.state.map(|s| CachedContainerState {
                                terminated: s.terminated,
                            }),
                        })
                        .collect()
                }),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStatus, PodCondition, PodStatus};
    use kube::ResourceExt;

    use super::*;
    use crate::controller::decide::{PodOutcome, pod_outcome};
    use crate::crd::AgentRun;

    fn failed_pod() -> Pod {
        let mut run = AgentRun::new("r", Default::default());
        run.metadata.uid = Some("uid-r".into());
        let mut pod = crate::controller::children::worker_pod(&run, 1, 0, &Default::default());
        pod.annotations_mut().insert("a".into(), "b".into());
        pod.metadata.resource_version = Some("7".into());
        pod.status = Some(PodStatus {
            phase: Some("Failed".into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: "False".into(),
                ..Default::default()
            }]),
            container_statuses: Some(vec![ContainerStatus {
                name: "worker".into(),
                image: "agentrun:dev".into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 3,
                        message: Some("the model refused".into()),
                        container_id: Some("containerd://0123456789abcdef".into()),
                        reason: Some("Error".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        pod
    }

    #[test]
    fn a_pod_decoded_from_the_api_keeps_what_a_reconcile_reads_and_nothing_else() {
        let pod = failed_pod();
        // What the watch receives: the Pod's JSON, decoded as a cached Pod.
        let json = serde_json::to_string(&pod).unwrap();
        let mut cached: CachedPod = serde_json::from_str(&json).unwrap();
        cached.strip();
        assert_eq!(
            pod_outcome(Some(&cached)),
            PodOutcome::Failed {
                exit_code: Some(3),
                message: "the worker exited with code 3: the model refused".into(),
                finished_at: None,
            }
        );
        assert_eq!(cached.metadata.name, pod.metadata.name);
        assert!(pod.metadata.labels.is_some());
        assert_eq!(cached.metadata.labels, None);
        assert_eq!(cached.resource_version().as_deref(), Some("7"));
        assert!(cached.metadata.owner_references.is_some());
        assert_eq!(
            cached.metadata.owner_references,
            pod.metadata.owner_references
        );
        assert!(cached.annotations().is_empty());
        assert_eq!(cached, {
            let mut converted = CachedPod::from(pod);
            converted.strip();
            converted
        });
        assert_eq!(
            CachedPod::url_path(&(), Some("ns")),
            "/api/v1/namespaces/ns/pods"
        );
    }

    #[test]
    fn a_succeeded_pod_keeps_only_its_phase_and_a_failed_one_how_its_container_ended() {
        let failed = failed_pod();
        let mut succeeded = failed.clone();
        succeeded.status.as_mut().unwrap().phase = Some("Succeeded".into());

        let mut cached = CachedPod::from(succeeded);
        cached.strip();
        assert_eq!(pod_outcome(Some(&cached)), PodOutcome::Succeeded);
        assert_eq!(cached.status.unwrap().container_statuses, None);

        let mut cached = CachedPod::from(failed);
        cached.strip();
        let statuses = cached.status.unwrap().container_statuses.unwrap();
        assert_eq!(
            statuses[0]
                .state
                .as_ref()
                .and_then(|s| s.terminated.as_ref()),
            Some(&ContainerStateTerminated {
                exit_code: 3,
                message: Some("the model refused".into()),
                ..Default::default()
            })
        );
    }

    #[test]
    fn the_kept_pod_restores_what_a_reconcile_reads() {
        let mut cached = CachedPod::from(failed_pod());
        cached.strip();
        let kept = cached.keep();
        assert_eq!(CachedPod::owner_uids(&kept).collect::<Vec<_>>(), ["uid-r"]);
        let restored = CachedPod::restore(&kept, Some("team"), "r-step-1-0");
        assert_eq!(restored.name_any(), "r-step-1-0");
        assert_eq!(restored.namespace().as_deref(), Some("team"));
        assert_eq!(restored.status, cached.status);
        assert_eq!(pod_outcome(Some(&restored)), pod_outcome(Some(&cached)));

        cached.metadata.deletion_timestamp = Some(Time(Default::default()));
        let deleting = CachedPod::restore(&cached.keep(), Some("team"), "r-step-1-0");
        assert!(matches!(
            pod_outcome(Some(&deleting)),
            PodOutcome::Failed {
                exit_code: None,
                ..
            }
        ));
    }

    #[test]
    fn a_pod_without_a_status_or_with_null_fields_decodes() {
        let cached: CachedPod = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[]},"status":{"phase":"Pending","containerStatuses":null}}"#,
        )
        .unwrap();
        assert_eq!(pod_outcome(Some(&cached)), PodOutcome::InProgress);
        let bare: CachedPod = serde_json::from_str(r#"{"metadata":{"name":"p"}}"#).unwrap();
        assert_eq!(pod_outcome(Some(&bare)), PodOutcome::InProgress);
    }
}
