//! The test kit of agentrun, shared by the integration tests (`tests/`) and the benchmark
//! (`crates/bench`):
//!
//! - [`cluster`]: a real control plane on loopback (etcd, kube-apiserver, kube-controller-manager),
//!   one per test binary, with the identities of its token file, kubectl and helm;
//! - [`operator`]: the controller and the dev kubelet of one test, in-process;
//! - [`model_server`] and [`tool_server`]: a scripted OpenAI-compatible model and HTTP tools;
//! - [`mcp_servers`]: MCP servers of the official Python SDK and the reference server, on loopback;
//!   [`otel_collector`]: a real OpenTelemetry Collector (OTLP in, JSON lines out);
//! - [`notification_receiver`]: a receiver of the controller's signed CloudEvents;
//! - [`runs`]: Agent and AgentRun manifests, waiting for a run's phase, its ApprovalRequests;
//! - [`namespaces`]: namespaces and service-account tokens, with errors returned;
//! - [`wait`]: bounded waits and free ports; [`cluster_env`]: a cluster folder's settings;
//! - [`browser`]: a real headless Chromium under chromedriver; [`console`]: `agentrun console`
//!   in-process.

pub mod browser;
pub mod cluster;
pub mod cluster_env;
pub mod console;
pub mod mcp_servers;
pub mod model_server;
pub mod namespaces;
pub mod notification_receiver;
pub mod operator;
pub mod otel_collector;
mod recorded;
pub mod runs;
pub mod tool_server;
pub mod wait;
