//! `agentrun-bench`: the operator benchmark (see [`agentrun_bench`] and `docs/benchmark.md`).

use clap::Parser;

fn main() -> std::process::ExitCode {
    agentrun_bench::cli::main(agentrun_bench::cli::BenchArgs::parse())
}
