//! Where the outboxes are kept: one ConfigMap in the controller's namespace (default
//! `agentrun-notification-outbox`), one key per sink (its name) holding the sink's
//! [`Outbox`](super::outbox::Outbox) as JSON. Only the controller writes it (the chart grants it
//! this one ConfigMap by name); only the leader replica runs the notifier, so there is one writer,
//! and a write guarded by a stale resourceVersion (someone edited it) is redone on the current one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};

use super::outbox::Outbox;
use crate::crd::keys::{field_managers, labels};

/// The outbox ConfigMap.
pub struct OutboxStore {
    api: Api<ConfigMap>,
    name: String,
    /// The resourceVersion last read or written; `None` when the ConfigMap does not exist.
    resource_version: Option<String>,
    /// The data last written, to skip writes that change nothing.
    written: BTreeMap<String, String>,
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A Kubernetes API request failed.
    #[error("outbox ConfigMap {name}: {source}")]
    Kube {
        /// The ConfigMap.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

impl OutboxStore {
    /// The store of ConfigMap `name` in `namespace`.
    pub fn new(client: Client, namespace: &str, name: &str) -> OutboxStore {
        OutboxStore {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            resource_version: None,
            written: BTreeMap::new(),
        }
    }

    fn error(&self, source: kube::Error) -> StoreError {
        StoreError::Kube {
            name: self.name.clone(),
            source,
        }
    }

    /// The outboxes kept, by sink name (none when the ConfigMap does not exist). An entry that
    /// does not parse is skipped with a warning: its events are derived again.
    pub async fn load(&mut self) -> Result<BTreeMap<String, Outbox>, StoreError> {
        let found = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.error(e))?;
        let Some(config_map) = found else {
            self.resource_version = None;
            return Ok(BTreeMap::new());
        };
        self.resource_version = config_map.resource_version();
        let data = config_map.data.unwrap_or_default();
        self.written = data.clone();
        Ok(data
            .into_iter()
            .filter_map(|(sink, text)| match Outbox::from_json(&text) {
                Ok(outbox) => Some((sink, outbox)),
                Err(error) => {
                    tracing::warn!(%sink, %error, "skipping an outbox that does not parse");
                    None
                }
            })
            .collect())
    }

    /// Writes `data` (sink name → outbox JSON) as the ConfigMap's whole data, creating it when
    /// missing. Nothing is written when it is what was last written.
    pub async fn save(&mut self, data: BTreeMap<String, String>) -> Result<(), StoreError> {
        if data == self.written && (self.resource_version.is_some() || data.is_empty()) {
            return Ok(());
        }
        let params = PostParams {
            field_manager: Some(field_managers::CONTROLLER.into()),
            ..Default::default()
        };
        for _ in 0..3 {
            let mut config_map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    labels: Some(
                        [
                            (labels::PART_OF.0.to_owned(), labels::PART_OF.1.to_owned()),
                            (
                                labels::MANAGED_BY.0.to_owned(),
                                labels::MANAGED_BY.1.to_owned(),
                            ),
                        ]
                        .into(),
                    ),
                    annotations: Some(
                        [(
                            "agentrun.dev/description".to_owned(),
                            "The notification outbox of the agentrun controller: per NotificationSink, the events not yet delivered and the ids delivered. Written by the controller only."
                                .to_owned(),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
                data: Some(data.clone()),
                ..Default::default()
            };
            let result = match &self.resource_version {
                Some(version) => {
                    config_map.metadata.resource_version = Some(version.clone());
                    self.api.replace(&self.name, &params, &config_map).await
                }
                None => self.api.create(&params, &config_map).await,
            };
            match result {
                Ok(written) => {
                    self.resource_version = written.resource_version();
                    self.written = data;
                    return Ok(());
                }
                // Changed, created or deleted by someone else: write over the current version.
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    self.resource_version = self
                        .api
                        .get_opt(&self.name)
                        .await
                        .map_err(|e| self.error(e))?
                        .and_then(|c| c.resource_version());
                }
                Err(e) => return Err(self.error(e)),
            }
        }
        Err(self.error(kube::Error::Api(
            kube::core::Status::failure(
                "the ConfigMap kept changing while it was written",
                "Conflict",
            )
            .with_code(409)
            .boxed(),
        )))
    }
}
