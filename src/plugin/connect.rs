//! Reaching the cluster like kubectl does (kubeconfig, context, namespace), asking the API server
//! who the current identity is (SelfSubjectReview), and reading the objects the commands show.

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, UserInfo};
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};

use super::PluginError;
use crate::crd::keys::labels;
use crate::crd::names::run_label_value;
use crate::crd::{AgentRun, ApprovalRequest};

/// A client and the namespace the command works in.
#[derive(Clone)]
pub struct Session {
    /// The Kubernetes client, authenticated as the kubeconfig's user.
    pub client: Client,
    /// `-n/--namespace`, else the context's namespace, else `default`.
    pub namespace: String,
}

impl Session {
    /// Connects as the kubeconfig selects: `--kubeconfig` (else `$KUBECONFIG`, else
    /// `~/.kube/config`, else the in-cluster service account), `--context`, `-n/--namespace`.
    ///
    /// Installs the rustls ring crypto provider first (a no-op when one is installed).
    pub async fn connect(args: &super::cli::ConnectionArgs) -> Result<Session, PluginError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..Default::default()
        };
        let config = match &args.kubeconfig {
            Some(path) => {
                // The reader's error names the file.
                let kubeconfig =
                    Kubeconfig::read_from(path).map_err(|e| PluginError::Kubeconfig {
                        message: e.to_string(),
                    })?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .map_err(|e| PluginError::Kubeconfig {
                        message: format!("{}: {e}", path.display()),
                    })?
            }
            None => match Config::from_kubeconfig(&options).await {
                Ok(config) => config,
                // Like kubectl in a Pod: without a kubeconfig, use the service account.
                Err(e) if args.context.is_none() => {
                    Config::incluster().map_err(|_| PluginError::Kubeconfig {
                        message: e.to_string(),
                    })?
                }
                Err(e) => {
                    return Err(PluginError::Kubeconfig {
                        message: e.to_string(),
                    });
                }
            },
        };
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config).map_err(PluginError::Client)?;
        Ok(Session { client, namespace })
    }

    /// The AgentRuns API of the session's namespace.
    pub fn runs(&self) -> Api<AgentRun> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The ApprovalRequests API of the session's namespace.
    pub fn requests(&self) -> Api<ApprovalRequest> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The AgentRun `name` of the session's namespace.
    pub async fn run(&self, name: &str) -> Result<AgentRun, PluginError> {
        self.runs()
            .get_opt(name)
            .await
            .map_err(|e| PluginError::api(format!("get agentrun {name}"), &e))?
            .ok_or_else(|| PluginError::NotFound {
                kind: "agentrun",
                name: name.to_owned(),
                namespace: self.namespace.clone(),
            })
    }

    /// The ApprovalRequest `name` of the session's namespace.
    pub async fn request(&self, name: &str) -> Result<ApprovalRequest, PluginError> {
        self.requests()
            .get_opt(name)
            .await
            .map_err(|e| PluginError::api(format!("get approvalrequest {name}"), &e))?
            .ok_or_else(|| PluginError::NotFound {
                kind: "approvalrequest",
                name: name.to_owned(),
                namespace: self.namespace.clone(),
            })
    }

    /// The ApprovalRequests of `run`: those labelled with the run's name whose
    /// `spec.agentRunRef` names this very run (same name and uid, so a deleted and re-created
    /// run of the same name never shows another run's decisions).
    pub async fn requests_of(&self, run: &AgentRun) -> Result<Vec<ApprovalRequest>, PluginError> {
        let name = run.name_any();
        let selector = format!("{}={}", labels::RUN, run_label_value(&name));
        let list = self
            .requests()
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| {
                PluginError::api(format!("list the approvalrequests of agentrun {name}"), &e)
            })?;
        let uid = run.uid();
        Ok(list
            .items
            .into_iter()
            .filter(|r| {
                r.spec.agent_run_ref.name == name
                    && uid
                        .as_deref()
                        .is_none_or(|uid| r.spec.agent_run_ref.uid == uid)
            })
            .collect())
    }

    /// Who the API server says the current identity is, as `kubectl auth whoami` asks it: a
    /// SelfSubjectReview (authentication.k8s.io/v1).
    pub async fn whoami(&self) -> Result<UserInfo, PluginError> {
        let api: Api<SelfSubjectReview> = Api::all(self.client.clone());
        let review = api
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .map_err(|e| PluginError::Identity {
                message: super::api_message(&e),
            })?;
        review
            .status
            .and_then(|s| s.user_info)
            .filter(|u| u.username.as_deref().is_some_and(|n| !n.is_empty()))
            .ok_or_else(|| PluginError::Identity {
                message: "the SelfSubjectReview has no status.userInfo.username".to_owned(),
            })
    }

    /// The current identity's username (see [`Session::whoami`]).
    pub async fn username(&self) -> Result<String, PluginError> {
        Ok(self.whoami().await?.username.unwrap_or_default())
    }
}
