//! The `agentrun` command: local runs, RunState tools, and (in a cluster) the controller and worker.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of the C library's allocator: the controller and worker allocate many small
/// strings and maps (RunStates, cached objects), and the static musl build's malloc is slow at
/// that (docs/benchmark.md, "Codec").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "agentrun",
    version,
    about = "AI-agent runs that pause for human approval"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Read, decide and summarize a serialized RunState (stdin to stdout).
    #[command(subcommand)]
    State(agentrun::cli::state::StateCommand),
    /// Run an agent locally: start from an input, or resume from a saved RunState.
    Run(agentrun::cli::run::RunArgs),
    /// Write the CustomResourceDefinitions generated from the Rust types (crds/*.yaml).
    Crdgen(agentrun::cli::crdgen::CrdgenArgs),
    /// Run the controller (in a cluster, or against KUBECONFIG).
    Controller(Box<agentrun::cli::operator::ControllerArgs>),
    /// Run one step of an AgentRun (the command of worker Pods).
    Worker(agentrun::cli::operator::WorkerArgs),
    /// Serve the approval console: a web UI where people decide as themselves.
    Console(Box<agentrun::cli::console::ConsoleArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::State(cmd) => agentrun::cli::state::main(cmd),
        Command::Run(args) => agentrun::cli::run::main(args),
        Command::Crdgen(args) => agentrun::cli::crdgen::main(args),
        Command::Controller(args) => agentrun::cli::operator::controller(*args),
        Command::Worker(args) => agentrun::cli::operator::worker(args),
        Command::Console(args) => agentrun::cli::console::main(*args),
    }
}
