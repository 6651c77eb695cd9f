//! The integration tests that share one control plane (started once for this binary by
//! `agentrun_testkit::cluster::ControlPlane::shared`, with the CRDs, admission policies and roles of
//! `crds/` installed). The tests run in parallel: each works in namespaces of its own and names any
//! cluster-scoped object it creates uniquely.
//!
//! Tests needing a control plane of their own have their own binaries: `crd_api` (no admission
//! policies), `helm_chart` (the chart's cluster-wide objects instead of `crds/`), `chaos` (it
//! restarts kube-apiserver). The tests needing none are in `offline`.

mod approval_assertions;
mod approval_policy;
mod attacks;
mod console;
mod control_plane;
mod controller_ha;
mod kubectl_plugin;
mod mcp_tools;
mod notifications;
mod operator_e2e;
mod policy_decisions;
mod worker_start;
