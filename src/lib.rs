//! agentrun: a Kubernetes operator for AI-agent runs that pause for human approval of risky tool
//! calls and resume later, with an audit trail.

pub mod agent;
pub mod cli;
pub mod controller;
pub mod crd;
pub mod plugin;
pub mod run_status;
pub mod state;
pub mod worker;
