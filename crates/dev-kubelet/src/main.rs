//! `agentrun-dev-kubelet`: the dev-only kubelet stand-in (see [`agentrun_dev_kubelet`]).

use clap::Parser;

fn main() -> std::process::ExitCode {
    agentrun_dev_kubelet::cli::main(agentrun_dev_kubelet::cli::DevKubeletArgs::parse())
}
