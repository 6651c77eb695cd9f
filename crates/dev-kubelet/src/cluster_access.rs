//! [`ClusterAccess`]: how a process reaches the API server, read from a kubeconfig; kubeconfig
//! files that authenticate with a bearer token.

use std::path::Path;

use kube::config::Kubeconfig;
use serde_json::json;

use crate::DevKubeletError;

/// How a worker process reaches the API server.
#[derive(Clone, Debug)]
pub struct ClusterAccess {
    /// The API server URL.
    pub server: String,
    /// Base64 PEM of the CA, as in a kubeconfig's `certificate-authority-data`.
    pub certificate_authority_data: Option<String>,
}

impl ClusterAccess {
    /// Reads the server and CA from a kubeconfig (the current context's cluster).
    pub fn from_kubeconfig(kubeconfig: &Kubeconfig) -> Result<Self, DevKubeletError> {
        let context_name = kubeconfig
            .current_context
            .clone()
            .ok_or_else(|| DevKubeletError::Kubeconfig("no current-context".into()))?;
        let context = kubeconfig
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.clone())
            .ok_or_else(|| DevKubeletError::Kubeconfig(format!("no context {context_name}")))?;
        let cluster = kubeconfig
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.clone())
            .ok_or_else(|| {
                DevKubeletError::Kubeconfig(format!("no cluster {}", context.cluster))
            })?;
        let certificate_authority_data = match (
            &cluster.certificate_authority_data,
            &cluster.certificate_authority,
        ) {
            (Some(data), _) => Some(data.clone()),
            (None, Some(path)) => {
                let pem = std::fs::read(path).map_err(|source| DevKubeletError::Io {
                    what: format!("reading {path}"),
                    source,
                })?;
                Some(base64_pem(&pem))
            }
            (None, None) => None,
        };
        Ok(Self {
            server: cluster
                .server
                .ok_or_else(|| DevKubeletError::Kubeconfig("cluster has no server".into()))?,
            certificate_authority_data,
        })
    }
}

impl ClusterAccess {
    /// A kubeconfig that authenticates `user` to this cluster with a bearer token.
    pub fn token_kubeconfig(&self, user: &str, token: &str) -> String {
        let mut cluster = json!({"server": self.server});
        if let Some(ca) = &self.certificate_authority_data {
            cluster["certificate-authority-data"] = json!(ca);
        }
        let doc = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "cluster", "user": user}}],
            "current-context": user,
        });
        // JSON is YAML: every kubeconfig reader takes it.
        serde_json::to_string_pretty(&doc).unwrap_or_default()
    }

    /// Writes [`ClusterAccess::token_kubeconfig`] to `path`, readable by its owner only (it holds
    /// a token).
    pub fn write_token_kubeconfig(
        &self,
        path: &Path,
        user: &str,
        token: &str,
    ) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?
            .write_all(self.token_kubeconfig(user, token).as_bytes())
    }
}

fn base64_pem(pem: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_kubeconfigs_read_back_with_and_without_a_ca() {
        for ca in [Some("Q0E=".to_owned()), None] {
            let access = ClusterAccess {
                server: "https://127.0.0.1:6443".into(),
                certificate_authority_data: ca.clone(),
            };
            let text = access.token_kubeconfig("ci", "t0k3n");
            let config: Kubeconfig = serde_yaml_ng::from_str(&text).unwrap();
            let read = ClusterAccess::from_kubeconfig(&config).unwrap();
            assert_eq!(read.server, access.server);
            assert_eq!(read.certificate_authority_data, ca);
            let user = config.auth_infos[0].auth_info.clone().unwrap();
            assert!(user.token.is_some());
        }
    }
}
