//! agentrun: a Kubernetes operator for AI-agent runs that pause for human approval of risky tool
//! calls and resume later, with an audit trail.

pub mod agent;
pub mod approval_policy;
pub mod assertion;
pub mod chunk_store;
pub mod cli;
pub mod console;
pub mod controller;
pub mod crd;
pub mod notify;
pub mod plugin;
pub mod state;
pub mod telemetry;
pub mod time;
pub mod worker;
