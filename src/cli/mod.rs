//! The subcommands of the `agentrun` binary. Each returns the process exit code.

pub mod crdgen;
pub mod run;
pub mod state;
