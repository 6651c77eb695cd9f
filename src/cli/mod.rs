//! The subcommands of the `agentrun` binary. Each returns the process exit code.

pub mod console;
pub mod crdgen;
pub mod operator;
pub mod run;
pub mod state;
