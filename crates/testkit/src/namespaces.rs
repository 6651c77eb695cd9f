//! Setting up namespaces and service-account identities, with errors returned (the benchmark
//! reports them) rather than panics.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::wait::poll_until;

/// Why setting something up failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A Kubernetes API request failed.
    #[error("kubernetes API, {what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Something did not happen in time.
    #[error("timed out after {seconds} s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The limit.
        seconds: u64,
    },
    /// The API server answered a TokenRequest without a token.
    #[error("the API server returned no token for {0}")]
    NoToken(String),
}

fn kube_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> SetupError {
    let what = what.into();
    move |source| SetupError::Kube { what, source }
}

/// Creates namespace `name` with `labels`, then waits up to `timeout` for kube-controller-manager
/// to give it its `default` ServiceAccount (Pods and tokens need it).
pub async fn create_namespace(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
    timeout: Duration,
) -> Result<(), SetupError> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(kube_error(format!("creating namespace {name}")))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    let found = poll_until(timeout, Duration::from_millis(100), || async {
        match accounts.get_opt("default").await {
            Ok(Some(_)) => std::ops::ControlFlow::Break(Ok(())),
            Ok(None) => std::ops::ControlFlow::Continue(()),
            Err(e) => std::ops::ControlFlow::Break(Err(e)),
        }
    })
    .await;
    match found {
        Ok(result) => result.map_err(kube_error("reading the default ServiceAccount")),
        Err(()) => Err(SetupError::Timeout {
            what: format!("the default ServiceAccount of {name}"),
            seconds: timeout.as_secs(),
        }),
    }
}

/// Mints a token for ServiceAccount `account` of `namespace` with the TokenRequest API, valid for
/// `seconds`.
pub async fn service_account_token(
    client: &Client,
    namespace: &str,
    account: &str,
    seconds: i64,
) -> Result<String, SetupError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![]),
            expiration_seconds: Some(seconds),
            ..Default::default()
        }),
        ..Default::default()
    };
    let response = accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .map_err(kube_error(format!(
            "minting a token for {namespace}/{account}"
        )))?;
    response
        .status
        .and_then(|s| s.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| SetupError::NoToken(format!("{namespace}/{account}")))
}
