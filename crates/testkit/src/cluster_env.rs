//! The settings `scripts/local-cluster` writes into a cluster's folder (`cluster.env`).

use std::collections::HashMap;
use std::path::PathBuf;

/// The settings `scripts/local-cluster` writes to `DIR/cluster.env`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterEnv {
    /// `KUBE_APISERVER_URL`.
    pub api_url: String,
    /// `KUBECONFIG_DIR`: `admin.kubeconfig`, `alice.kubeconfig`, ...
    pub kubeconfig_dir: PathBuf,
    /// `AUDIT_LOG`: the API server's JSON audit log.
    pub audit_log: PathBuf,
    /// `BIN_DIR`: kubectl, helm and the control-plane binaries.
    pub bin_dir: PathBuf,
}

/// Parses `cluster.env` (`KEY=value` lines); the error names the missing key.
pub fn parse_cluster_env(text: &str) -> Result<ClusterEnv, String> {
    let values: HashMap<&str, &str> = text
        .lines()
        .filter_map(|l| l.trim().split_once('='))
        .map(|(k, v)| (k.trim(), v.trim()))
        .collect();
    let get = |key: &str| {
        values
            .get(key)
            .filter(|v| !v.is_empty())
            .map(|v| v.to_string())
            .ok_or_else(|| format!("{key} is not set"))
    };
    Ok(ClusterEnv {
        api_url: get("KUBE_APISERVER_URL")?,
        kubeconfig_dir: get("KUBECONFIG_DIR")?.into(),
        audit_log: get("AUDIT_LOG")?.into(),
        bin_dir: get("BIN_DIR")?.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_env_names_the_missing_key() {
        let text = "KUBE_APISERVER_URL=https://127.0.0.1:6443\nKUBECONFIG_DIR=/c/kubeconfig\nAUDIT_LOG=/c/audit.log\nBIN_DIR=/bin/k8s\n";
        let env = parse_cluster_env(text).unwrap();
        assert_eq!(env.api_url, "https://127.0.0.1:6443");
        assert_eq!(env.audit_log, PathBuf::from("/c/audit.log"));
        let err = parse_cluster_env("KUBE_APISERVER_URL=x\nBIN_DIR=\n").unwrap_err();
        assert_eq!(err, "KUBECONFIG_DIR is not set");
    }
}
